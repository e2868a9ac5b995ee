//! Finding the crate's programs on `PATH`: a command tool's, the
//! sandbox's `bwrap`, the hooks' `bash`, the worktrees' `git`.

use std::path::{Path, PathBuf};

/// The first executable file named `program` in the absolute directories
/// of `path` (a `PATH` value): the one lookup of the crate's programs (a
/// command tool's, the sandbox's `bwrap`, the hooks' `bash`).
pub(crate) fn find_on(path: &std::ffi::OsStr, program: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(program))
        .find(|file| {
            std::fs::metadata(file)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}
