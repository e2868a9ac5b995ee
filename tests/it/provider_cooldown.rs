//! The cooldown gate every model on one endpoint and key shares: a 429 (or
//! 503) with `Retry-After`, or rate-limit headers with nothing remaining,
//! hold back every request to the endpoint until the wait is over (asserted
//! on when the server received each request); a wait beyond the tree's
//! deadline fails at once; `User-Agent`; the error's type and code in the
//! message. And an `#[ignore]`d measurement of what the gate saves a swarm
//! (BENCHMARKS.md "Shared cooldown").
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

/// OpenAI: a reply with `x-ratelimit-remaining-requests: 0` closes the gate
/// until `x-ratelimit-reset-requests` (a Go duration); a spent token bucket
/// with a reset of `6m0s` makes a request with a nearer deadline fail at once.
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
        message.contains("the endpoint asked to wait 360s, beyond the tree's deadline in 60s"),
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

/// What one swarm run cost the endpoint.
#[derive(Debug)]
struct Swarm {
    sent: usize,
    wasted: usize,
    elapsed: Duration,
}

/// A swarm of `workers` concurrent agents on one model, each making `each`
/// requests one after the other, against an endpoint that serves `quota`
/// requests per (fixed, one-second) window and answers the rest with 429 and
/// `Retry-After: 1`; every reply carries OpenAI's `x-ratelimit-remaining-requests`
/// and `x-ratelimit-reset-requests`, as OpenAI's do.
async fn swarm(workers: usize, each: usize, quota: usize, shared_cooldown: bool) -> Swarm {
    /// Requests by fixed one-second window since the server started.
    struct Windows {
        start: Instant,
        quota: usize,
        state: Mutex<Counts>,
    }
    #[derive(Default)]
    struct Counts {
        window: u64,
        served_in_window: usize,
        sent: usize,
        wasted: usize,
    }
    struct Endpoint(Arc<Windows>);
    impl Respond for Endpoint {
        fn respond(&self, _: &Request) -> ResponseTemplate {
            let windows = &self.0;
            let elapsed = windows.start.elapsed();
            let window = elapsed.as_secs();
            let reset = Duration::from_secs(window + 1) - elapsed;
            let mut counts = windows.state.lock().unwrap();
            if counts.window != window {
                counts.window = window;
                counts.served_in_window = 0;
            }
            counts.sent += 1;
            let served = counts.served_in_window < windows.quota;
            if served {
                counts.served_in_window += 1;
            } else {
                counts.wasted += 1;
            }
            let remaining = windows.quota - counts.served_in_window;
            let reply = if served {
                sse(wire::text_stream(ProviderKind::OpenAi, "ok"))
            } else {
                ResponseTemplate::new(429)
                    .insert_header("retry-after", "1")
                    .set_body_json(wire::error_json(ProviderKind::OpenAi, "Rate limit reached"))
            };
            reply
                .insert_header("x-ratelimit-remaining-requests", remaining.to_string())
                .insert_header(
                    "x-ratelimit-reset-requests",
                    format!("{}ms", reset.as_millis().max(1)),
                )
                .set_delay(Duration::from_millis(50))
        }
    }
    let server = MockServer::start().await;
    let windows = Arc::new(Windows {
        start: Instant::now(),
        quota,
        state: Mutex::default(),
    });
    Mock::given(method("POST"))
        .respond_with(Endpoint(windows.clone()))
        .mount(&server)
        .await;
    let mut settings: ProviderSettings = support::settings(ProviderKind::OpenAi, &server.uri());
    settings.retry.max_retries = 100;
    let model = HttpModel::new("swarm", settings).unwrap();
    let model = Arc::new(if shared_cooldown {
        model
    } else {
        model.without_cooldown()
    });
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let model = model.clone();
            tokio::spawn(async move {
                for _ in 0..each {
                    let (sink, _) = collector();
                    model.complete(request(false), sink).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed();
    let counts = windows.state.lock().unwrap();
    assert_eq!(
        counts.sent - counts.wasted,
        workers * each,
        "every request was served once"
    );
    Swarm {
        sent: counts.sent,
        wasted: counts.wasted,
        elapsed,
    }
}

/// BENCHMARKS.md "Shared cooldown": 20 agents × 3 requests on one model
/// against a 10 requests/s endpoint, with the shared cooldown and without.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement (about 15 s): --ignored --nocapture"]
async fn measure_the_shared_cooldown_on_a_swarm() {
    let (workers, each, quota) = (20, 3, 10);
    let with = swarm(workers, each, quota, true).await;
    let without = swarm(workers, each, quota, false).await;
    println!(
        "{workers} agents x {each} requests, {quota} requests/s, 429 with Retry-After: 1 beyond it"
    );
    println!("| | sent | wasted (429) | time |");
    println!("|---|---|---|---|");
    for (name, run) in [("shared cooldown", &with), ("no cooldown", &without)] {
        println!(
            "| {name} | {} | {} | {:.1} s |",
            run.sent,
            run.wasted,
            run.elapsed.as_secs_f64()
        );
    }
    println!(
        "wasted: {:.1}x fewer with the shared cooldown; sent: {:.2}x fewer",
        without.wasted as f64 / with.wasted.max(1) as f64,
        without.sent as f64 / with.sent as f64
    );
}
