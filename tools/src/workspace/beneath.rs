//! Opening a path beneath a directory handle, never out of it: with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` where the kernel has
//! it (Linux 5.6+), else by walking the path one component at a time.
//!
//! The walk holds each directory it passes as an opened handle and opens
//! the next component relative to it with `O_NOFOLLOW`, so no symbolic link
//! is ever followed by the kernel: a link is read (`readlinkat`) and its
//! target spliced into the components still to walk, an absolute target or
//! a `..` above the starting directory failing with `EXDEV`, as `openat2`
//! does. A link swapped in between the look and the open makes the open
//! fail (or, for an `O_PATH` open, yields the link itself, which the callers
//! refuse as not a regular file); it never leads out.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Component, Path};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// How many symbolic links one walk follows (as the kernel's 40).
const MAX_LINKS: usize = 40;

/// Set once `openat2` turned out to be missing (an old kernel, or a
/// seccomp filter that refuses it): every open walks from then on.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// Whether every open walks: `openat2` was found missing, or the
/// environment sets `ARBOR_NO_OPENAT2` (read once; the tests use it to run
/// the escape suite over the walk).
fn walk_only() -> bool {
    static FROM_ENV: OnceLock<bool> = OnceLock::new();
    NO_OPENAT2.load(Ordering::Relaxed)
        || *FROM_ENV.get_or_init(|| std::env::var_os("ARBOR_NO_OPENAT2").is_some())
}

/// Opens `rel` (relative; empty is `dir` itself) beneath `dir`.
pub(super) fn open(dir: &OwnedFd, rel: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    let path: &Path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if !walk_only() {
        use rustix::fs::ResolveFlags;
        let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        loop {
            match rustix::fs::openat2(dir, path, flags | OFlags::CLOEXEC, mode, resolve) {
                Err(Errno::INTR) | Err(Errno::AGAIN) => continue,
                Err(Errno::NOSYS) | Err(Errno::PERM) => {
                    // EPERM: a seccomp filter's answer for a call it does
                    // not know; a real EPERM comes back from the walk too.
                    tracing::warn!(
                        "openat2 is not available; workspace paths are resolved one component at a time"
                    );
                    NO_OPENAT2.store(true, Ordering::Relaxed);
                    break;
                }
                other => return other,
            }
        }
    }
    let _ = walk_only;
    walk(dir, path, flags, mode)
}

/// Opens `rel` beneath `dir` one component at a time (see the module docs).
pub(super) fn walk(dir: &OwnedFd, rel: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    let mut todo: VecDeque<OsString> = VecDeque::new();
    push_front(&mut todo, rel)?;
    // The directories passed, each opened from the one before it; the
    // last is where the next component is looked up.
    let mut passed: Vec<OwnedFd> = Vec::new();
    let mut links = 0;
    loop {
        let Some(name) = todo.pop_front() else {
            // Nothing left (the path was `.` or ended in `..`): the
            // directory reached, opened as asked.
            let here = passed.last().unwrap_or(dir);
            return rustix::fs::openat(here, ".", flags | OFlags::CLOEXEC, mode);
        };
        if name == ".." {
            if passed.pop().is_none() {
                return Err(Errno::XDEV);
            }
            continue;
        }
        let here = passed.last().unwrap_or(dir);
        let stat = rustix::fs::statat(here, &name, AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink {
            links += 1;
            if links > MAX_LINKS {
                return Err(Errno::LOOP);
            }
            let target = rustix::fs::readlinkat(here, &name, Vec::new())?;
            let target = OsString::from_vec(target.into_bytes());
            if Path::new(&target).is_absolute() {
                return Err(Errno::XDEV);
            }
            push_front(&mut todo, Path::new(&target))?;
            continue;
        }
        if todo.is_empty() {
            return rustix::fs::openat(
                here,
                &name,
                flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                mode,
            );
        }
        let next = rustix::fs::openat(
            here,
            &name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        passed.push(next);
    }
}

/// Puts `path`'s components in front of what is still to walk.
fn push_front(todo: &mut VecDeque<OsString>, path: &Path) -> Result<(), Errno> {
    let mut parts = Vec::new();
    for part in path.components() {
        match part {
            Component::Normal(p) => parts.push(p.to_os_string()),
            Component::ParentDir => parts.push(OsString::from("..")),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err(Errno::XDEV),
        }
    }
    for part in parts.into_iter().rev() {
        todo.push_front(part);
    }
    Ok(())
}
