//! TypeScript to JavaScript: types stripped with oxc (parse, scope, the
//! TypeScript transform alone, print), the module's imports listed with the
//! line each is on, and a map from the printed lines back to the source's.

use std::path::Path;

use oxc::allocator::Allocator;
use oxc::ast::ast::Statement;
use oxc::codegen::{Codegen, CodegenOptions};
use oxc::parser::Parser;
use oxc::semantic::SemanticBuilder;
use oxc::span::SourceType;
use oxc::transformer::{TransformOptions, Transformer};

/// One module as JavaScript.
#[derive(Clone, Debug)]
pub(crate) struct Stripped {
    /// The module's code, types taken out.
    pub code: String,
    /// The value imports left once types are gone (`import type` and imports
    /// used only as types dropped): specifier and 1-based source line.
    pub imports: Vec<(String, usize)>,
    /// For each line of `code` (0-based), the 1-based line of the source it
    /// came from, where known.
    pub lines: Vec<Option<u32>>,
}

/// A problem in one file: the 1-based line, where known, and what is wrong.
#[derive(Debug)]
pub(crate) struct SyntaxError {
    pub line: Option<usize>,
    pub message: String,
}

/// The 1-based line of byte `offset` in `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()
        .iter()
        .take(offset)
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Strips `source` (TypeScript when `path` ends in `.ts`/`.mts`, else
/// JavaScript) into a module of JavaScript.
pub(crate) fn strip(source: &str, path: &Path) -> Result<Stripped, SyntaxError> {
    let allocator = Allocator::default();
    let typescript = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("ts" | "mts" | "cts")
    );
    let source_type = if typescript {
        SourceType::ts()
    } else {
        SourceType::mjs()
    };
    let parsed = Parser::new(&allocator, source, source_type).parse();
    let first_error = |errors: Vec<oxc::diagnostics::OxcDiagnostic>| {
        errors.into_iter().next().map(|e| SyntaxError {
            line: e
                .labels
                .as_ref()
                .and_then(|l| l.first())
                .map(|l| line_of(source, l.offset())),
            message: e.message.to_string(),
        })
    };
    if parsed.panicked || !parsed.errors.is_empty() {
        return Err(first_error(parsed.errors).unwrap_or(SyntaxError {
            line: None,
            message: "the file could not be parsed".into(),
        }));
    }
    let mut program = parsed.program;
    let semantic = SemanticBuilder::new().build(&program);
    if let Some(e) = first_error(semantic.errors) {
        return Err(e);
    }
    let scoping = semantic.semantic.into_scoping();
    if typescript {
        let options = TransformOptions::default();
        let transformed =
            Transformer::new(&allocator, path, &options).build_with_scoping(scoping, &mut program);
        if let Some(e) = first_error(transformed.errors) {
            return Err(e);
        }
    }
    let mut imports = Vec::new();
    for statement in &program.body {
        let (source_literal, span) = match statement {
            Statement::ImportDeclaration(d) if !d.import_kind.is_type() => (&d.source, d.span),
            Statement::ExportAllDeclaration(d) if !d.export_kind.is_type() => (&d.source, d.span),
            Statement::ExportNamedDeclaration(d) if !d.export_kind.is_type() => match &d.source {
                Some(s) => (s, d.span),
                None => continue,
            },
            _ => continue,
        };
        imports.push((
            source_literal.value.to_string(),
            line_of(source, span.start as usize),
        ));
    }
    let options = CodegenOptions {
        source_map_path: Some(path.to_path_buf()),
        ..CodegenOptions::default()
    };
    let printed = Codegen::new().with_options(options).build(&program);
    let mut lines = vec![None; printed.code.lines().count() + 1];
    if let Some(map) = &printed.map {
        for token in map.get_tokens() {
            let dst = token.get_dst_line() as usize;
            if let Some(slot) = lines.get_mut(dst)
                && slot.is_none()
            {
                *slot = Some(token.get_src_line() + 1);
            }
        }
    }
    Ok(Stripped {
        code: printed.code,
        imports,
        lines,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_go_and_values_stay() {
        let src = "import type { A } from './types'\nimport { B } from './only-types'\nimport { c } from './c'\nconst x: A = { n: c } as B\nexport default x satisfies A\n";
        let out = strip(src, Path::new("a.ts")).unwrap();
        assert!(!out.code.contains("types"), "{}", out.code);
        assert!(!out.code.contains("satisfies"), "{}", out.code);
        assert_eq!(out.imports, vec![("./c".to_string(), 3)]);
        // The line of `const x` maps back to source line 4.
        let dst = out
            .code
            .lines()
            .position(|l| l.contains("const x"))
            .unwrap();
        assert_eq!(out.lines[dst], Some(4));
    }

    #[test]
    fn a_syntax_error_names_its_line() {
        let err = strip("const a = 1\nconst = 2\n", Path::new("a.ts")).unwrap_err();
        assert_eq!(err.line, Some(2), "{}", err.message);
    }
}
