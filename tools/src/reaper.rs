//! Every process group Arbor starts for a tool (MCP servers over stdio,
//! command tools) is registered here while it lives, so that no exit path
//! leaves one behind: dropping its [`Registration`] kills the group (normal
//! exit, a cancelled call), and [`kill_all`] ends every group still registered
//! (the SIGTERM/SIGINT handler and [`ExitGuard`] call it).
//!
//! On Linux a tool process runs under a keeper ([`crate::keeper`]),
//! registered with [`register_keeper`]: ending it means asking its keeper
//! (SIGTERM), which kills the program's group and everything it left
//! behind, and which does so by itself when Arbor dies, even by SIGKILL.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use arbor_actors::sync::LockExt as _;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Registered process groups and keepers, by registration.
static GROUPS: Mutex<Option<HashMap<u64, Target>>> = Mutex::new(None);
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A registered process group; dropping it kills the group (SIGKILL) and
/// forgets it. [`Registration::disarm`] forgets it without a kill (the group
/// already ended).
#[derive(Debug)]
pub struct Registration {
    key: u64,
    pgid: i32,
    target: Target,
    armed: bool,
}

/// What ending a registration signals.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// SIGKILL to the process group.
    Group(i32),
    /// SIGTERM to a keeper, which ends its program's processes and exits.
    Keeper(i32),
}

/// Registers the process group `pgid` (a child started with `process_group(0)`
/// leads a group whose id is its pid).
pub fn register(pgid: u32) -> Registration {
    let pgid = i32::try_from(pgid).unwrap_or(i32::MAX);
    insert(pgid, Target::Group(pgid))
}

/// Registers the keeper `pid` of a tool process (started with
/// [`keeper::install`](crate::keeper::install)).
pub fn register_keeper(pid: u32) -> Registration {
    let pid = i32::try_from(pid).unwrap_or(i32::MAX);
    insert(pid, Target::Keeper(pid))
}

fn insert(pgid: i32, target: Target) -> Registration {
    let key = NEXT.fetch_add(1, Ordering::Relaxed);
    GROUPS
        .locked()
        .get_or_insert_with(HashMap::new)
        .insert(key, target);
    Registration {
        key,
        pgid,
        target,
        armed: true,
    }
}

impl Registration {
    /// The id of the process group that [`kill`](Registration::kill) and
    /// [`kill_all`] send SIGKILL to (the pid given to [`register`]).
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// Kills the group now (SIGKILL to every process in it; for a keeper,
    /// SIGTERM, on which it kills every process of its program and exits).
    pub fn kill(&mut self) {
        if self.armed {
            end(self.target);
            self.forget();
        }
    }

    /// The registered process (the group's leader or the keeper) was waited
    /// for: a keeper ended every process of its program before it exited, so
    /// it is forgotten (its pid may be reused now); a group is killed, for
    /// what its leader left in it.
    pub fn exited(&mut self) {
        match self.target {
            Target::Keeper(_) => self.forget(),
            Target::Group(_) => self.kill(),
        }
    }

    /// Forgets the group without killing it.
    pub fn disarm(mut self) {
        self.forget();
    }

    fn forget(&mut self) {
        self.armed = false;
        if let Some(groups) = GROUPS.locked().as_mut() {
            groups.remove(&self.key);
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.kill();
    }
}

fn end(target: Target) {
    match target {
        // The group may be gone already (ESRCH): nothing to do then.
        Target::Group(pgid) if pgid > 1 => {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        Target::Keeper(pid) if pid > 1 => {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        _ => {}
    }
}

/// Kills every registered process group. Safe to call from a signal-handling
/// task or a panic hook; the registrations stay valid (dropping them later
/// is a no-op kill of a dead group).
pub fn kill_all() {
    let groups: Vec<Target> = GROUPS
        .locked()
        .as_ref()
        .map(|g| g.values().copied().collect())
        .unwrap_or_default();
    for target in groups {
        end(target);
    }
}

/// How many process groups are registered now (for tests and metrics).
pub fn live() -> usize {
    GROUPS.locked().as_ref().map_or(0, HashMap::len)
}

/// Kills every registered group when dropped: `main` holds one, so a panic
/// that unwinds out of it (or a normal return) leaves no tool process behind.
/// Paths that end the process without unwinding (`std::process::exit`, the
/// signal handler) call [`kill_all`] first.
#[derive(Debug)]
pub struct ExitGuard;

impl Drop for ExitGuard {
    fn drop(&mut self) {
        kill_all();
    }
}
