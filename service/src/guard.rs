//! What a browser could be made to do against a local server: a page on
//! another site sending requests to it. Two checks, before any route:
//!
//! - **Cross-origin writes are refused**: a request that changes state (any
//!   method but GET, HEAD and OPTIONS) whose `Origin` is not the server's own
//!   (or that the browser marks `Sec-Fetch-Site: cross-site`) gets 403, with
//!   or without a token. A `text/plain` `POST …/cancel` from any web page
//!   needs no CORS preflight; this is what stops it.
//! - **DNS rebinding is refused** when the server takes no tokens (a loopback
//!   bind): the `Host` must be a loopback name (`localhost`, `127.0.0.1`,
//!   `[::1]`, any port). A page whose own name was made to resolve to
//!   127.0.0.1 sends its own name as `Host`, and gets 403.
//!
//! The live page is also sent with `frame-ancestors 'none'` (see `page`).

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Shared;
use super::error::ApiError;

pub(crate) async fn check(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    if shared.options.tokens.is_empty() && !host.as_deref().is_some_and(is_loopback_host) {
        return forbidden(format!(
            "Host {:?} is not this machine's loopback address: a server without tokens \
             answers only requests to localhost, 127.0.0.1 or [::1]",
            host.unwrap_or_default()
        ));
    }
    let writes = !matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if writes {
        let cross_site = headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("cross-site"));
        let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        let foreign = origin.is_some_and(|o| !same_origin(o, host.as_deref()));
        if cross_site || foreign {
            return forbidden(format!(
                "cross-origin request refused (Origin {:?}): the API takes writes only \
                 from its own page or from clients that are not browsers",
                origin.unwrap_or("-")
            ));
        }
    }
    next.run(request).await
}

fn forbidden(message: String) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", message).into_response()
}

/// `localhost`, `*.localhost`, or a loopback IP literal, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        // [::1]:8080
        Some(rest) => rest.split_once(']').map_or(rest, |(ip, _)| ip),
        None => host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                name
            } else {
                host
            }
        }),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether an `Origin` (`scheme://host[:port]`) names the host the request was sent to.
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else {
        return false;
    };
    origin
        .split_once("://")
        .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_told_from_other_names() {
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:8080",
            "127.1.2.3",
            "[::1]:8080",
            "[::1]",
            "app.localhost:3000",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "10.0.0.1:8080",
            "[2001:db8::1]:80",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn an_origin_is_the_servers_own_only_for_its_host() {
        assert!(same_origin("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
        assert!(!same_origin(
            "http://127.0.0.1:8081",
            Some("127.0.0.1:8080")
        ));
        assert!(!same_origin("https://evil.example", Some("127.0.0.1:8080")));
        assert!(!same_origin("null", Some("127.0.0.1:8080")));
        assert!(!same_origin("http://127.0.0.1:8080", None));
    }
}
