//! A file and the files it imports, read from the agents directory and
//! turned into JavaScript: the bundle the engine evaluates. Nothing is read
//! once the bundle is built; the engine's loader serves only these modules.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::path::{Component, Path, PathBuf};

use crate::strip::{self, Stripped};

/// The most a file of an agent's module graph may hold.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// The most modules one agent file may import, directly or not.
pub const MAX_MODULES: usize = 256;

/// Why an agent file could not be loaded: the file, the line where known,
/// and what is wrong. Printed as `file:line: problem`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadError {
    /// The file, as given (the entry) or under the agents directory.
    pub file: PathBuf,
    /// The 1-based line, where known.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl LoadError {
    pub(crate) fn new(file: impl Into<PathBuf>, line: Option<usize>, message: String) -> Self {
        Self {
            file: file.into(),
            line,
            message,
        }
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file.display(), self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for LoadError {}

/// One module of a bundle.
#[derive(Clone, Debug)]
pub(crate) struct Module {
    pub code: String,
    /// Printed line (0-based) to source line (1-based).
    pub lines: Vec<Option<u32>>,
    /// Each import specifier of this module and the module it names.
    pub resolved: BTreeMap<String, String>,
    /// The file's text as read.
    pub source: String,
}

/// An agent file and every module it imports, as JavaScript, keyed by their
/// paths under the agents directory (`/`-separated).
#[derive(Clone, Debug)]
pub struct Bundle {
    pub(crate) root: PathBuf,
    pub(crate) entry: String,
    pub(crate) modules: BTreeMap<String, Module>,
}

impl Bundle {
    /// The entry module's key (its path under the agents directory).
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// The keys of every module in the bundle, the entry's included.
    pub fn modules(&self) -> impl Iterator<Item = &str> {
        self.modules.keys().map(String::as_str)
    }

    /// The text of each module as read (TypeScript, JavaScript or JSON),
    /// by key: what a stored config keeps to load the agent again.
    pub fn sources(&self) -> impl Iterator<Item = (&str, &str)> {
        self.modules
            .iter()
            .map(|(k, m)| (k.as_str(), m.source.as_str()))
    }

    /// The directory its keys are under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file of module `key`, for errors.
    pub(crate) fn file(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// The source line of line `line` (1-based) of module `key`'s printed code.
    pub(crate) fn source_line(&self, key: &str, line: usize) -> Option<usize> {
        let module = self.modules.get(key)?;
        let mapped = module.lines.get(line.checked_sub(1)?).copied().flatten()?;
        Some(mapped as usize)
    }

    /// A bundle of one module from JavaScript source (a `handleSteps` given
    /// as a string), with no imports.
    pub(crate) fn of_source(name: &str, code: String) -> Self {
        let lines = (1..=code.lines().count() as u32).map(Some).collect();
        let mut modules = BTreeMap::new();
        modules.insert(
            name.to_string(),
            Module {
                source: code.clone(),
                code,
                lines,
                resolved: BTreeMap::new(),
            },
        );
        Self {
            root: PathBuf::new(),
            entry: name.to_string(),
            modules,
        }
    }
}

/// Reads `file` (which must be inside `root`) and the modules it imports into
/// a bundle. Relative imports resolve inside `root` only; a package import,
/// an import leaving `root` or one naming no file is an error naming the
/// import and its `file:line`. `import type` and imports used only as types
/// are dropped before anything is resolved.
pub fn bundle(root: &Path, file: &Path) -> Result<Bundle, LoadError> {
    let canonical_root = root.canonicalize().map_err(|e| {
        LoadError::new(
            root,
            None,
            format!("the agents directory cannot be read: {e}"),
        )
    })?;
    let canonical_file = file
        .canonicalize()
        .map_err(|e| LoadError::new(file, None, format!("cannot be read: {e}")))?;
    let entry = key_of(&canonical_root, &canonical_file)
        .ok_or_else(|| LoadError::new(file, None, "is not inside the agents directory".into()))?;
    build(root, file, entry, &Disk(canonical_root))
}

/// [`bundle`] from files held in memory (an agent directory as a stored
/// config keeps it): `files` by their keys under the agents directory
/// (`/`-separated), `entry` the key of the agent file; `root` names the
/// directory in errors.
pub fn bundle_from(
    root: &Path,
    files: &BTreeMap<String, String>,
    entry: &str,
) -> Result<Bundle, LoadError> {
    build(root, &root.join(entry), entry.to_owned(), &Memory(files))
}

/// Why a file of an agent's module graph cannot be read (printed after
/// the file's name).
#[derive(Debug, thiserror::Error)]
enum ReadError {
    /// The system could not read it.
    #[error("cannot be read: {0}")]
    Io(std::io::Error),
    /// It holds more than [`MAX_FILE_BYTES`] (its size).
    #[error("is {0} bytes, more than the {MAX_FILE_BYTES} an agent file may hold")]
    TooLarge(u64),
    /// A stored config's files do not have it.
    #[error("is not among the stored files")]
    NotStored,
}

/// Why the file an import names is refused (printed after the import).
#[derive(Debug, thiserror::Error)]
enum Refused {
    /// Its links cannot be followed.
    #[error("{0}")]
    Unreadable(std::io::Error),
    /// Its links lead out of the agents directory.
    #[error("leaves the agents directory")]
    Outside,
}

/// Why an import cannot be resolved (each names the specifier as written).
#[derive(Debug, thiserror::Error)]
enum ImportError {
    /// Not a relative import.
    #[error(
        "import '{0}': a package import cannot be resolved (only relative imports inside the agents directory are; type-only imports are dropped)"
    )]
    Package(String),
    /// Its `..` climb above the agents directory.
    #[error("import '{0}' leaves the agents directory")]
    Climbs(String),
    /// The file it names is refused.
    #[error("import '{spec}' {why}")]
    Refused {
        /// The specifier.
        spec: String,
        /// Why its file is refused.
        why: Refused,
    },
    /// No file of the directory has its name, with any extension probed.
    #[error("import '{0}': no such file in the agents directory")]
    NoFile(String),
}

/// Where a bundle's files are read from.
trait Files {
    /// The text of the file at `key`.
    fn read(&self, key: &str) -> Result<String, ReadError>;
    /// The key of the file `key` names, links followed: `Ok(None)` when
    /// there is no file there, `Err` when it leads out of the directory.
    fn real(&self, key: &str) -> Result<Option<String>, Refused>;
}

/// The agents directory on disk (its canonical path).
struct Disk(PathBuf);

impl Files for Disk {
    fn read(&self, key: &str) -> Result<String, ReadError> {
        read_bounded(&self.0.join(key))
    }

    fn real(&self, key: &str) -> Result<Option<String>, Refused> {
        let path = self.0.join(key);
        if !path.is_file() {
            return Ok(None);
        }
        // A symbolic link may not lead out of the directory either.
        let real = path.canonicalize().map_err(Refused::Unreadable)?;
        key_of(&self.0, &real).map(Some).ok_or(Refused::Outside)
    }
}

/// An agents directory held in memory.
struct Memory<'a>(&'a BTreeMap<String, String>);

impl Files for Memory<'_> {
    fn read(&self, key: &str) -> Result<String, ReadError> {
        self.0.get(key).cloned().ok_or(ReadError::NotStored)
    }

    fn real(&self, key: &str) -> Result<Option<String>, Refused> {
        Ok(self.0.contains_key(key).then(|| key.to_owned()))
    }
}

fn build(root: &Path, file: &Path, entry: String, files: &dyn Files) -> Result<Bundle, LoadError> {
    let mut modules: BTreeMap<String, Module> = BTreeMap::new();
    let mut queue = VecDeque::from([entry.clone()]);
    while let Some(key) = queue.pop_front() {
        if modules.contains_key(&key) {
            continue;
        }
        if modules.len() >= MAX_MODULES {
            return Err(LoadError::new(
                file,
                None,
                format!("imports more than {MAX_MODULES} modules"),
            ));
        }
        let shown = if key == entry {
            file.to_path_buf()
        } else {
            root.join(&key)
        };
        let source = files
            .read(&key)
            .map_err(|e| LoadError::new(&shown, None, e.to_string()))?;
        let stripped = if key.ends_with(".json") {
            json_module(&source).map_err(|e| LoadError::new(&shown, e.line, e.message))?
        } else {
            strip::strip(&source, Path::new(&key))
                .map_err(|e| LoadError::new(&shown, e.line, e.message))?
        };
        let mut resolved = BTreeMap::new();
        for (spec, line) in &stripped.imports {
            let target = resolve(files, &key, spec)
                .map_err(|why| LoadError::new(&shown, Some(*line), why.to_string()))?;
            resolved.insert(spec.clone(), target.clone());
            queue.push_back(target);
        }
        modules.insert(
            key,
            Module {
                code: stripped.code,
                lines: stripped.lines,
                resolved,
                source,
            },
        );
    }
    Ok(Bundle {
        root: root.to_path_buf(),
        entry,
        modules,
    })
}

/// A JSON file imported as a module: its value is the default export.
fn json_module(source: &str) -> Result<Stripped, strip::SyntaxError> {
    let value: serde_json::Value =
        serde_json::from_str(source).map_err(|e| strip::SyntaxError {
            line: Some(e.line()),
            message: format!("not valid JSON: {e}"),
        })?;
    Ok(Stripped {
        code: format!("export default {value};\n"),
        imports: Vec::new(),
        lines: vec![Some(1), Some(1)],
    })
}

fn read_bounded(path: &Path) -> Result<String, ReadError> {
    let meta = std::fs::metadata(path).map_err(ReadError::Io)?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(ReadError::TooLarge(meta.len()));
    }
    std::fs::read_to_string(path).map_err(ReadError::Io)
}

/// `path`'s key under `root` (both canonical): its components joined by `/`.
fn key_of(root: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(root).ok()?;
    let parts: Vec<&str> = rel
        .components()
        .map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// The extensions a specifier without one may name, in order.
const PROBES: [&str; 8] = [
    "",
    ".ts",
    ".js",
    ".mjs",
    ".json",
    "/index.ts",
    "/index.js",
    "/index.mjs",
];

/// The module that `spec`, imported from module `from`, names.
fn resolve(files: &dyn Files, from: &str, spec: &str) -> Result<String, ImportError> {
    if !(spec.starts_with("./") || spec.starts_with("../")) {
        return Err(ImportError::Package(spec.to_owned()));
    }
    let mut parts: Vec<&str> = from.split('/').collect();
    parts.pop();
    for part in spec.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(ImportError::Climbs(spec.to_owned()));
                }
            }
            p => parts.push(p),
        }
    }
    let base = parts.join("/");
    // TypeScript's convention: `./x.js` may name `./x.ts`.
    let alternates = match base.strip_suffix(".js") {
        Some(stem) => vec![base.clone(), format!("{stem}.ts")],
        None => vec![base.clone()],
    };
    for candidate in alternates {
        for probe in PROBES {
            let key = format!("{candidate}{probe}");
            match files.real(&key) {
                Ok(Some(real)) => return Ok(real),
                Ok(None) => {}
                Err(why) => {
                    return Err(ImportError::Refused {
                        spec: spec.to_owned(),
                        why,
                    });
                }
            }
        }
    }
    Err(ImportError::NoFile(spec.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (name, body) in files {
            let p = d.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        }
        d
    }

    #[test]
    fn relative_imports_are_bundled_and_type_only_ones_dropped() {
        let d = dir(&[
            (
                "a.ts",
                "import type { X } from './types/x'\nimport { y } from './lib/y'\nexport default { y } as X\n",
            ),
            (
                "lib/y.ts",
                "import { z } from '../z.js'\nexport const y: number = z\n",
            ),
            ("z.ts", "export const z = 1\n"),
        ]);
        let b = bundle(d.path(), &d.path().join("a.ts")).unwrap();
        assert_eq!(
            b.modules().collect::<Vec<_>>(),
            ["a.ts", "lib/y.ts", "z.ts"]
        );
    }

    #[test]
    fn a_package_import_is_an_error_naming_it_and_its_line() {
        let d = dir(&[(
            "a.ts",
            "import type { T } from '@codebuff/sdk'\n\nimport { AgentTemplateTypes } from '@codebuff/common/types/session-state'\nexport default { id: AgentTemplateTypes.x }\n",
        )]);
        let err = bundle(d.path(), &d.path().join("a.ts")).unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert!(
            err.to_string()
                .contains("a.ts:3: import '@codebuff/common/types/session-state'"),
            "{err}"
        );
    }

    #[test]
    fn an_import_leaving_the_directory_is_refused() {
        let outer = dir(&[
            ("secret.ts", "export const s = 1\n"),
            (
                "agents/a.ts",
                "import { s } from '../secret'\nexport default { s }\n",
            ),
        ]);
        let root = outer.path().join("agents");
        let err = bundle(&root, &root.join("a.ts")).unwrap_err();
        assert!(
            err.to_string()
                .contains("a.ts:1: import '../secret' leaves the agents directory"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_relative_import_is_named() {
        let d = dir(&[("a.ts", "import { s } from './nope'\nexport default { s }\n")]);
        let err = bundle(d.path(), &d.path().join("a.ts")).unwrap_err();
        assert!(
            err.to_string().contains("import './nope': no such file"),
            "{err}"
        );
    }

    /// The typed reasons (issue 35) print the words the text ones did.
    #[test]
    fn typed_load_errors_say_what_the_texts_said() {
        assert_eq!(
            ReadError::TooLarge(2_000_000).to_string(),
            "is 2000000 bytes, more than the 1048576 an agent file may hold"
        );
        assert_eq!(
            ReadError::NotStored.to_string(),
            "is not among the stored files"
        );
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        assert_eq!(ReadError::Io(io()).to_string(), "cannot be read: gone");
        assert_eq!(
            ImportError::Package("zod".into()).to_string(),
            "import 'zod': a package import cannot be resolved (only relative imports inside the agents directory are; type-only imports are dropped)"
        );
        assert_eq!(
            ImportError::Climbs("../x".into()).to_string(),
            "import '../x' leaves the agents directory"
        );
        let refused = |why| ImportError::Refused {
            spec: "./l".into(),
            why,
        };
        assert_eq!(
            refused(Refused::Outside).to_string(),
            "import './l' leaves the agents directory"
        );
        assert_eq!(
            refused(Refused::Unreadable(io())).to_string(),
            "import './l' gone"
        );
        assert_eq!(
            ImportError::NoFile("./nope".into()).to_string(),
            "import './nope': no such file in the agents directory"
        );
        // Through the loader: a stored config without the imported file.
        let files = BTreeMap::from([(
            "a.ts".to_owned(),
            "import { s } from './b'\nexport default { s }\n".to_owned(),
        )]);
        let err = bundle_from(Path::new("agents"), &files, "a.ts").unwrap_err();
        assert_eq!(
            err.to_string(),
            "agents/a.ts:1: import './b': no such file in the agents directory"
        );
    }
}
