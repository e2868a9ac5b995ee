//! Follow-up turns as the service runs them (semantics §14). The supervisor
//! decides what a turn request becomes (`Supervisor::start_turn`: started,
//! queued in the store, or refused); this module tells another replica of
//! a turn queued behind the turn it runs, and takes the turns queued for
//! trees that run nowhere: at the start, and on every adoption pass (a
//! process that died between a turn's end and the next one's start, a turn
//! queued just as its tree ended). A tree's next turn is otherwise taken by
//! the process that ran the turn before it, as soon as that one ends
//! (`Shared::keep`).

use std::sync::Arc;

use arbor_actors::TreeId;
use arbor_supervisor::Queued;
use arbor_supervisor::store::QueuedTurn;
use serde::{Deserialize, Serialize};

use super::Shared;
use super::replica::{self, ControlBody};

/// Trees with queued turns one pass looks at.
const TAKE_AT_ONCE: usize = 64;

/// What became of a turn request.
pub(crate) enum Answer {
    /// It started here: its tree and root run.
    Started {
        /// The tree.
        tree: TreeId,
        /// The turn's root run (`T/0~n`).
        run_id: arbor_actors::RunId,
    },
    /// It waits for the turns before it to end.
    Queued(QueuedTurn),
}

/// A queued turn as a control carries it to the replica that runs its tree
/// (which journals it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Told {
    /// Its id in the store.
    pub(crate) id: u64,
    /// Its turn number.
    pub(crate) turn: u32,
    /// Its place in line when it was queued.
    pub(crate) position: usize,
    /// Its prompt.
    pub(crate) prompt: String,
}

impl Told {
    /// The queued turn it tells of, of tree `tree_id`.
    pub(crate) fn turn(&self, tree_id: &TreeId) -> QueuedTurn {
        QueuedTurn {
            id: self.id,
            tree_id: tree_id.clone(),
            turn: self.turn,
            prompt: self.prompt.clone(),
            params: None,
            queued_ms: 0,
            position: self.position,
            // (What the journal's event says of it; the store keeps the rest.)
            webhook: None,
        }
    }
}

/// Tells the replica that runs the tree (when another one does) of a turn
/// queued here, to journal it there (for `interrupt`, the supervisor posted
/// the cancel of its turn). Nothing to tell when this process runs the tree
/// (the supervisor journaled it and cancelled the turn).
pub(crate) async fn tell_queued(shared: &Shared, queued: &Queued) {
    if queued.here {
        return;
    }
    let tree = &queued.turn.tree_id;
    let control = ControlBody::TurnQueued(Told {
        id: queued.turn.id,
        turn: queued.turn.turn,
        position: queued.turn.position,
        prompt: queued.turn.prompt.clone(),
    });
    if let Err(error) = replica::forward(shared, tree, &control).await {
        tracing::warn!(tree = %tree, ?control, error = %error.message, "cannot tell the tree's replica of a queued turn");
    }
}

/// Journals a turn another replica queued behind the turn this one runs,
/// if it still waits (not journaled when it has started meanwhile).
pub(crate) async fn journal_told(
    shared: &Shared,
    tree_id: &TreeId,
    told: &Told,
) -> Result<(), arbor_supervisor::Error> {
    let supervisor = shared.runtime.supervisor();
    let (tree, id) = (tree_id.to_owned(), told.id);
    let waits = supervisor
        .read_store(move |store| Ok(store.queued_turns(&tree)?.iter().any(|q| q.id == id)))
        .await?;
    if waits && !supervisor.journal_queued(&told.turn(tree_id)) {
        return Err(arbor_supervisor::Error::UnknownTree(tree_id.clone()));
    }
    Ok(())
}

/// Takes the turns queued for trees whose turn has ended and that no
/// process runs (each tree's next turn, started here if this process claims
/// it first). Called on start and on every adoption pass.
pub(crate) async fn take_waiting(shared: &Arc<Shared>) {
    let supervisor = shared.runtime.supervisor();
    if supervisor.store_takes_writes().is_err() {
        return;
    }
    let trees = supervisor
        .read_store(|store| store.trees_with_queued_turns(TAKE_AT_ONCE))
        .await;
    let trees = match trees {
        Ok(trees) => trees,
        Err(error) => {
            tracing::warn!(%error, "cannot list the trees with queued turns");
            return;
        }
    };
    for tree in trees {
        if !supervisor.is_running(&tree) {
            shared.next_turns(&tree).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree id from a test's literal.
    fn as_tree(id: &str) -> TreeId {
        id.parse().unwrap()
    }

    #[test]
    fn a_queued_turn_travels_as_a_tagged_control_and_back() {
        let control = ControlBody::TurnQueued(Told {
            id: 7,
            turn: 2,
            position: 1,
            prompt: "and then?".into(),
        });
        let json = serde_json::to_value(&control).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"control": "turnQueued", "id": 7, "turn": 2, "position": 1,
                "prompt": "and then?"})
        );
        assert_eq!(
            serde_json::from_value::<ControlBody>(json).unwrap(),
            control
        );
        let ControlBody::TurnQueued(told) = control else {
            unreachable!()
        };
        assert_eq!(told.turn(&as_tree("t")).run_id(), "t/0~2");
    }
}
