//! Interrupted trees taken over: resumed at the start, and adopted after it
//! (a replica that crashed or handed its trees over), in batches.

use std::time::Duration;

use arbor_actors::TreeId;
use arbor_supervisor::store::TreeFilter;
use futures::StreamExt as _;

use super::{Service, turns};

/// Interrupted trees one replica claims together (one claim, one read of
/// their logs, then all started): small enough that the last of them starts
/// (and its heartbeat is kept) long before a lease could run out.
const ADOPT_AT_ONCE: usize = 64;
/// Such batches under way at once.
const ADOPT_BATCHES: usize = 2;

/// How often a replica looks for interrupted trees to adopt after its start.
/// A tree another replica handed over on shutdown (released, so interrupted
/// at once) is adopted at once on Postgres, where the release wakes every
/// replica (`Wake::Released`); this poll is the fallback (and SQLite's way).
pub const ADOPT_EVERY: Duration = Duration::from_millis(500);

impl Service {
    /// Resumes every interrupted tree in the store (a server that stopped, or
    /// crashed, mid-run), then reports ready. Returns the trees resumed.
    pub async fn resume_interrupted(&self) -> Vec<TreeId> {
        if *self.shared.shutdown.borrow() {
            return Vec::new();
        }
        let supervisor = self.shared.runtime.supervisor();
        // A store that is down (or failed) is not claimed from: this process
        // could not run what it took. The next pass looks again.
        if supervisor.store_takes_writes().is_err() {
            self.shared.ready.send_replace(true);
            return Vec::new();
        }
        let filter = TreeFilter {
            status: Some(arbor_supervisor::TreeStatus::Interrupted),
            limit: usize::MAX,
            offset: 0,
        };
        let trees = supervisor
            .read_store(move |store| store.trees(&filter))
            .await
            .unwrap_or_else(|error| {
                tracing::error!(%error, "cannot list interrupted trees");
                Vec::new()
            });
        // In batches: a replica that shut down hands over all its trees at
        // once; each batch is one claim and one read of the store for all
        // of its trees.
        let ids: Vec<TreeId> = trees.into_iter().map(|t| t.tree_id).collect();
        let batches: Vec<Vec<TreeId>> = ids.chunks(ADOPT_AT_ONCE).map(<[_]>::to_vec).collect();
        let resumed = futures::stream::iter(batches)
            .map(|batch| self.adopt(batch))
            .buffer_unordered(ADOPT_BATCHES)
            .flat_map(futures::stream::iter)
            .collect::<Vec<TreeId>>()
            .await;
        // Turns queued for trees that ended with no process to take them.
        turns::take_waiting(&self.shared).await;
        self.shared.ready.send_replace(true);
        resumed
    }

    /// Claims and resumes those of the interrupted trees `batch` this
    /// process can take; the ids of those that run here now.
    async fn adopt(&self, batch: Vec<TreeId>) -> Vec<TreeId> {
        if *self.shared.shutdown.borrow() {
            return Vec::new();
        }
        let supervisor = self.shared.runtime.supervisor();
        // The metrics label a resumed tree's agents by its model override too.
        let metrics = &self.shared.metrics;
        let label = |record: &arbor_supervisor::store::TreeRecord| {
            if let Some(model) = &record.model {
                metrics.tree_model(&record.tree_id, model);
            }
        };
        let started = match supervisor.adopt(batch, label).await {
            Ok(started) => started,
            Err(error) => {
                tracing::warn!(%error, "cannot adopt interrupted trees");
                return Vec::new();
            }
        };
        let mut resumed = Vec::with_capacity(started.len());
        for (tree_id, started) in started {
            match started {
                Ok(handle) => {
                    self.shared.metrics.trees_running.inc();
                    self.shared.replica.adoptions.inc();
                    self.shared.keep(handle);
                    tracing::info!(tree = %tree_id, "resumed");
                    resumed.push(tree_id);
                }
                Err(error) => {
                    self.shared.metrics.forget_tree(&tree_id);
                    tracing::warn!(tree = %tree_id, %error, "claimed but not resumed");
                }
            }
        }
        resumed
    }

    /// Keeps adopting interrupted trees after the start, every `every`, until
    /// shutdown: a tree whose owner crashed where this process cannot see it
    /// (another container, another host on a shared file) is interrupted only
    /// once its heartbeat goes stale, after the start-up pass. Trees another
    /// replica releases at its shutdown are looked for at once when the
    /// store says so (Postgres's `NOTIFY`), not at the next look. Claims are
    /// atomic, so servers sharing a store never run one tree twice.
    pub async fn adopt_interrupted(&self, every: Duration) {
        let mut shutdown = self.shared.shutdown.subscribe();
        let mut released = self.shared.adopt_wake.subscribe();
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                // Another replica handed its trees over: take them now.
                _ = released.changed() => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            let adopted = self.resume_interrupted().await;
            if !adopted.is_empty() {
                tracing::info!(trees = adopted.len(), "adopted interrupted trees");
            }
        }
    }
}
