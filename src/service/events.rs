//! `GET /v1/runs/{runId}/events`: a run's events (its whole subtree) as
//! Server-Sent Events. The journal first (from `Last-Event-ID` on), then live;
//! one shape either way (`journal_view`), each event's `seq` as its SSE id, so
//! a client that reconnects with the last id it saw misses nothing and sees
//! nothing twice. The stream ends after the run's own final event (or the
//! tree's end, or shutdown); a client too slow to keep up is closed, to
//! reconnect and go on from the journal.

use std::convert::Infallible;
use std::sync::Arc;

use arbor_supervisor::journal_view;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use serde_json::Value;
use tokio::sync::mpsc;

use super::Shared;
use super::error::ApiError;

const FINAL: [&str; 3] = ["agentFinished", "agentFailed", "agentCancelled"];

/// Live events a stream may fall behind by before it is closed.
const MAX_BEHIND: usize = 100_000;

/// The run path without a retry's `~n`: a retry belongs to its run's node.
fn node(run_id: &str) -> &str {
    run_id.split('~').next().unwrap_or(run_id)
}

/// Whether `candidate` is `run` (or a retry of it) or below it.
pub fn in_subtree(candidate: &str, run: &str) -> bool {
    let (c, r) = (node(candidate), node(run));
    c == r || (c.len() > r.len() && c.starts_with(r) && c.as_bytes()[r.len()] == b'.')
}

struct Follow {
    run_id: String,
    /// The tree's root run: its end ends every stream of the tree.
    root: String,
    tree_id: Arc<str>,
    last: u64,
    tx: mpsc::Sender<SseEvent>,
}

impl Follow {
    /// Sends one journal-shaped event if it is of the subtree and new; returns
    /// whether the stream is over (the run's final event went out, or the
    /// client left).
    async fn send(&mut self, mut event: Value) -> bool {
        let seq = event["seq"].as_u64().unwrap_or(0);
        if seq <= self.last {
            return false;
        }
        self.last = seq;
        let run = event["runId"].as_str().unwrap_or_default().to_owned();
        let kind = event["type"].as_str().unwrap_or("event").to_owned();
        let tree_over = run == self.root && FINAL.contains(&kind.as_str());
        if !in_subtree(&run, &self.run_id) {
            return tree_over;
        }
        if let Value::Object(map) = &mut event {
            map.insert("treeId".into(), Value::from(&*self.tree_id));
        }
        let sse = SseEvent::default()
            .id(seq.to_string())
            .event(kind.as_str())
            .json_data(&event);
        let Ok(sse) = sse else {
            return false;
        };
        if self.tx.send(sse).await.is_err() {
            return true;
        }
        tree_over || (run == self.run_id && FINAL.contains(&kind.as_str()))
    }
}

/// Opens the stream; fails (before any byte is sent) if the run is unknown.
pub async fn stream(
    shared: Arc<Shared>,
    run_id: String,
    after: u64,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let tree_id: Arc<str> = match run_id.split_once('/') {
        Some((tree, _)) => Arc::from(tree),
        None => return Err(ApiError::not_found(format!("no run {run_id}"))),
    };
    let supervisor = shared.runtime.supervisor();
    // Subscribed before the flush: whatever the journal does not have yet
    // arrives live.
    let mut live = supervisor.events().subscribe_tree(&tree_id);
    supervisor.flush().await?;
    let store = shared.store.clone();
    let running = supervisor.is_running(&tree_id);
    // A root whose tree runs here may not have started yet (a stream opened
    // right after the 201): it is known all the same.
    let root = format!("{tree_id}/0");
    let known = running && run_id == root;
    let (run, tree) = (run_id.clone(), tree_id.clone());
    let journal = tokio::task::spawn_blocking(move || {
        match store.run(&run) {
            Err(arbor_supervisor::Error::UnknownRun(_)) if known => {}
            other => {
                other?;
            }
        }
        store.events(&tree, after)
    })
    .await
    .map_err(|e| ApiError::unavailable("the store reader failed", e))??;
    let (tx, mut rx) = mpsc::channel(256);
    let mut shutdown = shared.shutdown.subscribe();
    let mut follow = Follow {
        run_id,
        root,
        tree_id,
        last: after,
        tx,
    };
    tokio::spawn(async move {
        for event in journal {
            if follow.send(event).await {
                return;
            }
        }
        if !running {
            // Ended (or run elsewhere): only what came in since the flush.
            while let Ok(event) = live.try_recv() {
                if let Some(view) = journal_view(&event) {
                    if follow.send(view).await {
                        return;
                    }
                }
            }
            return;
        }
        loop {
            let event = tokio::select! {
                event = live.recv() => event,
                () = follow.tx.closed() => return,
                _ = shutdown.changed() => return,
            };
            let Some(event) = event else { return };
            // A client that reads slower than its tree runs is cut off rather
            // than buffered without bound: it reconnects with Last-Event-ID
            // and reads the rest from the journal, losing nothing.
            if live.len() > MAX_BEHIND {
                tracing::warn!(run = %follow.run_id, behind = live.len(), "event stream too slow; closed");
                return;
            }
            if let Some(view) = journal_view(&event) {
                if follow.send(view).await {
                    return;
                }
            }
        }
    });
    let body = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|e| e.map(Ok)));
    Ok(Sse::new(body).keep_alive(KeepAlive::default()))
}

#[cfg(test)]
mod tests {
    use super::in_subtree;

    #[test]
    fn a_subtree_is_the_run_its_retries_and_what_is_below() {
        assert!(in_subtree("t/0", "t/0"));
        assert!(in_subtree("t/0.1.2", "t/0"));
        assert!(in_subtree("t/0.1~2", "t/0.1"));
        assert!(in_subtree("t/0.1.3~1", "t/0.1"));
        assert!(!in_subtree("t/0.10", "t/0.1"));
        assert!(!in_subtree("t/0", "t/0.1"));
        assert!(!in_subtree("t/0.2", "t/0.1"));
    }
}
