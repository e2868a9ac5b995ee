//! What every handler shares ([`Shared`]): the runtime, the options and
//! limits, the metrics, the service's own signals (ready, shutdown, the
//! store's wakes); and how a tree or a turn started by a request is admitted
//! and kept running to its end.

use std::collections::HashMap;
use std::sync::Arc;

use arbor_actors::sync::LockExt as _;
use arbor_actors::{FailureKind, RunId, TreeId};
use arbor_supervisor::{StartRequest, TreeHandle};
use axum::http::StatusCode;
use tokio::sync::watch;
use tracing::Instrument as _;

use super::metrics::Metrics;
use super::replica_metrics::ReplicaMetrics;
use super::{ApiError, ServiceLimits, ServiceOptions, limits, replica, turns};
use arbor::Runtime;

/// What every handler shares.
pub(crate) struct Shared {
    pub(super) runtime: Runtime,
    pub(super) options: ServiceOptions,
    pub(super) limits: ServiceLimits,
    /// The event streams open now (capped by `limits`).
    pub(super) streams: Arc<limits::StreamCounts>,
    pub(super) metrics: Metrics,
    /// This replica's share of the trees on a shared store.
    pub(super) replica: ReplicaMetrics,
    /// Set once interrupted trees are resumed.
    pub(super) ready: watch::Sender<bool>,
    /// Set on shutdown: event streams end, readiness fails.
    pub(super) shutdown: watch::Sender<bool>,
    /// Bumped when the store says a journal changed (another replica wrote):
    /// streams of trees run elsewhere read theirs again at once.
    pub(super) journal_wake: watch::Sender<u64>,
    /// Bumped when the store says a control was posted for a tree: the
    /// control loop takes it at once.
    pub(super) control_wake: watch::Sender<u64>,
    /// Bumped when the store says another process released its trees: the
    /// adoption loop looks for them at once.
    pub(super) adopt_wake: watch::Sender<u64>,
    /// Bumped when a tree ends here (or a webhook's retry is due): the
    /// webhook deliverer looks for due webhooks at once.
    pub(super) webhook_wake: watch::Sender<u64>,
    /// The trees this process runs (started or adopted here, not ended).
    pub(super) owned: std::sync::Mutex<std::collections::HashSet<TreeId>>,
    /// The waiting calls of trees other replicas run, folded from their
    /// journals as far as `/v1/approvals` read them last.
    pub(super) pending_seen: std::sync::Mutex<HashMap<TreeId, replica::PendingFold>>,
}

impl Shared {
    pub(super) fn readiness(&self) -> &'static str {
        if *self.shutdown.borrow() {
            "stopping"
        } else if !*self.ready.borrow() {
            "starting"
        } else if self.store_failed() {
            "store failed"
        } else {
            "ok"
        }
    }

    /// Until interrupted trees are resumed (a stream must not take a tree
    /// about to resume for one that has ended).
    pub(super) async fn wait_ready(&self) {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|r| *r).await;
    }

    pub(super) fn store_failed(&self) -> bool {
        self.runtime.supervisor().store_failure().is_some()
    }

    /// Starts a tree and keeps it running to its end in the background;
    /// returns its tree id and root run id.
    pub(super) async fn start(
        self: &Arc<Self>,
        request: StartRequest,
    ) -> Result<(TreeId, RunId), ApiError> {
        self.admit()?;
        // The observer must know the tree's model before its first event.
        let tree_id = request
            .tree_id
            .clone()
            .unwrap_or_else(arbor_supervisor::new_tree_id);
        if let Some(model) = &request.model {
            self.metrics.tree_model(&tree_id, model);
        }
        let request = StartRequest {
            tree_id: Some(tree_id.clone()),
            ..request
        };
        // On a task of its own: a client that hangs up mid-request must not
        // cut a start in half (a tree stored but never run). It runs in the
        // tree's span, whose trace is the request's (see `tree_span`).
        let span = tree_span(&tree_id);
        let started = tokio::spawn({
            let shared = self.clone();
            async move {
                match shared.runtime.supervisor().start(request).await {
                    Ok(handle) => Ok(shared.keep(handle)),
                    Err(error) => {
                        shared.metrics.trees_running.dec();
                        shared.metrics.forget_tree(&tree_id);
                        Err(error)
                    }
                }
            }
            .instrument(span)
        });
        match started.await {
            Ok(started) => Ok(started?),
            Err(error) => Err(ApiError::unavailable("starting the tree failed", error)),
        }
    }

    /// Admits a tree (or a turn) to start now, counted from here (the gauge
    /// of the metrics is the count): refused while shutting down or at
    /// `max_running_trees`.
    pub(super) fn admit(&self) -> Result<(), ApiError> {
        if *self.shutdown.borrow() {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the server is shutting down",
            ));
        }
        let running = self.metrics.trees_running.inc();
        if running >= self.options.max_running_trees as i64 {
            self.metrics.trees_running.dec();
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                format!(
                    "{running} trees are running, the most this server runs at once; try again later"
                ),
            ));
        }
        Ok(())
    }

    /// Asks a tree a follow-up turn (semantics §14): the supervisor starts
    /// it, queues it or refuses it (`Supervisor::start_turn`). On a task of
    /// its own, so a client that hangs up does not cut an accepted turn in
    /// half. A turn queued for a tree another replica runs is told to it
    /// (journaled there), with a cancel of its turn for `interrupt`; one
    /// queued for a tree that runs nowhere is taken here at once.
    pub(crate) async fn turn(
        self: &Arc<Self>,
        tree_id: TreeId,
        request: arbor_supervisor::TurnRequest,
    ) -> Result<turns::Answer, ApiError> {
        self.admit()?;
        let span = tree_span(&tree_id);
        let asked = tokio::spawn({
            let shared = self.clone();
            async move {
                let supervisor = shared.runtime.supervisor();
                let started = supervisor.start_turn(&tree_id, request).await;
                // Counted when it starts (here, now or later), not before.
                shared.metrics.trees_running.dec();
                match started? {
                    arbor_supervisor::TurnStart::Started(handle) => {
                        let (tree, run_id) = shared.keep_turn(handle);
                        Ok(turns::Answer::Started { tree, run_id })
                    }
                    arbor_supervisor::TurnStart::Queued(queued) => {
                        turns::tell_queued(&shared, &queued).await;
                        if !queued.here {
                            shared.next_turns(&tree_id).await;
                        }
                        Ok::<_, arbor_supervisor::Error>(turns::Answer::Queued(queued.turn))
                    }
                }
            }
            .instrument(span)
        });
        match asked.await {
            Ok(answer) => answer.map_err(ApiError::from),
            Err(error) => Err(ApiError::unavailable("starting the turn failed", error)),
        }
    }

    /// Keeps a turn the supervisor started (counted from now).
    pub(super) fn keep_turn(self: &Arc<Self>, handle: TreeHandle) -> (TreeId, RunId) {
        self.metrics.trees_running.inc();
        self.keep(handle)
    }

    /// Starts the turns queued for `tree_id` that this process takes (the
    /// next one, if the tree's turn has ended and no other process got it
    /// first); each is kept as any tree, and the next is taken when it ends.
    pub(crate) async fn next_turns(self: &Arc<Self>, tree_id: &TreeId) {
        if *self.shutdown.borrow() {
            return;
        }
        match self.runtime.supervisor().next_turn(tree_id, None).await {
            Ok(Some((turn, handle))) => {
                tracing::info!(tree = %tree_id, run = %turn.run_id(), "a queued turn started");
                self.keep_turn(handle);
            }
            // None waits (or a tree that was never stored).
            Ok(None) | Err(arbor_supervisor::Error::UnknownTree(_)) => {}
            Err(error) => {
                tracing::warn!(tree = %tree_id, %error, "cannot start the tree's queued turn");
            }
        }
    }

    /// Lets a started (and counted) tree run to its end, and uncounts it then.
    pub(super) fn keep(self: &Arc<Self>, handle: TreeHandle) -> (TreeId, RunId) {
        let ids = (handle.tree_id.clone(), handle.root_run_id.clone());
        let gauge = self.metrics.trees_running.clone();
        self.replica.owned.inc();
        self.owned.locked().insert(ids.0.clone());
        let shared = Arc::downgrade(self);
        tokio::spawn(async move {
            let tree_id = handle.tree_id.clone();
            let fenced = match handle.wait().await {
                Ok(result) => {
                    tracing::info!(
                        tree = %tree_id,
                        status = result.state.status.as_str(),
                        "tree ended"
                    );
                    result.state.error_kind == Some(FailureKind::Fenced)
                }
                Err(error) => {
                    tracing::warn!(tree = %tree_id, %error, "tree lost");
                    matches!(error, arbor_supervisor::Error::Fenced { .. })
                }
            };
            gauge.dec();
            if let Some(shared) = shared.upgrade() {
                // Its webhook, if it has one, is due now.
                shared.webhook_wake.send_modify(|n| *n += 1);
                shared.replica.owned.dec();
                shared.owned.locked().remove(&tree_id);
                if fenced {
                    shared.replica.fenced.inc();
                } else {
                    // The turn ended here: the next one queued starts here.
                    shared.runtime.supervisor().until_ended(&tree_id).await;
                    shared.next_turns(&tree_id).await;
                }
            }
        });
        ids
    }
}

/// The span a tree started by a request runs in (its root agent's span is
/// its child): a span of its own, so the request's span ends with the
/// request, not with the tree; with OpenTelemetry, in the request's trace
/// (its OTLP parent is the request's span).
fn tree_span(tree_id: &TreeId) -> tracing::Span {
    let request = tracing::Span::current();
    let span = tracing::info_span!(parent: None, "tree", arbor.tree.id = %tree_id);
    #[cfg(feature = "otel")]
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        // No OpenTelemetry layer (or a disabled span): nothing to continue.
        let _ = span.set_parent(request.context());
    }
    #[cfg(not(feature = "otel"))]
    span.follows_from(&request);
    span
}
