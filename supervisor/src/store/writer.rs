//! The writer that feeds a store from the supervisor, on a thread of its
//! own, in batches, off the agents' path; and its health, which the
//! supervisor, the agents and a service read.
//!
//! A store that is down for a while (a database restart, a terminated
//! connection, a full disk) is not a failure: the writer keeps the batch
//! and tries it again with backoff until it goes through. Meanwhile the
//! agents take no new model step (`WriterHealth::ready`), no tree starts or
//! is claimed here, and readiness says why. Only when it stays down past
//! `fail_after` does the writer give up: it releases this process's trees
//! (written as soon as the store answers again; another process adopts
//! them), stops them here, and reports the failure (a service then fails
//! its health check, so an orchestrator restarts it).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arbor_actors::sync::LockExt;
use arbor_actors::{RunId, TreeId};
use futures::future::BoxFuture;
use tokio::sync::{Notify, oneshot};

use super::{Fenced, Store, Write};
use crate::error::Error;

enum Msg {
    Write(Write),
    Flush(oneshot::Sender<Result<(), String>>),
}

/// How long the store may stay down before the writer gives up, unless
/// configured (`Supervisor::with_store_fail_after`).
pub const DEFAULT_FAIL_AFTER: Duration = Duration::from_secs(60);
/// The first wait before a batch is tried again; it doubles up to
/// `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The store is down: why, since when, and whether freeing disk space
/// brings it back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreDown {
    /// The store (a file, or a URL without its password).
    pub path: String,
    /// What the store or the system said.
    pub reason: String,
    /// Whether its disk is full.
    pub disk_full: bool,
    /// How long it has been down, in milliseconds.
    pub for_ms: u64,
}

impl StoreDown {
    /// As the error a start or a claim refused meanwhile gets.
    pub fn to_error(&self) -> Error {
        Error::StoreUnavailable {
            path: self.path.clone(),
            reason: format!(
                "{} (down for {:.1} s)",
                self.reason,
                self.for_ms as f64 / 1000.0
            ),
            disk_full: self.disk_full,
        }
    }
}

impl std::fmt::Display for StoreDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.to_error().fmt(f)
    }
}

/// What the writer knows of the store's health, shared with the supervisor
/// and the trees' agents.
pub(crate) struct WriterHealth {
    /// The clock `last_ok` counts on.
    base: Instant,
    /// When (ms on `base`) the last batch that went through began: its
    /// heartbeats are at least that fresh.
    last_ok: AtomicU64,
    /// How long after `last_ok` another process might claim this one's
    /// trees, less a margin: past it, agents wait for the next write.
    fresh_ms: u64,
    /// Why the store is down, and since when; `None` while it takes writes.
    down: Mutex<Option<(Instant, StoreDown)>>,
    /// Whether `down` is `Some` (read without the lock, at every step).
    is_down: AtomicBool,
    /// How long it may stay down before the writer gives up, in ms.
    fail_after_ms: AtomicU64,
    /// Woken at every write that went through.
    written: Notify,
    /// Set when the writer is dropped: it stops trying a store that is down.
    closing: AtomicBool,
    /// Trees another process claimed after this one (the writer's record,
    /// set before the write that found it counts as written): they are
    /// never ready here, whatever the store does.
    fenced: Arc<Mutex<HashMap<TreeId, Fenced>>>,
}

impl WriterHealth {
    /// A writer's health; `lease_ms` is the store's lease (how long another
    /// process waits after the last heartbeat before it may claim a tree).
    pub(crate) fn new(lease_ms: u64, fail_after: Duration) -> Arc<Self> {
        Arc::new(WriterHealth {
            base: Instant::now(),
            last_ok: AtomicU64::new(0),
            fresh_ms: (lease_ms / 2).max(1),
            down: Mutex::new(None),
            is_down: AtomicBool::new(false),
            fail_after_ms: AtomicU64::new(fail_after.as_millis() as u64),
            written: Notify::new(),
            closing: AtomicBool::new(false),
            fenced: Arc::default(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    /// Sets how long the store may stay down before the writer gives up.
    pub(crate) fn set_fail_after(&self, fail_after: Duration) {
        self.fail_after_ms
            .store(fail_after.as_millis() as u64, Ordering::Relaxed);
    }

    fn fail_after(&self) -> Duration {
        Duration::from_millis(self.fail_after_ms.load(Ordering::Relaxed))
    }

    /// Why the store is down now, if it is.
    pub(crate) fn down(&self) -> Option<StoreDown> {
        self.down.locked().as_ref().map(|(since, down)| StoreDown {
            for_ms: since.elapsed().as_millis() as u64,
            ..down.clone()
        })
    }

    /// Whether an agent may send its next model request now: the store is
    /// up, and this process wrote recently enough that no other process can
    /// have claimed its trees since (a process that was stopped, or cut off
    /// from its store, for longer waits for its next write, which a fence
    /// may refuse: then the tree stops here without a request sent twice).
    pub(crate) fn ready(&self) -> bool {
        self.ready_at(self.now_ms())
    }

    /// `ready`, at `now_ms` on this clock.
    fn ready_at(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_ok.load(Ordering::Acquire)) < self.fresh_ms
            && !self.is_down.load(Ordering::Acquire)
    }

    /// `ready`, for an agent of `tree_id`: never once another process claimed
    /// the tree after this one. The write that finds the fence goes through
    /// (for the other trees) and so opens the gate; this tree's agents stay
    /// held, to be stopped, rather than send one more request.
    pub(crate) fn ready_for(&self, tree_id: &TreeId) -> bool {
        self.ready() && !self.fenced.locked().contains_key(tree_id)
    }

    /// Waits until `ready_for(tree_id)`; for a tree fenced out, for ever
    /// (its agents are stopped meanwhile).
    pub(crate) fn until_ready_for(self: &Arc<Self>, tree_id: TreeId) -> BoxFuture<'static, ()> {
        let health = self.clone();
        Box::pin(async move {
            loop {
                let written = health.written.notified();
                tokio::pin!(written);
                written.as_mut().enable();
                if health.fenced.locked().contains_key(&tree_id) {
                    return std::future::pending().await;
                }
                if health.ready() {
                    return;
                }
                written.await;
            }
        })
    }

    /// A batch that began at `began` (ms on this clock) went through.
    fn wrote(&self, began: u64) {
        self.last_ok.fetch_max(began, Ordering::AcqRel);
        let was_down = if self.is_down.load(Ordering::Acquire) {
            self.is_down.store(false, Ordering::Release);
            self.down.locked().take()
        } else {
            None
        };
        if let Some((since, down)) = was_down {
            tracing::warn!(
                down_ms = since.elapsed().as_millis() as u64,
                "the store takes writes again (it was down: {})",
                down.reason
            );
        }
        self.written.notify_waiters();
    }

    /// The store refused a batch for now (`error` is `StoreUnavailable`);
    /// returns how long it has been down.
    fn failed_for_now(&self, error: StoreDown) -> Duration {
        let mut down = self.down.locked();
        match &mut *down {
            Some((since, was)) => {
                *was = error;
                since.elapsed()
            }
            None => {
                tracing::warn!(
                    "{error}; holding the writes and trying again (new steps wait, no tree \
                     is started or claimed here meanwhile)"
                );
                *down = Some((Instant::now(), error));
                self.is_down.store(true, Ordering::Release);
                Duration::ZERO
            }
        }
    }
}

/// Feeds a store from the supervisor: a thread takes whatever has queued up
/// and writes it as one transaction. The queue is bounded (see `QUEUE`).
/// A store that is down for now is tried again (see the module doc); when a
/// write fails for good, or the store stays down past `fail_after`, the
/// writer keeps the reason and calls `on_failure` (the supervisor fails the
/// running trees).
pub(crate) struct StoreWriter {
    /// `None` only while dropping.
    tx: Option<mpsc::SyncSender<Msg>>,
    failure: Arc<Mutex<Option<String>>>,
    /// Trees another process took over: nothing more is written for them.
    fenced: Arc<Mutex<HashMap<TreeId, Fenced>>>,
    health: Arc<WriterHealth>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Dropping the writer (with the supervisor and its last tree) writes what is
/// still queued and waits for it: nothing emitted is lost on a clean
/// shutdown. (A store that is down then is not waited for: what could not
/// be written is logged.)
impl Drop for StoreWriter {
    fn drop(&mut self) {
        self.tx = None;
        self.health.closing.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

const MAX_BATCH: usize = 8192;
/// How far a resumed tree's event numbers jump past the last one stored.
/// Events reach readers (an event stream) only once the writer's queue took
/// them, so at most the queue and a batch in progress were seen but not
/// stored when the process died; the jump is larger than that, with room for
/// a shutdown's last moments, so a reader never sees a number twice.
pub(crate) const RESUME_SEQ_GAP: u64 = 1 << 20;
/// Writes waiting for the writer. When the store cannot keep up, an agent that
/// emits an event waits for room (backpressure) instead of the queue, and the
/// states it holds, growing without bound.
const QUEUE: usize = 64 * 1024;
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long the writer lets writes gather before a batch (the most a write
/// waits before it is committed, beyond the time to write the batch before it).
const GATHER: Duration = Duration::from_millis(2);

/// What the writer tells the supervisor.
pub(crate) struct WriterHooks {
    /// The store failed for good (or stayed down past `fail_after`): the
    /// running trees fail with the reason.
    pub(crate) on_failure: Box<dyn Fn(String) + Send>,
    /// Another process took this tree over: stop it here.
    pub(crate) on_fenced: Box<dyn Fn(Fenced) + Send>,
}

impl StoreWriter {
    /// Starts the writer's thread on `store`, reporting to `hooks` and
    /// keeping `health`.
    pub(crate) fn start(
        store: Arc<dyn Store>,
        hooks: WriterHooks,
        health: Arc<WriterHealth>,
    ) -> Result<Self, Error> {
        let (tx, rx) = mpsc::sync_channel::<Msg>(QUEUE);
        let failure = Arc::new(Mutex::new(None));
        let failed = failure.clone();
        // Shared with the health, which holds a fenced tree's agents.
        let fenced = health.fenced.clone();
        let fenced_here = fenced.clone();
        let runtime = tokio::runtime::Handle::try_current().ok();
        let health_here = health.clone();
        // A new writer has written nothing, and nobody else holds its trees.
        health.wrote(health.now_ms());
        let thread = std::thread::Builder::new()
            .name("arbor-store".into())
            .spawn(move || {
                // A panic in the writer is a store failure like any other:
                // the running trees fail with it instead of going on unstored.
                let on_failure = std::rc::Rc::new(hooks.on_failure);
                let notify = on_failure.clone();
                let failure = failed.clone();
                let run = std::panic::AssertUnwindSafe(move || {
                    let loop_ = Loop {
                        store,
                        failure: failed,
                        on_failure,
                        fenced: fenced_here,
                        on_fenced: hooks.on_fenced,
                        health: health_here,
                        owned: HashMap::new(),
                        released: HashSet::new(),
                    };
                    loop_.run(rx, runtime)
                });
                if std::panic::catch_unwind(run).is_err() {
                    let reason = "the store failed: its writer panicked".to_owned();
                    *failure.locked() = Some(reason.clone());
                    notify(reason);
                }
            })
            .map_err(|e| Error::Store(format!("cannot start the store writer: {e}")))?;
        Ok(StoreWriter {
            tx: Some(tx),
            failure,
            fenced,
            health,
            thread: Some(thread),
        })
    }

    /// Whether another process took this tree over (then this one must not
    /// run it): the claim it holds now, if so.
    pub(crate) fn fenced(&self, tree_id: &TreeId) -> Option<Fenced> {
        self.fenced.locked().get(tree_id).cloned()
    }

    pub(crate) fn send(&self, write: Write) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Msg::Write(write));
        }
    }

    /// Why the store stopped taking writes for good, if it did.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure.locked().clone()
    }

    /// The store's health as this writer sees it.
    pub(crate) fn health(&self) -> &Arc<WriterHealth> {
        &self.health
    }

    /// Waits until everything sent so far is written.
    pub(crate) async fn flush(&self) -> Result<(), Error> {
        let (done, wait) = oneshot::channel();
        if let Some(tx) = &self.tx {
            let _ = tx.send(Msg::Flush(done));
        }
        match wait.await {
            Ok(result) => result.map_err(Error::Store),
            Err(_) => Err(Error::Store("the store writer has stopped".into())),
        }
    }
}

/// The writer's thread: what it reports to, and what it keeps of the trees.
struct Loop {
    store: Arc<dyn Store>,
    failure: Arc<Mutex<Option<String>>>,
    on_failure: std::rc::Rc<Box<dyn Fn(String) + Send>>,
    fenced: Arc<Mutex<HashMap<TreeId, Fenced>>>,
    on_fenced: Box<dyn Fn(Fenced) + Send>,
    health: Arc<WriterHealth>,
    /// Trees this process runs, by root run id, so their heartbeat stays fresh.
    owned: HashMap<RunId, TreeId>,
    /// Trees this process handed over: their later events are not recorded.
    released: HashSet<TreeId>,
}

/// How a batch ended.
enum Outcome {
    /// Written (or given up on after `on_failure` was called).
    Done,
    /// It failed for good: the reason.
    Failed(String),
}

impl Loop {
    fn is_fenced(&self, tree: &str) -> bool {
        self.fenced.locked().contains_key(tree)
    }

    fn run(mut self, rx: mpsc::Receiver<Msg>, runtime: Option<tokio::runtime::Handle>) {
        let mut last_beat = Instant::now();
        let mut batch: Vec<Write> = Vec::new();
        let mut flushes = Vec::new();
        let mut failed: Option<String> = None;
        let freeing = Arc::new(AtomicBool::new(false));
        loop {
            // With a backlog, go straight on. Otherwise wait for a write, then let
            // a batch gather: while this thread sleeps, senders find no receiver
            // to wake, so an event costs them a queue push and no syscall. (Not
            // for a new tree or a flush: someone waits for those.)
            let first = match rx.try_recv() {
                Ok(msg) => Some(msg),
                Err(mpsc::TryRecvError::Disconnected) => return,
                Err(mpsc::TryRecvError::Empty) => match rx.recv_timeout(HEARTBEAT) {
                    Ok(msg) => {
                        if matches!(msg, Msg::Write(Write::Event(_))) {
                            std::thread::sleep(GATHER);
                        }
                        Some(msg)
                    }
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                },
            };
            for msg in first
                .into_iter()
                .chain(std::iter::from_fn(|| rx.try_recv().ok()))
            {
                match msg {
                    Msg::Write(write) => {
                        if let Some(write) = self.take(write) {
                            batch.push(write);
                        }
                    }
                    Msg::Flush(done) => flushes.push(done),
                }
                if batch.len() >= MAX_BATCH {
                    break;
                }
            }
            if last_beat.elapsed() >= HEARTBEAT && !self.owned.is_empty() {
                batch.push(Write::Heartbeat(self.owned.values().cloned().collect()));
                last_beat = Instant::now();
            }
            if failed.is_none()
                && self.failure.locked().is_none()
                && !batch.is_empty()
                && let Outcome::Failed(reason) = self.write(&mut batch)
            {
                tracing::error!("{reason}");
                *self.failure.locked() = Some(reason.clone());
                (self.on_failure)(reason.clone());
                failed = Some(reason);
            }
            // The writes hold the final states of finished runs; freeing them is
            // work this thread (the store's bottleneck) can hand to the runtime,
            // one batch at a time (a busy runtime must not pile them up).
            match &runtime {
                Some(runtime) if batch.len() > 64 && !freeing.swap(true, Ordering::AcqRel) => {
                    let done = std::mem::take(&mut batch);
                    let freeing = freeing.clone();
                    runtime.spawn(async move {
                        drop(done);
                        freeing.store(false, Ordering::Release);
                    });
                }
                _ => batch.clear(),
            }
            let failed_now = failed.clone().or_else(|| self.failure.locked().clone());
            for done in flushes.drain(..) {
                let _ = done.send(failed_now.clone().map_or(Ok(()), Err));
            }
        }
    }

    /// A write as the batch takes it, noting the trees it starts, ends and
    /// releases; `None` for one that is not written.
    fn take(&mut self, write: Write) -> Option<Write> {
        let mut write = match write {
            // Once released, a tree's later events are not recorded: the
            // next process resumes it from what was stored until then.
            Write::Event(event) if self.released.contains(&event.tree_id) => return None,
            // Nor those of a tree another process took over.
            Write::Event(event) if self.is_fenced(&event.tree_id) => return None,
            Write::Known { tree_id, .. } if self.is_fenced(&tree_id) => return None,
            write => write,
        };
        match &mut write {
            Write::Tree(tree) => {
                // A new claim of its own (a resume after it was fenced).
                self.fenced.locked().remove(tree.tree_id.as_str());
                self.released.remove(tree.tree_id.as_str());
                self.owned
                    .insert(tree.root_run_id.clone(), tree.tree_id.clone());
            }
            // Only a root's end releases what the tree owned.
            Write::Event(event)
                if event.kind.final_state().is_some() && event.run_id.path().len() == 1 =>
            {
                self.owned.remove(&event.run_id);
            }
            Write::Release(trees) => {
                trees.retain(|tree| !self.is_fenced(tree));
                self.owned.retain(|_, tree| !trees.contains(tree));
                self.released.extend(trees.iter().cloned());
            }
            _ => {}
        }
        Some(write)
    }

    /// Writes the batch: again and again while the store is down for now
    /// (see the module doc), giving up on this process's trees once it has
    /// been down for `fail_after`.
    fn write(&mut self, batch: &mut Vec<Write>) -> Outcome {
        let mut backoff = FIRST_BACKOFF;
        let mut gave_up = false;
        loop {
            let began = self.health.now_ms();
            let started = Instant::now();
            let result = self.store.write(batch);
            tracing::debug!(
                writes = batch.len(),
                us = started.elapsed().as_micros() as u64,
                "store batch"
            );
            match result {
                Ok(fenced) => {
                    // The fences first: the agents the write lets go must
                    // not include a fenced tree's.
                    self.fenced_out(fenced);
                    self.health.wrote(began);
                    return Outcome::Done;
                }
                Err(Error::StoreUnavailable {
                    path,
                    reason,
                    disk_full,
                }) => {
                    let down = StoreDown {
                        path,
                        reason,
                        disk_full,
                        for_ms: 0,
                    };
                    let text = Error::StoreUnavailable {
                        path: down.path.clone(),
                        reason: down.reason.clone(),
                        disk_full: down.disk_full,
                    }
                    .to_string();
                    let down_for = self.health.failed_for_now(down);
                    if self.health.closing.load(Ordering::Acquire) {
                        tracing::error!(
                            writes = batch.len(),
                            "stopping with the store down: {text}; the last {} writes are not \
                             stored (the trees resume from their last stored step)",
                            batch.len()
                        );
                        return Outcome::Done;
                    }
                    if !gave_up && down_for >= self.health.fail_after() {
                        gave_up = true;
                        self.give_up(batch, &text, down_for);
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(error) => return Outcome::Failed(format!("the store failed: {error}")),
            }
        }
    }

    /// The store has been down for `fail_after`: this process's trees are
    /// released (in the batch, written once the store answers: another
    /// process then adopts them at once) and stopped here, and the writer
    /// reports the failure.
    fn give_up(&mut self, batch: &mut Vec<Write>, reason: &str, down_for: Duration) {
        let trees: Vec<TreeId> = self.owned.values().cloned().collect();
        self.owned.clear();
        self.released.extend(trees.iter().cloned());
        if !trees.is_empty() {
            batch.push(Write::Release(trees.clone()));
        }
        let reason = format!(
            "the store failed: it has been down for {:.0} s ({reason}); this process \
             released its {} trees to whichever process takes them next",
            down_for.as_secs_f64(),
            trees.len()
        );
        tracing::error!("{reason}");
        *self.failure.locked() = Some(reason.clone());
        (self.on_failure)(reason);
    }

    /// Stops, here, the trees another process took over.
    fn fenced_out(&mut self, fenced: Vec<Fenced>) {
        for f in fenced {
            let mut known = self.fenced.locked();
            if known.contains_key(&f.tree_id) {
                continue;
            }
            tracing::warn!(
                tree = %f.tree_id,
                epoch = f.epoch,
                owner_epoch = f.current,
                owner = %f.owner,
                "fenced out of tree {}: another process claimed it since (epoch {} \
                 there, {} here); stopping it in this process, nothing more is \
                 written for it",
                f.tree_id,
                f.current,
                f.epoch
            );
            known.insert(f.tree_id.clone(), f.clone());
            drop(known);
            self.owned.retain(|_, tree| *tree != f.tree_id);
            (self.on_fenced)(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use arbor_actors::sync::LockExt as _;

    use super::{StoreDown, TreeId, WriterHealth};

    /// A process whose last write is older than half the lease (it was
    /// stopped, or its store was down) takes no new step until it writes
    /// again; a store that is down closes the gate whatever the clock says.
    #[test]
    fn a_writer_that_has_not_written_within_half_the_lease_holds_new_steps() {
        let health = WriterHealth::new(5_000, Duration::from_secs(60));
        health.wrote(1_000);
        assert!(health.ready_at(3_499));
        assert!(!health.ready_at(3_500), "2.5 s after its last write");
        health.wrote(3_000);
        assert!(health.ready_at(5_000));
        let down_for = health.failed_for_now(StoreDown {
            path: "postgres://arbor@db/arbor".into(),
            reason: "connection refused".into(),
            disk_full: false,
            for_ms: 0,
        });
        assert_eq!(down_for, Duration::ZERO);
        assert!(!health.ready_at(3_001), "down");
        let down = health.down().unwrap().to_string();
        assert!(
            down.starts_with(
                "the store at postgres://arbor@db/arbor cannot be reached: connection refused \
                 (down for "
            ),
            "{down}"
        );
        health.wrote(4_000);
        assert!(health.ready_at(4_001) && health.down().is_none());
    }

    /// A tree another process claimed is never ready here, even right after
    /// a write (the one that found the fence): its waiting agents are held
    /// until they are stopped. The others go on.
    #[tokio::test]
    async fn a_fenced_tree_is_never_ready_again() {
        let health = WriterHealth::new(5_000, Duration::from_secs(60));
        let (t, u): (TreeId, TreeId) = ("t".parse().unwrap(), "u".parse().unwrap());
        health.wrote(health.now_ms());
        assert!(health.ready_for(&t) && health.ready_for(&u));
        health.fenced.locked().insert(
            t.clone(),
            super::Fenced {
                tree_id: t.clone(),
                epoch: 1,
                current: 2,
                owner: "elsewhere:1".into(),
            },
        );
        health.wrote(health.now_ms());
        assert!(!health.ready_for(&t), "fenced");
        assert!(health.ready_for(&u));
        let held = health.until_ready_for(t);
        let waited = tokio::time::timeout(Duration::from_millis(50), held).await;
        assert!(waited.is_err(), "a fenced tree's agent is let go");
        let free = health.until_ready_for(u);
        tokio::time::timeout(Duration::from_secs(5), free)
            .await
            .expect("another tree's agent goes on");
    }
}
