//! The supervisor's store: attaching one (its writer and what happens when
//! it fails or fences a tree), its health, reads on a blocking thread, and
//! handing trees over at shutdown.

use arbor_actors::TreeId;
use std::sync::Arc;

use arbor_actors::sync::LockExt as _;
use arbor_actors::{AgentMsg, CancelReason, EventKind, Failure, FailureKind};
use ractor::ActorRef;

use super::Supervisor;
use crate::error::{Error, StoreUse};
use crate::store::{Fenced, Store, StoreDown, StoreWriter, Write, WriterHealth, WriterHooks};

impl Supervisor {
    /// Stores every tree from now on: its runs, a checkpoint of each agent at
    /// every step boundary, its events and its model replies. Writes go through
    /// a thread of their own, in batches. If a write fails, every running tree
    /// fails with the reason and no new tree starts.
    ///
    /// A tree another process takes over (it claimed it since, see
    /// `Store::claim`) is stopped here: its agents are cancelled with the
    /// reason (they end `failed`, naming it), nothing more of it is written,
    /// and the other trees go on.
    ///
    /// A store that is down for a while (its database restarts, its
    /// connection is cut, its disk is full) fails nothing: the writer holds
    /// the writes and tries them again with backoff, the trees' agents take
    /// no new model step, and no tree starts or is claimed here, until it
    /// takes writes again ([`store_down`](Self::store_down) says why
    /// meanwhile). Only past [`with_store_fail_after`](Self::with_store_fail_after)
    /// (60 s by default) are the trees released and failed here.
    pub fn with_store(mut self, store: Arc<dyn Store>) -> Result<Self, Error> {
        let trees = self.trees.clone();
        let fenced_trees = self.trees.clone();
        let health = WriterHealth::new(store.lease_ms(), self.store_fail_after);
        let hooks = WriterHooks {
            on_failure: Box::new(move |reason| {
                let roots: Vec<ActorRef<AgentMsg>> = trees
                    .locked()
                    .values()
                    .map(|(_, root)| root.clone())
                    .collect();
                for root in roots {
                    let _ = root.cast(AgentMsg::Cancel(CancelReason::Failed(Failure::new(
                        FailureKind::Store,
                        reason.clone(),
                    ))));
                }
            }),
            on_fenced: Box::new(move |fenced: Fenced| {
                let root = fenced_trees
                    .locked()
                    .get(fenced.tree_id.as_str())
                    .map(|(_, r)| r.clone());
                if let Some(root) = root {
                    let reason = Error::from(fenced).to_string();
                    let _ = root.cast(AgentMsg::Cancel(CancelReason::Failed(Failure::new(
                        FailureKind::Fenced,
                        reason,
                    ))));
                }
            }),
        };
        let writer = Arc::new(StoreWriter::start(store.clone(), hooks, health)?);
        let sink = writer.clone();
        // Streaming deltas are not stored: they need not cross the queue.
        self.bus.sink(move |event| {
            if !matches!(event.kind, EventKind::ModelDelta { .. }) {
                sink.send(Write::Event(event.clone()));
            }
        });
        self.store = Some((store, writer));
        Ok(self)
    }

    /// The store trees are written to; `None` without one.
    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.store.as_ref().map(|(store, _)| store)
    }

    /// Why the store stopped taking writes for good, if it did (then no tree
    /// starts): a write it refused, or an outage longer than
    /// [`with_store_fail_after`](Self::with_store_fail_after).
    pub fn store_failure(&self) -> Option<String> {
        self.store.as_ref().and_then(|(_, writer)| writer.failure())
    }

    /// Why the store takes no writes for now, if so (its connection was
    /// lost, its disk is full): the writer tries again until it does.
    pub fn store_down(&self) -> Option<StoreDown> {
        self.store
            .as_ref()
            .and_then(|(_, writer)| writer.health().down())
    }

    /// How long the store may stay down before this process gives its trees
    /// up (releases them to the next process and fails them here) and
    /// [`store_failure`](Self::store_failure) says so. 60 s unless set.
    pub fn with_store_fail_after(mut self, fail_after: std::time::Duration) -> Self {
        self.store_fail_after = fail_after;
        if let Some((_, writer)) = &self.store {
            writer.health().set_fail_after(fail_after);
        }
        self
    }

    /// Whether this process may start or claim trees on its store now:
    /// `Ok` without a store, else the error a start gets while the store is
    /// down ([`Error::StoreUnavailable`]) or has failed ([`Error::Store`]).
    pub fn store_takes_writes(&self) -> Result<(), Error> {
        let Some((_, writer)) = &self.store else {
            return Ok(());
        };
        if let Some(reason) = writer.failure() {
            return Err(Error::Store(reason));
        }
        match writer.health().down() {
            Some(down) => Err(down.to_error()),
            None => Ok(()),
        }
    }

    /// Runs `f` on the store, on a blocking thread (store calls are
    /// synchronous; the runtime's threads must not wait on them).
    pub async fn read_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Store) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let Some((store, _)) = &self.store else {
            return Err(Error::NoStore {
                needed_for: StoreUse::Read,
            });
        };
        let store = store.clone();
        tokio::task::spawn_blocking(move || f(&*store))
            .await
            .map_err(|e| Error::Store(format!("the store reader failed: {e}")))?
    }

    /// Like [`read_store`](Self::read_store), once everything that happened
    /// so far is in the store (a run that just ended included).
    pub async fn read_store_now<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Store) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        self.flush().await?;
        self.read_store(f).await
    }

    /// Waits until everything that happened so far is in the store.
    pub async fn flush(&self) -> Result<(), Error> {
        match &self.store {
            Some((_, writer)) => writer.flush().await,
            None => Ok(()),
        }
    }

    /// Whether another process claimed this tree after this one did (a
    /// higher fencing epoch): the store refused this process's writes for
    /// it from that batch on, so what it emits here since (its stopping
    /// included) is in no journal. False again once this process claims
    /// the tree anew.
    pub fn is_fenced(&self, tree_id: &TreeId) -> bool {
        self.store
            .as_ref()
            .is_some_and(|(_, writer)| writer.fenced(tree_id).is_some())
    }

    /// Hands every tree still running here over to the next process, for a
    /// shutdown: waits until everything so far is stored, then marks them
    /// interrupted (a new process resumes them at once, without waiting for
    /// this one's heartbeat to go stale) and records nothing more of them.
    /// Returns the trees handed over.
    pub async fn release(&self) -> Result<Vec<TreeId>, Error> {
        let Some((_, writer)) = &self.store else {
            return Ok(Vec::new());
        };
        let trees: Vec<TreeId> = self.contexts().iter().map(|c| c.tree_id.clone()).collect();
        writer.flush().await?;
        writer.send(Write::Release(trees.clone()));
        writer.flush().await?;
        Ok(trees)
    }
}
