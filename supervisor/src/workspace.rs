//! Where a tree's agents work (issue 36): a directory the workspace tools
//! resolve every path in and cannot leave, chosen per tree (the CLI's
//! working directory or `--workspace`, a start request's
//! `limits.workspace`), checked against the roots the config allows, and
//! opened once per tree by the opener the catalog was built with (the
//! tools crate's `Workspace`, which also keeps what each agent last read
//! there).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arbor_actors::tool::Workspace;
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// A tree's workspace as a request gives it and the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkspaceSpec {
    /// The directory (absolute; kept canonical once a tree starts).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub root: PathBuf,
    /// Whether the tree's agents may only read there.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// Opens a tree's workspace (the tools crate's `Workspace::open`), or says
/// why it cannot.
pub type WorkspaceOpener =
    Arc<dyn Fn(&WorkspaceSpec) -> Result<Arc<dyn Workspace>, String> + Send + Sync>;

/// A new tree's workspace, checked: an existing directory, given as an
/// absolute path, inside one of `roots` when there are any (a service's
/// `workspace_roots`); kept canonical, so the store holds where it really
/// is.
pub(crate) fn admit(spec: &WorkspaceSpec, roots: &[PathBuf]) -> Result<WorkspaceSpec, Error> {
    let invalid = |problem: String| Error::InvalidRequest {
        field: "limits.workspace.root".to_owned(),
        problem,
    };
    if !spec.root.is_absolute() {
        return Err(invalid(format!(
            "{} is not an absolute path",
            spec.root.display()
        )));
    }
    let root = std::fs::canonicalize(&spec.root)
        .map_err(|e| invalid(format!("{}: {e}", spec.root.display())))?;
    if !root.is_dir() {
        return Err(invalid(format!("{} is not a directory", root.display())));
    }
    if !roots.is_empty() && !roots.iter().any(|allowed| within(&root, allowed)) {
        return Err(invalid(format!(
            "{} is outside the workspace roots this service allows ({})",
            root.display(),
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(WorkspaceSpec {
        root,
        read_only: spec.read_only,
    })
}

/// Whether `path` (canonical) is `root` or below it (`root` canonicalised
/// here; a root that does not exist holds nothing).
fn within(path: &Path, root: &Path) -> bool {
    std::fs::canonicalize(root).is_ok_and(|root| path.starts_with(root))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(root: &Path) -> WorkspaceSpec {
        WorkspaceSpec {
            root: root.to_path_buf(),
            read_only: false,
        }
    }

    #[test]
    fn a_workspace_must_be_an_absolute_existing_directory_inside_the_roots() {
        let dir = tempfile::tempdir().expect("tempdir");
        let inside = dir.path().join("repo");
        std::fs::create_dir(&inside).expect("mkdir");
        let other = tempfile::tempdir().expect("tempdir");
        let roots = [dir.path().to_path_buf()];
        let admitted = admit(&spec(&inside), &roots).expect("inside a root");
        assert_eq!(
            admitted.root,
            std::fs::canonicalize(&inside).expect("canon")
        );
        // Anywhere, without roots (the CLI).
        assert!(admit(&spec(other.path()), &[]).is_ok());
        let problem = |s: WorkspaceSpec| match admit(&s, &roots) {
            Err(Error::InvalidRequest { field, problem }) => {
                assert_eq!(field, "limits.workspace.root");
                problem
            }
            other => panic!("{other:?}"),
        };
        assert!(problem(spec(other.path())).contains("outside the workspace roots"));
        assert!(problem(spec(Path::new("repo"))).contains("not an absolute path"));
        assert!(problem(spec(&dir.path().join("missing"))).contains("No such file"));
        let file = dir.path().join("f");
        std::fs::write(&file, "x").expect("write");
        assert!(problem(spec(&file)).contains("not a directory"));
        // A link inside the root that leads out is judged by where it leads.
        let link = dir.path().join("out");
        std::os::unix::fs::symlink(other.path(), &link).expect("symlink");
        assert!(problem(spec(&link)).contains("outside the workspace roots"));
    }
}
