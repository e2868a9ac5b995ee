//! Tool processes die with Arbor, even when Arbor is killed with SIGKILL.
//!
//! On Linux every tool process (a command tool's program, an MCP server over
//! stdio) is started under a *keeper*: the process `spawn` forks becomes a
//! small supervisor (named `arbor-keeper`) that forks the program and stays
//! its parent. The keeper
//!
//! - is a child subreaper (`PR_SET_CHILD_SUBREAPER`): whatever the program
//!   leaves behind, even a grandchild that double-forked with `setsid`, is
//!   re-parented to the keeper when its own parent ends, not to init;
//! - puts the program in a process group of its own and sets its parent-death
//!   signal (`PR_SET_PDEATHSIG`, SIGKILL), so it dies if the keeper does;
//! - watches a *lifeline*: a pipe whose only write end Arbor holds. When
//!   Arbor ends for any reason (a normal exit, a panic, SIGKILL, the OOM
//!   killer) the kernel closes it and the keeper wakes;
//! - ends everything: when the program exits (whatever it left running is
//!   killed, as a command tool's docs promise), when Arbor asks (SIGTERM: a
//!   timeout, a cancelled call, shutdown) or when the lifeline breaks, it
//!   kills the program's group and then every process re-parented to it,
//!   round after round, until it has no child left; then it exits with the
//!   program's status (so Arbor sees the program's exit code or signal).
//!
//! A [`CallLock`] is held by the keeper until that sweep is done, so an
//! `arbor resume` of the same call waits while an earlier attempt may still
//! run, and never starts a second copy of a side-effecting tool beside it.
//!
//! The keeper runs between `fork` and `exec` of a multi-threaded process, so
//! its code makes system calls only: no allocation, no locks.
//!
//! Elsewhere (not Linux) tools run as before: in a process group that Arbor
//! kills (SIGKILL) on every way out it sees, which a SIGKILL of Arbor is not.
//!
//! The workspace denies unsafe code: each function here that makes system
//! calls allows it, with a SAFETY comment on each block.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often a call waiting for an earlier attempt looks again.
const LOCK_POLL: Duration = Duration::from_millis(50);

/// Makes `command` start its program under a keeper (see the module docs);
/// `lock`, if any, is held by the keeper until every process of the call has
/// ended. False when no keeper is used (not Linux, or the lifeline pipe could
/// not be made): the caller then kills the process group itself.
pub fn install(command: &mut tokio::process::Command, lock: Option<&CallLock>) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd as _;
        imp::install(command, lock.map(|l| l.file.as_raw_fd()))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (command, lock);
        false
    }
}

/// The lock of one tool call (its tree, agent run, call id and tool), shared
/// by every Arbor process on this machine through a lock file (`flock`), so
/// a resumed call waits while an earlier attempt of it (the keeper of a
/// killed Arbor, still sweeping) lives.
#[derive(Debug)]
pub struct CallLock {
    file: File,
    path: PathBuf,
}

/// Why a call could not take its lock.
#[derive(Debug)]
pub struct StillRunning {
    /// The keeper of the earlier attempt, when it wrote its pid.
    pub pid: Option<u32>,
}

impl CallLock {
    /// Takes the lock of the call `key` (any strings that name it uniquely),
    /// waiting up to `wait` while an earlier attempt holds it. `Ok(None)`:
    /// no lock could be made here (no writable directory): the call runs
    /// unguarded. `Err`: the earlier attempt still runs after `wait`.
    /// `what` names the call in the warning logged while it waits.
    pub async fn take(
        key: &[&str],
        what: &str,
        wait: Duration,
    ) -> Result<Option<CallLock>, StillRunning> {
        let Some(dir) = lock_dir() else {
            return Ok(None);
        };
        let path = dir.join(format!("{:016x}.lock", fnv(key)));
        let deadline = tokio::time::Instant::now() + wait;
        let mut warned = false;
        let holder = |path: &Path| -> Option<u32> {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|t| t.trim().parse().ok())
        };
        loop {
            match try_lock(&path) {
                Err(e) => {
                    tracing::debug!("no call lock at {}: {e}", path.display());
                    return Ok(None);
                }
                Ok(Some(file)) => {
                    #[cfg(target_os = "linux")]
                    let Some(file) = imp::above_stdio(file.into()).map(File::from) else {
                        return Ok(None);
                    };
                    return Ok(Some(CallLock { file, path }));
                }
                Ok(None) if tokio::time::Instant::now() >= deadline => {
                    return Err(StillRunning { pid: holder(&path) });
                }
                Ok(None) => {
                    if !warned {
                        warned = true;
                        let pid = holder(&path)
                            .map(|p| format!(" (its keeper is pid {p})"))
                            .unwrap_or_default();
                        tracing::warn!(
                            "{what}: an earlier attempt of this call{pid} is still running; \
                             waiting up to {wait:?} for it to end before starting it again"
                        );
                    }
                    tokio::time::sleep(LOCK_POLL).await;
                }
            }
        }
    }

    /// Writes the keeper's pid into the lock file (for the message of a
    /// call that finds it held).
    pub fn note_pid(&self, pid: u32) {
        use std::io::Write as _;
        let _ = self.file.set_len(0);
        let _ = (&self.file).write_all(pid.to_string().as_bytes());
    }

    /// The call's processes have all ended: removes the lock file (while
    /// holding the lock, so no one can hold a lock on the removed file).
    pub fn release(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Opens the lock file at `path` and tries to lock it. `Ok(None)`: held by
/// another open file (an earlier attempt). A lock on a file that was removed
/// meanwhile is dropped and tried again on the new one.
#[allow(unsafe_code)]
fn try_lock(path: &Path) -> std::io::Result<Option<File>> {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::MetadataExt as _;
    loop {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        // SAFETY: flock on an fd this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                Ok(None)
            } else {
                Err(e)
            };
        }
        let held = file.metadata()?;
        match std::fs::metadata(path) {
            Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => return Ok(Some(file)),
            _ => continue, // removed (or replaced) by the holder we waited for
        }
    }
}

/// `$XDG_RUNTIME_DIR/arbor/calls`, or `$TMPDIR/arbor-UID/calls` (created,
/// owner-only), or None.
#[allow(unsafe_code)]
fn lock_dir() -> Option<PathBuf> {
    use std::os::unix::fs::DirBuilderExt as _;
    use std::os::unix::fs::PermissionsExt as _;
    static DIR: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let base = match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(dir) if Path::new(&dir).is_absolute() => PathBuf::from(dir).join("arbor"),
            _ => {
                // SAFETY: getuid cannot fail.
                let uid = unsafe { libc::getuid() };
                std::env::temp_dir().join(format!("arbor-{uid}"))
            }
        };
        let dir = base.join("calls");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .ok()?;
        // A directory someone else made (in a shared /tmp) is not used.
        let meta = std::fs::symlink_metadata(&base).ok()?;
        // SAFETY: getuid cannot fail.
        let me = unsafe { libc::getuid() };
        (std::os::unix::fs::MetadataExt::uid(&meta) == me
            && meta.is_dir()
            && meta.permissions().mode() & 0o022 == 0)
            .then_some(dir)
    })
    .clone()
}

/// FNV-1a over the key's parts (NUL-separated): a stable file name.
fn fnv(key: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in key {
        for byte in part.bytes().chain([0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

#[cfg(target_os = "linux")]
mod imp {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
    use std::sync::OnceLock;

    /// The lifeline: (read end, write end), both close-on-exec; Arbor holds
    /// both for its whole life, keepers only the read end.
    static LIFELINE: OnceLock<Option<(OwnedFd, OwnedFd)>> = OnceLock::new();

    #[allow(unsafe_code)]
    fn lifeline() -> Option<(RawFd, RawFd)> {
        LIFELINE
            .get_or_init(|| {
                let mut fds = [0; 2];
                // SAFETY: pipe2 fills two fds this process then owns.
                if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                    return None;
                }
                // SAFETY: just created, owned by nothing else.
                let (read, write) =
                    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
                Some((above_stdio(read)?, above_stdio(write)?))
            })
            .as_ref()
            .map(|(r, w)| (r.as_raw_fd(), w.as_raw_fd()))
    }

    /// `fd`, or a copy of it numbered 3 or more: a process started with a
    /// standard stream closed gets fds 0–2 from `open`, which the child's
    /// stdio would replace.
    #[allow(unsafe_code)]
    pub(super) fn above_stdio(fd: OwnedFd) -> Option<OwnedFd> {
        if fd.as_raw_fd() > 2 {
            return Some(fd);
        }
        // SAFETY: F_DUPFD_CLOEXEC on an fd this process owns makes a new one.
        let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
        // SAFETY: a new fd, owned by nothing else.
        (copy >= 0).then(|| unsafe { OwnedFd::from_raw_fd(copy) })
    }

    #[allow(unsafe_code)]
    pub(super) fn install(command: &mut tokio::process::Command, lock: Option<RawFd>) -> bool {
        let Some((life, _)) = lifeline() else {
            return false;
        };
        let lock = lock.unwrap_or(-1);
        // SAFETY: the closure runs in the forked child and only makes system
        // calls (see `keeper`).
        unsafe {
            command.pre_exec(move || keeper(life, lock));
        }
        true
    }

    /// The signals the keeper waits for (through a signalfd).
    #[allow(unsafe_code)]
    fn waited_signals() -> libc::sigset_t {
        // SAFETY: sigset operations on a local set.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for signal in [
                libc::SIGCHLD,
                libc::SIGTERM,
                libc::SIGINT,
                libc::SIGHUP,
                libc::SIGQUIT,
            ] {
                libc::sigaddset(&mut set, signal);
            }
            set
        }
    }

    /// Runs in the child `spawn` forked, after std set up its stdio, group and
    /// signal mask: forks the program (which returns `Ok` to go on to `exec`)
    /// and becomes its keeper (which never returns).
    #[allow(unsafe_code)]
    fn keeper(life: RawFd, lock: RawFd) -> std::io::Result<()> {
        // SAFETY: system calls only; this process has one thread.
        unsafe {
            let me = libc::getpid();
            let arbor = libc::getppid();
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Block the waited signals before the program exists, so none is lost.
            let set = waited_signals();
            let mut before: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut before);
            let program = libc::fork();
            if program < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if program == 0 {
                // The program: its own group, dead with its keeper, the
                // signal mask std gave it.
                libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
                libc::setpgid(0, 0);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                if libc::getppid() != me {
                    libc::raise(libc::SIGKILL);
                }
                return Ok(());
            }
            keep(program, arbor, life, lock, &set)
        }
    }

    /// The keeper's life: see the module docs.
    #[allow(unsafe_code)]
    unsafe fn keep(
        program: libc::pid_t,
        arbor: libc::pid_t,
        life: RawFd,
        lock: RawFd,
        set: &libc::sigset_t,
    ) -> ! {
        // SAFETY: system calls only; this process has one thread.
        unsafe {
            libc::prctl(libc::PR_SET_NAME, c"arbor-keeper".as_ptr(), 0, 0, 0);
            // A copy of Arbor's memory: never dump it.
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            // Hold nothing of Arbor's: stdio (the program's pipes, which must
            // close when it ends), sockets, files, std's exec-error pipe.
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            if null >= 0 {
                for fd in 0..3 {
                    libc::dup2(null, fd);
                }
            }
            let mut keep_fds = [life, lock];
            keep_fds.sort_unstable();
            let mut from = 3;
            for fd in keep_fds {
                if fd >= from {
                    close_range(from, fd - 1);
                    from = fd + 1;
                }
            }
            close_range(from, libc::c_int::MAX);

            let sfd = libc::signalfd(-1, set, libc::SFD_CLOEXEC);
            let mut status: Option<libc::c_int> = None;
            // Arbor ended before the lifeline was watched (the pipe tells too;
            // this is only quicker).
            let mut done = libc::getppid() != arbor;
            while !done && status.is_none() {
                let mut fds = [
                    libc::pollfd {
                        fd: life,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: sfd,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                let n = libc::poll(fds.as_mut_ptr(), 2, -1);
                if n < 0 {
                    if *libc::__errno_location() == libc::EINTR {
                        continue;
                    }
                    break; // cannot wait: end everything now
                }
                if fds[0].revents != 0 {
                    break; // Arbor is gone
                }
                if fds[1].revents != 0 {
                    let mut info: [libc::signalfd_siginfo; 8] = std::mem::zeroed();
                    let read =
                        libc::read(sfd, info.as_mut_ptr().cast(), std::mem::size_of_val(&info));
                    let count = usize::try_from(read).unwrap_or(0)
                        / std::mem::size_of::<libc::signalfd_siginfo>();
                    for one in &info[..count] {
                        if one.ssi_signo == libc::SIGCHLD as u32 {
                            reap(program, &mut status);
                        } else {
                            done = true; // asked to stop
                        }
                    }
                }
            }
            sweep(program, &mut status);
            let _ = lock; // held until this process exits
            match status {
                Some(st) if libc::WIFEXITED(st) => libc::_exit(libc::WEXITSTATUS(st)),
                Some(st) if libc::WIFSIGNALED(st) => {
                    let signal = libc::WTERMSIG(st);
                    libc::signal(signal, libc::SIG_DFL);
                    let mut one: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut one);
                    libc::sigaddset(&mut one, signal);
                    libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
                    libc::raise(signal);
                    libc::_exit(128 + signal)
                }
                // Stopped before the program ended: it was killed.
                _ => {
                    libc::raise(libc::SIGKILL);
                    libc::_exit(137)
                }
            }
        }
    }

    /// Reaps every child that has ended, noting the program's status.
    #[allow(unsafe_code)]
    unsafe fn reap(program: libc::pid_t, status: &mut Option<libc::c_int>) {
        loop {
            let mut st = 0;
            // SAFETY: waitpid on this process's children.
            let pid = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            if pid == program {
                *status = Some(st);
            }
        }
    }

    /// Kills the program's group, then every child this keeper has (the
    /// program, what was re-parented to it, and their groups), until none
    /// is left.
    #[allow(unsafe_code)]
    unsafe fn sweep(program: libc::pid_t, status: &mut Option<libc::c_int>) {
        // SAFETY: system calls only.
        unsafe {
            libc::kill(-program, libc::SIGKILL);
            loop {
                let listed = for_each_child(|pid| {
                    libc::kill(pid, libc::SIGKILL);
                    libc::kill(-pid, libc::SIGKILL);
                });
                let mut st = 0;
                let pid = if listed {
                    libc::waitpid(-1, &mut st, 0)
                } else {
                    // No list of children here: reap what ended, then stop.
                    libc::waitpid(-1, &mut st, libc::WNOHANG)
                };
                if pid == program {
                    *status = Some(st);
                }
                if pid < 0 {
                    if *libc::__errno_location() == libc::EINTR {
                        continue;
                    }
                    return; // ECHILD: nothing left
                }
                if pid == 0 {
                    return;
                }
            }
        }
    }

    /// Calls `f` with the pid of each child of this (one-threaded) process;
    /// false when the kernel offers no list (no `/proc/thread-self/children`).
    #[allow(unsafe_code)]
    unsafe fn for_each_child(mut f: impl FnMut(libc::pid_t)) -> bool {
        // SAFETY: system calls on a local buffer.
        unsafe {
            let fd = libc::open(
                c"/proc/thread-self/children".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return false;
            }
            let mut buf = [0u8; 512];
            let mut pid: libc::pid_t = 0;
            let mut digits = false;
            loop {
                let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 {
                    break;
                }
                for &b in &buf[..n as usize] {
                    if b.is_ascii_digit() {
                        pid = pid
                            .saturating_mul(10)
                            .saturating_add(libc::pid_t::from(b - b'0'));
                        digits = true;
                    } else if digits {
                        f(pid);
                        pid = 0;
                        digits = false;
                    }
                }
            }
            if digits {
                f(pid);
            }
            libc::close(fd);
            true
        }
    }

    /// Closes fds `from..=to` (close_range, or one by one on old kernels).
    #[allow(unsafe_code)]
    unsafe fn close_range(from: RawFd, to: RawFd) {
        if from > to {
            return;
        }
        // SAFETY: closing fds this process will not use again.
        unsafe {
            if libc::syscall(
                libc::SYS_close_range,
                from as libc::c_uint,
                to as libc::c_uint,
                0,
            ) != 0
            {
                for fd in from..=to.min(65_535) {
                    libc::close(fd);
                }
            }
        }
    }
}
