//! Follow-up turns (semantics §14) and their queue. A turn asked for while
//! its tree runs a turn is decided here, by the request's [`Multitask`]:
//! refused, or queued in the store (`Store::queue_turn`), durably, with the
//! turn number its root will have; `interrupt` also cancels the running
//! turn. A queued turn starts when the turn before it has ended, taken by
//! whichever process finds the tree ended (`Store::take_turn`, which claims
//! the tree in the same transaction): the one that ran the turn before it,
//! one that adopts the tree after its owner died, or (a service) one that
//! looks for ended trees with turns waiting. The decision itself is
//! [`decide_turn`], a plain function.

use arbor_actors::TreeId;
use std::str::FromStr;

use arbor_actors::TreeHooks as _;
use arbor_actors::sync::LockExt as _;
use arbor_actors::{EventKind, RunId};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Supervisor, TreeHandle, not_an_object};
use crate::error::{Error, StoreUse};
use crate::recovery::Recovery;
use crate::store::{QueuedTurn, StoreWriter, TreeRecord};

/// Turns one tree may have queued at once unless set otherwise
/// ([`Supervisor::with_turn_queue_limit`]).
pub const DEFAULT_TURN_QUEUE: usize = 16;

/// What a follow-up turn does when its tree is running a turn already
/// (semantics §14).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Multitask {
    /// Refuse it ([`Error::TurnRunning`]).
    Reject,
    /// Queue it: it starts when the running turn (and every turn queued
    /// before it) has ended.
    #[default]
    Enqueue,
    /// Cancel the running turn (it ends `cancelled`, keeping its partial
    /// state) and queue it: turns queued before it keep their places.
    Interrupt,
}

impl Multitask {
    /// Its name (`reject`, `enqueue`, `interrupt`).
    pub fn as_str(self) -> &'static str {
        match self {
            Multitask::Reject => "reject",
            Multitask::Enqueue => "enqueue",
            Multitask::Interrupt => "interrupt",
        }
    }
}

impl FromStr for Multitask {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reject" => Ok(Multitask::Reject),
            "enqueue" => Ok(Multitask::Enqueue),
            "interrupt" => Ok(Multitask::Interrupt),
            other => Err(format!(
                "{other:?} is not a multitask strategy (reject, enqueue, interrupt)"
            )),
        }
    }
}

/// A follow-up turn asked of a stored tree ([`Supervisor::start_turn`]).
#[derive(Clone, Debug, Default)]
pub struct TurnRequest {
    /// The root's new prompt.
    pub prompt: String,
    /// Params for the root, checked against its input schema.
    pub params: Option<Value>,
    /// What to do when the tree is running a turn.
    pub multitask: Multitask,
    /// Where to post the turn's completion webhook when its run ends (see
    /// [`StartRequest::webhook`](crate::StartRequest::webhook)): kept with
    /// the turn while it waits, then with its run.
    pub webhook: Option<String>,
}

impl TurnRequest {
    /// A turn with this prompt, no params, and the default strategy (`enqueue`).
    pub fn new(prompt: impl Into<String>) -> Self {
        TurnRequest {
            prompt: prompt.into(),
            ..TurnRequest::default()
        }
    }
}

/// Where a tree's turns stand when a turn is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnsNow {
    /// Its last turn ended (completed, failed or cancelled).
    Ended,
    /// A turn is under way: it runs here or in another process, or it was
    /// cut short and waits for its resume.
    Running,
}

/// What becomes of a turn request ([`decide_turn`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnDecision {
    /// Start it now.
    Start,
    /// Queue it behind the running turn and the turns waiting.
    Enqueue,
    /// Cancel the running turn, and queue it.
    Interrupt,
    /// Refuse it: a turn is running and the request said `reject`.
    Reject,
    /// Refuse it: as many turns wait as the tree may hold.
    Full,
}

/// What a follow-up turn asked with `multitask` becomes, when the tree's
/// turns stand as `now` and `queued` turns wait already (a tree holds at
/// most `limit`). An ended tree with none waiting starts it, whatever the
/// strategy; one with turns waiting queues it behind them (nothing runs to
/// interrupt or to be refused for); a running one refuses it (`reject`),
/// or queues it (`enqueue`), or queues it and cancels the running turn
/// (`interrupt`), unless the queue is full.
pub fn decide_turn(
    multitask: Multitask,
    now: TurnsNow,
    queued: usize,
    limit: usize,
) -> TurnDecision {
    match (now, multitask) {
        (TurnsNow::Ended, _) if queued == 0 => TurnDecision::Start,
        (TurnsNow::Running, Multitask::Reject) => TurnDecision::Reject,
        _ if queued >= limit => TurnDecision::Full,
        (TurnsNow::Running, Multitask::Interrupt) => TurnDecision::Interrupt,
        _ => TurnDecision::Enqueue,
    }
}

/// What [`Supervisor::start_turn`] did with a turn.
pub enum TurnStart {
    /// It started here: its handle (its root is `T/0~n`).
    Started(TreeHandle),
    /// It waits in the store for the turns before it to end.
    Queued(Queued),
}

/// A turn [`Supervisor::start_turn`] queued.
#[derive(Clone, Debug)]
pub struct Queued {
    /// The turn as stored: its run id to be (`QueuedTurn::run_id`), its
    /// place in line.
    pub turn: QueuedTurn,
    /// Whether this process runs the tree's turn: then the queued turn is
    /// journaled (a `turnQueued` event of its run) and, with `interrupt`,
    /// the running turn is cancelled here; this process starts it when the
    /// running turn ends, if it takes the tree's next turns
    /// ([`Supervisor::next_turn`]).
    pub here: bool,
    /// With `interrupt` and a turn this process does not run: the run
    /// (the tree's latest root) whose cancel was posted in the store for
    /// the process that runs it, which takes it as it takes `arbor cancel`'s
    /// (nothing is left for the caller to do).
    pub cancel_elsewhere: Option<RunId>,
}

impl Supervisor {
    /// Caps the turns one tree may have queued (default
    /// [`DEFAULT_TURN_QUEUE`]): one more is refused with
    /// [`Error::TurnQueueFull`].
    pub fn with_turn_queue_limit(mut self, limit: usize) -> Self {
        self.turn_queue_limit = limit.max(1);
        self
    }

    /// Asks the stored tree `tree_id` a follow-up turn (semantics §14). If
    /// its last turn ended and no turn waits, the turn starts here at once:
    /// its root goes on from its final state with the request's prompt (and
    /// params) as a new run `T/0~n` of the same agent, in the same tree; its
    /// children are spawned as usual, and the tree's budgets cover all its
    /// turns. Otherwise the request's [`Multitask`] decides ([`decide_turn`]):
    /// refused ([`Error::TurnRunning`], or [`Error::TurnQueueFull`] past the
    /// queue's limit), or queued in the store with the run id its root will
    /// have, journaled as a `turnQueued` event when this process runs the
    /// tree, and started when the turns before it have ended, by whichever
    /// process then takes the tree's next turn ([`next_turn`](Self::next_turn)).
    /// With `interrupt` the running turn is cancelled: here when this
    /// process runs it, else by a cancel control posted in the store for
    /// the process that does. Either way its prompt and params are checked
    /// against the root's template first, so a queued turn is one that can
    /// start.
    pub async fn start_turn(
        &self,
        tree_id: &TreeId,
        request: TurnRequest,
    ) -> Result<TurnStart, Error> {
        let Some((_, writer)) = &self.store else {
            return Err(Error::NoStore {
                needed_for: StoreUse::Turn,
            });
        };
        let here = self.is_running(tree_id);
        if !here {
            // The last turn's end is written before the store is asked if it ended.
            writer.flush().await?;
        }
        let id = tree_id.to_owned();
        let (record, status, waiting) = self
            .read_store(move |store| {
                let (record, summary) = store.tree(&id)?;
                let waiting = store.queued_turns(&id)?.len();
                Ok((record, summary.status, waiting))
            })
            .await?;
        self.check_turn(&record, &request)?;
        let now = if here || !status.is_final() {
            TurnsNow::Running
        } else {
            TurnsNow::Ended
        };
        let decision = decide_turn(request.multitask, now, waiting, self.turn_queue_limit);
        match decision {
            TurnDecision::Reject => {
                return Err(Error::TurnRunning {
                    tree: tree_id.clone(),
                });
            }
            TurnDecision::Full => {
                return Err(Error::TurnQueueFull {
                    tree: tree_id.clone(),
                    limit: self.turn_queue_limit,
                });
            }
            TurnDecision::Start | TurnDecision::Enqueue | TurnDecision::Interrupt => {}
        }
        // Every turn goes through the store's queue, which numbers it; one
        // to start now is taken at once (unless another got in first: then
        // it waits for that one, as queued).
        self.store_takes_writes()?;
        let (id, prompt, params, webhook, limit) = (
            tree_id.to_owned(),
            request.prompt.clone(),
            request.params.clone(),
            request.webhook.clone(),
            self.turn_queue_limit,
        );
        let turn = self
            .read_store(move |store| {
                store.queue_turn(&id, &prompt, params.as_ref(), webhook.as_deref(), limit)
            })
            .await?;
        if decision == TurnDecision::Start
            && let Some((_, handle)) = self.next_turn(tree_id, Some(turn.id)).await?
        {
            return Ok(TurnStart::Started(handle));
        }
        let here = self.journal_queued(&turn);
        let mut cancel_elsewhere = None;
        if decision == TurnDecision::Interrupt && !(here && self.cancel_tree(tree_id)) {
            // Run elsewhere: a cancel control in the store, as every caller
            // (the library, `arbor run --continue`, a replica) interrupts.
            // The turn is queued already: a failed post is logged, not the
            // request's error (a retry would queue it twice), and the caller
            // still learns which run to cancel.
            let (id, run) = (tree_id.to_owned(), record.root_run_id.clone());
            let posted = self
                .read_store(move |store| {
                    store.post_control(&id, &json!({"control": "cancel", "runId": run}))
                })
                .await;
            if let Err(error) = posted {
                tracing::warn!(tree = %tree_id, %error, "the interrupted turn's cancel was not posted");
            }
            cancel_elsewhere = Some(record.root_run_id);
        }
        Ok(TurnStart::Queued(Queued {
            turn,
            here,
            cancel_elsewhere,
        }))
    }

    /// Journals a queued turn as a `turnQueued` event of the run its root
    /// will be, if this process runs its tree's turn now; whether it did.
    /// (A service calls it for a turn another replica queued.)
    pub fn journal_queued(&self, turn: &QueuedTurn) -> bool {
        let ctx = self
            .trees
            .locked()
            .get(turn.tree_id.as_str())
            .and_then(|(ctx, _)| ctx.upgrade());
        let Some(ctx) = ctx else {
            return false;
        };
        let run_id = turn.run_id();
        ctx.emit(
            &run_id,
            EventKind::TurnQueued {
                turn: turn.turn,
                position: turn.position,
                prompt: turn.prompt.as_str().into(),
            },
        );
        true
    }

    /// Starts the next turn queued for the tree `tree_id` (or only the turn
    /// `only`, when it is the next), if the tree's turn has ended and this
    /// process claims it first (`Store::take_turn`); the turn and its
    /// handle, or `None` when there is nothing to start here (none waits,
    /// the tree runs here or elsewhere, or another process got it). A
    /// process that runs a tree's turns calls it when each ends (a service
    /// does, and looks for ended trees with turns waiting). A turn that
    /// cannot start after all (its tree's state cannot be read, its input
    /// no longer fits) is not left claimed: the tree ends failed with the
    /// reason, and a turn that could never start is dropped.
    pub async fn next_turn(
        &self,
        tree_id: &TreeId,
        only: Option<u64>,
    ) -> Result<Option<(QueuedTurn, TreeHandle)>, Error> {
        let Some((_, writer)) = &self.store else {
            return Err(Error::NoStore {
                needed_for: StoreUse::Turn,
            });
        };
        if self.is_running(tree_id) {
            return Ok(None);
        }
        // Most trees have none waiting: one read says so, without a flush
        // or a write (turns are queued in the store directly).
        let id = tree_id.to_owned();
        let waiting = self
            .read_store(move |store| Ok(!store.queued_turns(&id)?.is_empty()))
            .await?;
        if !waiting {
            return Ok(None);
        }
        self.store_takes_writes()?;
        // The last turn's end is written before the store is asked if it ended.
        writer.flush().await?;
        let id = tree_id.to_owned();
        let taken = self
            .read_store(move |store| {
                let Some((turn, epoch)) = store.take_turn(&id, only)? else {
                    return Ok(None);
                };
                let read = store
                    .tree(&id)
                    .and_then(|(record, _)| Ok((record, store.recovery(&id)?)));
                Ok(Some((turn, epoch, read)))
            })
            .await?;
        let Some((turn, epoch, read)) = taken else {
            return Ok(None);
        };
        let started = match read {
            Ok((record, recovery)) => self.start_queued(writer, record, recovery, &turn).await,
            Err(error) => Err(error),
        };
        match started {
            Ok(handle) => Ok(Some((turn, handle))),
            Err(error) => {
                let never = matches!(
                    error,
                    Error::InvalidInput { .. }
                        | Error::UnknownAgent(_)
                        | Error::UnknownModel { .. }
                        | Error::InvalidTemplate { .. }
                        | Error::TreeConfig(_)
                        | Error::NotResumable { .. }
                        | Error::StoreCorrupt { .. }
                        | Error::StoreCorruptId { .. }
                );
                tracing::warn!(tree = %tree_id, run = %turn.run_id(), %error, dropped = never, "a queued turn could not start");
                let (id, reason, queued) = (
                    tree_id.to_owned(),
                    format!("queued turn {} could not start: {error}", turn.run_id()),
                    turn.id,
                );
                let released = self
                    .read_store(move |store| {
                        if never {
                            store.forget_turn(queued)?;
                        }
                        store.fail_claimed(&id, epoch, &reason)
                    })
                    .await;
                if let Err(e) = released {
                    tracing::warn!(tree = %tree_id, error = %e, "cannot release a tree whose queued turn did not start");
                }
                Err(error)
            }
        }
    }

    /// Runs the queued `turn` of a tree this process just claimed for it:
    /// its root goes on from the last turn's final state.
    async fn start_queued(
        &self,
        writer: &StoreWriter,
        record: TreeRecord,
        recovery: Recovery,
        turn: &QueuedTurn,
    ) -> Result<TreeHandle, Error> {
        let root = record.root_run_id.clone();
        let Some((last, _)) = recovery.finished.get(&*root.to_string()).cloned() else {
            return Err(Error::NotResumable {
                tree: record.tree_id.clone(),
                reason: format!("its root {root} has no final state"),
            });
        };
        let tree_id = record.tree_id.clone();
        let mut request = record.request()?;
        request.turn = turn.turn;
        request.prompt = turn.prompt.clone();
        request.params = turn.params.clone();
        request.webhook = turn.webhook.clone();
        request.history = Some(last.message_history.clone());
        self.go_on(writer, &tree_id, request, recovery).await
    }

    /// Whether the turn's prompt and params fit the template the tree's
    /// root runs (as a start checks them), before it is queued.
    fn check_turn(&self, record: &TreeRecord, request: &TurnRequest) -> Result<(), Error> {
        if let Some(url) = &request.webhook {
            crate::request::check_webhook(url)?;
        }
        let config = record.config.clone().or_else(|| self.config.clone());
        let catalog = self.catalog_for(config.as_ref())?;
        let template = catalog
            .find_template(&record.agent)
            .ok_or_else(|| Error::UnknownAgent(record.agent.clone()))?;
        if let Some(kind) = request.params.as_ref().and_then(not_an_object) {
            return Err(Error::InvalidInput {
                agent: template.id.clone(),
                message: format!("params must be a JSON object, not {kind}"),
            });
        }
        template
            .check_input(Some(&request.prompt), request.params.as_ref())
            .map_err(|e| Error::InvalidInput {
                agent: template.id.clone(),
                message: e.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::{Multitask, TurnDecision, TurnsNow, decide_turn};

    /// Every strategy against every state of a tree's turns: an ended tree
    /// with nothing waiting starts the turn whatever was asked; otherwise
    /// `reject` refuses while a turn runs, the queue's bound refuses the
    /// rest, `interrupt` cancels only a turn that runs, and everything else
    /// waits its turn.
    #[test]
    fn the_multitask_decision_table() {
        use Multitask::*;
        use TurnDecision as D;
        use TurnsNow::*;
        let limit = 2;
        let table = [
            // (strategy, tree, queued) → decision
            (Reject, Ended, 0, D::Start),
            (Enqueue, Ended, 0, D::Start),
            (Interrupt, Ended, 0, D::Start),
            (Reject, Ended, 1, D::Enqueue),
            (Enqueue, Ended, 1, D::Enqueue),
            (Interrupt, Ended, 1, D::Enqueue),
            (Enqueue, Ended, 2, D::Full),
            (Reject, Running, 0, D::Reject),
            (Reject, Running, 2, D::Reject),
            (Enqueue, Running, 0, D::Enqueue),
            (Enqueue, Running, 1, D::Enqueue),
            (Enqueue, Running, 2, D::Full),
            (Interrupt, Running, 0, D::Interrupt),
            (Interrupt, Running, 1, D::Interrupt),
            (Interrupt, Running, 2, D::Full),
        ];
        for (multitask, now, queued, expected) in table {
            assert_eq!(
                decide_turn(multitask, now, queued, limit),
                expected,
                "{multitask:?} on a tree {now:?} with {queued} queued"
            );
        }
    }

    #[test]
    fn a_strategy_reads_and_prints_as_its_name() {
        for m in [Multitask::Reject, Multitask::Enqueue, Multitask::Interrupt] {
            assert_eq!(m.as_str().parse::<Multitask>(), Ok(m));
            assert_eq!(
                serde_json::to_value(m).unwrap(),
                serde_json::Value::from(m.as_str())
            );
        }
        assert_eq!(Multitask::default(), Multitask::Enqueue);
        assert!("later".parse::<Multitask>().unwrap_err().contains("later"));
    }
}
