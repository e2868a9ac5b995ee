//! The workspace and its confinement: every path an agent gives is resolved
//! against the workspace's directory handle, at the moment of use, so that
//! nothing it names leaves the workspace (see the module docs of
//! [`crate::workspace`] for the rules and why `openat2`).

use std::ffi::OsStr;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use super::stale::Reads;

/// `statfs` magic numbers of pseudo file systems no path may reach: procfs
/// (`/proc`, whose magic links lead anywhere) and sysfs.
const PROC_SUPER_MAGIC: u64 = 0x9fa0;
const SYSFS_MAGIC: u64 = 0x6265_6572;

/// What agents may do in a workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Read and change files, run commands.
    #[default]
    ReadWrite,
    /// Read files only: write, edit and the shell are refused.
    ReadOnly,
}

/// The directory a tree's agents work in (see the module docs): its
/// canonical path, a handle on it every path is resolved against, its
/// access, what each agent last read there, and the shell's environment.
pub struct Workspace {
    root: PathBuf,
    /// The path as it was given, before it was made canonical, so that an
    /// absolute path under either is understood.
    given: PathBuf,
    dir: OwnedFd,
    /// The device the workspace's directory is on: a walked file on
    /// another is checked for /proc and /sys ([`Workspace::open_walked`]).
    dev: u64,
    access: Access,
    pub(super) reads: Reads,
    pub(super) env: Vec<String>,
    /// The sandbox the shell runs in, if the config asks for one.
    pub(crate) sandbox: Option<crate::sandbox::Sandbox>,
}

impl fmt::Debug for Workspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workspace")
            .field("root", &self.root)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl arbor_actors::tool::Workspace for Workspace {
    fn root(&self) -> &Path {
        &self.root
    }

    fn read_only(&self) -> bool {
        self.access == Access::ReadOnly
    }

    fn isolate(
        self: Arc<Self>,
        run: &arbor_actors::id::RunId,
        agent_type: &str,
    ) -> Option<Arc<dyn arbor_actors::tool::Workspace>> {
        Some(super::worktree::isolate(self, run, agent_type))
    }
}

/// The directory of the workspace agents may not write: Claude Code's hooks
/// and settings, which run outside any sandbox.
pub const PROTECTED: &str = ".claude";

/// The variables the shell tool passes from Arbor's environment by default
/// (besides `PATH`): who and where the user is, the locale, the terminal and
/// the temporary directory. Anything else (tokens, keys) must be listed.
pub const DEFAULT_SHELL_ENV: &[&str] = &[
    "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "TMPDIR",
];

impl Workspace {
    /// Opens the directory `root` (made canonical) as a workspace.
    pub fn open(root: impl AsRef<Path>, access: Access) -> io::Result<Self> {
        let given = root.as_ref().to_path_buf();
        let root = std::fs::canonicalize(&given)?;
        let dir = rustix::fs::open(
            &root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        #[allow(clippy::useless_conversion)] // st_dev's type differs by target
        let dev = u64::from(rustix::fs::fstat(&dir)?.st_dev);
        Ok(Workspace {
            root,
            given,
            dir,
            dev,
            access,
            reads: Reads::default(),
            env: DEFAULT_SHELL_ENV.iter().map(|v| (*v).to_owned()).collect(),
            sandbox: None,
        })
    }

    /// The same workspace whose shell runs in `sandbox` (then a read-only
    /// workspace's shell runs too, with the workspace read-only in it).
    pub fn with_sandbox(mut self, sandbox: Option<crate::sandbox::Sandbox>) -> Self {
        self.sandbox = sandbox;
        self
    }

    /// The same workspace whose shell passes exactly `names` (besides
    /// `PATH`) from Arbor's environment.
    pub fn with_shell_env(mut self, names: Vec<String>) -> Self {
        self.env = names;
        self
    }

    /// Into the handle a [`ToolContext`](arbor_actors::ToolContext) carries.
    pub fn into_handle(self) -> Arc<dyn arbor_actors::tool::Workspace> {
        Arc::new(self)
    }

    /// The workspace's directory (canonical).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// What agents may do here.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Refuses a change when the workspace is read-only.
    pub(super) fn writable(&self, what: &str) -> Result<(), Refusal> {
        match self.access {
            Access::ReadWrite => Ok(()),
            Access::ReadOnly => Err(Refusal(format!(
                "{what}: the workspace {} is read-only for this agent",
                self.root.display()
            ))),
        }
    }

    /// `given` as a path relative to the workspace, checked lexically: an
    /// absolute path must lie under the workspace, and no `..` may climb out
    /// of it. Symbolic links are judged later, when the path is opened.
    pub fn relative(&self, given: &str) -> Result<PathBuf, Refusal> {
        if given.contains('\0') {
            return Err(Refusal(format!("{given:?}: a path cannot contain NUL")));
        }
        let path = Path::new(given);
        let rest = if path.is_absolute() {
            let Some(rest) = [&self.root, &self.given]
                .iter()
                .find_map(|r| path.strip_prefix(r).ok())
            else {
                return Err(self.outside(given));
            };
            rest
        } else {
            path
        };
        let mut out = PathBuf::new();
        for part in rest.components() {
            match part {
                Component::Normal(p) => out.push(p),
                Component::CurDir => {}
                Component::ParentDir => {
                    if !out.pop() {
                        return Err(self.outside(given));
                    }
                }
                Component::RootDir | Component::Prefix(_) => return Err(self.outside(given)),
            }
        }
        Ok(out)
    }

    /// A relative path as the model should see it: as is, or absolute under
    /// the workspace (Claude Code's tools speak absolute paths).
    pub fn show(&self, rel: &Path, absolute: bool) -> String {
        if absolute && rel.as_os_str().is_empty() {
            self.root.display().to_string()
        } else if absolute {
            self.root.join(rel).display().to_string()
        } else if rel.as_os_str().is_empty() {
            ".".to_owned()
        } else {
            rel.display().to_string()
        }
    }

    fn outside(&self, given: &str) -> Refusal {
        Refusal(format!(
            "{given}: refused, the path is outside the workspace {}; every path must stay inside it",
            self.root.display()
        ))
    }

    /// Opens `rel` beneath the workspace's handle, symbolic links resolved
    /// but never out of it (see [`super::beneath`]).
    fn open_beneath(&self, rel: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        super::beneath::open(&self.dir, rel, flags, mode)
    }

    /// The error for a failed resolution of `rel` (given as `given`).
    fn failed(&self, given: &str, errno: Errno) -> Refusal {
        let why = match errno {
            Errno::XDEV => {
                return Refusal(format!(
                    "{given}: refused, the path or a symbolic link on it leads outside the workspace {}",
                    self.root.display()
                ));
            }
            Errno::LOOP => "refused, too many symbolic links or a /proc magic link",
            Errno::NOENT => "no such file or directory",
            Errno::NOTDIR => "a component of the path is not a directory",
            Errno::ISDIR => "is a directory",
            Errno::ACCESS | Errno::PERM => "permission denied",
            other => return Refusal(format!("{given}: {}", io::Error::from(other))),
        };
        Refusal(format!("{given}: {why}"))
    }

    /// Refuses what lies on /proc or /sys (when the workspace contains them).
    fn not_pseudo(&self, given: &str, fd: &OwnedFd) -> Result<(), Refusal> {
        let fs = rustix::fs::fstatfs(fd).map_err(|e| self.failed(given, e))?;
        #[allow(clippy::unnecessary_cast)] // f_type's type differs by target
        let kind = fs.f_type as u64;
        if kind == PROC_SUPER_MAGIC || kind == SYSFS_MAGIC {
            return Err(Refusal(format!(
                "{given}: refused, /proc and /sys are not part of any workspace"
            )));
        }
        Ok(())
    }

    /// Opens the regular file `given` for reading: its relative path, the
    /// file and its status. Refused: a path out of the workspace, anything
    /// but a regular file (directories, fifos, sockets, devices), a file
    /// with several hard links (one may be outside), /proc.
    pub fn open_read(&self, given: &str) -> Result<(PathBuf, File, Stat), Refusal> {
        let rel = self.relative(given)?;
        // Looked at first through an O_PATH handle, which opens nothing:
        // a fifo would block an open, a device could act on one.
        let probe = self
            .open_beneath(&rel, OFlags::PATH, Mode::empty())
            .map_err(|e| self.failed(given, e))?;
        let stat = rustix::fs::fstat(&probe).map_err(|e| self.failed(given, e))?;
        self.regular(given, &stat)?;
        self.not_pseudo(given, &probe)?;
        let fd = self
            .open_beneath(
                &rel,
                OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
                Mode::empty(),
            )
            .map_err(|e| self.failed(given, e))?;
        let opened = rustix::fs::fstat(&fd).map_err(|e| self.failed(given, e))?;
        // Replaced between the two opens: judged again.
        self.regular(given, &opened)?;
        Ok((rel, File::from(fd), opened))
    }

    /// Opens for reading a file the workspace's own walk listed as a
    /// regular file (`rel`, relative, as the walk gave it): one resolution
    /// beneath the workspace and one status, where [`open_read`]'s look
    /// before it opens takes five system calls; a search opens thousands.
    /// The same refusals: the file is judged on the status of what was
    /// opened, and checked for /proc and /sys when it is on another device
    /// than the workspace. Opening without the look first is safe here:
    /// the walk saw a regular file (a fifo put in its place does not block
    /// a non-blocking open; a device needs root to make).
    ///
    /// [`open_read`]: Self::open_read
    pub(super) fn open_walked(&self, rel: &Path) -> Result<(File, Stat), Refusal> {
        let given = rel.to_string_lossy();
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            let (_, file, stat) = self.open_read(&given)?;
            return Ok((file, stat));
        }
        let fd = self
            .open_beneath(
                rel,
                OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
                Mode::empty(),
            )
            .map_err(|e| self.failed(&given, e))?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| self.failed(&given, e))?;
        self.regular(&given, &stat)?;
        #[allow(clippy::useless_conversion)] // st_dev's type differs by target
        if u64::from(stat.st_dev) != self.dev {
            self.not_pseudo(&given, &fd)?;
        }
        Ok((File::from(fd), stat))
    }

    /// Refuses what is not a regular file of one link.
    fn regular(&self, given: &str, stat: &Stat) -> Result<(), Refusal> {
        let kind = match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => {
                if stat.st_nlink > 1 {
                    return Err(Refusal(format!(
                        "{given}: refused, the file has {} hard links and one may be outside the workspace",
                        stat.st_nlink
                    )));
                }
                return Ok(());
            }
            FileType::Directory => "is a directory",
            FileType::Fifo => "refused, it is a fifo",
            FileType::Socket => "refused, it is a socket",
            FileType::CharacterDevice | FileType::BlockDevice => "refused, it is a device file",
            FileType::Symlink => "refused, it is a symbolic link",
            FileType::Unknown => "refused, it is not a regular file",
        };
        Err(Refusal(format!("{given}: {kind}")))
    }

    /// Opens the directory `given` (empty: the workspace itself) for listing.
    pub fn open_dir(&self, given: &str) -> Result<(PathBuf, OwnedFd), Refusal> {
        let rel = self.relative(given)?;
        let fd = self
            .open_beneath(&rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .map_err(|e| match e {
                Errno::NOTDIR => Refusal(format!("{given}: not a directory")),
                e => self.failed(given, e),
            })?;
        self.not_pseudo(given, &fd)?;
        Ok((rel, fd))
    }

    /// The file `given` to be written: its relative path, its directory
    /// (opened beneath the workspace; created, with its missing parents,
    /// when `create`) and its name in it. What is there now is judged by
    /// [`Target::current`].
    pub fn target(&self, given: &str, create: bool) -> Result<Target, Refusal> {
        let rel = self.relative(given)?;
        // The hooks and settings there run outside any sandbox, with
        // Arbor's environment: an agent that could rewrite them could run
        // anything (`.claude/hooks/*.py` is how Claude Code's docs write them).
        if rel
            .components()
            .next()
            .is_some_and(|c| c.as_os_str() == PROTECTED)
        {
            return Err(Refusal(format!(
                "{given}: the workspace's {PROTECTED}/ (its hooks and settings) is not written by agents"
            )));
        }
        let Some(name) = rel.file_name().map(OsStr::to_os_string) else {
            return Err(Refusal(format!("{given}: names no file")));
        };
        let parent = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        let flags = OFlags::PATH | OFlags::DIRECTORY;
        let dir = match self.open_beneath(&parent, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) if create => self.make_dirs(given, &parent)?,
            Err(e) => return Err(self.failed(given, e)),
        };
        self.not_pseudo(given, &dir)?;
        Ok(Target { rel, dir, name })
    }

    /// Creates the missing directories of `parent`, each one made inside the
    /// one before it as opened beneath the workspace.
    fn make_dirs(&self, given: &str, parent: &Path) -> Result<OwnedFd, Refusal> {
        let flags = OFlags::PATH | OFlags::DIRECTORY;
        let mut prefix = PathBuf::new();
        let mut dir = self
            .open_beneath(&prefix, flags, Mode::empty())
            .map_err(|e| self.failed(given, e))?;
        for part in parent.components() {
            prefix.push(part);
            dir = match self.open_beneath(&prefix, flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => {
                    match rustix::fs::mkdirat(&dir, part.as_os_str(), Mode::from_raw_mode(0o777)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(self.failed(given, e)),
                    }
                    self.open_beneath(&prefix, flags, Mode::empty())
                        .map_err(|e| self.failed(given, e))?
                }
                Err(e) => return Err(self.failed(given, e)),
            };
        }
        Ok(dir)
    }
}

/// A file about to be written: its directory, opened beneath the workspace,
/// and its name there; every operation is relative to that directory and
/// follows no symbolic link.
pub struct Target {
    /// The path relative to the workspace.
    pub rel: PathBuf,
    dir: OwnedFd,
    name: std::ffi::OsString,
}

impl Target {
    /// What is there now: `None` for no file, else its bytes. Refused: a
    /// symbolic link, a directory, a fifo, a device, a file of several links.
    pub fn current(&self, ws: &Workspace, given: &str) -> Result<Option<Vec<u8>>, Refusal> {
        let stat = match rustix::fs::statat(&self.dir, &self.name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(ws.failed(given, e)),
        };
        ws.regular(given, &stat)?;
        let fd = rustix::fs::openat(
            &self.dir,
            &self.name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ws.failed(given, e))?;
        let opened = rustix::fs::fstat(&fd).map_err(|e| ws.failed(given, e))?;
        ws.regular(given, &opened)?;
        // Never held whole past what a write or an edit takes.
        let size = u64::try_from(opened.st_size).unwrap_or(u64::MAX);
        if size > super::files::MAX_FILE_BYTES {
            return Err(Refusal(format!(
                "{given}: the file is {size} bytes, more than a write or an edit takes ({})",
                super::files::MAX_FILE_BYTES
            )));
        }
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut File::from(fd), &mut bytes)
            .map_err(|e| Refusal(format!("{given}: {e}")))?;
        Ok(Some(bytes))
    }

    /// Replaces the file with `bytes`: written to a new file beside it,
    /// then renamed over it (so no reader sees half of it), keeping the old
    /// file's permissions (new files: 0644 less the umask).
    pub fn replace(&self, given: &str, bytes: &[u8]) -> Result<(), Refusal> {
        let fail = |e: &dyn fmt::Display| Refusal(format!("{given}: could not write: {e}"));
        let mode = match rustix::fs::statat(&self.dir, &self.name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Mode::from_raw_mode(stat.st_mode & 0o7777),
            Err(_) => Mode::from_raw_mode(0o644),
        };
        // A name of its own (process, counter), made new or refused: two
        // writers never share it, and nothing planted at it is truncated.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut attempt = 0;
        let (temp, fd) = loop {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut temp = std::ffi::OsString::from(".");
            temp.push(&self.name);
            temp.push(format!(".arbor-{}-{n}.tmp", std::process::id()));
            match rustix::fs::openat(
                &self.dir,
                &temp,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                mode,
            ) {
                Ok(fd) => break (temp, fd),
                Err(Errno::EXIST) if attempt < 16 => attempt += 1,
                Err(e) => return Err(fail(&e)),
            }
        };
        let _ = rustix::fs::fchmod(&fd, mode);
        let written = io::Write::write_all(&mut File::from(fd), bytes);
        let renamed = written.map_err(|e| fail(&e)).and_then(|()| {
            rustix::fs::renameat(&self.dir, &temp, &self.dir, &self.name).map_err(|e| fail(&e))
        });
        if renamed.is_err() {
            let _ = rustix::fs::unlinkat(&self.dir, &temp, AtFlags::empty());
        }
        renamed
    }
}

/// Why a path or an operation was refused: what the model reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal(pub String);

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Refusal> for arbor_actors::ToolError {
    fn from(r: Refusal) -> Self {
        arbor_actors::ToolError::new(r.0)
    }
}
