//! "Apply it here, or forward it to the replica that runs the tree", written
//! once for every control route (cancel, steer, a decision, decisions over
//! many calls, a budget raise): [`here_or_forward`] tries the route's own
//! work and, when this process does not run the tree, posts the control for
//! the replica that does.

use arbor_actors::TreeId;
use arbor_actors::approval::Decision;
use arbor_supervisor::Error;
use serde::Serialize;
use utoipa::ToSchema;

use crate::Shared;
use crate::error::ApiError;
use crate::replica::{self, ControlBody, Route};

/// A control (cancel, decision, message, budget) for a tree another replica
/// of the service runs: posted to the shared store, applied by that replica.
#[derive(Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Forwarded {
    /// The replica that runs the tree (`scope:pid`); `null` while the tree
    /// waits to be adopted (its owner is gone), for the replica that adopts it.
    pub forwarded_to: Option<String>,
    /// What happened, in words.
    pub note: String,
}

impl Forwarded {
    fn to(owner: Option<String>) -> Forwarded {
        Forwarded {
            note: replica::forwarded_note(&owner),
            forwarded_to: owner,
        }
    }
}

/// The control a route applies, as it is posted for another replica.
pub(super) enum Control<'a> {
    /// One control.
    One(ControlBody),
    /// One decision over the calls of the tree waiting now (of `tool` only,
    /// when set): posted as one `Decide` per call the tree's journal has
    /// waiting (that replica checks each call).
    DecideWaiting {
        /// The decision on each.
        decision: &'a Decision,
        /// Only the calls of this tool.
        tool: Option<&'a str>,
        /// "Always allow": one `ApproveAlways` is posted per tool (its first
        /// call's), which approves the tool's other calls with it.
        always: bool,
    },
}

/// Where a control was applied.
pub(super) enum Applied<T> {
    /// Here: what the route's own work answered.
    Here(T),
    /// Posted for the replica that runs the tree.
    Forwarded {
        /// Where it went, as the answer names it.
        to: Forwarded,
        /// The calls decided (`Control::DecideWaiting`), oldest first;
        /// empty for `Control::One`.
        calls: Vec<String>,
    },
    /// Neither: this process does not run what the control names, and no
    /// other replica runs the tree (it has ended, or there is none). The
    /// supervisor's refusal, for the route to word.
    Refused(arbor_supervisor::Error),
}

/// Whether the supervisor refused a control as not its own (it runs no such
/// run, tree or waiting call), so that the replica that runs the tree may
/// take it; any other refusal is the request's own (an empty message, a
/// raise of nothing or of a budget that cannot be in force, a run that has
/// ended) and is answered here as the owner would answer it.
fn not_here(refused: &Error) -> bool {
    matches!(
        refused,
        Error::UnknownRun(_) | Error::UnknownTree(_) | Error::UnknownApproval { .. }
    )
}

/// Applies a control to `tree_id`: `here` (the route's own work through
/// this process's supervisor) first; when that refuses it as not this
/// process's (an unknown run, tree or call) and another replica runs the
/// tree (or will adopt it), `control` is posted to the store for that
/// replica. Any other refusal of `here` stands ([`not_here`]).
pub(super) async fn here_or_forward<T>(
    shared: &Shared,
    tree_id: &TreeId,
    control: Control<'_>,
    here: impl Future<Output = Result<T, Error>>,
) -> Result<Applied<T>, ApiError> {
    let refused = match here.await {
        Ok(answer) => return Ok(Applied::Here(answer)),
        Err(refused) if not_here(&refused) => refused,
        Err(error) => return Err(error.into()),
    };
    let Route::Forward { owner } = replica::locate(shared, tree_id).await? else {
        return Ok(Applied::Refused(refused));
    };
    let calls = match control {
        Control::One(body) => {
            replica::forward(shared, tree_id, &body).await?;
            Vec::new()
        }
        Control::DecideWaiting {
            decision,
            tool,
            always,
        } => {
            let tree = tree_id.to_owned();
            let journal = shared
                .runtime
                .supervisor()
                .read_store(move |store| store.events(&tree, 0))
                .await?;
            let mut calls = Vec::new();
            let mut allowed = std::collections::HashSet::new();
            for call in replica::pending_from_journal(tree_id, &journal) {
                if tool.is_some_and(|t| t != call.tool) {
                    continue;
                }
                let body = match always {
                    false => Some(ControlBody::Decide {
                        call_id: call.tool_call_id.clone(),
                        decision: decision.clone(),
                    }),
                    true => allowed
                        .insert(call.tool.clone())
                        .then(|| ControlBody::ApproveAlways {
                            call_id: call.tool_call_id.clone(),
                        }),
                };
                if let Some(body) = body {
                    replica::forward(shared, tree_id, &body).await?;
                }
                calls.push(call.tool_call_id);
            }
            calls
        }
    };
    Ok(Applied::Forwarded {
        to: Forwarded::to(owner),
        calls,
    })
}

#[cfg(test)]
mod tests {
    use arbor_actors::steer::SteerRefused;
    use arbor_supervisor::{Error, RaiseRefused};

    use super::not_here;

    /// Only "not run here" goes to the replica that runs the tree; a request
    /// the owner would refuse as well (a raise of nothing, an empty message)
    /// is refused here instead of answered 202 and refused there unseen.
    #[test]
    fn a_raise_of_nothing_or_an_empty_message_is_refused_here_not_forwarded() {
        for forwarded in [
            Error::UnknownRun("t1/0".parse().unwrap()),
            Error::UnknownTree("t1".parse().unwrap()),
            Error::UnknownApproval {
                tree_id: "t1".parse().unwrap(),
                call_id: "c".into(),
            },
        ] {
            assert!(not_here(&forwarded), "{forwarded}");
        }
        for refused in [
            Error::NothingRaised,
            Error::RaiseRefused(RaiseRefused::Zero),
            Error::SteerRefused {
                run_id: "t1/0".parse().unwrap(),
                reason: SteerRefused::Empty,
            },
        ] {
            assert!(!not_here(&refused), "{refused}");
        }
    }
}
