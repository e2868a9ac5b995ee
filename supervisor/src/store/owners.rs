//! Who runs a tree, and whether it can be claimed: the owner ids of
//! processes (`scope:pid`), their liveness, and the claim decisions every
//! backend takes alike (moved out of `store/mod.rs`; no change).

use std::path::Path;

use arbor_actors::TreeId;

use super::{STALE_AFTER_MS, TreeStatus};
use crate::error::Error;

/// Where a process id means something: this machine's boot and this pid
/// namespace (containers on one host share the boot id, not the pids). Linux
/// only; elsewhere liveness rests on the heartbeat alone.
/// Read once: it does not change while the process lives.
fn process_scope() -> Option<&'static str> {
    static SCOPE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    SCOPE
        .get_or_init(|| {
            let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
            let pid_ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
            Some(format!("{}/{}", boot.trim(), pid_ns.display()))
        })
        .as_deref()
}

/// Who runs a tree: `scope:pid`.
pub(crate) fn owner_id() -> String {
    format!("{}:{}", process_scope().unwrap_or("-"), std::process::id())
}

/// Whether the process that runs a tree is alive, when this process can tell
/// (same boot and pid namespace): `Some(false)` if its pid is gone or a
/// zombie, `None` if it cannot tell (then the heartbeat decides). A stopped
/// process (SIGSTOP, a debugger) may never go on: its heartbeat decides too,
/// and if it does go on after another process took its tree over, the
/// tree's fencing epoch stops it there.
pub(crate) fn owner_alive(owner: &str) -> Option<bool> {
    let (scope, pid) = owner.rsplit_once(':')?;
    if scope == "-" || process_scope() != Some(scope) {
        return None;
    }
    if pid == std::process::id().to_string() {
        return Some(true);
    }
    Some(
        match std::fs::read_to_string(Path::new("/proc").join(pid).join("stat")) {
            Err(_) => false,
            Ok(stat) => match stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
            {
                Some('Z' | 'X') => false,
                Some('T' | 't') => return None,
                _ => true,
            },
        },
    )
}

/// Whether a tree marked running is really being run: its owner is alive, or
/// (when that cannot be told) its heartbeat is fresh.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn still_running(owner: &str, heartbeat_ms: u64, now_ms: u64) -> bool {
    still_running_within(owner, heartbeat_ms, now_ms, STALE_AFTER_MS)
}

/// `still_running` under a lease of `lease_ms`: an owner this process cannot
/// see (another host or pid namespace, as replicas on one database are)
/// runs its trees while its heartbeat is younger than the lease.
pub(crate) fn still_running_within(
    owner: &str,
    heartbeat_ms: u64,
    now_ms: u64,
    lease_ms: u64,
) -> bool {
    owner_alive(owner).unwrap_or(now_ms.saturating_sub(heartbeat_ms) <= lease_ms)
}

/// Whether a tree can be claimed to resume it (`Store::claim`), from its row:
/// it is still marked running and nobody runs it (its owner is gone, or,
/// when that cannot be told, its heartbeat is older than `lease_ms`). The
/// same decision on every backend.
pub(crate) fn claimable(
    tree: &TreeId,
    row: (TreeStatus, &str, u64),
    now_ms: u64,
    lease_ms: u64,
) -> Result<(), Error> {
    match claim_refused(row, now_ms, lease_ms) {
        Some(reason) => Err(Error::NotResumable {
            tree: tree.clone(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Why a tree cannot be claimed to resume it ([`claimable`]), or `None`
/// when it can.
pub(crate) fn claim_refused(
    (status, owner, heartbeat_ms): (TreeStatus, &str, u64),
    now_ms: u64,
    lease_ms: u64,
) -> Option<String> {
    if status != TreeStatus::Running {
        return Some(format!("it already ended ({status})"));
    }
    if still_running_within(owner, heartbeat_ms, now_ms, lease_ms) {
        return Some(
            "another process is running it (it is alive, or its heartbeat is recent); stop that one first"
                .into(),
        );
    }
    None
}

/// Whether a tree can be claimed for a follow-up turn (`Store::claim_turn`):
/// its last turn ended. The same decision on every backend.
pub(crate) fn turn_claimable(tree: &TreeId, status: TreeStatus) -> Result<(), Error> {
    if !status.is_final() {
        return Err(Error::NotResumable {
            tree: tree.clone(),
            reason: format!("its turn has not ended ({status})"),
        });
    }
    Ok(())
}
