//! Control of running trees: decisions on waiting tool calls, steering,
//! cancelling a run or a tree, raising a tree's budgets, and waiting for a
//! tree to end.

use std::sync::Arc;

use arbor_actors::approval::{DecideRefused, Decision};
use arbor_actors::steer::SteerRefused;
use arbor_actors::sync::LockExt as _;
use arbor_actors::{AgentMsg, CancelReason, RunId, TreeId};

use super::Supervisor;
use crate::Raised;
use crate::error::Error;

impl Supervisor {
    /// The tool calls that wait for a person's decision (semantics §12), in
    /// one tree or in all, oldest first. A restarted tree's are listed again
    /// once its agents are back at the waiting step.
    pub fn approvals(&self, tree_id: Option<&TreeId>) -> Vec<crate::PendingApproval> {
        self.approvals.list(tree_id)
    }

    /// Decides on the waiting call `call_id` of tree `tree_id`: approve (with
    /// the model's input, or an edited one checked against the tool's schema)
    /// or deny with a reason (the model reads it). Journaled as an
    /// `approvalDecided` event; once a step's last decision is in, its calls go on.
    pub async fn decide(
        &self,
        tree_id: &TreeId,
        call_id: &str,
        decision: Decision,
    ) -> Result<(), Error> {
        let refused = |reason| Error::DecisionRefused {
            tree_id: tree_id.clone(),
            call_id: call_id.to_owned(),
            reason,
        };
        let unknown = || Error::UnknownApproval {
            tree_id: tree_id.clone(),
            call_id: call_id.to_owned(),
        };
        let Some(run_id) = self.approvals.run_of(tree_id, call_id) else {
            // A call of a tree that has ended (cancelled, say) waits for
            // nothing any more: refused as ended (409), not unknown (404).
            return Err(match self.asked_and_ended(tree_id, call_id).await {
                true => refused(DecideRefused::Ended),
                false => unknown(),
            });
        };
        let actor = self.live_actor(&run_id).ok_or_else(unknown)?;
        let call_id = call_id.to_owned();
        match ractor::call!(actor, |reply| AgentMsg::Decide {
            call_id: call_id.clone(),
            decision: Box::new(decision),
            reply
        }) {
            Ok(answer) => answer.map_err(refused),
            Err(_) => Err(refused(DecideRefused::Ended)),
        }
    }

    /// One decision over many calls (semantics §12): every call of tree
    /// `tree_id` waiting now, or every one of the tool `tool`, gets
    /// `decision`, each as its own journaled `approvalDecided` event (so a
    /// restart takes them as recorded). An edited input is one call's:
    /// refused here. Returns the calls decided, oldest first; a tree with
    /// none waiting is refused as [`Error::UnknownApproval`] naming `*` (or
    /// as ended, when it has).
    pub async fn decide_all(
        &self,
        tree_id: &TreeId,
        tool: Option<&str>,
        decision: Decision,
    ) -> Result<Vec<String>, Error> {
        let label = tool.map_or_else(|| "*".to_owned(), |t| format!("* ({t})"));
        if let Decision::Approve { input: Some(_) } = decision {
            return Err(Error::DecisionRefused {
                tree_id: tree_id.clone(),
                call_id: label,
                reason: DecideRefused::InvalidInput(
                    "an edited input is one call's: approve the calls one by one".into(),
                ),
            });
        }
        let calls = self.approvals.covered(tree_id, tool);
        if calls.is_empty() {
            return Err(match self.tree_ended(tree_id).await {
                true => Error::DecisionRefused {
                    tree_id: tree_id.clone(),
                    call_id: label,
                    reason: DecideRefused::Ended,
                },
                false => Error::UnknownApproval {
                    tree_id: tree_id.clone(),
                    call_id: label,
                },
            });
        }
        let mut decided = Vec::with_capacity(calls.len());
        for call in calls {
            // A call whose run ended meanwhile is no longer decided.
            match self.decide(tree_id, &call, decision.clone()).await {
                Ok(()) => decided.push(call),
                Err(Error::UnknownApproval { .. } | Error::DecisionRefused { .. }) => {}
                Err(other) => return Err(other),
            }
        }
        Ok(decided)
    }

    /// Whether the call `call_id` of tree `tree_id` was asked for and never
    /// decided, and the tree has ended (a cancelled tree's waiting call): a
    /// decision on it is refused as ended. A call decided already waits
    /// for nothing: that one is unknown. Without a store, whether the tree
    /// has ended ([`tree_ended`](Self::tree_ended)).
    async fn asked_and_ended(&self, tree_id: &TreeId, call_id: &str) -> bool {
        if self.store.is_none() || self.is_running(tree_id) {
            return self.tree_ended(tree_id).await;
        }
        let (tree, call) = (tree_id.to_owned(), call_id.to_owned());
        self.read_store_now(move |store| {
            if !store.status(&tree)?.is_final() {
                return Ok(false);
            }
            let journal = store.events(&tree, 0)?;
            let of_call = |kind: arbor_actors::EventType| {
                journal.iter().any(|e| {
                    e.kind == kind
                        && e.body.get("toolCallId").and_then(serde_json::Value::as_str)
                            == Some(call.as_str())
                })
            };
            Ok(of_call(arbor_actors::EventType::ApprovalRequested)
                && !of_call(arbor_actors::EventType::ApprovalDecided))
        })
        .await
        .unwrap_or(false)
    }

    /// Whether the tree `tree_id` has ended: it does not run here, and the
    /// store has it ended (or, without a store, its root's final state is
    /// still kept).
    async fn tree_ended(&self, tree_id: &TreeId) -> bool {
        if self.is_running(tree_id) {
            return false;
        }
        if self.store.is_none() {
            return tree_id
                .parse::<TreeId>()
                .is_ok_and(|tree| self.finished_state(&tree.root()).is_some());
        }
        let tree = tree_id.to_owned();
        self.read_store_now(move |store| store.status(&tree))
            .await
            .is_ok_and(|status| status.is_final())
    }

    /// Cancels a run and its whole subtree; its parent sees it as cancelled.
    /// Cancels a running run and its subtree. A child that is spawned but
    /// has not started (it waits for a live slot, or for a retry) ends
    /// cancelled without starting: its parent is told.
    pub fn cancel_run(&self, run_id: &RunId) -> Result<(), Error> {
        let unknown = || Error::UnknownRun(run_id.clone());
        if let Some(actor) = self.live_actor(run_id) {
            return actor
                .cast(AgentMsg::Cancel(CancelReason::Requested))
                .map_err(|_| unknown());
        }
        // An ended child is no waiting one, though its parent still runs.
        if self.finished_state(run_id).is_some() {
            return Err(unknown());
        }
        let parent = self
            .contexts()
            .iter()
            .find_map(|c| {
                let parent = c.waiting_parent(run_id)?;
                c.live_actor(&parent)
            })
            .ok_or_else(unknown)?;
        parent
            .cast(AgentMsg::CancelChild {
                run_id: run_id.clone(),
            })
            .map_err(|_| unknown())
    }

    /// Sends a running agent a steering message (semantics §9): it joins
    /// the agent's history at its next step boundary and is journaled as a
    /// `steered` event. Refused for a run that has ended, has not started, or
    /// an empty message, and for one more message than the run may hold
    /// before it takes them ([`Supervisor::with_steer_limits`]);
    /// [`Error::UnknownRun`] for a run this supervisor does not run or keep.
    pub async fn steer(&self, run_id: &RunId, text: &str) -> Result<(), Error> {
        let refused = |reason| Error::SteerRefused {
            run_id: run_id.clone(),
            reason,
        };
        if text.trim().is_empty() {
            return Err(refused(SteerRefused::Empty));
        }
        let Some(actor) = self.live_actor(run_id) else {
            if self.finished_state(run_id).is_some() {
                return Err(refused(SteerRefused::Ended));
            }
            let waiting = self
                .contexts()
                .iter()
                .any(|c| c.waiting_parent(run_id).is_some());
            if waiting {
                return Err(refused(SteerRefused::NotStarted));
            }
            return Err(Error::UnknownRun(run_id.clone()));
        };
        let (text, limits): (Arc<str>, _) = (text.into(), self.steer_limits);
        match ractor::call!(actor, |reply| AgentMsg::Steer {
            text,
            limits,
            reply
        }) {
            Ok(answer) => answer.map_err(refused),
            // The actor stopped between the lookup and the call: it ended.
            Err(_) => Err(refused(SteerRefused::Ended)),
        }
    }

    /// Sets the budgets `set` names and adds `add` to the ones in force, for
    /// the running tree `tree_id` (semantics §13): its agents paused on a
    /// spent budget try their step again. The change is a `limitsRaised`
    /// event, so a resumed tree keeps it. Returns the budgets now in force.
    /// Refused for a raise of nothing ([`Error::NothingRaised`]) or one that
    /// cannot be in force ([`Error::RaiseRefused`], see [`Raised::check_raise`]).
    pub fn raise_limits(
        &self,
        tree_id: &TreeId,
        set: Raised,
        add: Raised,
    ) -> Result<Raised, Error> {
        if set.is_empty() && add.is_empty() {
            return Err(Error::NothingRaised);
        }
        Raised::check_raise(&set, &add)?;
        let ctx = self
            .trees
            .locked()
            .get(tree_id.as_str())
            .and_then(|(ctx, _)| ctx.upgrade())
            .ok_or_else(|| Error::UnknownTree(tree_id.clone()))?;
        Ok(ctx.raise(set, add)?)
    }

    /// Cancels the running tree `tree_id` (its root and so its whole
    /// subtree); `false` when it does not run here.
    pub fn cancel_tree(&self, tree_id: &TreeId) -> bool {
        let root = self
            .trees
            .locked()
            .get(tree_id.as_str())
            .filter(|(ctx, _)| ctx.strong_count() > 0)
            .map(|(_, root)| root.clone());
        match root {
            Some(root) => root.cast(AgentMsg::Cancel(CancelReason::Requested)).is_ok(),
            None => false,
        }
    }

    /// Waits until the tree `tree_id` no longer runs here (at once if it
    /// does not): every agent and every handle of it is gone.
    pub async fn until_ended(&self, tree_id: &TreeId) {
        let rx = self.gone.locked().get(tree_id.as_str()).cloned();
        if let Some(mut rx) = rx {
            let _ = rx.wait_for(|gone| *gone).await;
        }
    }
}
