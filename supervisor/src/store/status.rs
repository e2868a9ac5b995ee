//! A tree's status, as stored, listed and filtered on.

use std::fmt;
use std::str::FromStr;

use arbor_actors::AgentStatus;
use serde::{Deserialize, Serialize};

/// Where a tree is: `running` (its process is alive), `interrupted` (stored as
/// running, its process gone: `arbor resume` or a restarted server goes on
/// with it), or its root's final status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum TreeStatus {
    /// Its process runs it (alive, or its heartbeat is fresh).
    Running,
    /// Stored as running, but its process is gone: it can be resumed.
    Interrupted,
    /// Its root completed.
    Completed,
    /// Its root failed.
    Failed,
    /// Its root was cancelled.
    Cancelled,
}

impl TreeStatus {
    pub(crate) const ALL: [TreeStatus; 5] = [
        TreeStatus::Running,
        TreeStatus::Interrupted,
        TreeStatus::Completed,
        TreeStatus::Failed,
        TreeStatus::Cancelled,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TreeStatus::Running => "running",
            TreeStatus::Interrupted => "interrupted",
            TreeStatus::Completed => "completed",
            TreeStatus::Failed => "failed",
            TreeStatus::Cancelled => "cancelled",
        }
    }

    /// Whether the tree ended (it is not running and not interrupted).
    pub fn is_final(self) -> bool {
        !matches!(self, TreeStatus::Running | TreeStatus::Interrupted)
    }

    /// The status a store keeps: an interrupted tree is stored as running
    /// (which of the two it is is judged from its owner's liveness).
    pub(crate) fn stored(self) -> TreeStatus {
        match self {
            TreeStatus::Interrupted => TreeStatus::Running,
            other => other,
        }
    }
}

/// A tree's status once its root has this status.
impl From<AgentStatus> for TreeStatus {
    fn from(status: AgentStatus) -> Self {
        match status {
            AgentStatus::Running => TreeStatus::Running,
            AgentStatus::Completed => TreeStatus::Completed,
            AgentStatus::Failed => TreeStatus::Failed,
            AgentStatus::Cancelled => TreeStatus::Cancelled,
        }
    }
}

impl fmt::Display for TreeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Text that names no tree status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not one of running, interrupted, completed, failed, cancelled")]
pub struct UnknownStatus(pub String);

impl FromStr for TreeStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, UnknownStatus> {
        TreeStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_reads_back_from_its_name_and_its_json() {
        for status in TreeStatus::ALL {
            assert_eq!(status.as_str().parse::<TreeStatus>(), Ok(status));
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{status}\""));
        }
        let err = "done".parse::<TreeStatus>().unwrap_err();
        assert!(err.to_string().contains("running, interrupted"), "{err}");
    }

    #[test]
    fn an_interrupted_tree_is_stored_as_running_and_is_not_final() {
        assert_eq!(TreeStatus::Interrupted.stored(), TreeStatus::Running);
        assert_eq!(TreeStatus::Failed.stored(), TreeStatus::Failed);
        assert!(!TreeStatus::Interrupted.is_final());
        assert!(TreeStatus::Cancelled.is_final());
        assert_eq!(
            TreeStatus::from(AgentStatus::Completed),
            TreeStatus::Completed
        );
    }
}
