//! A worktree per parallel writer (issue 36): a template with
//! `isolation = "worktree"` runs in a git worktree of its own, on a new
//! branch from its parent's workspace, so that siblings editing the same
//! repository never write over each other. The tools crate makes the
//! worktree (when the agent first uses its workspace, never in a handler)
//! and seals it when the run completes: what the agent left uncommitted is
//! committed on its branch, and the [`WorktreeReport`] (branch, commits, a
//! diff summary) goes into the run's state and its parent's spawn result.
//! A worktree with no changes is removed with its branch; one with changes
//! is kept for the parent (or a person) to merge. Sealing is journaled
//! (`worktreeSealed`): a resumed run takes the recorded report instead of
//! touching the repository again; a replay, which runs the tools again,
//! seals again.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where a template's agents work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// In their parent's workspace (the tree's, for a root).
    #[default]
    Shared,
    /// In a git worktree of their own, on a new branch from their parent's
    /// workspace.
    Worktree,
}

/// What a sealed worktree holds: its parent merges `branch`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeReport {
    /// The branch the agent's work is on.
    pub branch: String,
    /// The commit the branch started from.
    pub base: String,
    /// The worktree's directory while it is kept (it has changes); `None`
    /// once it was removed (it had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// The branch's commits after `base`, oldest first.
    #[serde(default)]
    pub commits: Vec<WorktreeCommit>,
    /// The files the branch changes against `base`.
    #[serde(default)]
    pub files: Vec<FileChange>,
    /// One line: `3 files changed, 10 insertions(+), 2 deletions(-)`, or
    /// `no changes`.
    pub summary: String,
    /// Why sealing failed, if it did (the worktree is then kept as it was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One commit of a worktree's branch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorktreeCommit {
    /// Its hash.
    pub sha: String,
    /// Its subject line.
    pub subject: String,
}

/// One file a worktree's branch changes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    /// Its path in the repository.
    pub path: String,
    /// Lines added (`None` for a binary file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added: Option<u64>,
    /// Lines removed (`None` for a binary file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<u64>,
}

impl WorktreeReport {
    /// Whether the branch has work to merge.
    pub fn has_changes(&self) -> bool {
        !self.commits.is_empty()
    }
}
