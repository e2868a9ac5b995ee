//! The cooldown gate every model on one endpoint and key shares: a 429 (or
//! 503) with `Retry-After`, or rate-limit headers with nothing remaining,
//! hold back every request to the endpoint until the wait is over (asserted
//! on when the server received each request); a wait beyond the tree's
//! deadline fails at once; `User-Agent`; the error's type and code in the
//! message. A tree of 20 children of one lead under a 429 mix, run by the
//! supervisor against a rate-limited loopback endpoint: every child
//! completes and no request arrives inside a `Retry-After` window the
//! endpoint announced; and an `#[ignore]`d measurement of what the gate
//! saves that tree (BENCHMARKS.md "Shared cooldown").
//!
//! The waits are the client's real ones (tokio time, not paused: a paused
//! clock jumps to the next timer while a request is on the wire, which would
//! fire the request timeout), so each gate test waits its window (1.5 to 2 s).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arbor::actors::{Model, ModelError, ModelRequest};
use arbor::providers::{ApiKey, HttpModel, ProviderKind, ProviderSettings};
use serde_json::json;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::support::{self, collector, guarded, request, retries, sse, wire};

/// Runs each case once per wire format, as `provider_faults` does.
macro_rules! for_each_kind {
    ($($case:ident),* $(,)?) => {
        mod openai {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(arbor::providers::ProviderKind::OpenAi).await
                }
            )*
        }
        mod anthropic {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(arbor::providers::ProviderKind::Anthropic).await
                }
            )*
        }
    };
}

for_each_kind!(
    a_429_holds_back_the_request_waiting_to_start,
    a_429_holds_back_every_model_on_the_endpoint_and_key,
    a_retry_waits_for_the_gate_another_request_closed,
    retry_after_beyond_the_deadline_fails_at_once,
    retry_after_beyond_max_delay_is_honoured,
    every_request_says_it_is_arbor,
);

/// When each request arrived and the key it carried.
type Arrivals = Arc<Mutex<Vec<(Instant, String)>>>;

/// Answers the `n`-th request (from 0) with `answer(n)`, noting its arrival.
struct Script<F> {
    arrivals: Arrivals,
    answer: F,
}

impl<F: Fn(usize) -> ResponseTemplate + Send + Sync + 'static> Respond for Script<F> {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let key = ["authorization", "x-api-key"]
            .iter()
            .find_map(|name| request.headers.get(*name)?.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let n = {
            let mut arrivals = self.arrivals.lock().unwrap();
            arrivals.push((Instant::now(), key));
            arrivals.len() - 1
        };
        (self.answer)(n)
    }
}

/// A server answering by `answer`; and the arrivals it notes.
async fn scripted(
    kind: ProviderKind,
    answer: impl Fn(usize) -> ResponseTemplate + Send + Sync + 'static,
) -> (MockServer, Arrivals) {
    let server = MockServer::start().await;
    let arrivals = Arrivals::default();
    Mock::given(method("POST"))
        .and(path(support::path(kind)))
        .respond_with(Script {
            arrivals: arrivals.clone(),
            answer,
        })
        .mount(&server)
        .await;
    (server, arrivals)
}

fn ok(kind: ProviderKind) -> ResponseTemplate {
    sse(wire::text_stream(kind, "ok"))
}

fn limited(kind: ProviderKind, status: u16, retry_after: &str) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .insert_header("retry-after", retry_after)
        .set_body_json(wire::error_json(kind, "Rate limit reached"))
}

fn times(arrivals: &Arrivals) -> Vec<Instant> {
    arrivals.lock().unwrap().iter().map(|(t, _)| *t).collect()
}

/// A request whose tree's deadline is `within` from now.
fn request_within(within: Duration) -> ModelRequest {
    let mut request = request(false);
    request.meta.deadline = Some(tokio::time::Instant::now() + within);
    request
}

/// Two concurrent requests on one model that sends one at a time: the first
/// gets 429 with `Retry-After: 2`; the second, admitted by the limiter at
/// once, is not sent before the two seconds are over, nor is the retry.
/// `Retry-After` beyond the policy's `max_delay` (1 s here) is not shortened.
async fn a_429_holds_back_the_request_waiting_to_start(kind: ProviderKind) {
    let (server, arrivals) = scripted(kind, move |n| match n {
        0 => limited(kind, 429, "2"),
        _ => ok(kind),
    })
    .await;
    let mut settings = support::settings(kind, &server.uri());
    settings.limits.max_concurrent = Some(1);
    let model = Arc::new(HttpModel::new("m", settings).unwrap());
    let (sink, deltas) = collector();
    let (a, b) = guarded(async {
        tokio::join!(
            model.complete(request(false), sink.clone()),
            model.complete(request(false), sink.clone())
        )
    })
    .await;
    assert_eq!(a.unwrap().message.text(), "ok");
    assert_eq!(b.unwrap().message.text(), "ok");
    let at = times(&arrivals);
    assert_eq!(at.len(), 3, "one 429, then the retry and the other request");
    for later in &at[1..] {
        let after = *later - at[0];
        assert!(
            after >= Duration::from_secs(2),
            "sent {after:?} after the 429"
        );
    }
    let retries = retries(&deltas);
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert_eq!(
        retries[0].1, 2000,
        "Retry-After is honoured beyond max_delay"
    );
}

/// Two catalog models on the same base URL and key share the gate: after
/// one gets 429 (`Retry-After: 2`), neither sends before the window ends; a
/// model with another key on the same server is not held.
async fn a_429_holds_back_every_model_on_the_endpoint_and_key(kind: ProviderKind) {
    let (server, arrivals) = scripted(kind, move |n| match n {
        0 => limited(kind, 429, "2"),
        _ => ok(kind),
    })
    .await;
    let settings = support::settings(kind, &server.uri());
    let mut once = settings.clone();
    once.retry.max_retries = 0;
    let first = HttpModel::new("first", once).unwrap();
    let mut renamed = settings.clone();
    renamed.model = "another-model".into();
    let second = HttpModel::new("second", renamed).unwrap();
    let mut other_key = settings.clone();
    other_key.api_key = Some(ApiKey::new("sk-another-key".into()));
    let other = HttpModel::new("other", other_key).unwrap();

    let (sink, _) = collector();
    let error = guarded(first.complete(request(false), sink.clone()))
        .await
        .expect_err("no retries");
    assert!(matches!(error, ModelError::RateLimited { .. }), "{error:?}");
    assert_eq!(error.retry_after(), Some(Duration::from_secs(2)));
    let (a, b, c) = guarded(async {
        tokio::join!(
            first.complete(request(false), sink.clone()),
            second.complete(request(false), sink.clone()),
            other.complete(request(false), sink.clone()),
        )
    })
    .await;
    for reply in [a, b, c] {
        assert_eq!(reply.unwrap().message.text(), "ok");
    }
    let arrivals = arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 4);
    let start = arrivals[0].0;
    for (at, key) in &arrivals[1..] {
        let after = *at - start;
        if key.contains("sk-another-key") {
            assert!(after < Duration::from_secs(2), "another key is not held");
        } else {
            assert!(
                after >= Duration::from_secs(2),
                "sent {after:?} after the 429"
            );
        }
    }
}

/// A request on the wire when another request's 429 closes the gate fails
/// (500, retried after a millisecond's backoff): its retry waits for the
/// gate. The 500 is held (an axum server) until the 429 has been seen.
async fn a_retry_waits_for_the_gate_another_request_closed(kind: ProviderKind) {
    use axum::extract::State;
    use axum::response::IntoResponse;

    #[derive(Default)]
    struct Held {
        arrivals: Mutex<Vec<Instant>>,
        first_arrived: tokio::sync::Notify,
        release: tokio::sync::Notify,
    }
    let held = Arc::new(Held::default());
    let app = axum::Router::new()
        .route(
            support::path(kind),
            axum::routing::post(move |State(held): State<Arc<Held>>| async move {
                let n = {
                    let mut arrivals = held.arrivals.lock().unwrap();
                    arrivals.push(Instant::now());
                    arrivals.len() - 1
                };
                let error = wire::error_json(kind, "oops").to_string();
                match n {
                    0 => {
                        held.first_arrived.notify_one();
                        held.release.notified().await;
                        (axum::http::StatusCode::INTERNAL_SERVER_ERROR, error).into_response()
                    }
                    1 => (
                        axum::http::StatusCode::TOO_MANY_REQUESTS,
                        [("retry-after", "2")],
                        error,
                    )
                        .into_response(),
                    _ => (
                        [("content-type", "text/event-stream")],
                        wire::text_stream(kind, "ok"),
                    )
                        .into_response(),
                }
            }),
        )
        .with_state(held.clone());
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let settings = support::settings(kind, &uri);
    let retried = Arc::new(HttpModel::new("retried", settings.clone()).unwrap());
    let mut once = settings;
    once.retry.max_retries = 0;
    let limited = HttpModel::new("limited", once).unwrap();
    let (sink, deltas) = collector();
    let on_the_wire = tokio::spawn({
        let retried = retried.clone();
        async move { retried.complete(request(false), sink).await }
    });
    guarded(held.first_arrived.notified()).await;
    let (sink, _) = collector();
    let error = guarded(limited.complete(request(false), sink))
        .await
        .expect_err("the 429");
    assert!(matches!(error, ModelError::RateLimited { .. }), "{error:?}");
    held.release.notify_one();
    let reply = guarded(on_the_wire)
        .await
        .unwrap()
        .expect("the retry succeeds");
    assert_eq!(reply.message.text(), "ok");
    let at = held.arrivals.lock().unwrap().clone();
    assert_eq!(at.len(), 3);
    let after = at[2] - at[1];
    assert!(
        after >= Duration::from_secs(2),
        "the retry went {after:?} after the 429"
    );
    let retries = retries(&deltas);
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert!(retries[0].1 < 1000, "its own backoff is short: {retries:?}");
    server.abort();
}

/// `Retry-After: 30` with the tree's deadline in 5 s: the request fails at
/// once, saying why, and so does the next request to the endpoint (without
/// being sent).
async fn retry_after_beyond_the_deadline_fails_at_once(kind: ProviderKind) {
    let (server, arrivals) = scripted(kind, move |n| match n {
        0 => limited(kind, 429, "30"),
        _ => ok(kind),
    })
    .await;
    let model = HttpModel::new("m", support::settings(kind, &server.uri())).unwrap();
    let started = Instant::now();
    let (sink, deltas) = collector();
    let error = guarded(model.complete(request_within(Duration::from_secs(5)), sink.clone()))
        .await
        .expect_err("the wait does not fit");
    // Not a wait for the deadline (5 s) nor for the 30 s: it gave up before
    // either (a loose bound, for a loaded machine).
    assert!(started.elapsed() < Duration::from_secs(4), "at once");
    let ModelError::RateLimited {
        message,
        retry_after,
        ..
    } = &error
    else {
        panic!("expected RateLimited, got {error:?}");
    };
    assert!(
        message.contains("the endpoint asked to wait 30s, beyond the tree's deadline in 5s"),
        "{message}"
    );
    assert!(message.contains("Rate limit reached"), "{message}");
    assert_eq!(*retry_after, Some(Duration::from_secs(30)));
    assert!(retries(&deltas).is_empty());
    // The gate is closed for every request to the endpoint.
    let error = guarded(model.complete(request_within(Duration::from_secs(5)), sink))
        .await
        .expect_err("the gate is closed");
    assert!(
        error.to_string().contains("beyond the tree's deadline"),
        "{error}"
    );
    assert_eq!(arrivals.lock().unwrap().len(), 1, "nothing else was sent");
}

/// `Retry-After` longer than `max_delay` is waited for in full when it fits
/// before the deadline.
async fn retry_after_beyond_max_delay_is_honoured(kind: ProviderKind) {
    let (server, arrivals) = scripted(kind, move |n| match n {
        0 => ResponseTemplate::new(429)
            .insert_header("retry-after-ms", "300")
            .set_body_json(wire::error_json(kind, "Rate limit reached")),
        _ => ok(kind),
    })
    .await;
    let mut settings = support::settings(kind, &server.uri());
    settings.retry.max_delay = Duration::from_millis(1);
    let model = HttpModel::new("m", settings).unwrap();
    let (sink, deltas) = collector();
    let reply = guarded(model.complete(request_within(Duration::from_secs(10)), sink))
        .await
        .unwrap();
    assert_eq!(reply.message.text(), "ok");
    let retries = retries(&deltas);
    assert_eq!(retries.len(), 1);
    assert_eq!(retries[0].1, 300, "{retries:?}");
    let at = times(&arrivals);
    assert!(at[1] - at[0] >= Duration::from_millis(300));
}

async fn every_request_says_it_is_arbor(kind: ProviderKind) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(support::path(kind)))
        .and(header(
            "user-agent",
            concat!("arbor/", env!("CARGO_PKG_VERSION")),
        ))
        .respond_with(ok(kind))
        .mount(&server)
        .await;
    let model = HttpModel::new("m", support::settings(kind, &server.uri())).unwrap();
    let (sink, _) = collector();
    // Without the header the request would match nothing: a 404, refused.
    let reply = guarded(model.complete(request(false), sink)).await.unwrap();
    assert_eq!(reply.message.text(), "ok");
}

/// OpenAI: a reply with `x-ratelimit-remaining-requests: 0` of a bucket of
/// unknown size (no `x-ratelimit-limit-requests`, so no rate) closes the gate
/// until `x-ratelimit-reset-requests` (a Go duration); a spent token bucket
/// with a reset of `6m0s` makes a request with a nearer deadline fail at
/// once, quoting the headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_remaining_zero_closes_the_gate_until_the_reset() {
    let kind = ProviderKind::OpenAi;
    let (server, arrivals) = scripted(kind, move |n| match n {
        0 => ok(kind)
            .insert_header("x-ratelimit-remaining-requests", "0")
            .insert_header("x-ratelimit-reset-requests", "1.5s")
            .insert_header("x-ratelimit-remaining-tokens", "1000")
            .insert_header("x-ratelimit-reset-tokens", "6m0s"),
        1 => ok(kind)
            .insert_header("x-ratelimit-remaining-requests", "10")
            .insert_header("x-ratelimit-reset-requests", "20ms")
            .insert_header("x-ratelimit-remaining-tokens", "0")
            .insert_header("x-ratelimit-reset-tokens", "6m0s"),
        _ => ok(kind),
    })
    .await;
    let model = HttpModel::new("m", support::settings(kind, &server.uri())).unwrap();
    let (sink, _) = collector();
    for _ in 0..2 {
        let reply = guarded(model.complete(request(false), sink.clone()))
            .await
            .unwrap();
        assert_eq!(reply.message.text(), "ok");
    }
    let at = times(&arrivals);
    assert!(
        at[1] - at[0] >= Duration::from_millis(1500),
        "{:?}",
        at[1] - at[0]
    );
    let error = guarded(model.complete(request_within(Duration::from_secs(60)), sink))
        .await
        .expect_err("the tokens reset in 6 minutes");
    let message = error.to_string();
    assert!(
        message.contains(
            "the endpoint's rate limit has room for the next request in 360s, beyond the \
             tree's deadline in 60s (it sent x-ratelimit-remaining-tokens: 0, \
             x-ratelimit-reset-tokens: 6m0s)"
        ),
        "{message}"
    );
    assert_eq!(arrivals.lock().unwrap().len(), 2);
}

/// Anthropic: `anthropic-ratelimit-requests-remaining: 0` closes the gate
/// until `anthropic-ratelimit-requests-reset` (an RFC 3339 time), here far
/// off, so the next request with a deadline fails at once, unsent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_remaining_zero_closes_the_gate_until_the_reset() {
    let kind = ProviderKind::Anthropic;
    let (server, arrivals) = scripted(kind, move |_| {
        ok(kind)
            .insert_header("anthropic-ratelimit-requests-remaining", "0")
            .insert_header("anthropic-ratelimit-requests-reset", "2999-01-01T00:00:00Z")
            .insert_header("anthropic-ratelimit-tokens-remaining", "5000")
    })
    .await;
    let model = HttpModel::new("m", support::settings(kind, &server.uri())).unwrap();
    let (sink, _) = collector();
    let reply = guarded(model.complete(request(false), sink.clone()))
        .await
        .unwrap();
    assert_eq!(reply.message.text(), "ok");
    let error = guarded(model.complete(request_within(Duration::from_secs(60)), sink))
        .await
        .expect_err("the gate is closed until the reset");
    assert!(
        matches!(&error, ModelError::RateLimited { message, .. }
            if message.contains("beyond the tree's deadline in 60s")),
        "{error}"
    );
    assert_eq!(arrivals.lock().unwrap().len(), 1);
}

/// A 503 with `Retry-After` closes the gate like a 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_with_retry_after_closes_the_gate() {
    let kind = ProviderKind::OpenAi;
    let (server, arrivals) = scripted(kind, move |n| match n {
        0 => limited(kind, 503, "30"),
        _ => ok(kind),
    })
    .await;
    let mut settings = support::settings(kind, &server.uri());
    settings.retry.max_retries = 0;
    let model = HttpModel::new("m", settings).unwrap();
    let (sink, _) = collector();
    let error = guarded(model.complete(request(false), sink.clone()))
        .await
        .expect_err("503");
    assert!(matches!(error, ModelError::Transient { .. }), "{error:?}");
    let error = guarded(model.complete(request_within(Duration::from_secs(5)), sink))
        .await
        .expect_err("the gate is closed");
    assert!(
        error
            .to_string()
            .contains("asked to wait 30s, beyond the tree's deadline in 5s"),
        "{error}"
    );
    assert_eq!(arrivals.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_type_and_code_are_kept_in_the_message() {
    let cases = [
        (
            ProviderKind::OpenAi,
            json!({"error": {"message": "This model's maximum context length is 128000 tokens.",
                "type": "invalid_request_error", "param": "messages",
                "code": "context_length_exceeded"}}),
            "invalid_request_error/context_length_exceeded: This model's maximum context length is 128000 tokens.",
        ),
        (
            ProviderKind::Anthropic,
            json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "prompt is too long: 210000 tokens > 200000 maximum"}}),
            "invalid_request_error: prompt is too long: 210000 tokens > 200000 maximum",
        ),
    ];
    for (kind, body, expected) in cases {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(support::path(kind)))
            .respond_with(ResponseTemplate::new(400).set_body_json(body))
            .mount(&server)
            .await;
        let model = HttpModel::new("m", support::settings(kind, &server.uri())).unwrap();
        let (sink, _) = collector();
        let error = guarded(model.complete(request(false), sink))
            .await
            .expect_err("refused");
        match &error {
            ModelError::Rejected {
                status, message, ..
            } => {
                assert_eq!(*status, 400);
                assert_eq!(message, expected);
            }
            other => panic!("expected Rejected, got {other:?}"),
        }
    }
}

/// A rate-limited OpenAI-compatible endpoint (Chat Completions, whole
/// replies) on loopback, for a tree. It serves `quota` requests per fixed
/// `window` (counted from its start) and answers the rest with 429 and a
/// wait of `retry_after` (`Retry-After` in whole seconds, else OpenAI's
/// `retry-after-ms`); every reply carries `x-ratelimit-remaining-requests`
/// and `x-ratelimit-reset-requests` (to the window's end), as OpenAI's do,
/// and is sent after `hold`. It notes when each request arrived and each
/// window it announced. It answers as the tree's agents need: a system
/// prompt `spawn TYPE N` (with `spawn_agents`) spawns N children of TYPE on
/// the first step; `work N` calls `echo` until N - 1 results are in, then
/// answers; anything else is answered with text.
#[derive(Clone, Copy, Debug)]
struct Rate {
    quota: usize,
    window: Duration,
    retry_after: Duration,
    hold: Duration,
}

struct Limited {
    start: Instant,
    rate: Rate,
    seen: Mutex<Seen>,
}

/// What the limited endpoint saw.
#[derive(Default)]
struct Seen {
    window: u128,
    served_in_window: usize,
    arrivals: Vec<Instant>,
    wasted: usize,
    /// Each 429's window: from when it was sent, for how long.
    announced: Vec<(Instant, Duration)>,
}

async fn limited_chat(
    axum::extract::State(limited): axum::extract::State<Arc<Limited>>,
    body: String,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let rate = limited.rate;
    let (served, remaining, reset) = {
        let now = Instant::now();
        let elapsed = now - limited.start;
        let window = elapsed.as_nanos() / rate.window.as_nanos();
        let reset = rate.window * (window as u32 + 1) - elapsed;
        let mut seen = limited.seen.lock().unwrap();
        seen.arrivals.push(now);
        if seen.window != window {
            seen.window = window;
            seen.served_in_window = 0;
        }
        let served = seen.served_in_window < rate.quota;
        if served {
            seen.served_in_window += 1;
        } else {
            seen.wasted += 1;
        }
        (served, rate.quota - seen.served_in_window, reset)
    };
    tokio::time::sleep(rate.hold).await;
    let mut response = if served {
        let request: serde_json::Value = serde_json::from_str(&body).unwrap();
        axum::Json(tree_reply(&request)).into_response()
    } else {
        let (name, value) = if rate.retry_after.subsec_nanos() == 0 {
            ("retry-after", rate.retry_after.as_secs().to_string())
        } else {
            ("retry-after-ms", rate.retry_after.as_millis().to_string())
        };
        let mut response = (
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            axum::Json(wire::error_json(ProviderKind::OpenAi, "Rate limit reached")),
        )
            .into_response();
        response.headers_mut().insert(name, value.parse().unwrap());
        // Announced as it goes out.
        let mut seen = limited.seen.lock().unwrap();
        seen.announced.push((Instant::now(), rate.retry_after));
        response
    };
    let headers = response.headers_mut();
    headers.insert(
        "x-ratelimit-remaining-requests",
        remaining.to_string().parse().unwrap(),
    );
    headers.insert(
        "x-ratelimit-reset-requests",
        format!("{}ms", reset.as_millis().max(1)).parse().unwrap(),
    );
    response
}

/// The limited endpoint's reply to one of the tree's requests (see [`Rate`]).
fn tree_reply(request: &serde_json::Value) -> serde_json::Value {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let system = messages
        .iter()
        .find(|m| m["role"] == "system")
        .and_then(|m| m["content"].as_str())
        .unwrap_or("");
    let results = messages.iter().filter(|m| m["role"] == "tool").count();
    let call = |name: &str, id: String, input: serde_json::Value| {
        json!({"role": "assistant", "content": "", "tool_calls": [{
            "id": id, "type": "function",
            "function": {"name": name, "arguments": input.to_string()}
        }]})
    };
    let message = match system.split_whitespace().collect::<Vec<_>>()[..] {
        ["spawn", agent_type, count] if results == 0 => {
            let agents: Vec<_> = (0..count.parse().unwrap())
                .map(|i: usize| json!({"agent_type": agent_type, "prompt": format!("part {i}")}))
                .collect();
            call(
                "spawn_agents",
                "call_spawn".into(),
                json!({"agents": agents}),
            )
        }
        ["work", steps] if results + 1 < steps.parse::<usize>().unwrap() => {
            call("echo", format!("call_{results}"), json!({"n": results}))
        }
        _ => json!({"role": "assistant", "content": "done"}),
    };
    json!({
        "id": "chatcmpl-tree", "object": "chat.completion", "model": request["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    })
}

/// What one swarm tree cost the endpoint.
#[derive(Debug)]
struct Swarm {
    sent: usize,
    wasted: usize,
    /// Requests that arrived inside a window the endpoint had announced
    /// (more than [`ANNOUNCED_LATE`] after its 429 went out).
    inside: Vec<Duration>,
    elapsed: Duration,
}

/// How long after its 429 went out a request may still arrive inside the
/// announced window without the client having ignored it: it was already
/// on its way, or past the gate, before the 429 reached the client (loopback
/// and a loaded test machine: a generous bound against windows of 300 ms
/// and more). Both times are the mock's clock.
const ANNOUNCED_LATE: Duration = Duration::from_millis(100);

/// A tree on one OpenAI model against the [`Rate`]-limited endpoint: a
/// lead whose first step spawns `children` workers, each of them making
/// `each` requests (calling `echo` in between), then the lead's answer.
/// With the model as built (its endpoint's shared cooldown) or
/// `without_cooldown()`. Every agent completes.
async fn swarm(children: usize, each: usize, rate: Rate, shared_cooldown: bool) -> Swarm {
    use arbor::actors::{AgentStatus, AgentTemplate, EventKind};
    use arbor::supervisor::{StartRequest, Supervisor, TreeLimits};

    let limited = Arc::new(Limited {
        start: Instant::now(),
        rate,
        seen: Mutex::default(),
    });
    let app = axum::Router::new()
        .route(
            support::path(ProviderKind::OpenAi),
            axum::routing::post(limited_chat),
        )
        .with_state(limited.clone());
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mut settings: ProviderSettings = support::settings(ProviderKind::OpenAi, &uri);
    settings.stream = false;
    settings.retry.max_retries = 100;
    let model = HttpModel::new("m", settings).unwrap();
    let model = if shared_cooldown {
        model
    } else {
        model.without_cooldown()
    };
    let lead = AgentTemplate::new("lead", "m")
        .system_prompt(&format!("spawn worker {children}"))
        .spawns(&["worker"])
        .max_steps(4);
    let worker = arbor_test_support::with_echo(
        AgentTemplate::new("worker", "m").system_prompt(&format!("work {each}")),
    )
    .max_steps(each as u32 + 1);
    let catalog = arbor_test_support::catalog(
        vec![("m", Arc::new(model) as Arc<dyn Model>)],
        vec![lead, worker],
        vec![arbor_test_support::echo()],
    );
    let supervisor = Supervisor::new(catalog, TreeLimits::default());
    let start = StartRequest {
        agent: "lead".into(),
        prompt: "go".into(),
        ..StartRequest::default()
    };
    let started = Instant::now();
    let (result, events) =
        arbor_test_support::run_request(&supervisor, start, support::GUARD).await;
    let elapsed = started.elapsed();
    server.abort();

    assert_eq!(
        result.state.status,
        AgentStatus::Completed,
        "{:?}",
        result.state.error_message()
    );
    let children_done: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ChildFinished { status, .. } => Some(*status),
            _ => None,
        })
        .collect();
    assert_eq!(
        children_done,
        vec![AgentStatus::Completed; children],
        "every child completes"
    );
    let seen = limited.seen.lock().unwrap();
    let served = seen.arrivals.len() - seen.wasted;
    assert_eq!(served, 2 + children * each, "every request served once");
    let inside = seen
        .arrivals
        .iter()
        .filter_map(|at| {
            seen.announced.iter().find_map(|(from, wait)| {
                let after = at.checked_duration_since(*from)?;
                (after > ANNOUNCED_LATE && after < *wait).then_some(after)
            })
        })
        .collect();
    Swarm {
        sent: seen.arrivals.len(),
        wasted: seen.wasted,
        inside,
        elapsed,
    }
}

/// Acceptance 3 of issue 15, kept short: a lead spawns 20 workers, each
/// making 2 requests, on one model against an endpoint serving 8 requests
/// per 300 ms and answering the rest 429 with `retry-after-ms: 300`. Every
/// agent completes, and no request reaches the endpoint inside a window it
/// announced (past [`ANNOUNCED_LATE`]): the 429 of one child holds back its
/// siblings, their next steps and the retries alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_swarm_tree_sends_nothing_inside_a_retry_after_window() {
    let rate = Rate {
        quota: 8,
        window: Duration::from_millis(300),
        retry_after: Duration::from_millis(300),
        hold: Duration::from_millis(10),
    };
    let run = swarm(20, 2, rate, true).await;
    assert!(run.wasted > 0, "the endpoint never refused: {run:?}");
    assert!(
        run.inside.is_empty(),
        "{} requests arrived inside an announced window, at {:?} into it",
        run.inside.len(),
        run.inside
    );
}

/// BENCHMARKS.md "Shared cooldown": the tree of the test above at the
/// scale of the earlier measurement (20 workers x 3 requests, 10 requests
/// per one-second window, `Retry-After: 1`, 50 ms replies), with the shared
/// cooldown and without it, `RUNS` times each, alternated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement (about a minute): --ignored --nocapture"]
async fn measure_the_shared_cooldown_on_a_swarm() {
    const RUNS: usize = 3;
    let (children, each) = (20, 3);
    let rate = Rate {
        quota: 10,
        window: Duration::from_secs(1),
        retry_after: Duration::from_secs(1),
        hold: Duration::from_millis(50),
    };
    println!(
        "a lead spawning {children} workers x {each} requests (+2 of the lead), {} requests/s, \
         429 with Retry-After: 1 beyond it",
        rate.quota
    );
    println!("| run | cooldown | sent | wasted (429) | inside a window | time |");
    println!("|---|---|---|---|---|---|");
    for run in 1..=RUNS {
        for shared_cooldown in [true, false] {
            let swarm = swarm(children, each, rate, shared_cooldown).await;
            println!(
                "| {run} | {} | {} | {} | {} | {:.1} s |",
                if shared_cooldown { "shared" } else { "none" },
                swarm.sent,
                swarm.wasted,
                swarm.inside.len(),
                swarm.elapsed.as_secs_f64()
            );
            if shared_cooldown {
                assert!(swarm.inside.is_empty(), "{swarm:?}");
            }
        }
    }
}

/// Two `[models.*]` entries on one endpoint and key share one limiter, the
/// tighter budget winning: a lead on `a` (`max_concurrent = 2`) spawns 12
/// workers on `b` (`max_concurrent = 6`), and the server never has more
/// than 2 requests in flight (6 if each entry had a budget of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_entries_on_one_key_share_the_tighter_max_concurrent() {
    use arbor::actors::AgentStatus;
    use arbor::supervisor::{StartRequest, Supervisor};

    let server = support::FakeOpenAi::start(Duration::from_millis(20), None).await;
    let text = format!(
        r#"
[limits]
max_children_per_call = 12

[models.a]
provider = "openai"
base_url = "{url}"
model = "test"
stream = false
limits = {{ max_concurrent = 2 }}

[models.b]
provider = "openai"
base_url = "{url}/"
model = "another"
stream = false
limits = {{ max_concurrent = 6, requests_per_minute = 10000 }}

[agents.lead]
model = "a"
system_prompt = "spawn worker 12"
spawnable_agents = ["worker"]
max_steps = 4

[agents.worker]
model = "b"
system_prompt = "answer briefly"
max_steps = 2
"#,
        url = server.base_url
    );
    let config = arbor::Config::parse(&text, "shared.toml", std::path::PathBuf::new()).unwrap();
    let supervisor = Supervisor::new(config.catalog().unwrap(), config.limits.clone());
    let start = StartRequest {
        agent: "lead".into(),
        prompt: "go".into(),
        ..StartRequest::default()
    };
    let (result, _) = arbor_test_support::run_request(&supervisor, start, support::GUARD).await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    assert_eq!(server.requests(), 2 + 12);
    let max = server.max_in_flight();
    assert_eq!(max, 2, "{max} requests were in flight at once");
}
