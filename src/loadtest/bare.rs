//! The baselines: bare trees of the same shape as the load test's, with none
//! of Arbor's machinery (no state machine, no events, no model). What a tree
//! of actors, or of tasks, costs by itself.
//!
//! Four kinds ([`BareKind`]), which differ only in what a node holds:
//!
//! - `shared`: the parent's history by reference (one `Arc<[Arc<str>]>` that a
//!   parent builds once for all its children) plus the node's own message, as
//!   Arbor shares its histories. This is the baseline Arbor's ratios are
//!   against.
//! - `none`: no history at all.
//! - `copied`: a deep-copied `Vec<String>` of the parent's messages in every
//!   node (what a runtime without shared histories would do). Kept only to
//!   compare with the figures measured against it before.
//! - `tokio`: the `shared` tree as bare tokio tasks, no ractor: each node is a
//!   spawned task that spawns its children into a `JoinSet` and waits for them.
//!
//! The actor kinds spawn each actor's children linked, one after the other from
//! a task (as Arbor does), wait for their replies, reply to the parent and stop.
//!
//! A tree with a model latency or a live cap ([`Pacing`]) takes Arbor's steps
//! too, as waits: a leaf one, a parent one before its children and one after.
//! What a bare tree reaches there is what the machine allows any runtime.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use arbor_actors::models::Latency;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::task::JoinSet;

/// Which bare tree a baseline runs (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BareKind {
    /// Actors holding the parent's history by reference, plus their own message.
    Shared,
    /// Actors with no history.
    None,
    /// Actors each holding a deep copy of the parent's history.
    Copied,
    /// Tokio tasks (no ractor) holding the history by reference, like `Shared`.
    Tokio,
}

impl BareKind {
    /// Every kind, in the order reports list them (`shared` first: the ratios
    /// that count are against it).
    pub const ALL: [BareKind; 4] = [
        BareKind::Shared,
        BareKind::None,
        BareKind::Copied,
        BareKind::Tokio,
    ];

    /// The kind's name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            BareKind::Shared => "shared",
            BareKind::None => "none",
            BareKind::Copied => "copied",
            BareKind::Tokio => "tokio",
        }
    }

    /// What the kind is, in a few words, for the printed report.
    pub fn label(self) -> &'static str {
        match self {
            BareKind::Shared => "bare ractor, shared history",
            BareKind::None => "bare ractor, no history",
            BareKind::Copied => "bare ractor, copied history",
            BareKind::Tokio => "bare tokio, shared history",
        }
    }
}

impl fmt::Display for BareKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A baseline name that is none of the kinds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown baseline {0:?}: expected shared, none, copied or tokio")]
pub struct UnknownBareKind(pub String);

impl FromStr for BareKind {
    type Err = UnknownBareKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BareKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownBareKind(s.to_owned()))
    }
}

/// What one bare tree did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BareRun {
    /// Nodes that ran, the root included.
    pub nodes: u64,
    /// Most nodes alive (started and not yet finished) at once.
    pub alive_max: usize,
}

/// Counts nodes as they start and finish.
#[derive(Default)]
struct Gauge {
    nodes: AtomicUsize,
    alive: AtomicUsize,
    alive_max: AtomicUsize,
}

impl Gauge {
    fn up(&self) {
        self.nodes.fetch_add(1, Ordering::Relaxed);
        let alive = self.alive.fetch_add(1, Ordering::Relaxed) + 1;
        self.alive_max.fetch_max(alive, Ordering::Relaxed);
    }

    fn down(&self) {
        self.alive.fetch_sub(1, Ordering::Relaxed);
    }

    fn run(&self) -> BareRun {
        BareRun {
            nodes: self.nodes.load(Ordering::Acquire) as u64,
            alive_max: self.alive_max.load(Ordering::Acquire),
        }
    }
}

/// What a bare node's model calls cost, as Arbor's simulated ones do: each
/// step (one for a leaf; for a parent one before its children and one after)
/// waits the load test's `latency` while holding one of `max_live` slots. A
/// child starts only once it has a slot, and a parent gives its slot back
/// while its children run, as Arbor's agents do (semantics §8); a slot is
/// handed out in the order asked for. Without a latency and a cap a tree is
/// not paced: its nodes take no steps.
pub struct Pacing {
    latency: Latency,
    slots: Option<Arc<Semaphore>>,
    /// Steps taken so far: each step's seed for a log-normal latency.
    steps: AtomicU64,
}

impl Pacing {
    /// The pacing of a load test with this latency and live cap; `None` when
    /// there is neither (the tree then runs as fast as it can).
    pub fn new(latency: Latency, max_live: Option<usize>) -> Option<Arc<Pacing>> {
        if latency.is_zero() && max_live.is_none() {
            return None;
        }
        Some(Arc::new(Pacing {
            latency,
            // `max_live` is at most 1,000,000 (the config's range), far
            // below the semaphore's own limit.
            slots: max_live.map(|n| Arc::new(Semaphore::new(n.clamp(1, Semaphore::MAX_PERMITS)))),
            steps: AtomicU64::new(0),
        }))
    }

    /// Waits for a live slot (none to wait for without a cap).
    async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        match &self.slots {
            // The semaphore is never closed.
            Some(slots) => slots.clone().acquire_owned().await.ok(),
            None => None,
        }
    }

    /// One model call: waits the latency.
    async fn step(&self) {
        if !self.latency.is_zero() {
            let seed = self.steps.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(self.latency.sample(seed)).await;
        }
    }
}

/// A live slot under `pacing`'s cap (none for a tree that is not paced).
async fn paced_slot(pacing: &Option<Arc<Pacing>>) -> Option<OwnedSemaphorePermit> {
    match pacing {
        Some(pacing) => pacing.slot().await,
        None => None,
    }
}

/// A node's step (none for a tree that is not paced).
async fn paced_step(pacing: &Option<Arc<Pacing>>) {
    if let Some(pacing) = pacing {
        pacing.step().await;
    }
}

/// A parent's last step, once its children are done, in a slot taken back.
async fn paced_last_step(pacing: &Option<Arc<Pacing>>) {
    let _slot = paced_slot(pacing).await;
    paced_step(pacing).await;
}

/// A node's history.
enum NodeHistory {
    None,
    /// Every message copied into this node.
    Copied(Vec<String>),
    /// The parent's messages, shared with the siblings, and this node's own.
    Shared {
        inherited: Arc<[Arc<str>]>,
        own: Arc<str>,
    },
}

impl NodeHistory {
    /// The history of a parent's children: a deep copy for `Copied`; for
    /// `Shared`, the parent's messages and its own message, built once and
    /// shared by every child.
    fn for_children(&self) -> ChildHistory {
        match self {
            NodeHistory::None => ChildHistory::None,
            NodeHistory::Copied(messages) => ChildHistory::Copied(messages.clone()),
            NodeHistory::Shared { inherited, own } => {
                ChildHistory::Shared(extended(inherited, own))
            }
        }
    }
}

/// `inherited` followed by `own`: what a parent's children inherit.
fn extended(inherited: &[Arc<str>], own: &Arc<str>) -> Arc<[Arc<str>]> {
    inherited
        .iter()
        .cloned()
        .chain(std::iter::once(own.clone()))
        .collect()
}

/// What a parent hands each of its children.
enum ChildHistory {
    None,
    Copied(Vec<String>),
    Shared(Arc<[Arc<str>]>),
}

impl ChildHistory {
    fn child(&self, depth: usize, index: usize) -> NodeHistory {
        match self {
            ChildHistory::None => NodeHistory::None,
            ChildHistory::Copied(messages) => NodeHistory::Copied(messages.clone()),
            ChildHistory::Shared(inherited) => NodeHistory::Shared {
                inherited: inherited.clone(),
                own: prompt(depth, index),
            },
        }
    }
}

/// A child's own message: the task its parent gives it.
fn prompt(depth: usize, index: usize) -> Arc<str> {
    Arc::from(format!("task {index} at depth {depth}"))
}

struct BareNode;

enum BareMsg {
    ChildDone,
}

struct BareArgs {
    shape: Arc<[usize]>,
    depth: usize,
    parent: Option<ActorRef<BareMsg>>,
    done: Option<oneshot::Sender<()>>,
    gauge: Arc<Gauge>,
    history: NodeHistory,
    pacing: Option<Arc<Pacing>>,
    /// The live slot the node was started in (a paced tree with a cap).
    slot: Option<OwnedSemaphorePermit>,
}

struct BareState {
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
        args.gauge.up();
        let waiting = args.shape.get(args.depth).copied().unwrap_or(0);
        Ok(BareState { args, waiting })
    }

    async fn post_start(
        &self,
        myself: ActorRef<BareMsg>,
        state: &mut BareState,
    ) -> Result<(), ActorProcessingErr> {
        // A paced node's first step; a bare node awaits it (no cancel to
        // serve), and gives its slot back after it.
        paced_step(&state.args.pacing).await;
        state.args.slot = None;
        if state.waiting == 0 {
            finish(&myself, state);
            return Ok(());
        }
        let (shape, depth, gauge, pacing) = (
            state.args.shape.clone(),
            state.args.depth + 1,
            state.args.gauge.clone(),
            state.args.pacing.clone(),
        );
        let history = state.args.history.for_children();
        let fanout = state.waiting;
        tokio::spawn(async move {
            for index in 0..fanout {
                let slot = paced_slot(&pacing).await;
                let args = BareArgs {
                    shape: shape.clone(),
                    depth,
                    parent: Some(myself.clone()),
                    done: None,
                    gauge: gauge.clone(),
                    history: history.child(depth, index),
                    pacing: pacing.clone(),
                    slot,
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
                    paced_last_step(&state.args.pacing).await;
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
    state.args.gauge.down();
    if let Some(parent) = &state.args.parent {
        let _ = parent.cast(BareMsg::ChildDone);
    }
    if let Some(done) = state.args.done.take() {
        let _ = done.send(());
    }
    myself.stop(None);
}

/// One node of the tokio tree: spawns its children as tasks, waits for them
/// all, and ends. It holds its history until then, as an actor would.
/// The node's inputs: the tree's shape, its depth, its history (inherited
/// and own), and the tree's gauge, pacing and the node's slot.
struct TokioNode {
    shape: Arc<[usize]>,
    depth: usize,
    inherited: Arc<[Arc<str>]>,
    own: Arc<str>,
    gauge: Arc<Gauge>,
    pacing: Option<Arc<Pacing>>,
    slot: Option<OwnedSemaphorePermit>,
}

fn tokio_node(node: TokioNode) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let TokioNode {
            shape,
            depth,
            inherited,
            own,
            gauge,
            pacing,
            slot,
        } = node;
        gauge.up();
        paced_step(&pacing).await;
        drop(slot);
        let fanout = shape.get(depth).copied().unwrap_or(0);
        if fanout > 0 {
            let children = extended(&inherited, &own);
            let mut set = JoinSet::new();
            for index in 0..fanout {
                let slot = paced_slot(&pacing).await;
                set.spawn(tokio_node(TokioNode {
                    shape: shape.clone(),
                    depth: depth + 1,
                    inherited: children.clone(),
                    own: prompt(depth + 1, index),
                    gauge: gauge.clone(),
                    pacing: pacing.clone(),
                    slot,
                }));
            }
            while set.join_next().await.is_some() {}
            paced_last_step(&pacing).await;
        }
        drop((inherited, own));
        gauge.down();
    })
}

/// Runs a bare tree of `kind` and `shape` whose root starts with `history`
/// messages of `msg_bytes` bytes, its steps paced by `pacing` ([`Pacing::new`];
/// `None`: no steps); returns when every node has finished.
pub async fn run_bare(
    kind: BareKind,
    shape: &[usize],
    history: usize,
    msg_bytes: usize,
    pacing: Option<Arc<Pacing>>,
) -> BareRun {
    let gauge = Arc::new(Gauge::default());
    let messages = || (0..history).map(|_| "x".repeat(msg_bytes));
    let shared = || -> Arc<[Arc<str>]> { messages().map(Arc::from).collect() };
    // The root takes a slot like any node.
    let slot = paced_slot(&pacing).await;
    let history = match kind {
        BareKind::Tokio => {
            // The root is a task too, like every node.
            let root = tokio_node(TokioNode {
                shape: shape.into(),
                depth: 0,
                inherited: shared(),
                own: prompt(0, 0),
                gauge: gauge.clone(),
                pacing,
                slot,
            });
            let _ = tokio::spawn(root).await;
            return gauge.run();
        }
        BareKind::Shared => NodeHistory::Shared {
            inherited: shared(),
            own: prompt(0, 0),
        },
        BareKind::None => NodeHistory::None,
        BareKind::Copied => NodeHistory::Copied(messages().collect()),
    };
    let (tx, rx) = oneshot::channel();
    let args = BareArgs {
        shape: shape.into(),
        depth: 0,
        parent: None,
        done: Some(tx),
        gauge: gauge.clone(),
        history,
        pacing,
        slot,
    };
    if Actor::spawn(None, BareNode, args).await.is_ok() {
        let _ = rx.await;
    }
    gauge.run()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_from_its_name_and_a_wrong_name_lists_them() {
        for kind in BareKind::ALL {
            assert_eq!(kind.name().parse::<BareKind>(), Ok(kind));
        }
        let err = "copy".parse::<BareKind>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown baseline \"copy\": expected shared, none, copied or tokio"
        );
    }

    #[test]
    fn a_shared_history_is_built_once_per_parent_and_shared_by_its_children() {
        let parent = NodeHistory::Shared {
            inherited: vec![Arc::<str>::from("a"), Arc::from("b")].into(),
            own: Arc::from("mine"),
        };
        let children = parent.for_children();
        let (
            NodeHistory::Shared { inherited: one, .. },
            NodeHistory::Shared {
                inherited: two,
                own,
            },
        ) = (children.child(1, 0), children.child(1, 1))
        else {
            panic!("a shared parent has shared children")
        };
        assert!(Arc::ptr_eq(&one, &two), "siblings share one history");
        assert_eq!(
            one.iter().map(|m| &**m).collect::<Vec<_>>(),
            ["a", "b", "mine"]
        );
        assert_eq!(&*own, "task 1 at depth 1");
    }

    /// A paced tree takes the steps of Arbor's: the root one before and one
    /// after its children, each child one, every step 50 ms, at most
    /// `max_live` at once while the root waits with its slot given back. Ten
    /// children at a cap of 4 go in three waves: 50 + 3 × 50 + 50 ms. Without
    /// the cap they would take 150 ms; without the latency, none.
    #[tokio::test(start_paused = true)]
    async fn a_paced_bare_tree_steps_at_its_latency_and_never_runs_more_than_its_cap() {
        let latency = Latency::Fixed(std::time::Duration::from_millis(50));
        for kind in [BareKind::Shared, BareKind::Tokio] {
            let start = tokio::time::Instant::now();
            let run = run_bare(kind, &[10], 2, 10, Pacing::new(latency, Some(4))).await;
            assert_eq!(run.nodes, 11, "{kind}");
            assert_eq!(
                start.elapsed(),
                std::time::Duration::from_millis(250),
                "{kind}: three waves of children between the root's two steps"
            );
            // The root, waiting, and at most 4 children stepping.
            assert!(run.alive_max <= 5, "{kind}: {run:?}");
        }
        let start = tokio::time::Instant::now();
        run_bare(BareKind::Shared, &[10], 2, 10, Pacing::new(latency, None)).await;
        assert_eq!(start.elapsed(), std::time::Duration::from_millis(150));
        assert!(Pacing::new(Latency::Fixed(std::time::Duration::ZERO), None).is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_kind_runs_every_node_of_the_shape() {
        for kind in BareKind::ALL {
            let run = tokio::time::timeout(
                std::time::Duration::from_secs(60),
                run_bare(kind, &[3, 4], 5, 10, None),
            )
            .await
            .unwrap_or_else(|_| panic!("the {kind} tree did not end in 60 s"));
            assert_eq!(run.nodes, 1 + 3 + 12, "{kind}");
            assert!(run.alive_max >= 1 && run.alive_max <= 16, "{kind}: {run:?}");
        }
    }
}
