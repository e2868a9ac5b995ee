//! Taking stored trees up again: resuming one, adopting many at once (one
//! claim, one read), and replaying one on its recorded replies.

use arbor_actors::TreeId;
use std::sync::Arc;

use super::{StartRequest, Supervisor, TreeHandle};
use crate::error::{Error, StoreUse};
use crate::recovery::Recovery;
use crate::store::{Store, StoreWriter, TreeRecord, Write};

impl Supervisor {
    /// Resumes a stored tree that was interrupted: runs that finished are merged
    /// from their stored final states, runs that were cut short go on from their
    /// last checkpoint, and recorded model replies are served instead of asking
    /// the model again. A program's run starts its program again, held to
    /// its journaled yields and fed its recorded results until it reaches
    /// where it was: one whose program now yields otherwise fails, naming
    /// the first yield that differs.
    pub async fn resume(&self, tree_id: &TreeId) -> Result<TreeHandle, Error> {
        self.resume_with(tree_id, false).await
    }

    /// [`resume`](Self::resume), with `restart_programs`: the programs of
    /// runs that had not finished start over, as new (their records, and the
    /// model replies recorded for their runs, are dropped; their tools run
    /// again), for a program whose file was edited since.
    pub async fn resume_with(
        &self,
        tree_id: &TreeId,
        restart_programs: bool,
    ) -> Result<TreeHandle, Error> {
        let writer = self.writer_to_take(tree_id, StoreUse::Resume)?;
        // Atomic: of two processes resuming one tree, one gets it.
        let (record, mut recovery) = self
            .claim_stored(tree_id, |store, id| store.claim(id))
            .await?;
        if restart_programs {
            recovery.restart_programs();
        }
        let request = self.resumed_request(tree_id, record)?;
        self.go_on(writer, tree_id, request, recovery).await
    }

    /// Resumes those of the interrupted trees `tree_ids` this process can
    /// take, as [`resume`](Self::resume) resumes one, but together: one
    /// claim for all of them (`Store::claim_interrupted`: a tree that ended,
    /// that a live process runs or that another process is claiming right
    /// now is left out), one read of what they resume from
    /// (`Store::resumes`), then every tree started at once. `before` sees
    /// each tree's record just before it starts. Returns each tree claimed,
    /// with its handle or why it could not start; trees not claimed are not
    /// in it.
    pub async fn adopt(
        &self,
        tree_ids: Vec<TreeId>,
        before: impl Fn(&TreeRecord),
    ) -> Result<Vec<(TreeId, Result<TreeHandle, Error>)>, Error> {
        let Some((_, writer)) = &self.store else {
            return Err(Error::NoStore {
                needed_for: StoreUse::Resume,
            });
        };
        // A store that is down (or failed) is not claimed from: this
        // process could not run what it took.
        self.store_takes_writes()?;
        let ids: Vec<TreeId> = tree_ids
            .into_iter()
            .filter(|id| !self.is_running(id))
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let read = self
            .read_store(move |store| {
                let claimed = store.claim_interrupted(&ids)?;
                let ids: Vec<TreeId> = claimed.iter().map(|(id, _)| id.clone()).collect();
                let read = store.resumes(&ids)?;
                let mut out = Vec::with_capacity(read.len());
                for ((tree_id, epoch), read) in claimed.into_iter().zip(read) {
                    // A tree claimed that cannot be loaded fails, with the
                    // reason, instead of staying claimed (running) for ever.
                    if let Err(error) = &read {
                        let reason = format!("the tree cannot be resumed: {error}");
                        tracing::error!(tree = %tree_id, "{reason}");
                        store.fail_claimed(&tree_id, epoch, &reason)?;
                    }
                    out.push((tree_id, read));
                }
                Ok(out)
            })
            .await?;
        let starts = read.into_iter().map(|(tree_id, read)| {
            let before = &before;
            async move {
                let started = match read {
                    Ok((record, recovery)) => {
                        before(&record);
                        match self.resumed_request(&tree_id, record) {
                            Ok(request) => self.go_on(writer, &tree_id, request, recovery).await,
                            Err(error) => Err(error),
                        }
                    }
                    Err(error) => Err(error),
                };
                (tree_id, started)
            }
        });
        Ok(futures::future::join_all(starts).await)
    }

    /// The request a claimed stored tree resumes with.
    fn resumed_request(&self, tree_id: &TreeId, record: TreeRecord) -> Result<StartRequest, Error> {
        let mut request = record.request()?;
        if self.catalogs.is_none() && request.config != self.config && self.config.is_some() {
            // It runs on this supervisor's catalog: say so, and record it.
            tracing::warn!(
                tree = %tree_id,
                "resuming on this process's config, not the one the tree started with; \
                 the change is recorded with the tree"
            );
            request.config = self.config.clone();
        }
        Ok(request)
    }

    /// The store's writer, to take the stored tree `tree_id` over with (for
    /// `needed_for`): refused without a store, or while the tree runs here.
    fn writer_to_take(
        &self,
        tree_id: &TreeId,
        needed_for: StoreUse,
    ) -> Result<&StoreWriter, Error> {
        let Some((_, writer)) = &self.store else {
            return Err(Error::NoStore { needed_for });
        };
        if self.is_running(tree_id) {
            return Err(Error::TreeExists(tree_id.clone()));
        }
        Ok(writer)
    }

    /// Claims the stored tree `tree_id` with `claim`; its record and what the
    /// store recovers of it.
    async fn claim_stored(
        &self,
        tree_id: &TreeId,
        claim: fn(&dyn Store, &TreeId) -> Result<u64, Error>,
    ) -> Result<(TreeRecord, Recovery), Error> {
        self.store_takes_writes()?;
        let id = tree_id.to_owned();
        self.read_store(move |store| {
            let (record, _) = store.tree(&id)?;
            claim(store, &id)?;
            Ok((record, store.recovery(&id)?))
        })
        .await
    }

    /// Runs the claimed stored tree `tree_id` on with `request`, from what
    /// was recovered of it: its finished runs' final states are known here
    /// again, and the writer is told what the store holds of it already.
    pub(super) async fn go_on(
        &self,
        writer: &StoreWriter,
        tree_id: &TreeId,
        request: StartRequest,
        mut recovery: Recovery,
    ) -> Result<TreeHandle, Error> {
        for (state, _) in recovery.finished.values() {
            self.registry.record(state);
        }
        writer.send(Write::Known {
            tree_id: tree_id.clone(),
            messages: std::mem::take(&mut recovery.message_ids),
            calls: recovery.replies.keys().cloned().collect(),
            runs: std::mem::take(&mut recovery.runs),
        });
        self.begin(request, Some((Arc::new(recovery), false))).await
    }

    /// Runs a tree again on its recorded model replies only (no model is called;
    /// a missing reply fails that agent). Needs a supervisor without a store,
    /// so the replay never overwrites what it is checked against.
    /// `recorded` is what the store recovered of the tree: its replies, its
    /// steering messages (each taken again at the step it arrived in) and
    /// its decisions on tool calls (taken without asking).
    pub async fn replay(
        &self,
        request: StartRequest,
        recorded: Recovery,
    ) -> Result<TreeHandle, Error> {
        if self.store.is_some() {
            return Err(Error::ReplayWithStore);
        }
        let recovery = Recovery::replay(recorded);
        self.begin(request, Some((Arc::new(recovery), true))).await
    }
}
