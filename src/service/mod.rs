//! `arbor serve`: Arbor as a service. An HTTP API (axum) over a [`Runtime`]
//! with a store: start trees, follow their events live (SSE, resumable from the
//! journal), cancel runs, read states and spawn trees, list agents; health,
//! readiness, Prometheus metrics, the OpenAPI document, and a live tree page.
//!
//! Embedding: [`Service::router`] is a plain `axum::Router` to mount in an
//! app of one's own (see `examples/embed.rs`); [`Service::serve`] runs it on a
//! listener with graceful shutdown.

pub mod access;
mod api;
mod auth;
mod conn;
mod error;
mod events;
mod guard;
mod http_metrics;
mod limits;
mod metrics;
mod replica;
mod replica_metrics;
mod turns;

use std::collections::HashMap;

use futures::StreamExt as _;

use arbor_actors::FailureKind;
use arbor_actors::sync::LockExt as _;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arbor_supervisor::store::TreeFilter;
use arbor_supervisor::{StartRequest, TreeHandle};
use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, patch, post};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::Instrument as _;

pub use api::{ApiDoc, document as openapi_document};
pub use auth::Tokens;
pub use error::{ApiError, ErrorBody};
pub use limits::{ServiceLimits, connection_cap};

use crate::{Error, Runtime};
use metrics::Metrics;
use replica_metrics::ReplicaMetrics;

/// The live tree page (plain HTML and JS over the API).
const PAGE: &str = include_str!("page.html");

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

/// How the service runs (from `[service]` of the config, or in code).
#[derive(Debug)]
pub struct ServiceOptions {
    /// The bearer tokens a request may present (none: only loopback serves).
    pub tokens: Tokens,
    /// Where the tokens come from, named when they are missing.
    pub tokens_env: String,
    /// Largest request body, in bytes.
    pub body_limit: usize,
    /// Trees running at once; more starts are refused (503).
    pub max_running_trees: usize,
    /// After a shutdown signal: how long open requests and streams may take,
    /// then how long the store may take to write what is in flight.
    pub shutdown_timeout: Duration,
}

impl ServiceOptions {
    /// From the config's `[service]` (validated, so typed already), with the
    /// tokens read from its `tokens_env` (unnamed admins) and from each
    /// `[service.principals.NAME] token_env`. A principal's variable that is
    /// unset or holds no token, and a token two principals share, are
    /// config errors naming the key.
    pub fn from_config(config: &crate::Config) -> Result<ServiceOptions, Error> {
        let section = &config.file.service;
        let mut tokens = Tokens::parse(&std::env::var(&section.tokens_env).unwrap_or_default());
        let mut problems = Vec::new();
        let problem =
            |p: &crate::config::PrincipalSettings, message: String| crate::config::Problem {
                line: p.line,
                key: format!("service.principals.{}.token_env", p.name),
                message,
            };
        for p in &config.service.principals {
            let value = std::env::var(&p.token_env).unwrap_or_default();
            let before = tokens.len();
            tokens.add(value.split(','), &access::Principal::named(&p.name, p.role));
            if tokens.len() == before {
                let why = match std::env::var_os(&p.token_env) {
                    None => "is not set",
                    Some(_) => "holds no token",
                };
                problems.push(problem(
                    p,
                    format!(
                        "{} {why}: principal {:?} needs its tokens there (comma-separated)",
                        p.token_env, p.name
                    ),
                ));
            }
        }
        if problems.is_empty()
            && let Some((a, b)) = tokens.ambiguous()
            && let Some(p) = config.service.principals.iter().find(|p| p.name == b)
        {
            problems.push(problem(
                p,
                format!(
                    "{} holds a token that {a} has too: a token must name one caller",
                    p.token_env
                ),
            ));
        }
        if !problems.is_empty() {
            return Err(Error::Config(crate::ConfigError {
                file: config.source.clone(),
                problems,
            }));
        }
        Ok(ServiceOptions {
            tokens,
            tokens_env: section.tokens_env.clone(),
            body_limit: section.body_limit,
            max_running_trees: section.max_running_trees,
            shutdown_timeout: config.service.shutdown_timeout,
        })
    }

    /// Whether the service may listen on `addr`: without tokens, only on a
    /// loopback address.
    pub fn check_bind(&self, addr: std::net::SocketAddr) -> Result<(), Error> {
        if self.tokens.is_empty() && !addr.ip().is_loopback() {
            return Err(Error::Insecure {
                addr: addr.to_string(),
                env: self.tokens_env.clone(),
            });
        }
        Ok(())
    }
}

/// What every handler shares.
pub(crate) struct Shared {
    runtime: Runtime,
    options: ServiceOptions,
    limits: ServiceLimits,
    /// The event streams open now (capped by `limits`).
    streams: Arc<limits::StreamCounts>,
    metrics: Metrics,
    /// This replica's share of the trees on a shared store.
    replica: ReplicaMetrics,
    /// Set once interrupted trees are resumed.
    ready: watch::Sender<bool>,
    /// Set on shutdown: event streams end, readiness fails.
    shutdown: watch::Sender<bool>,
    /// Bumped when the store says a journal changed (another replica wrote):
    /// streams of trees run elsewhere read theirs again at once.
    journal_wake: watch::Sender<u64>,
    /// Bumped when the store says a control was posted for a tree: the
    /// control loop takes it at once.
    control_wake: watch::Sender<u64>,
    /// Bumped when the store says another process released its trees: the
    /// adoption loop looks for them at once.
    adopt_wake: watch::Sender<u64>,
    /// The trees this process runs (started or adopted here, not ended).
    owned: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The waiting calls of trees other replicas run, folded from their
    /// journals as far as `/v1/approvals` read them last.
    pending_seen: std::sync::Mutex<HashMap<String, replica::PendingFold>>,
}

impl Shared {
    fn readiness(&self) -> &'static str {
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
    async fn wait_ready(&self) {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|r| *r).await;
    }

    fn store_failed(&self) -> bool {
        self.runtime.supervisor().store_failure().is_some()
    }

    /// Starts a tree and keeps it running to its end in the background;
    /// returns its tree id and root run id.
    async fn start(
        self: &Arc<Self>,
        request: StartRequest,
    ) -> Result<(Arc<str>, String), ApiError> {
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
    fn admit(&self) -> Result<(), ApiError> {
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
        tree_id: String,
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
    fn keep_turn(self: &Arc<Self>, handle: TreeHandle) -> (Arc<str>, String) {
        self.metrics.trees_running.inc();
        self.keep(handle)
    }

    /// Starts the turns queued for `tree_id` that this process takes (the
    /// next one, if the tree's turn has ended and no other process got it
    /// first); each is kept as any tree, and the next is taken when it ends.
    pub(crate) async fn next_turns(self: &Arc<Self>, tree_id: &str) {
        if *self.shutdown.borrow() {
            return;
        }
        match self.runtime.supervisor().next_turn(tree_id, None).await {
            Ok(Some((turn, handle))) => {
                tracing::info!(tree = tree_id, run = %turn.run_id(), "a queued turn started");
                self.keep_turn(handle);
            }
            // None waits (or a tree that was never stored).
            Ok(None) | Err(arbor_supervisor::Error::UnknownTree(_)) => {}
            Err(error) => {
                tracing::warn!(tree = tree_id, %error, "cannot start the tree's queued turn");
            }
        }
    }

    /// Lets a started (and counted) tree run to its end, and uncounts it then.
    fn keep(self: &Arc<Self>, handle: TreeHandle) -> (Arc<str>, String) {
        let ids = (handle.tree_id.clone(), handle.root_run_id.clone());
        let gauge = self.metrics.trees_running.clone();
        self.replica.owned.inc();
        self.owned.locked().insert(ids.0.to_string());
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
                shared.replica.owned.dec();
                shared.owned.locked().remove(&*tree_id);
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
fn tree_span(tree_id: &str) -> tracing::Span {
    let request = tracing::Span::current();
    let span = tracing::info_span!(parent: None, "tree", arbor.tree.id = tree_id);
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

/// Arbor as an HTTP service.
#[derive(Clone)]
pub struct Service {
    shared: Arc<Shared>,
}

impl Service {
    /// A service over `runtime`, which must have a store (event streams are
    /// resumable from its journal; finished runs are read from it). Its
    /// connection and stream limits are the `[service]` ones of the config
    /// the runtime was built from (the defaults for a runtime built in code;
    /// see [`with_limits`](Self::with_limits)).
    pub fn new(runtime: Runtime, options: ServiceOptions) -> Result<Service, Error> {
        let limits = runtime
            .config()
            .map(|config| config.service.limits)
            .unwrap_or_default();
        Self::with_limits(runtime, options, limits)
    }

    /// A service with the connection and stream limits given.
    pub fn with_limits(
        runtime: Runtime,
        options: ServiceOptions,
        limits: ServiceLimits,
    ) -> Result<Service, Error> {
        if runtime.supervisor().store().is_none() {
            return Err(Error::NoStore);
        }
        let models = runtime
            .supervisor()
            .catalog()
            .templates()
            .map(|t| (t.id.clone(), Arc::from(t.model.as_str())))
            .collect::<HashMap<_, _>>();
        let (shutdown, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            runtime,
            options,
            limits,
            streams: Default::default(),
            metrics: Metrics::new(models),
            replica: ReplicaMetrics::new(),
            ready: watch::channel(false).0,
            shutdown,
            journal_wake: watch::channel(0).0,
            control_wake: watch::channel(0).0,
            adopt_wake: watch::channel(0).0,
            owned: Default::default(),
            pending_seen: Default::default(),
        });
        // Controls other replicas post for this one's trees, and the
        // store's notifications (a Postgres store's; SQLite has none).
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(replica::control_loop(
                Arc::downgrade(&shared),
                shared.control_wake.subscribe(),
            ));
            if let Some(store) = shared.runtime.supervisor().store() {
                replica::follow_wakes(Arc::downgrade(store), Arc::downgrade(&shared));
            }
        }
        let observer = Arc::downgrade(&shared);
        shared.runtime.supervisor().events().observe(move |event| {
            if let Some(shared) = observer.upgrade() {
                shared.metrics.observe(event);
            }
        });
        Ok(Service { shared })
    }

    /// The runtime the service starts its trees in.
    pub fn runtime(&self) -> &Runtime {
        &self.shared.runtime
    }

    /// Whether requests need no token (none configured): only for a loopback bind.
    pub fn is_open(&self) -> bool {
        self.shared.options.tokens.is_empty()
    }

    /// Every route, with the token check, the body limit and JSON errors for
    /// unknown routes. Mount it in an app of your own, or [`serve`](Self::serve) it.
    pub fn router(&self) -> Router {
        let shared = self.shared.clone();
        let api = Router::new()
            .route(
                "/v1/runs",
                post(api::runs::create_run).get(api::runs::list_runs),
            )
            .route("/v1/runs/{run_id}", get(api::runs::get_run))
            .route("/v1/runs/{run_id}/events", get(api::runs::run_events))
            .route("/v1/runs/{run_id}/cancel", post(api::runs::cancel_run))
            .route("/v1/runs/{run_id}/messages", post(api::runs::steer_run))
            .route("/v1/approvals", get(api::approvals::list_approvals))
            .route(
                "/v1/trees/{tree_id}/limits",
                patch(api::limits::raise_limits).get(api::limits::get_limits),
            )
            .route("/v1/trees/{tree_id}/turns", post(api::turns::create_turn))
            .route(
                "/v1/trees/{tree_id}/approvals",
                get(api::approvals::tree_approvals).post(api::approvals::decide_approvals),
            )
            .route(
                "/v1/trees/{tree_id}/approvals/{call_id}",
                post(api::approvals::decide_approval),
            )
            .route("/v1/trees/{tree_id}", get(api::trees::get_tree))
            .route("/v1/agents", get(api::agents::list_agents))
            .route(
                "/metrics",
                get(api::operations::metrics).layer(middleware::from_fn(negotiate_metrics)),
            )
            .route("/openapi.json", get(openapi));
        let api = if self.is_open() {
            api
        } else {
            api.route_layer(middleware::from_fn_with_state(
                shared.clone(),
                auth::require_token,
            ))
        };
        Router::new()
            .route("/", get(page))
            .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
            .route("/healthz", get(api::operations::healthz))
            .route("/readyz", get(api::operations::readyz))
            .merge(api)
            // The route template each request matched, for the HTTP metrics.
            .route_layer(middleware::from_fn(http_metrics::matched))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(DefaultBodyLimit::max(self.shared.options.body_limit))
            .layer(middleware::from_fn_with_state(
                self.shared.options.body_limit,
                limits::refuse_large_body,
            ))
            .layer(middleware::from_fn_with_state(
                self.shared.clone(),
                guard::check,
            ))
            .layer(middleware::from_fn(log_request))
            // Outermost: every request counted and timed, refused ones too.
            .layer(middleware::from_fn_with_state(
                self.shared.metrics.http(),
                http_metrics::record,
            ))
            .with_state(shared)
    }

    /// Resumes every interrupted tree in the store (a server that stopped, or
    /// crashed, mid-run), then reports ready. Returns the trees resumed.
    pub async fn resume_interrupted(&self) -> Vec<String> {
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
        let ids: Vec<String> = trees.into_iter().map(|t| t.tree_id).collect();
        let batches: Vec<Vec<String>> = ids.chunks(ADOPT_AT_ONCE).map(<[_]>::to_vec).collect();
        let resumed = futures::stream::iter(batches)
            .map(|batch| self.adopt(batch))
            .buffer_unordered(ADOPT_BATCHES)
            .flat_map(futures::stream::iter)
            .collect::<Vec<String>>()
            .await;
        // Turns queued for trees that ended with no process to take them.
        turns::take_waiting(&self.shared).await;
        self.shared.ready.send_replace(true);
        resumed
    }

    /// Claims and resumes those of the interrupted trees `batch` this
    /// process can take; the ids of those that run here now.
    async fn adopt(&self, batch: Vec<String>) -> Vec<String> {
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

    /// Ends every event stream and fails readiness (a shutdown has begun).
    pub fn stop(&self) {
        self.shared.shutdown.send_replace(true);
    }

    /// Serves on `listener` until `signal` completes, then shuts down
    /// gracefully: stops accepting, ends event streams, lets open requests
    /// finish, and waits for the store to take everything emitted so far
    /// (every run's last checkpoint), each within `shutdown_timeout`. Trees
    /// still running are left interrupted, to resume on the next start.
    ///
    /// Connections are HTTP/1.1 under the service's [`ServiceLimits`]: a
    /// header-read and an idle timeout, and a cap on open connections kept
    /// under the process's open-files limit (raised to its hard limit first);
    /// `conn.rs` says what happens at the cap.
    pub async fn serve(
        self,
        listener: TcpListener,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let timeout = self.shared.options.shutdown_timeout;
        let local = listener
            .local_addr()
            .map_err(|e| Error::Service(format!("the listener has no address: {e}")))?;
        self.shared.options.check_bind(local)?;
        let limits = self.shared.limits;
        let fd_limit = conn::raise_fd_limit();
        let cap = connection_cap(limits.max_connections, fd_limit);
        if cap < limits.max_connections {
            tracing::warn!(
                max_connections = limits.max_connections,
                open_files = fd_limit,
                "accepting at most {cap} connections: the open-files limit leaves room for no more"
            );
        }
        let connections = conn::Connections::new(cap);
        let app = self.router();
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<tokio::time::Instant>();
        let this = self.clone();
        let mut stopping = self.shared.shutdown.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                () = signal => {}
                // Stopped some other way (`Service::stop`): the signal is moot.
                _ = stopping.wait_for(|stop| *stop) => {}
            }
            tracing::info!("shutting down: no new connections, ending event streams");
            // The deadline before the stop, which lets the server's future end.
            let _ = stopped_tx.send(tokio::time::Instant::now() + timeout);
            this.stop();
        });
        let server = conn::serve(
            listener,
            app,
            limits,
            connections.clone(),
            self.shared.shutdown.subscribe(),
        );
        let mut server = std::pin::pin!(server);
        // One bound for the whole shutdown: open requests, then the store.
        let mut deadline = None;
        tokio::select! {
            () = &mut server => {}
            () = async {
                if let Ok(at) = stopped_rx.await {
                    deadline = Some(at);
                    tokio::time::sleep_until(at).await;
                }
            } => {
                tracing::warn!("requests still open after {timeout:?}; closing them");
                connections.close_all();
            }
        };
        let left = deadline
            .map(|at| at.saturating_duration_since(tokio::time::Instant::now()))
            .unwrap_or(timeout)
            .max(Duration::from_secs(1));
        let supervisor = self.shared.runtime.supervisor();
        match tokio::time::timeout(left, supervisor.release()).await {
            Ok(Ok(trees)) => tracing::info!(
                trees = trees.len(),
                "store flushed; running trees handed over, to resume on the next start"
            ),
            Ok(Err(error)) => tracing::error!(%error, "the store failed while shutting down"),
            Err(_) => tracing::error!("the store did not flush within {left:?}"),
        }
        Ok(())
    }
}

async fn page() -> Response {
    // For work on the page: serve it from a file, read on every request.
    let page = match std::env::var_os("ARBOR_PAGE_FILE") {
        Some(path) => {
            std::fs::read_to_string(path).unwrap_or_else(|e| format!("ARBOR_PAGE_FILE: {e}"))
        }
        None => PAGE.to_owned(),
    };
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 frame-ancestors 'none'",
            ),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        Html(page),
    )
        .into_response()
}

async fn openapi() -> Response {
    static DOCUMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let document = DOCUMENT.get_or_init(|| {
        // utoipa's document, the metrics route's entry, and the schemas of
        // AgentState and the stream's events.
        api::document(metrics::document).to_string()
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        document.as_str(),
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route (the API is under /v1; its document is /openapi.json)")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method (see /openapi.json)",
    )
}

/// `/metrics` in the format the scraper's `Accept` asks for: the handler
/// writes OpenMetrics; the Prometheus text format 0.0.4 is the default.
async fn negotiate_metrics(request: Request, next: Next) -> Response {
    let format = metrics::Format::negotiate(
        request
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    );
    let response = next.run(request).await;
    if format == metrics::Format::OpenMetrics || !response.status().is_success() {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let text = format.convert(&String::from_utf8_lossy(&bytes));
    parts.headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(format.content_type()),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(text))
}

/// A span per request, and one line: method, path, status, time. (No headers:
/// they carry tokens.)
async fn log_request(request: Request, next: Next) -> Response {
    use tracing::Instrument;
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let span = tracing::info_span!("request", %method, %path, otel.kind = "server");
    // A caller's W3C `traceparent`: the request (and a tree it starts) goes
    // on in the caller's trace.
    #[cfg(feature = "otel")]
    crate::telemetry::continue_trace(&span, request.headers());
    let started = std::time::Instant::now();
    let response = next.run(request).instrument(span).await;
    tracing::info!(
        %method,
        %path,
        status = response.status().as_u16(),
        ms = started.elapsed().as_millis() as u64,
        "request"
    );
    response
}
