//! The built-in workspace tools: reading, writing and editing files, listing,
//! glob and grep, a shell, a todo list and a think tool, offered under three
//! families of names and input schemas, so that prompts written for either
//! work unchanged:
//!
//! | what | Arbor | Codebuff | Claude Code |
//! |---|---|---|---|
//! | read files (line ranges, numbered) | `workspace/read` | `read_files` | `Read` |
//! | write a file | `workspace/write` | `write_file` | `Write` |
//! | exact-text edits (one or several) | `workspace/edit` | `str_replace` | `Edit`, `MultiEdit` |
//! | list a directory | `workspace/list` | (none) | `LS` |
//! | find files by glob | `workspace/glob` | `find_files` (a path search) | `Glob` |
//! | search contents | `workspace/grep` | `code_search` | `Grep` |
//! | run a command | `workspace/shell` | `run_terminal_command` | `Bash` |
//! | todo list | `workspace/todos` | `write_todos` | `TodoWrite` |
//! | think | `workspace/think` | `think_deeply` | (none) |
//!
//! Each tool works in the calling agent's [`Workspace`], which the runtime
//! hands it in [`ToolContext::workspace`](arbor_actors::ToolContext); a tool
//! called without one answers with an error saying so.
//!
//! # Confinement
//!
//! Every path an agent gives is resolved against the workspace when it is
//! used, never ahead of time: relative paths from the workspace, absolute
//! ones only when they lie under it. Refused, with an error the model
//! reads: `..` climbing out; absolute paths elsewhere; a symbolic link, or
//! a symbolic link on the way (a parent directory), that leads out,
//! whenever it was made; `/proc` and `/sys` (also when the workspace
//! contains them) and `/proc`'s magic links; anything but a regular file
//! or a directory where one is opened (fifos, sockets, device files; they
//! are looked at through an `O_PATH` handle, which opens nothing); a file
//! of several hard links (one may be outside, and a hard link cannot be
//! told from the original); writing through a symbolic link.
//!
//! **Why `openat2`.** The workspace keeps a handle on its directory, and
//! every open is `openat2(handle, path, RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)` (Linux 5.6+, through `rustix`): the kernel
//! resolves each component, symbolic links included, and fails with `EXDEV`
//! the moment resolution would leave the directory, all in the one system
//! call. There is no window between a check and the open that a link
//! swapped in by another process could use, as there is for checking a
//! canonicalised path and then opening it. Re-checking after the open by
//! reading `/proc/self/fd/N` is no answer here, since `/proc` is refused
//! and may not be mounted. A write opens the file's directory beneath the
//! handle, then works inside it by name without following links
//! (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`, `renameat`), and missing
//! directories are made one by one, each inside the one before as opened
//! beneath the handle. Without `openat2` (a kernel older than 5.6, a
//! seccomp filter that refuses it) each path is walked one component at a
//! time from the handle, each directory opened with `O_NOFOLLOW` and each
//! link read and resolved by Arbor, not the kernel (`beneath.rs`): just as
//! race-free, only slower. The module uses Linux's `O_PATH`, so for now it
//! builds on Linux only.
//!
//! Listing, glob and grep walk the tree with ripgrep's walker by path (see
//! [`search`]); they never follow symbolic links, and grep opens each file
//! again through the handle, so a race can at worst show a name, never
//! content, from outside.
//!
//! The shell is not confined by this: a command can reach whatever the user
//! can. It starts in the workspace (or a directory of it), with an
//! allow-listed environment, and a read-only workspace refuses it until the
//! sandbox (a later step) can enforce read-only.
//!
//! # Stale writes
//!
//! See [`stale`]: a write over a file the agent never read, or a write or
//! edit of a file that changed since the agent read it, is refused with a
//! conflict the model reads.

mod arbor;
mod beneath;
mod claude;
mod codebuff;
mod confine;
pub mod files;
pub mod notes;
pub mod search;
pub mod shell;
pub mod stale;
mod tool;
pub mod worktree;

use std::sync::Arc;

use arbor_actors::Tool;

pub use confine::{Access, DEFAULT_SHELL_ENV, Refusal, Target, Workspace};
pub use tool::{Family, Op, WorkspaceTool, workspace_of};

/// The prefix of Arbor's own names, and of the template entries that name
/// workspace tools in a family-neutral way (`workspace/*`, `workspace/read`).
pub const PREFIX: &str = "workspace/";

/// The tools of one family.
pub fn tools(family: Family) -> Vec<Arc<WorkspaceTool>> {
    let list = match family {
        Family::Arbor => arbor::tools(),
        Family::Codebuff => codebuff::tools(),
        Family::Claude => claude::tools(),
    };
    list.into_iter().map(Arc::new).collect()
}

/// Every family's tools, Arbor's first.
pub fn all_tools() -> Vec<Arc<dyn Tool>> {
    Family::ALL
        .iter()
        .flat_map(|f| tools(*f))
        .map(|t| t as Arc<dyn Tool>)
        .collect()
}

/// The names of one family's tools, in the order of the table above.
pub fn names(family: Family) -> Vec<&'static str> {
    tools(family).iter().map(|t| t.name).collect()
}

/// What a template entry naming workspace tools Arbor's way (`workspace/*`,
/// `workspace/edit`, any pattern over `workspace/NAME`) names in `family`:
/// Arbor's own names as they are; Codebuff's and Claude Code's tools that do
/// what the matched Arbor tools do (`workspace/edit` is `Edit` and
/// `MultiEdit` for Claude Code; a tool the family lacks, such as Claude
/// Code's think, is left out). `None`: not such an entry.
pub fn expand(entry: &str, family: Family) -> Option<Vec<String>> {
    if !entry.starts_with(PREFIX) {
        return None;
    }
    let ops: Vec<Op> = arbor::tools()
        .iter()
        .filter(|t| arbor_supervisor::pattern_matches(entry, t.name))
        .map(|t| t.op)
        .collect();
    if family == Family::Arbor {
        return Some(
            arbor::tools()
                .iter()
                .filter(|t| ops.contains(&t.op))
                .map(|t| t.name.to_owned())
                .collect(),
        );
    }
    let same = |arbor_op: Op, op: Op| {
        arbor_op == op
            || (arbor_op == Op::Edit && op == Op::MultiEdit)
            || (arbor_op == Op::Glob && op == Op::FindFiles)
    };
    Some(
        tools(family)
            .iter()
            .filter(|t| ops.iter().any(|o| same(*o, t.op)))
            .map(|t| t.name.to_owned())
            .collect(),
    )
}

#[cfg(test)]
mod tests;
