//! `GET /v1/runs/{runId}/events`: a run's events (its whole subtree) as
//! Server-Sent Events. The journal first (from `Last-Event-ID` on), then live;
//! one shape either way (`journal_view`), each event's `seq` as its SSE id, so
//! a client that reconnects with the last id it saw misses nothing and sees
//! nothing twice. A live event is sent once the store has it (see `stored`):
//! a stream shows nothing that is not in the journal, and when this process
//! is fenced out of the tree (another claimed it) the stream follows the
//! journal the new owner writes, to the tree's real end, as a stream of a
//! tree run elsewhere does. The stream ends after the run's own final event
//! (or the tree's end, or shutdown); a client too slow to keep up is closed, to
//! reconnect and go on from the journal. Open streams are capped, in total
//! and per tree (`[service] max_event_streams`, `max_event_streams_per_tree`).

use std::convert::Infallible;
use std::sync::Arc;

use arbor_actors::{Event, EventKind, RunId, TreeId};
use arbor_supervisor::TreeStatus;
use arbor_supervisor::{JournalEntry, journal_view};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::Shared;
use super::error::ApiError;

/// Live events a stream may fall behind by before it is closed.
const MAX_BEHIND: usize = 100_000;
/// Live events a stream takes together before it waits for the store to
/// have them (one flush of the writer for all of them).
const LIVE_BATCH: usize = 1024;
/// How long a client may take no event before its stream is closed.
const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How often a live stream checks its tree still runs (a root lost without a
/// final event ends the stream too).
const TREE_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether `candidate` is `run` or below it. (A retry is a run of its own,
/// `RUN~n`, with its own children `RUN~n.k`: streamed on its own id.)
///
/// `RunId::is_within` on the printed ids: the id module's text form of it,
/// tested there to agree with the typed one on run ids, so that a stream
/// does not parse the run id of every event it filters.
pub fn in_subtree(candidate: &str, run: &str) -> bool {
    arbor_actors::id::is_within(candidate, run)
}

struct Follow {
    run_id: String,
    /// The root run of the followed run's turn: its end ends the stream.
    root: String,
    /// `run_id` and `root` typed, for live events (whose ids are).
    typed: (RunId, RunId),
    tree_id: TreeId,
    last: u64,
    /// The highest `seq` read from the journal (of any run of the tree):
    /// the next read starts after it.
    read: u64,
    /// The client asked for the model's streamed text (`?deltas=true`).
    deltas: bool,
    tx: mpsc::Sender<SseEvent>,
}

/// An event's SSE data: its journal entry and the tree it is of.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Data<'a> {
    #[serde(flatten)]
    entry: &'a JournalEntry,
    tree_id: &'a str,
}

impl Follow {
    /// Whether an event of `run` ends the stream: the run's own final event,
    /// or its tree's root's. Judged before the de-duplication: a client whose
    /// last id is at or past the end (a reconnect after it) must not wait
    /// forever.
    fn ends(&self, run: &str, is_final: bool) -> bool {
        is_final && (run == self.root || run == self.run_id)
    }

    /// Whether an event is new to the client and of the subtree.
    fn wanted(&self, seq: u64, run: &str) -> bool {
        seq > self.last && in_subtree(run, &self.run_id)
    }

    /// [`ends`](Self::ends) for a live event's run id.
    fn ends_live(&self, run: &RunId, is_final: bool) -> bool {
        let (own, root) = &self.typed;
        is_final && (run == root || run == own)
    }

    /// [`wanted`](Self::wanted) for a live event's run id.
    fn wanted_live(&self, seq: u64, run: &RunId) -> bool {
        seq > self.last && run.is_within(&self.typed.0)
    }

    /// Sends a journal entry (read from the store) if it is of the subtree
    /// and new; returns whether the stream is over (the run's final event
    /// went out, or the client left).
    async fn send_entry(&mut self, entry: JournalEntry) -> bool {
        self.read = self.read.max(entry.seq);
        let ends = self.ends(&entry.run_id, entry.is_final());
        if !self.wanted(entry.seq, &entry.run_id) {
            return ends;
        }
        self.deliver(&entry, ends).await
    }

    /// The same for a live event, judged on the event itself: its journal
    /// entry is built only when it is sent (and not at all for what the
    /// journal leaves out, which `journal_view` tells before any JSON).
    async fn send_event(&mut self, event: &Event) -> bool {
        // The final kinds are the journal's final types (and always journaled).
        let ends = self.ends_live(&event.run_id, event.kind.final_state().is_some());
        if !self.wanted_live(event.seq, &event.run_id) {
            return ends;
        }
        match journal_view(event) {
            Some(entry) => self.deliver(&entry, ends).await,
            None if self.deltas && matches!(event.kind, EventKind::ModelDelta { .. }) => {
                self.deliver_delta(event).await || ends
            }
            None => ends,
        }
    }

    /// Sends a piece of a model's streamed reply (`?deltas=true`): the event
    /// as it is, with no SSE `id`, since no journal has it (a client that
    /// reconnects goes on from the last journaled event it saw, and the
    /// step's `modelResponded` has the whole reply). Returns whether the
    /// client left.
    async fn deliver_delta(&mut self, event: &Event) -> bool {
        let Ok(sse) = SseEvent::default()
            .event(event.kind.name())
            .json_data(event)
        else {
            return false;
        };
        self.send(sse).await
    }

    /// Sends an entry that is wanted; returns `ends`, or true if the client
    /// left or took nothing for too long.
    async fn deliver(&mut self, entry: &JournalEntry, ends: bool) -> bool {
        self.last = entry.seq;
        let data = Data {
            entry,
            tree_id: &self.tree_id,
        };
        let sse = SseEvent::default()
            .id(entry.seq.to_string())
            .event(entry.kind.name())
            .json_data(&data);
        let Ok(sse) = sse else {
            return ends;
        };
        self.send(sse).await || ends
    }

    /// Sends one SSE event; true if the client left or took nothing for too
    /// long.
    async fn send(&mut self, sse: SseEvent) -> bool {
        // A client that takes nothing for this long is closed; it can
        // reconnect with Last-Event-ID and lose nothing.
        match tokio::time::timeout(SEND_TIMEOUT, self.tx.send(sse)).await {
            Ok(Ok(())) => false,
            Ok(Err(_)) => true,
            Err(_) => {
                tracing::warn!(run = %self.run_id, "event stream not read for {SEND_TIMEOUT:?}; closed");
                true
            }
        }
    }
}

/// Where the followed tree runs, as far as this process can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Whereabouts {
    /// In this process: its events arrive on the bus.
    Here,
    /// In another process on the store (running there, or interrupted and
    /// about to be adopted): its events are read from the journal.
    Elsewhere,
    /// Nowhere: it has ended (or the store does not know it).
    Ended,
}

impl Whereabouts {
    /// Judged from whether this process runs the tree and the status the
    /// store lists it with (`None`: the store has no such tree).
    pub(crate) fn judge(here: bool, stored: Option<TreeStatus>) -> Whereabouts {
        match (here, stored) {
            (true, _) => Whereabouts::Here,
            (false, Some(status)) if !status.is_final() => Whereabouts::Elsewhere,
            (false, _) => Whereabouts::Ended,
        }
    }
}

/// How often a stream of a tree run by another replica reads its journal
/// (sooner when the store's change notifications wake it). Each read is of
/// the segments past the stream's cursor only (`Store::events`), and the
/// tree's status is one row's columns (`Store::status`), every `TREE_CHECK`.
const POLL: std::time::Duration = std::time::Duration::from_millis(200);
/// How long a stream follows a tree the store lists as interrupted (its
/// owner gone, no replica has adopted it yet) before it ends; the client
/// reconnects and goes on from the journal.
const ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Where `tree_id` runs now: here, or (asked of the store) elsewhere.
async fn whereabouts(shared: &Shared, tree_id: &TreeId) -> Result<Whereabouts, ApiError> {
    if shared.runtime.supervisor().is_running(tree_id) {
        return Ok(Whereabouts::Here);
    }
    Ok(stored_whereabouts(shared, tree_id).await?.0)
}

/// Opens the stream; fails (before any byte is sent) if the run is unknown.
/// With `deltas`, the model's streamed text (`modelDelta`, never journaled)
/// goes out too while the tree runs in this process.
pub async fn stream(
    shared: Arc<Shared>,
    id: RunId,
    after: u64,
    deltas: bool,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    // Kept as text too: events are filtered by their printed ids.
    let run_id = id.to_string();
    let tree_id = id.tree().clone();
    // Held until the stream ends; refused (503 or 429, naming the cap) before
    // anything else is done for it.
    let slot = shared.streams.open(tree_id.as_arc(), &shared.limits)?;
    let supervisor = shared.runtime.supervisor();
    // Ends with the server; subscribed first, so a stop during the set-up counts.
    let mut shutdown = shared.shutdown.subscribe();
    // Trees interrupted by a restart are resumed before they are followed.
    shared.wait_ready().await;
    // The root of the run's turn (`T/0`, or `T/0~n` for a follow-up turn):
    // another turn's end does not end this stream.
    let turn_root = id.turn_root();
    let root = turn_root.to_string();
    // A run of a tree running here or on another replica may not have
    // started yet (a root right after the 201, a child named by
    // `childSpawned` that waits for a live slot): it is followed all the
    // same, until it ends or the tree does. (Asked before the flush: a tree
    // that ends after it may have events the store does not have yet; one
    // that ended before has them all stored.)
    let known = whereabouts(&shared, &tree_id).await? != Whereabouts::Ended;
    let run = id.clone();
    supervisor
        .read_store_now(move |store| match store.run(&run) {
            Err(arbor_supervisor::Error::UnknownRun(_)) if known => Ok(()),
            other => other.map(drop),
        })
        .await?;
    // Subscribed before the second flush: whatever the journal does not have
    // yet arrives live.
    let mut live = supervisor.events().subscribe_tree(&tree_id);
    let tree = tree_id.clone();
    let journal = supervisor
        .read_store_now(move |store| store.events(&tree, after))
        .await?;
    let running = runs_here(&shared, &tree_id);
    let (tx, mut rx) = mpsc::channel(256);
    let mut follow = Follow {
        run_id,
        root,
        typed: (id, turn_root),
        tree_id,
        last: after,
        read: after,
        deltas,
        tx,
    };
    let task_shared = shared.clone();
    tokio::spawn(async move {
        let _slot = slot;
        let shared = task_shared;
        for entry in journal {
            if follow.send_entry(entry).await {
                return;
            }
        }
        let mut tick = tokio::time::interval(TREE_CHECK);
        tick.tick().await;
        let mut running = running;
        loop {
            // What arrived live: one event awaited while the tree runs here,
            // then whatever else is queued.
            let mut batch = Vec::new();
            if running {
                let event = tokio::select! {
                    event = live.recv() => event,
                    () = follow.tx.closed() => return,
                    _ = shutdown.wait_for(|stop| *stop) => return,
                    _ = tick.tick() => {
                        running = runs_here(&shared, &follow.tree_id);
                        continue;
                    }
                };
                let Some(event) = event else { return };
                // A client that reads slower than its tree runs is cut off
                // rather than buffered without bound: it reconnects with
                // Last-Event-ID and reads the rest from the journal, losing
                // nothing.
                if live.len() > MAX_BEHIND {
                    tracing::warn!(run = %follow.run_id, behind = live.len(), "event stream too slow; closed");
                    return;
                }
                batch.push(event);
            }
            while batch.len() < LIVE_BATCH {
                let Ok(event) = live.try_recv() else { break };
                batch.push(event);
            }
            if !batch.is_empty() {
                match stored(&shared, &follow.tree_id, &mut shutdown, &follow.tx).await {
                    Stored::Yes => {
                        for event in &batch {
                            if follow.send_event(event).await {
                                return;
                            }
                        }
                    }
                    // Taken over by another process: these events (its
                    // stopping here among them) are in no journal. The
                    // journal has what was stored, and goes on with what
                    // the new owner writes, to the tree's real end.
                    Stored::Fenced => {
                        tracing::info!(run = %follow.run_id, "the tree was taken over by another process; its stream follows the journal");
                        running = false;
                    }
                    Stored::Gone => return,
                }
            }
            if !running {
                // Not running here (any more): the journal, which another
                // replica may go on writing.
                drop(live);
                shared.replica.remote_streams.inc();
                follow.journal(&shared, &mut shutdown).await;
                shared.replica.remote_streams.dec();
                return;
            }
        }
    });
    let body = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|e| e.map(Ok)));
    // Often enough that a quiet stream is never taken for an idle connection.
    let keep_alive = KeepAlive::new().interval(shared.limits.stream_keep_alive());
    Ok(Sse::new(body).keep_alive(keep_alive))
}

/// Whether this process runs the tree and still holds it: a tree another
/// process claimed since (fenced out here) is followed from its journal,
/// as one run elsewhere is, even while it is still stopping here.
fn runs_here(shared: &Shared, tree_id: &TreeId) -> bool {
    let supervisor = shared.runtime.supervisor();
    supervisor.is_running(tree_id) && !supervisor.is_fenced(tree_id)
}

/// What became of the live events a stream holds once the store's writer
/// has had them.
enum Stored {
    /// Written: they are in the journal, and may be sent.
    Yes,
    /// Another process claimed the tree since: the store refused this
    /// process's writes for it, so some may be in no journal; none is sent.
    Fenced,
    /// The client left, the server stops, or the store failed for good
    /// (the client reconnects, here or to another replica).
    Gone,
}

/// Waits until the store has every event this process emitted so far
/// (those a stream holds among them), and says whether they went in: a
/// live event is sent only once it is in the journal of the process that
/// holds the tree, so a process fenced out of it (paused past its lease,
/// then going on) never shows a client an event no journal has.
async fn stored(
    shared: &Shared,
    tree_id: &TreeId,
    shutdown: &mut watch::Receiver<bool>,
    tx: &mpsc::Sender<SseEvent>,
) -> Stored {
    let supervisor = shared.runtime.supervisor();
    let flushed = tokio::select! {
        flushed = supervisor.flush() => flushed,
        () = tx.closed() => return Stored::Gone,
        _ = shutdown.wait_for(|stop| *stop) => return Stored::Gone,
    };
    // The writer records a fence before it answers the flush.
    if supervisor.is_fenced(tree_id) {
        Stored::Fenced
    } else if flushed.is_ok() {
        Stored::Yes
    } else {
        Stored::Gone
    }
}

impl Follow {
    /// Follows the journal of a tree this process does not run: reads what
    /// is new every `POLL` (or when the store says something changed) until
    /// the stream's end is sent, the tree ends, or it stays interrupted (no
    /// replica adopts it) for `ORPHAN_GRACE`. A replica that adopts the tree
    /// goes on writing the same journal, so the stream just goes on; this
    /// one included (then its writer is flushed before each read).
    async fn journal(&mut self, shared: &Arc<Shared>, shutdown: &mut watch::Receiver<bool>) {
        let supervisor = shared.runtime.supervisor();
        let mut wake = shared.journal_wake.subscribe();
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut orphaned: Option<tokio::time::Instant> = None;
        let mut checked = tokio::time::Instant::now();
        let mut first = true;
        self.read = self.read.max(self.last);
        loop {
            // Where it runs first, then the journal: a tree that ended before
            // the read has its whole journal in it.
            let status = if std::mem::take(&mut first)
                || checked.elapsed() >= TREE_CHECK
                || orphaned.is_some()
            {
                checked = tokio::time::Instant::now();
                Some(stored_whereabouts(shared, &self.tree_id).await)
            } else {
                None
            };
            let tree = self.tree_id.clone();
            let after = self.read;
            let here = supervisor.is_running(&tree);
            let read = move |store: &dyn arbor_supervisor::store::Store| store.events(&tree, after);
            let entries = if here {
                supervisor.read_store_now(read).await
            } else {
                supervisor.read_store(read).await
            };
            let Ok(entries) = entries else {
                // The client reconnects, to this replica or another one.
                return;
            };
            for entry in entries {
                if self.send_entry(entry).await {
                    return;
                }
            }
            match status {
                Some(Ok((Whereabouts::Ended, _)) | Err(_)) => return,
                Some(Ok((_, interrupted))) => {
                    if !interrupted {
                        orphaned = None;
                    } else if orphaned
                        .get_or_insert_with(tokio::time::Instant::now)
                        .elapsed()
                        >= ORPHAN_GRACE
                    {
                        return;
                    }
                }
                None => {}
            }
            tokio::select! {
                _ = tick.tick() => {}
                _ = wake.changed() => {}
                () = self.tx.closed() => return,
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
        }
    }
}

/// Where the tree runs, and whether the store lists it interrupted (owner
/// gone, not adopted yet); the store's error when it cannot say.
async fn stored_whereabouts(
    shared: &Shared,
    tree_id: &TreeId,
) -> Result<(Whereabouts, bool), arbor_supervisor::Error> {
    let supervisor = shared.runtime.supervisor();
    let tree = tree_id.clone();
    let stored = supervisor
        .read_store(move |store| match store.status(&tree) {
            // Ended with turns queued: the next one is about to start (a
            // stream of a queued turn's run waits for it).
            Ok(status) if status.is_final() && !store.queued_turns(&tree)?.is_empty() => {
                Ok(Some(TreeStatus::Running))
            }
            Ok(status) => Ok(Some(status)),
            Err(arbor_supervisor::Error::UnknownTree(_)) => Ok(None),
            Err(error) => Err(error),
        })
        .await?;
    let here = supervisor.is_running(tree_id);
    Ok((
        Whereabouts::judge(here, stored),
        !here && stored == Some(TreeStatus::Interrupted),
    ))
}

#[cfg(test)]
mod tests {
    use super::{TreeStatus, Whereabouts, in_subtree};

    #[test]
    fn a_tree_not_running_here_is_followed_while_the_store_lists_it_unfinished() {
        use Whereabouts::*;
        assert_eq!(Whereabouts::judge(true, None), Here);
        assert_eq!(Whereabouts::judge(true, Some(TreeStatus::Completed)), Here);
        assert_eq!(
            Whereabouts::judge(false, Some(TreeStatus::Running)),
            Elsewhere
        );
        assert_eq!(
            Whereabouts::judge(false, Some(TreeStatus::Interrupted)),
            Elsewhere
        );
        for ended in [
            TreeStatus::Completed,
            TreeStatus::Failed,
            TreeStatus::Cancelled,
        ] {
            assert_eq!(Whereabouts::judge(false, Some(ended)), Ended);
        }
        assert_eq!(Whereabouts::judge(false, None), Ended);
    }

    #[test]
    fn a_subtree_is_the_run_and_what_is_below_it() {
        assert!(in_subtree("t/0", "t/0"));
        assert!(in_subtree("t/0.1.2", "t/0"));
        assert!(in_subtree("t/0.1.3~1", "t/0.1"));
        assert!(in_subtree("t/0.1~1.2", "t/0.1~1"));
        assert!(!in_subtree("t/0.1~1", "t/0.1"));
        assert!(!in_subtree("t/0.1~1.3", "t/0.1~1.2"));
        assert!(!in_subtree("t/0.1~12", "t/0.1~1"));
        assert!(!in_subtree("t/0.10", "t/0.1"));
        assert!(!in_subtree("t/0", "t/0.1"));
        assert!(!in_subtree("t/0.2", "t/0.1"));
    }
}
