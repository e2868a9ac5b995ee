//! The baseline: a bare ractor tree of the same shape. Each actor spawns its
//! children linked (from a task, as Arbor does), waits for their replies,
//! replies to its parent and stops. No state machine, no events: what an actor
//! tree costs by itself.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::oneshot;

pub struct BareNode;

pub enum BareMsg {
    ChildDone,
}

pub struct BareArgs {
    shape: Arc<[usize]>,
    depth: usize,
    parent: Option<ActorRef<BareMsg>>,
    done: Option<oneshot::Sender<()>>,
    /// Each node owns a copy of its parent's messages (a deep-copied `Vec`, as a
    /// runtime without shared histories would do).
    history: Vec<String>,
}

pub struct BareState {
    args: BareArgs,
    waiting: usize,
}

impl Actor for BareNode {
    type Msg = BareMsg;
    type State = BareState;
    type Arguments = BareArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<BareMsg>,
        args: BareArgs,
    ) -> Result<BareState, ActorProcessingErr> {
        let waiting = args.shape.get(args.depth).copied().unwrap_or(0);
        Ok(BareState { args, waiting })
    }

    async fn post_start(
        &self,
        myself: ActorRef<BareMsg>,
        state: &mut BareState,
    ) -> Result<(), ActorProcessingErr> {
        if state.waiting == 0 {
            finish(&myself, state);
            return Ok(());
        }
        let (shape, depth, history) = (
            state.args.shape.clone(),
            state.args.depth + 1,
            state.args.history.clone(),
        );
        let fanout = state.waiting;
        tokio::spawn(async move {
            for _ in 0..fanout {
                let args = BareArgs {
                    shape: shape.clone(),
                    depth,
                    parent: Some(myself.clone()),
                    done: None,
                    history: history.clone(),
                };
                if Actor::spawn_linked(None, BareNode, args, myself.get_cell())
                    .await
                    .is_err()
                {
                    let _ = myself.cast(BareMsg::ChildDone);
                }
            }
        });
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<BareMsg>,
        msg: BareMsg,
        state: &mut BareState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            BareMsg::ChildDone => {
                state.waiting -= 1;
                if state.waiting == 0 {
                    finish(&myself, state);
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<BareMsg>,
        _event: SupervisionEvent,
        _state: &mut BareState,
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
}

fn finish(myself: &ActorRef<BareMsg>, state: &mut BareState) {
    if let Some(parent) = &state.args.parent {
        let _ = parent.cast(BareMsg::ChildDone);
    }
    if let Some(done) = state.args.done.take() {
        let _ = done.send(());
    }
    myself.stop(None);
}

/// Runs a bare tree of `shape` whose nodes each carry `history` messages of
/// `msg_bytes` bytes; returns when the root has heard from every child.
pub async fn run_bare_tree(shape: &[usize], history: usize, msg_bytes: usize) {
    let (tx, rx) = oneshot::channel();
    let args = BareArgs {
        shape: shape.into(),
        depth: 0,
        parent: None,
        done: Some(tx),
        history: (0..history).map(|_| "x".repeat(msg_bytes)).collect(),
    };
    if Actor::spawn(None, BareNode, args).await.is_ok() {
        let _ = rx.await;
    }
}
