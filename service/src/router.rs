//! [`Service::router`]: every route, the middleware around them (token,
//! body limit, guard, logging, HTTP metrics), and the routes that are not
//! the API's own (the page, the OpenAPI document, JSON errors for unknown
//! routes and methods).

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, patch, post};

use super::{ApiError, Service, api, auth, guard, http_metrics, limits, metrics};

/// The live tree page (plain HTML and JS over the API).
const PAGE: &str = include_str!("page.html");

impl Service {
    /// Every route, with the token check, the body limit and JSON errors for
    /// unknown routes. Mount it in an app of your own, or [`serve`](Self::serve) it.
    pub fn router(&self) -> Router {
        let shared = self.shared.clone();
        let api = Router::new()
            .route(
                "/v1/runs",
                post(api::runs::create_run).get(api::runs::list_runs),
            )
            .route("/v1/runs/wait", post(api::wait::wait_run))
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
    arbor::telemetry::continue_trace(&span, request.headers());
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
