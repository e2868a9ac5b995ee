//! The operator's routes: `/healthz`, `/readyz` (with what they found of the
//! store) and `/metrics`.

use std::sync::Arc;

use arbor_supervisor::store::TreeFilter;
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::Shared;
use crate::access::{self, Action, Caller, Subject};
use crate::error::ErrorBody;

#[derive(Serialize, ToSchema)]
pub struct Health {
    /// `ok`; readiness: `starting`, `stopping`, `store unavailable` (it
    /// takes no writes for now: the writes wait and are tried again),
    /// `store unreachable` (it answers no read) or `store failed`; health:
    /// `store failed` (it stayed down past `[store] fail_after`, or refused
    /// a write for good: restart the process).
    pub status: String,
    /// Readiness only: whether the store answers (a shared database may be
    /// down while this process is up).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreHealth>,
}

/// What readiness found of the store.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoreHealth {
    /// It answered a read within the readiness bound (2 s).
    pub reachable: bool,
    /// It takes this process's writes (it is not down, and has not failed).
    pub writable: bool,
    /// How long it has taken no writes, in milliseconds, while it is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub down_for_ms: Option<u64>,
    /// Why not, when it is unreachable, down or failed (without credentials).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[utoipa::path(
    get, path = "/healthz", tag = "operations", security(()),
    responses(
        (status = 200, description = "The process serves requests", body = Health),
        (status = 503, description = "The store failed for good (it stayed down past `[store] fail_after`, or refused a write): restart the process", body = Health),
    )
)]
pub async fn healthz(State(shared): State<Arc<Shared>>) -> (StatusCode, Json<Health>) {
    match shared.runtime.supervisor().store_failure() {
        None => (
            StatusCode::OK,
            Json(Health {
                status: "ok".into(),
                store: None,
            }),
        ),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Health {
                status: "store failed".into(),
                store: Some(StoreHealth {
                    reachable: false,
                    writable: false,
                    down_for_ms: None,
                    error: Some(arbor::config::store::redact(&reason)),
                }),
            }),
        ),
    }
}

#[utoipa::path(
    get, path = "/readyz", tag = "operations", security(()),
    responses(
        (status = 200, description = "Ready: interrupted trees resumed, the store writable", body = Health),
        (status = 503, description = "Starting, stopping, the store down, failed or not answering", body = Health),
    )
)]
pub async fn readyz(State(shared): State<Arc<Shared>>) -> (StatusCode, Json<Health>) {
    let store = store_health(&shared).await;
    let status = match shared.readiness() {
        "ok" if !store.writable => "store unavailable",
        "ok" if !store.reachable => "store unreachable",
        status => status,
    };
    let code = if status == "ok" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        Json(Health {
            status: status.into(),
            store: Some(store),
        }),
    )
}

/// Whether the store takes writes (the writer's word: down for now, or
/// failed), and answers a small read (one tree listed) in time.
async fn store_health(shared: &Shared) -> StoreHealth {
    let supervisor = shared.runtime.supervisor();
    let redact = |text: &str| arbor::config::store::redact(text);
    let (writable, down_for_ms, why) = match (supervisor.store_failure(), supervisor.store_down()) {
        (Some(reason), _) => (false, None, Some(redact(&reason))),
        (None, Some(down)) => (false, Some(down.for_ms), Some(redact(&down.to_string()))),
        (None, None) => (true, None, None),
    };
    let filter = TreeFilter {
        status: None,
        limit: 1,
        offset: 0,
    };
    let read = supervisor.read_store(move |store| store.trees(&filter));
    let (reachable, error) =
        match tokio::time::timeout(std::time::Duration::from_secs(2), read).await {
            Ok(Ok(_)) => (true, None),
            Ok(Err(error)) => (false, Some(redact(&error.to_string()))),
            Err(_) => (false, Some("no answer within 2 s".into())),
        };
    StoreHealth {
        reachable,
        writable,
        down_for_ms,
        // The writer's reason first: it says what the store said to a write.
        error: why.or(error),
    }
}

#[utoipa::path(
    get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "Prometheus metrics (OpenMetrics text)",
         content_type = "application/openmetrics-text", body = String),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The token's principal has role `user`", body = ErrorBody),
    )
)]
pub async fn metrics(State(shared): State<Arc<Shared>>, Caller(caller): Caller) -> Response {
    if let Err(error) = access::check(&shared, &caller, Action::Operate, Subject::Service).await {
        return error.into_response();
    }
    let supervisor = shared.runtime.supervisor();
    let approvals_pending = supervisor.approvals(None).len();
    let down = supervisor.store_down();
    let writable = supervisor.store().is_some() && supervisor.store_takes_writes().is_ok();
    shared.metrics.store_state(writable, down.map(|d| d.for_ms));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared
            .replica
            .append_to(shared.metrics.encode(approvals_pending)),
    )
        .into_response()
}
