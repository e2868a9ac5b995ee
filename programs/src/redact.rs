//! A module's string literals replaced by value: what a stored config keeps
//! of an agent file whose MCP servers hold secrets (an `env` token, a header)
//! is the file with each literal of such a value replaced, the rest of the
//! text as it was.

use oxc::allocator::Allocator;
use oxc::ast::ast::{StringLiteral, TemplateLiteral};
use oxc::ast_visit::{Visit, walk};
use oxc::parser::Parser;
use oxc::span::SourceType;

/// `source` (the module `key`: TypeScript, JavaScript or JSON by its
/// extension) with every string literal (or template without `${}`) whose
/// value `replace` maps to a new value written as that value instead. A
/// file that does not parse is returned as it is (it is not loaded either).
pub fn replace_strings(
    source: &str,
    key: &str,
    replace: &dyn Fn(&str) -> Option<String>,
) -> String {
    let json = key.ends_with(".json");
    // A JSON file is parsed as one parenthesised expression.
    let (text, shift) = if json {
        (format!("({source}\n)"), 1)
    } else {
        (source.to_owned(), 0)
    };
    let typescript = [".ts", ".mts", ".cts"].iter().any(|e| key.ends_with(e));
    let source_type = if typescript {
        SourceType::ts()
    } else {
        SourceType::mjs()
    };
    let allocator = Allocator::default();
    let parsed = Parser::new(&allocator, &text, source_type).parse();
    if parsed.panicked || !parsed.errors.is_empty() {
        return source.to_owned();
    }
    let mut found = Found {
        replace,
        spans: Vec::new(),
    };
    found.visit_program(&parsed.program);
    let mut spans = found.spans;
    spans.sort_by_key(|(start, _, _)| *start);
    let mut out = String::with_capacity(source.len());
    let mut at = 0usize;
    for (start, end, value) in spans {
        let (Some(start), Some(end)) = (start.checked_sub(shift), end.checked_sub(shift)) else {
            continue;
        };
        let Some(before) = source.get(at..start) else {
            continue;
        };
        out.push_str(before);
        out.push_str(&serde_json::Value::String(value).to_string());
        at = end;
    }
    out.push_str(source.get(at..).unwrap_or_default());
    out
}

struct Found<'r> {
    replace: &'r dyn Fn(&str) -> Option<String>,
    /// Byte start, end and the new value of each literal to replace.
    spans: Vec<(usize, usize, String)>,
}

impl<'a> Visit<'a> for Found<'_> {
    fn visit_string_literal(&mut self, it: &StringLiteral<'a>) {
        if let Some(value) = (self.replace)(it.value.as_str()) {
            self.spans
                .push((it.span.start as usize, it.span.end as usize, value));
        }
    }

    fn visit_template_literal(&mut self, it: &TemplateLiteral<'a>) {
        if let ([quasi], []) = (it.quasis.as_slice(), it.expressions.as_slice())
            && let Some(cooked) = &quasi.value.cooked
            && let Some(value) = (self.replace)(cooked.as_str())
        {
            self.spans
                .push((it.span.start as usize, it.span.end as usize, value));
            return;
        }
        walk::walk_template_literal(self, it);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(v: &str) -> Option<String> {
        v.starts_with("sk-").then(|| "(not stored)".to_owned())
    }

    #[test]
    fn a_secret_literal_is_replaced_and_the_rest_kept() {
        let ts = "const t: string = 'sk-one'\nexport default { env: { A: \"sk-two\", B: `sk-three`, C: `x${t}` }, keep: 'kept' }\n";
        let out = replace_strings(ts, "a.ts", &secret);
        assert!(!out.contains("sk-"), "{out}");
        assert!(
            out.contains("keep: 'kept'") && out.contains("`x${t}`"),
            "{out}"
        );
        let json = "{\"env\": {\"TOKEN\": \"sk-json\"}}";
        let out = replace_strings(json, "a.json", &secret);
        assert_eq!(out, "{\"env\": {\"TOKEN\": \"(not stored)\"}}");
    }
}
