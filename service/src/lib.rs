//! `arbor serve`: Arbor as a service. An HTTP API (axum) over a [`Runtime`]
//! with a store: start trees, follow their events live (SSE, resumable from the
//! journal), cancel runs, read states and spawn trees, list agents; health,
//! readiness, Prometheus metrics, the OpenAPI document, and a live tree page.
//!
//! Embedding: [`Service::router`] is a plain `axum::Router` to mount in an
//! app of one's own (see `examples/embed.rs`); [`Service::serve`] runs it on a
//! listener with graceful shutdown.

pub mod access;
mod adopt;
mod api;
mod auth;
mod conn;
mod error;
mod events;
mod guard;
mod http_metrics;
mod limits;
mod metrics;
mod options;
mod replica;
mod replica_metrics;
mod router;
mod serve;
mod shared;
mod turns;
mod webhooks;

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::watch;

pub use adopt::ADOPT_EVERY;
pub use api::{ApiDoc, document as openapi_document};
pub use auth::Tokens;
pub use error::{ApiError, ErrorBody};
pub use limits::{ServiceLimits, connection_cap};
pub use options::ServiceOptions;
pub use webhooks::WebhookOptions;
pub use webhooks::decide::Retries as WebhookRetries;
pub use webhooks::payload::{WebhookPayload, WebhookUsage, signature as webhook_signature};

use arbor::{Error, Runtime};
use metrics::Metrics;
use replica_metrics::ReplicaMetrics;
use shared::Shared;

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
            webhook_wake: watch::channel(0).0,
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
            // Completion webhooks of trees that ended (here, before a
            // restart, or on another replica), and their retries.
            tokio::spawn(webhooks::deliver_loop(
                Arc::downgrade(&shared),
                shared.webhook_wake.subscribe(),
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
}
