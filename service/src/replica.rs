//! One replica among several on a shared store: every route serves every
//! tree. A control (cancel, an approval's decision, a steering message, a
//! budget raise) for a tree another replica runs is posted to the store
//! (`Store::post_control`) and answered `202` naming that owner; every
//! replica runs a control loop that takes the controls of the trees it runs
//! (`Store::take_controls`, woken by the store's notifications where it has
//! them, polled every `CONTROL_POLL` otherwise) and applies each through the
//! supervisor exactly as the local route would.
//!
//! Where a control goes is decided by [`route`], a pure function of what
//! this process runs and what the store says of the tree.

use std::sync::Weak;
use std::time::Duration;

use arbor_actors::approval::Decision;
use arbor_actors::sync::LockExt as _;
use arbor_actors::{RunId, TreeId};
use arbor_supervisor::store::{Control, Owner, Wake};
use arbor_supervisor::{JournalEntry, TreeStatus};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::Shared;
use super::access::Scope;
use super::error::ApiError;

/// How often the control loop looks for controls when no notification
/// came (a SQLite store has none).
pub(crate) const CONTROL_POLL: Duration = Duration::from_millis(200);

/// What another replica asks of a tree this one runs, as posted to the
/// store (JSON, tagged by `control`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "control", rename_all = "camelCase")]
pub(crate) enum ControlBody {
    /// `POST /v1/runs/{runId}/cancel`.
    #[serde(rename_all = "camelCase")]
    Cancel {
        /// The run whose subtree is cancelled.
        run_id: RunId,
    },
    /// `POST /v1/runs/{runId}/messages`.
    #[serde(rename_all = "camelCase")]
    Steer {
        /// The run the message is for.
        run_id: RunId,
        /// The message.
        text: String,
    },
    /// `POST /v1/trees/{treeId}/approvals/{callId}`.
    #[serde(rename_all = "camelCase")]
    Decide {
        /// The call decided on.
        call_id: String,
        /// The decision.
        decision: Decision,
    },
    /// `POST /v1/trees/{treeId}/approvals/{callId}` with `always`: the call
    /// approved and its tool allowed for good in the tree.
    #[serde(rename_all = "camelCase")]
    ApproveAlways {
        /// The call approved.
        call_id: String,
    },
    /// `PATCH /v1/trees/{treeId}/limits`.
    #[serde(rename_all = "camelCase")]
    Raise {
        /// Budgets set.
        set: Budget,
        /// Budgets added to.
        add: Budget,
    },
    /// `POST /v1/trees/{treeId}/turns` queued a turn behind the one this
    /// replica runs: journaled here (`turnQueued`).
    TurnQueued(super::turns::Told),
}

/// A budget raise as a control carries it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Budget {
    pub(crate) max_steps: Option<u64>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) max_credits: Option<f64>,
}

impl From<Budget> for arbor_supervisor::Raised {
    fn from(b: Budget) -> Self {
        arbor_supervisor::Raised {
            max_steps: b.max_steps,
            max_tokens: b.max_tokens,
            max_credits: b.max_credits,
        }
    }
}

/// Where a control for a tree goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// This process runs the tree: the route applies the control itself.
    Local,
    /// Another replica runs it (or will, once it adopts the interrupted
    /// tree): posted to the store for that replica to apply.
    Forward {
        /// The owner's id, `None` while the tree waits to be adopted.
        owner: Option<String>,
    },
    /// The tree has ended: refused as locally (409).
    Ended(TreeStatus),
    /// No tree of that id anywhere: refused as locally (404).
    Unknown,
}

/// Where a control goes, from whether this process runs the tree, its owner
/// in the store (`Store::owner`: `None` when none is alive) and its status
/// there (`None`: the store has no such tree).
pub(crate) fn route(here: bool, owner: Option<&Owner>, status: Option<TreeStatus>) -> Route {
    if here {
        return Route::Local;
    }
    match (owner, status) {
        (_, None) => Route::Unknown,
        (Some(owner), Some(status)) if !status.is_final() => Route::Forward {
            owner: Some(owner.owner.clone()),
        },
        (None, Some(TreeStatus::Interrupted)) => Route::Forward { owner: None },
        // Listed running with no live owner: its lease is just running out.
        (None, Some(TreeStatus::Running)) => Route::Forward { owner: None },
        (_, Some(status)) => Route::Ended(status),
    }
}

/// Where a control for `tree_id` goes now (asked of the store when this
/// process does not run the tree).
pub(crate) async fn locate(shared: &Shared, tree_id: &TreeId) -> Result<Route, ApiError> {
    let supervisor = shared.runtime.supervisor();
    if supervisor.is_running(tree_id) {
        return Ok(Route::Local);
    }
    let tree = tree_id.to_owned();
    // Read once this process's own writes are in: a tree that just ended
    // here is no longer running but may not be stored as ended yet, and
    // would read as still owned by this very process (a control "forwarded"
    // to itself instead of refused as ended).
    let (owner, status) = supervisor
        .read_store_now(move |store| match store.tree(&tree) {
            Ok((_, summary)) => Ok((store.owner(&tree)?, Some(summary.status))),
            Err(arbor_supervisor::Error::UnknownTree(_)) => Ok((None, None)),
            Err(error) => Err(error),
        })
        .await?;
    // It may have come here meanwhile (adopted by this replica).
    Ok(route(
        supervisor.is_running(tree_id),
        owner.as_ref(),
        status,
    ))
}

/// Posts a control for a tree another replica runs; the owner it went to.
pub(crate) async fn forward(
    shared: &Shared,
    tree_id: &TreeId,
    control: &ControlBody,
) -> Result<(), ApiError> {
    let body = serde_json::to_value(control)
        .map_err(|e| ApiError::unavailable("encoding the control failed", e))?;
    let tree = tree_id.to_owned();
    shared
        .runtime
        .supervisor()
        .read_store(move |store| store.post_control(&tree, &body))
        .await?;
    shared.replica.forwarded.inc();
    Ok(())
}

/// The message of a 202 for a forwarded control.
pub(crate) fn forwarded_note(owner: &Option<String>) -> String {
    match owner {
        Some(owner) => format!("forwarded to the replica that runs the tree ({owner})"),
        None => "forwarded to the replica that adopts the tree (its owner is gone)".to_owned(),
    }
}

/// The tool calls of a tree waiting for a decision, as its journal tells
/// them (for a tree another replica runs, whose approvals this process does
/// not hold): asked for and not decided, and of a run that has not ended.
/// A resumed run that asks again replaces its earlier request.
pub(crate) fn pending_from_journal(
    tree_id: &TreeId,
    journal: &[JournalEntry],
) -> Vec<arbor_supervisor::PendingApproval> {
    let mut fold = PendingFold::default();
    fold.apply(tree_id, journal);
    fold.pending
}

/// The waiting calls of one tree, folded from its journal up to `read`: the
/// journal's entries after it go on from here (`apply`), so a tree's journal
/// is read once, then only what is new.
#[derive(Clone, Debug, Default)]
pub(crate) struct PendingFold {
    /// The principal that started the tree (a listing by owner keeps its
    /// own trees' folds up to date).
    owner: Option<String>,
    /// The highest `seq` folded in.
    read: u64,
    /// The calls waiting as of `read`, oldest first.
    pending: Vec<arbor_supervisor::PendingApproval>,
}

impl PendingFold {
    /// Folds in the journal's entries that follow the ones folded so far.
    fn apply(&mut self, tree_id: &TreeId, journal: &[JournalEntry]) {
        let pending = &mut self.pending;
        let call = |entry: &JournalEntry| {
            entry
                .body
                .get("toolCallId")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        for entry in journal {
            self.read = self.read.max(entry.seq);
            match entry.kind.name() {
                "approvalRequested" => {
                    let Some(call_id) = call(entry) else { continue };
                    // The journal keeps run ids as text; one that is no run
                    // id names no call that can be decided.
                    let Ok(run_id) = entry.run_id.parse::<RunId>() else {
                        continue;
                    };
                    // Asked again after a restart: it keeps the age of its first ask.
                    let first = pending
                        .iter()
                        .find(|p| p.tool_call_id == call_id)
                        .map_or(entry.at_ms, |p| p.requested_ms.min(entry.at_ms));
                    pending.retain(|p| p.tool_call_id != call_id);
                    pending.push(arbor_supervisor::PendingApproval {
                        tree_id: tree_id.clone(),
                        run_id,
                        tool_call_id: call_id,
                        step: entry
                            .body
                            .get("step")
                            .and_then(|v| v.as_u64())
                            .and_then(|v| u32::try_from(v).ok())
                            .unwrap_or_default(),
                        tool: entry
                            .body
                            .get("tool")
                            .and_then(|v| v.as_str())
                            .unwrap_or_default()
                            .to_owned(),
                        input: entry.body.get("input").cloned().unwrap_or_default(),
                        requested_ms: first,
                    });
                }
                "approvalDecided" => {
                    if let Some(call_id) = call(entry) {
                        pending.retain(|p| p.tool_call_id != call_id);
                    }
                }
                _ if entry.is_final() => pending.retain(|p| p.run_id != *entry.run_id),
                _ => {}
            }
        }
    }
}

/// The calls waiting in `trees` (trees this process does not run, each
/// with the principal that started it), read from their journals: each
/// tree's from where the last listing read it (`Shared::pending_seen`).
/// `trees` are all the trees other replicas run now that `scope` covers:
/// the folds of the other trees it covers are dropped, so what is kept
/// follows what runs. A tree the store no longer has is left out.
pub(crate) async fn pending_elsewhere(
    shared: &Shared,
    trees: Vec<(TreeId, Option<String>)>,
    scope: &Scope,
) -> Result<Vec<arbor_supervisor::PendingApproval>, ApiError> {
    let folds: Vec<(TreeId, PendingFold)> = {
        let mut seen = shared.pending_seen.locked();
        let wanted: std::collections::HashSet<&TreeId> = trees.iter().map(|(t, _)| t).collect();
        seen.retain(|tree, fold| {
            let covered = match scope {
                Scope::All => true,
                Scope::Owner(name) => fold.owner.as_deref() == Some(&**name),
                Scope::Nothing => false,
            };
            wanted.contains(tree) || !covered
        });
        trees
            .into_iter()
            .map(|(tree, owner)| {
                let fold = seen.get(&tree).cloned().unwrap_or(PendingFold {
                    owner,
                    ..PendingFold::default()
                });
                (tree, fold)
            })
            .collect()
    };
    let folded = shared
        .runtime
        .supervisor()
        .read_store(move |store| {
            let mut folded = Vec::with_capacity(folds.len());
            for (tree, mut fold) in folds {
                match store.events(&tree, fold.read) {
                    Ok(entries) => {
                        fold.apply(&tree, &entries);
                        folded.push((tree, fold));
                    }
                    Err(arbor_supervisor::Error::UnknownTree(_)) => {}
                    Err(error) => return Err(error),
                }
            }
            Ok(folded)
        })
        .await?;
    let mut seen = shared.pending_seen.locked();
    let mut pending = Vec::new();
    for (tree, fold) in folded {
        pending.extend(fold.pending.iter().cloned());
        // Another listing may have read further meanwhile.
        let kept = seen.entry(tree).or_default();
        if fold.read >= kept.read {
            *kept = fold;
        }
    }
    Ok(pending)
}

/// Takes the controls of the trees this process runs and applies them, until
/// shutdown: at once when the store says one was posted (`wake`), else
/// every `CONTROL_POLL`.
pub(crate) async fn control_loop(shared: Weak<Shared>, mut wake: watch::Receiver<u64>) {
    let Some(mut shutdown) = shared.upgrade().map(|s| s.shutdown.subscribe()) else {
        return;
    };
    let mut tick = tokio::time::interval(CONTROL_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = wake.changed() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        // Held only while there is work: a dropped service ends the loop.
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let trees: Vec<TreeId> = shared.owned.locked().iter().cloned().collect();
        if trees.is_empty() {
            continue;
        }
        let taken = shared
            .runtime
            .supervisor()
            .read_store(move |store| store.take_controls(&trees))
            .await;
        let controls = match taken {
            Ok(controls) => controls,
            Err(error) => {
                tracing::warn!(%error, "cannot take the controls posted for this replica's trees");
                continue;
            }
        };
        for control in controls {
            apply(&shared, control).await;
        }
    }
}

/// Applies one control taken from the store, as its route would have here.
async fn apply(shared: &Shared, control: Control) {
    let supervisor = shared.runtime.supervisor();
    let Control { id, tree_id, body } = control;
    let body: ControlBody = match serde_json::from_value(body) {
        Ok(body) => body,
        Err(error) => {
            shared.replica.refused.inc();
            tracing::warn!(tree = %tree_id, control = id, %error, "a control that is not one; dropped");
            return;
        }
    };
    let done = match &body {
        ControlBody::Cancel { run_id } => supervisor.cancel_run(run_id).map(drop),
        ControlBody::Steer { run_id, text } => supervisor.steer(run_id, text).await,
        ControlBody::Decide { call_id, decision } => supervisor
            .decide(&tree_id, call_id, decision.clone())
            .await
            .map(drop),
        ControlBody::ApproveAlways { call_id } => {
            supervisor.approve_always(&tree_id, call_id).await.map(drop)
        }
        ControlBody::Raise { set, add } => supervisor
            .raise_limits(&tree_id, (*set).into(), (*add).into())
            .map(drop),
        ControlBody::TurnQueued(told) => super::turns::journal_told(shared, &tree_id, told).await,
    };
    match done {
        Ok(()) => {
            shared.replica.applied.inc();
            tracing::info!(tree = %tree_id, control = id, ?body, "applied a control another replica forwarded");
        }
        Err(error) => {
            shared.replica.refused.inc();
            tracing::warn!(tree = %tree_id, control = id, ?body, %error, "a forwarded control could not be applied");
        }
    }
}

/// Follows the store's notifications (a Postgres store's `LISTEN`; SQLite
/// has none), on a thread of its own, until the service is gone: each
/// wake-up bumps the watch of what it is about. A lost connection (a
/// database restart, a terminated backend) is opened again, with backoff,
/// and everything is woken once it is back (a notification sent meanwhile
/// was missed); between the two, the loops poll as they always do.
pub(crate) fn follow_wakes(store: Weak<dyn arbor_supervisor::store::Store>, shared: Weak<Shared>) {
    let started = std::thread::Builder::new()
        .name("arbor-wake".into())
        .spawn(move || {
            let mut backoff = WAKE_BACKOFF;
            let mut first = true;
            loop {
                // Held only while subscribing: a dropped store ends the thread.
                let Some(subscribed) = store.upgrade().map(|store| store.subscribe()) else {
                    return;
                };
                let wakes = match subscribed {
                    Ok(Some(wakes)) => wakes,
                    // No notifications on this store: the loops poll.
                    Ok(None) => return,
                    Err(error) => {
                        if first {
                            tracing::warn!(
                                %error,
                                "cannot subscribe to the store's notifications; polling until it answers"
                            );
                        }
                        first = false;
                        std::thread::sleep(backoff);
                        backoff = (backoff * 2).min(WAKE_BACKOFF_MAX);
                        if shared.strong_count() == 0 {
                            return;
                        }
                        continue;
                    }
                };
                if !first {
                    tracing::info!("following the store's notifications again");
                    let Some(shared) = shared.upgrade() else {
                        return;
                    };
                    for target in [&shared.journal_wake, &shared.control_wake, &shared.adopt_wake] {
                        target.send_modify(|n| *n = n.wrapping_add(1));
                    }
                }
                first = false;
                backoff = WAKE_BACKOFF;
                for wake in wakes {
                    let Some(shared) = shared.upgrade() else {
                        return;
                    };
                    let target = match wake {
                        Wake::Journal { .. } => &shared.journal_wake,
                        Wake::Control { .. } => &shared.control_wake,
                        Wake::Released { .. } => &shared.adopt_wake,
                    };
                    target.send_modify(|n| *n = n.wrapping_add(1));
                }
                // The connection was lost: open it again.
                if shared.strong_count() == 0 {
                    return;
                }
                std::thread::sleep(backoff);
            }
        });
    if let Err(error) = started {
        tracing::warn!(%error, "cannot follow the store's notifications; polling only");
    }
}

/// The first wait before the notifications' connection is opened again; it
/// doubles up to `WAKE_BACKOFF_MAX`.
const WAKE_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);
const WAKE_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree id from a test's literal.
    fn as_tree(id: &str) -> TreeId {
        id.parse().unwrap()
    }

    fn owner() -> Owner {
        Owner {
            owner: "boot/ns:42".into(),
            heartbeat_ms: 1,
            epoch: 3,
        }
    }

    #[test]
    fn a_tree_run_here_is_controlled_here_whatever_the_store_says() {
        for status in [None, Some(TreeStatus::Running), Some(TreeStatus::Completed)] {
            assert_eq!(route(true, Some(&owner()), status), Route::Local);
            assert_eq!(route(true, None, status), Route::Local);
        }
    }

    #[test]
    fn a_tree_another_replica_runs_is_forwarded_to_it_by_name() {
        assert_eq!(
            route(false, Some(&owner()), Some(TreeStatus::Running)),
            Route::Forward {
                owner: Some("boot/ns:42".into())
            }
        );
        // Interrupted: for whichever replica adopts it.
        assert_eq!(
            route(false, None, Some(TreeStatus::Interrupted)),
            Route::Forward { owner: None }
        );
    }

    #[test]
    fn an_ended_or_unknown_tree_is_refused_as_locally() {
        for status in [
            TreeStatus::Completed,
            TreeStatus::Failed,
            TreeStatus::Cancelled,
        ] {
            assert_eq!(route(false, None, Some(status)), Route::Ended(status));
            assert_eq!(
                route(false, Some(&owner()), Some(status)),
                Route::Ended(status)
            );
        }
        assert_eq!(route(false, None, None), Route::Unknown);
    }

    fn entry(seq: u64, run: &str, json: serde_json::Value) -> JournalEntry {
        let mut body = json.as_object().unwrap().clone();
        let kind = body.remove("type").unwrap();
        JournalEntry {
            kind: kind.as_str().unwrap().parse().unwrap(),
            body,
            output: None,
            seq,
            run_id: run.into(),
            at_ms: seq * 10,
        }
    }

    #[test]
    fn a_journal_tells_the_calls_still_waiting_for_a_decision() {
        let asked = |call: &str| {
            serde_json::json!({"type": "approvalRequested", "step": 1, "toolCallId": call,
                "tool": "say", "input": {"text": "hi"}})
        };
        let journal = [
            entry(1, "t/0", asked("c1")),
            entry(2, "t/0.1", asked("c2")),
            entry(3, "t/0.2", asked("c3")),
            entry(
                4,
                "t/0",
                serde_json::json!({"type": "approvalDecided", "step": 1,
                "toolCallId": "c1", "decision": {"decision": "approve"}}),
            ),
            entry(
                5,
                "t/0.2",
                serde_json::json!({"type": "agentCancelled", "status": "cancelled"}),
            ),
            // Asked again after a resume: one entry, the later one, with
            // the age of its first ask (issue 34: it restarted at 0).
            entry(6, "t/0.1", asked("c2")),
        ];
        let pending = pending_from_journal(&as_tree("t"), &journal);
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert_eq!(pending[0].tool_call_id, "c2");
        assert_eq!(pending[0].run_id, "t/0.1");
        assert_eq!(pending[0].requested_ms, 20);
        assert_eq!(pending[0].input, serde_json::json!({"text": "hi"}));
    }

    /// A journal folded in two reads (the second from where the first
    /// ended, as a listing goes on from the last) gives what one read of
    /// it all gives.
    #[test]
    fn a_journal_folded_in_parts_gives_what_it_gives_whole() {
        let asked = |call: &str| {
            serde_json::json!({"type": "approvalRequested", "step": 1, "toolCallId": call,
                "tool": "say", "input": {}})
        };
        let journal = [
            entry(1, "t/0.1", asked("c1")),
            entry(2, "t/0.2", asked("c2")),
            entry(
                3,
                "t/0.1",
                serde_json::json!({"type": "approvalDecided", "step": 1,
                "toolCallId": "c1", "decision": {"decision": "approve"}}),
            ),
            entry(4, "t/0.3", asked("c3")),
            entry(
                5,
                "t/0.2",
                serde_json::json!({"type": "agentFailed", "status": "failed"}),
            ),
        ];
        let whole = pending_from_journal(&as_tree("t"), &journal);
        for cut in 0..=journal.len() {
            let mut fold = PendingFold::default();
            fold.apply(&as_tree("t"), &journal[..cut]);
            let read = fold.read;
            let rest: Vec<JournalEntry> =
                journal.iter().filter(|e| e.seq > read).cloned().collect();
            fold.apply(&as_tree("t"), &rest);
            assert_eq!(fold.pending, whole, "cut at {cut}");
            assert_eq!(fold.read, 5);
        }
        assert_eq!(whole.len(), 1, "{whole:?}");
        assert_eq!(whole[0].tool_call_id, "c3");
    }

    #[test]
    fn controls_travel_as_tagged_json_and_back() {
        let controls = [
            ControlBody::Cancel {
                run_id: "t/0.1".parse().unwrap(),
            },
            ControlBody::Steer {
                run_id: "t/0".parse().unwrap(),
                text: "hurry".into(),
            },
            ControlBody::Decide {
                call_id: "t/0-s1-c0".into(),
                decision: Decision::Deny {
                    reason: "no".into(),
                },
            },
            ControlBody::ApproveAlways {
                call_id: "t/0-s1-c0".into(),
            },
            ControlBody::Raise {
                set: Budget::default(),
                add: Budget {
                    max_steps: Some(5),
                    ..Budget::default()
                },
            },
        ];
        for control in controls {
            let json = serde_json::to_value(&control).unwrap();
            assert!(json["control"].is_string(), "{json}");
            assert_eq!(
                serde_json::from_value::<ControlBody>(json).unwrap(),
                control
            );
        }
        let cancel = serde_json::to_value(ControlBody::Cancel {
            run_id: "t/0".parse().unwrap(),
        })
        .unwrap();
        assert_eq!(
            cancel,
            serde_json::json!({"control": "cancel", "runId": "t/0"})
        );
    }
}
