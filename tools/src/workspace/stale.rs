//! Stale writes: what each agent last read or wrote of each file of a
//! workspace, so that a write based on content that has changed since (a
//! sibling's edit, a command's output) is refused with a conflict the model
//! reads, instead of silently undoing the other change.
//!
//! The rules, like Claude Code's:
//! - a write over an existing file needs the agent to have read it (or
//!   written it) and the file to be unchanged since;
//! - an edit of a file the agent read needs the file unchanged since that
//!   read; an edit of a file it never read is judged by its exact matches
//!   alone (the old text must still be there).
//!
//! What is kept is a hash of the whole file (and its length) per agent run
//! and path, in memory: after a restart an agent reads again before it
//! overwrites. Each check and the write after it happen under one lock of
//! the workspace, so two agents of one process cannot interleave them.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use arbor_actors::sync::LockExt as _;

use super::confine::Refusal;

/// A file's content as the stale-write check compares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    len: usize,
    hash: u64,
}

impl Seen {
    /// The fingerprint of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        let mut hasher = std::hash::DefaultHasher::new();
        bytes.hash(&mut hasher);
        Seen {
            len: bytes.len(),
            hash: hasher.finish(),
        }
    }
}

/// What each agent run last saw of each file, and the lock writes take.
#[derive(Debug, Default)]
pub struct Reads {
    seen: Mutex<HashMap<(String, PathBuf), Seen>>,
    writing: Mutex<()>,
}

impl Reads {
    /// Notes that `agent` read (or wrote) `rel` as `bytes`.
    pub fn saw(&self, agent: &str, rel: &Path, bytes: &[u8]) {
        self.seen
            .locked()
            .insert((agent.to_owned(), rel.to_path_buf()), Seen::of(bytes));
    }

    /// What `agent` last saw of `rel`.
    pub fn last(&self, agent: &str, rel: &Path) -> Option<Seen> {
        self.seen
            .locked()
            .get(&(agent.to_owned(), rel.to_path_buf()))
            .copied()
    }

    /// The lock held from a write's check to its rename.
    pub fn writing(&self) -> MutexGuard<'_, ()> {
        self.writing.locked()
    }

    /// Whether `agent` may change `rel`, whose content is now `current`
    /// (`None`: no file): `whole` for a write that replaces it all (which
    /// needs a read first), not for an edit.
    pub fn check(
        &self,
        agent: &str,
        rel: &Path,
        shown: &str,
        current: Option<&[u8]>,
        whole: bool,
    ) -> Result<(), Refusal> {
        let Some(current) = current else {
            return Ok(());
        };
        match self.last(agent, rel) {
            None if whole => Err(Refusal(format!(
                "{shown}: refused, the file exists and you have not read it: read it first, then write it (or edit it)"
            ))),
            None => Ok(()),
            Some(seen) if seen == Seen::of(current) => Ok(()),
            Some(_) => Err(Refusal(format!(
                "{shown}: conflict, the file changed since you last read it (another agent or a command changed it); read it again and redo your change on what it holds now"
            ))),
        }
    }
}
