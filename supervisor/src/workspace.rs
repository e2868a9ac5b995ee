//! Where a tree's agents work (issue 36): a directory the workspace tools
//! resolve every path in and cannot leave, chosen per tree (the CLI's
//! working directory or `--workspace`, a start request's
//! `limits.workspace`), checked against the roots the config allows, and
//! opened once per tree by the opener the catalog was built with (the
//! tools crate's `Workspace`, which also keeps what each agent last read
//! there).

use std::path::PathBuf;
use std::sync::Arc;

use arbor_actors::tool::Workspace;
use serde::{Deserialize, Serialize};

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
    Arc<dyn Fn(&WorkspaceSpec) -> std::io::Result<Arc<dyn Workspace>> + Send + Sync>;
