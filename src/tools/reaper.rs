//! Every process group Arbor starts for a tool (MCP servers over stdio,
//! command tools) is registered here while it lives, so that no exit path
//! leaves one behind: dropping its [`Registration`] kills the group (normal
//! exit, a cancelled call), and [`kill_all`] ends every group still registered
//! (the SIGTERM/SIGINT handler and [`ExitGuard`] call it).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use arbor_actors::sync::LockExt as _;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

static GROUPS: Mutex<Option<HashMap<u64, i32>>> = Mutex::new(None);
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A registered process group; dropping it kills the group (SIGKILL) and
/// forgets it. [`Registration::disarm`] forgets it without a kill (the group
/// already ended).
#[derive(Debug)]
pub struct Registration {
    key: u64,
    pgid: i32,
    armed: bool,
}

/// Registers the process group `pgid` (a child started with `process_group(0)`
/// leads a group whose id is its pid).
pub fn register(pgid: u32) -> Registration {
    let key = NEXT.fetch_add(1, Ordering::Relaxed);
    let pgid = i32::try_from(pgid).unwrap_or(i32::MAX);
    GROUPS
        .locked()
        .get_or_insert_with(HashMap::new)
        .insert(key, pgid);
    Registration {
        key,
        pgid,
        armed: true,
    }
}

impl Registration {
    /// The id of the process group that [`kill`](Registration::kill) and
    /// [`kill_all`] send SIGKILL to (the pid given to [`register`]).
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// Kills the group now (SIGKILL to every process in it).
    pub fn kill(&mut self) {
        if self.armed {
            kill_group(self.pgid);
            self.forget();
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

fn kill_group(pgid: i32) {
    if pgid > 1 {
        // The group may be gone already (ESRCH): nothing to do then.
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// Kills every registered process group. Safe to call from a signal-handling
/// task or a panic hook; the registrations stay valid (dropping them later
/// is a no-op kill of a dead group).
pub fn kill_all() {
    let groups: Vec<i32> = GROUPS
        .locked()
        .as_ref()
        .map(|g| g.values().copied().collect())
        .unwrap_or_default();
    for pgid in groups {
        kill_group(pgid);
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
