//! HTTP server metrics: `arbor_http_requests_total{method,route,status}` and
//! `arbor_http_request_duration_seconds{method,route}`, labelled by the
//! route's *template* (`/v1/runs/{run_id}`), never the raw path, so the
//! number of series stays bounded whatever paths clients send.
//!
//! Two axum middlewares: [`matched`], a route layer, copies the template
//! the router matched to the response; [`record`], the outermost layer,
//! counts and times every request, routed or not. A request no route took
//! (a 404, or one the connection guard refused before routing) is labelled
//! `route="unmatched"`; a method outside the standard ones is `other`. The
//! duration ends when the response's head is ready: an event stream's
//! length is not in it.
//!
//! The router (`service/router.rs`) mounts both.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

use crate::metrics::HttpMetrics;

/// The route label of a request no route took.
pub(crate) const UNMATCHED: &str = "unmatched";

/// The route template a request matched, carried on its response from
/// [`matched`] to [`record`].
#[derive(Clone)]
struct Route(MatchedPath);

/// A route layer (`Router::route_layer`, after every route is added):
/// puts the route template the request matched on its response.
pub(crate) async fn matched(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().cloned();
    let mut response = next.run(request).await;
    if let Some(route) = route {
        response.extensions_mut().insert(Route(route));
    }
    response
}

/// The outermost layer (`Router::layer`, last): counts the request by
/// method, route template and status, and times it.
pub(crate) async fn record(
    State(metrics): State<HttpMetrics>,
    request: Request,
    next: Next,
) -> Response {
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    let route = response
        .extensions()
        .get::<Route>()
        .map_or(UNMATCHED, |route| route.0.as_str());
    metrics.record(method, route, response.status().as_u16(), started.elapsed());
    response
}

/// A method's label: the standard methods by name, anything else `other`
/// (a client cannot grow the label set).
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Format, Metrics};
    use axum::Router;
    use axum::http::StatusCode;
    use axum::middleware::{from_fn, from_fn_with_state};
    use axum::routing::get;
    use std::collections::HashMap;

    #[test]
    fn unknown_methods_share_one_label() {
        assert_eq!(method_label(&Method::GET), "GET");
        let odd = Method::from_bytes(b"BREW").unwrap_or(Method::TRACE);
        assert_eq!(method_label(&odd), "other");
    }

    /// Requests to a router with both layers, on loopback.
    #[tokio::test]
    async fn requests_are_counted_by_route_template_not_path() {
        let metrics = Metrics::new(HashMap::new());
        let app = Router::new()
            .route("/v1/runs/{run_id}", get(|| async { "run" }))
            .route(
                "/v1/runs/{run_id}/cancel",
                axum::routing::post(|| async { StatusCode::ACCEPTED }),
            )
            .fallback(|| async { StatusCode::NOT_FOUND })
            .route_layer(from_fn(matched))
            .layer(from_fn_with_state(metrics.http(), record));
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(listener) => listener,
            Err(e) => panic!("no loopback listener: {e}"),
        };
        let addr = listener.local_addr().map(|a| a.to_string());
        let addr = addr.unwrap_or_default();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let client = reqwest::Client::new();
        let send = |method: reqwest::Method, path: &str| {
            client
                .request(method, format!("http://{addr}{path}"))
                .send()
        };
        for path in ["/v1/runs/t1/0", "/v1/runs/t2/0", "/v1/runs/abc"] {
            let status = send(reqwest::Method::GET, path).await.map(|r| r.status());
            assert!(status.is_ok(), "{path}: {status:?}");
        }
        let cancel = send(reqwest::Method::POST, "/v1/runs/t1/cancel").await;
        assert_eq!(cancel.map(|r| r.status().as_u16()).ok(), Some(202));
        server.abort();

        let text = Format::Prometheus.convert(&metrics.encode(0));
        let sample = |line: &str| text.lines().any(|l| l == line);
        // `/v1/runs/t1/0` is no route here (run ids have no slash in this
        // router): two unmatched 404s, one matched 200.
        for line in [
            r#"arbor_http_requests_total{method="GET",route="/v1/runs/{run_id}",status="200"} 1"#,
            r#"arbor_http_requests_total{method="GET",route="unmatched",status="404"} 2"#,
            r#"arbor_http_requests_total{method="POST",route="/v1/runs/{run_id}/cancel",status="202"} 1"#,
            r#"arbor_http_request_duration_seconds_count{method="GET",route="/v1/runs/{run_id}"} 1"#,
            r#"arbor_http_request_duration_seconds_count{method="GET",route="unmatched"} 2"#,
            "# TYPE arbor_http_requests_total counter",
            "# TYPE arbor_http_request_duration_seconds histogram",
        ] {
            assert!(sample(line), "no {line:?} in\n{text}");
        }
        assert!(!text.contains("t1"), "a raw path became a label:\n{text}");
    }
}
