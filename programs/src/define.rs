//! A Codebuff agent file (`.ts`, `.js`, `.json`) read into its
//! `AgentDefinition` as JSON, and its `handleSteps` kept as a [`Program`] to
//! run later.

use std::path::Path;
use std::sync::Arc;

use rquickjs::{Ctx, Function, Module, Object, Value};

use crate::engine::{JsError, Limits, Sandbox};
use crate::load::{self, Bundle, LoadError};

/// A `handleSteps` to run: the bundle that defines it, evaluated again for
/// each run (so it may use what its module imports).
#[derive(Clone, Debug)]
pub struct Program {
    pub(crate) bundle: Arc<Bundle>,
}

impl Program {
    /// The module graph the program runs in.
    pub fn bundle(&self) -> &Bundle {
        &self.bundle
    }
}

/// An agent file as loaded.
#[derive(Clone, Debug)]
pub struct AgentFile {
    /// The default export (an `AgentDefinition`) as JSON, without `handleSteps`.
    pub definition: serde_json::Value,
    /// Its `handleSteps`, when it has one (a generator function, or its
    /// source as a string).
    pub program: Option<Program>,
    /// The 1-based line of each top-level field in the file, where found
    /// (for errors about a field).
    pub field_lines: Vec<(String, usize)>,
}

/// Finds a program's `handleSteps` in its module's namespace: the default
/// export's `handleSteps` (a function, or a string of one), a default export
/// that is itself a function, or a named export `handleSteps`.
pub(crate) const EXTRACT: &str = r#"(ns) => {
  const d = ns.default;
  if (d !== null && typeof d === 'object') {
    const h = d.handleSteps;
    if (typeof h === 'function') return h;
    if (typeof h === 'string') {
      const f = (0, eval)('(' + h + ')');
      if (typeof f !== 'function') throw new TypeError('handleSteps is a string that is not the source of a function');
      return f;
    }
  }
  if (typeof d === 'function') return d;
  if (typeof ns.handleSteps === 'function') return ns.handleSteps;
  throw new TypeError('the module exports no handleSteps (a generator function as the default export, its handleSteps field, or a named export)');
}"#;

/// The default export as JSON and what kind of `handleSteps` it has.
const DESCRIBE: &str = r#"(ns) => {
  const d = ns.default;
  if (d === undefined) throw new TypeError('the module has no default export (export default an AgentDefinition)');
  if (d === null || typeof d !== 'object' || Array.isArray(d)) throw new TypeError('the default export is not an object (an AgentDefinition)');
  for (const k of Object.keys(d)) {
    if (k !== 'handleSteps' && typeof d[k] === 'function') throw new TypeError("field '" + k + "' is a function; only handleSteps may be");
  }
  const h = d.handleSteps;
  if (h !== undefined && typeof h !== 'function' && typeof h !== 'string') throw new TypeError('handleSteps is neither a generator function nor its source as a string');
  const json = JSON.stringify(d, (k, v) => (k === 'handleSteps' ? undefined : v));
  return { json, has: h !== undefined };
}"#;

/// [`DESCRIBE`] for a file that may not be an agent: a module whose default
/// export is not an object with an `id` (a helper, a file of types) answers
/// `{ json: null }`, as Codebuff's loader skips it.
const DESCRIBE_IF_AGENT: &str = r#"(ns, describe) => {
  const d = ns.default;
  if (d === null || typeof d !== 'object' || Array.isArray(d) || d.id === undefined) return { json: null, has: false };
  return describe(ns);
}"#;

/// Evaluates `bundle`'s entry module and returns its namespace.
pub(crate) fn namespace<'js>(ctx: &Ctx<'js>, bundle: &Bundle) -> rquickjs::Result<Object<'js>> {
    let code = bundle
        .modules
        .get(&bundle.entry)
        .map(|m| m.code.clone())
        .unwrap_or_default();
    let (module, promise) = Module::declare(ctx.clone(), bundle.entry.clone(), code)?.eval()?;
    promise.finish::<()>()?;
    module.namespace()
}

/// Reads the Codebuff agent file `file` inside the agents directory `root`.
pub fn load_agent_file(root: &Path, file: &Path, limits: Limits) -> Result<AgentFile, LoadError> {
    let bundle = Arc::new(load::bundle(root, file)?);
    let sandbox = Sandbox::new(Arc::clone(&bundle), limits)
        .map_err(|e| LoadError::new(file, None, e.message))?;
    // One evaluation: the definition as JSON and, when it has one, its
    // handleSteps checked now, so a bad string is a load error and not a
    // run's failure.
    let (json, has_program) = sandbox
        .run(|ctx| {
            let ns = namespace(ctx, &bundle)?;
            let describe: Function = ctx.eval(DESCRIBE)?;
            let described: Object = describe.call((ns.clone(),))?;
            let json: String = described.get("json")?;
            let has: bool = described.get("has")?;
            if has {
                let extract: Function = ctx.eval(EXTRACT)?;
                let _: Value = extract.call((ns,))?;
            }
            Ok((json, has))
        })
        .map_err(|e| located(file, &bundle, e))?;
    let definition: serde_json::Value = serde_json::from_str(&json).map_err(|e| {
        LoadError::new(
            file,
            None,
            format!("the default export is not JSON data: {e}"),
        )
    })?;
    let program = has_program.then(|| Program {
        bundle: Arc::clone(&bundle),
    });
    let source = std::fs::read_to_string(file).unwrap_or_default();
    Ok(AgentFile {
        field_lines: field_lines(&source, &definition),
        definition,
        program,
    })
}

/// Reads the agent file of `bundle` (its entry, shown as `file` in
/// errors), as Codebuff's loader does: `Ok(None)` when its default export
/// is not an object with an `id` (a module of helpers or types, not an
/// agent).
pub fn load_agent_bundle(
    bundle: Bundle,
    file: &Path,
    limits: Limits,
) -> Result<Option<AgentFile>, LoadError> {
    let bundle = Arc::new(bundle);
    let sandbox = Sandbox::new(Arc::clone(&bundle), limits)
        .map_err(|e| LoadError::new(file, None, e.message))?;
    let (json, has_program) = sandbox
        .run(|ctx| {
            let ns = namespace(ctx, &bundle)?;
            let describe: Function = ctx.eval(DESCRIBE)?;
            let check: Function = ctx.eval(DESCRIBE_IF_AGENT)?;
            let described: Object = check.call((ns.clone(), describe))?;
            let json: Option<String> = described.get("json")?;
            let has: bool = described.get("has")?;
            if has {
                let extract: Function = ctx.eval(EXTRACT)?;
                let _: Value = extract.call((ns,))?;
            }
            Ok((json, has))
        })
        .map_err(|e| located(file, &bundle, e))?;
    let Some(json) = json else {
        return Ok(None);
    };
    let definition: serde_json::Value = serde_json::from_str(&json).map_err(|e| {
        LoadError::new(
            file,
            None,
            format!("the default export is not JSON data: {e}"),
        )
    })?;
    let source = bundle
        .modules
        .get(&bundle.entry)
        .map(|m| m.source.clone())
        .unwrap_or_default();
    let program = has_program.then(|| Program {
        bundle: Arc::clone(&bundle),
    });
    Ok(Some(AgentFile {
        field_lines: field_lines(&source, &definition),
        definition,
        program,
    }))
}

/// Reads a program file (`program = "agents/fan-out.ts"`): a module whose
/// default export is a generator function, or an `AgentDefinition` with
/// `handleSteps`, or which exports `handleSteps`.
pub fn load_program_file(root: &Path, file: &Path, limits: Limits) -> Result<Program, LoadError> {
    let bundle = Arc::new(load::bundle(root, file)?);
    let sandbox = Sandbox::new(Arc::clone(&bundle), limits)
        .map_err(|e| LoadError::new(file, None, e.message))?;
    sandbox
        .run(|ctx| {
            let ns = namespace(ctx, &bundle)?;
            let extract: Function = ctx.eval(EXTRACT)?;
            let _: Value = extract.call((ns,))?;
            Ok(())
        })
        .map_err(|e| located(file, &bundle, e))?;
    Ok(Program { bundle })
}

/// A program from the source of a generator function (`handleSteps` as a
/// string, as Codebuff's SDK allows).
pub fn program_from_source(name: &str, source: &str) -> Program {
    let code = format!("export default (\n{source}\n);\n");
    let mut bundle = Bundle::of_source(name, code);
    if let Some(module) = bundle.modules.get_mut(name) {
        // Line 1 is the wrapper's; source line k is printed line k + 1.
        module.lines = std::iter::once(None)
            .chain((1..=source.lines().count() as u32).map(Some))
            .chain(std::iter::once(None))
            .collect();
    }
    Program {
        bundle: Arc::new(bundle),
    }
}

/// An error of the entry's evaluation, at its `file:line` where known.
fn located(file: &Path, bundle: &Bundle, e: JsError) -> LoadError {
    match e.at {
        Some((key, line)) if key == bundle.entry => LoadError::new(file, Some(line), e.message),
        Some((key, line)) => LoadError::new(bundle.file(&key), Some(line), e.message),
        None => LoadError::new(file, None, e.message),
    }
}

/// Where each top-level field of the definition is written: the first line
/// that starts (after spaces) with `name:` or `"name":`.
fn field_lines(source: &str, definition: &serde_json::Value) -> Vec<(String, usize)> {
    let Some(fields) = definition.as_object() else {
        return Vec::new();
    };
    fields
        .keys()
        .chain(std::iter::once(&"handleSteps".to_string()))
        .filter_map(|key| {
            source
                .lines()
                .position(|l| {
                    let t = l.trim_start();
                    t.starts_with(&format!("{key}:"))
                        || t.starts_with(&format!("\"{key}\":"))
                        || t.starts_with(&format!("'{key}':"))
                        || t.starts_with(&format!("{key}("))
                        || t.starts_with(&format!("*{key}("))
                })
                .map(|i| (key.clone(), i + 1))
        })
        .collect()
}
