//! Requests on a stored tree from any process that has its store (`arbor
//! cancel`, `arbor budget` on a store): carried out here when this process
//! runs the tree, posted in the store for the live process that runs it, or,
//! when nobody runs it, decided from the store.
//!
//! A cancel of a tree nobody runs (it was interrupted) stores it as
//! cancelled, so that no process resumes or adopts it.

use std::fmt;
use std::str::FromStr;

use arbor_actors::sync::LockExt as _;
use arbor_actors::{IdError, RunId, TreeId};
use serde_json::json;

use super::Supervisor;
use crate::Raised;
use crate::error::Error;
use crate::limits::Budget;
use crate::store::TreeStatus;

/// What [`Supervisor::raise_stored`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum BudgetOutcome {
    /// This process runs the tree: raised here; the budgets now in force.
    Here(Raised),
    /// Another process runs the tree (or will, once it resumes or adopts
    /// it): the raise was posted in the store for it, which applies it at
    /// its next look.
    Posted {
        /// The process that runs the tree (`scope:pid`); `None` while nobody does.
        owner: Option<String>,
    },
}

/// What a cancel names ([`Supervisor::cancel_stored`]): a whole tree (its
/// latest turn), or one run of a tree and its subtree. Read from text at the
/// edge (`arbor cancel ID`): an id with a `/` is a run id, any other a tree id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The whole tree.
    Tree(TreeId),
    /// One run and its subtree.
    Run(RunId),
}

impl Target {
    /// The tree the target is of.
    pub fn tree(&self) -> &TreeId {
        match self {
            Target::Tree(tree) => tree,
            Target::Run(run) => run.tree(),
        }
    }
}

impl FromStr for Target {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, IdError> {
        if s.contains('/') {
            s.parse().map(Target::Run)
        } else {
            s.parse().map(Target::Tree)
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Tree(tree) => tree.fmt(f),
            Target::Run(run) => run.fmt(f),
        }
    }
}

/// What [`Supervisor::cancel_stored`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// This process runs it: cancelled here (it ends as cancelled).
    Here,
    /// Another live process runs its tree: a cancel was posted in the store
    /// for it (`Store::post_control`), which it takes at its next look.
    Posted {
        /// The process that runs the tree (`scope:pid`).
        owner: String,
    },
    /// Nobody ran the tree (it was interrupted): it is stored as cancelled,
    /// so no process resumes or adopts it.
    Ended,
}

/// How a cancel of a stored tree is carried out ([`plan_cancel`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CancelPlan {
    /// A live process runs the tree: post a cancel for it.
    Post,
    /// Nobody runs it: claim it and store it as cancelled.
    EndStored,
}

/// How to cancel `target` (of a tree whose latest root is `root`) of a
/// tree stored with `status`, that a live process runs (`owned`) or not.
/// Refused for a tree that has ended, and for a run below the root of a
/// tree nobody runs (only a running tree can cancel part of itself).
pub(crate) fn plan_cancel(
    target: &Target,
    root: &RunId,
    status: TreeStatus,
    owned: bool,
) -> Result<CancelPlan, Error> {
    let tree_id = target.tree();
    let refused = |reason: String| Error::CancelRefused {
        id: target.to_string(),
        reason,
    };
    if status.is_final() {
        return Err(refused(format!(
            "tree {tree_id} has already ended ({status})"
        )));
    }
    if owned {
        return Ok(CancelPlan::Post);
    }
    if matches!(target, Target::Run(run) if run != root) {
        return Err(refused(format!(
            "nobody runs tree {tree_id} (it is interrupted): cancel the whole tree \
             (arbor cancel {tree_id}) or resume it first"
        )));
    }
    Ok(CancelPlan::EndStored)
}

/// The reason a tree cancelled while nobody ran it is stored with.
const ENDED_REASON: &str = "cancelled while interrupted (arbor cancel)";

impl Supervisor {
    /// Cancels `target` (a whole tree, or a run and its subtree) wherever
    /// its tree is: here ([`Supervisor::cancel_run`]), in the live process
    /// that runs it (a cancel posted in the store), or, when nobody runs it,
    /// by storing the tree as cancelled. Refused ([`Error::CancelRefused`])
    /// for a tree that has ended; [`Error::UnknownTree`] /
    /// [`Error::UnknownRun`] for one the store does not have.
    pub async fn cancel_stored(&self, target: &Target) -> Result<CancelOutcome, Error> {
        let tree_id = target.tree().clone();
        if self.is_running(&tree_id) {
            let run = match target {
                Target::Run(run) => run.clone(),
                Target::Tree(_) => {
                    self.read_store(move |store| Ok(store.tree(&tree_id)?.0.root_run_id))
                        .await?
                }
            };
            self.cancel_run(&run)?;
            return Ok(CancelOutcome::Here);
        }
        let target = target.clone();
        self.read_store_now(move |store| {
            let (record, summary) = store.tree(&tree_id)?;
            if let Target::Run(run) = &target {
                store.run(run)?;
            }
            let owner = store.owner(&tree_id)?;
            let run = match &target {
                Target::Run(run) => run.clone(),
                Target::Tree(_) => record.root_run_id.clone(),
            };
            let cancel = json!({"control": "cancel", "runId": run});
            match plan_cancel(
                &target,
                &record.root_run_id,
                summary.status,
                owner.is_some(),
            )? {
                CancelPlan::Post => {
                    store.post_control(&tree_id, &cancel)?;
                    Ok(CancelOutcome::Posted {
                        owner: owner.map(|o| o.owner).unwrap_or_default(),
                    })
                }
                CancelPlan::EndStored => match store.claim(&tree_id) {
                    Ok(epoch) => {
                        store.cancel_claimed(&tree_id, epoch, ENDED_REASON)?;
                        Ok(CancelOutcome::Ended)
                    }
                    // Taken up meanwhile (an `arbor serve` adopted it): the
                    // cancel goes to the process that runs it now.
                    Err(Error::NotResumable { .. }) => {
                        // Or ended meanwhile: refused as an ended tree is.
                        let status = store.status(&tree_id)?;
                        plan_cancel(&target, &record.root_run_id, status, true)?;
                        let owner = store.owner(&tree_id)?.map(|o| o.owner);
                        store.post_control(&tree_id, &cancel)?;
                        Ok(CancelOutcome::Posted {
                            owner: owner.unwrap_or_default(),
                        })
                    }
                    Err(error) => Err(error),
                },
            }
        })
        .await
    }
}

impl Supervisor {
    /// The budgets in force for the tree `tree_id` (semantics §13): its
    /// limits with every raise over them, read from this process when it
    /// runs the tree, else from the store (for a tree that has ended too).
    pub async fn budgets(&self, tree_id: &TreeId) -> Result<Raised, Error> {
        let here = self
            .trees
            .locked()
            .get(tree_id.as_str())
            .and_then(|(ctx, _)| ctx.upgrade());
        if let Some(ctx) = here {
            return Ok(ctx.budget.budgets());
        }
        let tree = tree_id.to_owned();
        self.read_store_now(move |store| {
            let (record, _) = store.tree(&tree)?;
            let raised = store.recovery(&tree)?.raised;
            let budget = Budget::new(record.limits);
            budget.restore_raised(raised);
            Ok(budget.budgets())
        })
        .await
    }

    /// Raises the budgets of the tree `tree_id` wherever it runs: here
    /// ([`Supervisor::raise_limits`]), or posted in the store for the
    /// process that runs it (or resumes it). Refused for a raise of nothing
    /// or one that cannot be in force, as `raise_limits` refuses them, and
    /// ([`Error::RaiseEnded`]) for a tree that has ended.
    pub async fn raise_stored(
        &self,
        tree_id: &TreeId,
        set: Raised,
        add: Raised,
    ) -> Result<BudgetOutcome, Error> {
        if set.is_empty() && add.is_empty() {
            return Err(Error::NothingRaised);
        }
        Raised::check_raise(&set, &add)?;
        if self.is_running(tree_id) {
            return Ok(BudgetOutcome::Here(self.raise_limits(tree_id, set, add)?));
        }
        let tree = tree_id.to_owned();
        self.read_store_now(move |store| {
            let status = store.status(&tree)?;
            if status.is_final() {
                return Err(Error::RaiseEnded {
                    tree: tree.clone(),
                    status,
                });
            }
            let owner = store.owner(&tree)?.map(|o| o.owner);
            let budget = |r: Raised| {
                json!({"maxSteps": r.max_steps, "maxTokens": r.max_tokens, "maxCredits": r.max_credits})
            };
            store.post_control(
                &tree,
                &json!({"control": "raise", "set": budget(set), "add": budget(add)}),
            )?;
            Ok(BudgetOutcome::Posted { owner })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::{CancelPlan, Target, plan_cancel};
    use crate::store::TreeStatus;

    #[test]
    fn a_running_tree_is_told_an_interrupted_one_is_ended_and_an_ended_one_refused() {
        let plan = |id: &str, status, owned| {
            let target: Target = id.parse().unwrap();
            plan_cancel(&target, &"t/0~1".parse().unwrap(), status, owned)
        };
        assert_eq!(
            plan("t", TreeStatus::Running, true).unwrap(),
            CancelPlan::Post
        );
        assert_eq!(
            plan("t/0.2", TreeStatus::Running, true).unwrap(),
            CancelPlan::Post
        );
        assert_eq!(
            plan("t", TreeStatus::Interrupted, false).unwrap(),
            CancelPlan::EndStored
        );
        assert_eq!(
            plan("t/0~1", TreeStatus::Interrupted, false).unwrap(),
            CancelPlan::EndStored
        );
        let part = plan("t/0~1.2", TreeStatus::Interrupted, false).unwrap_err();
        assert!(part.to_string().contains("cancel the whole tree"), "{part}");
        let ended = plan("t", TreeStatus::Completed, false).unwrap_err();
        assert_eq!(
            ended.to_string(),
            "cannot cancel t: tree t has already ended (completed)"
        );
    }
}
