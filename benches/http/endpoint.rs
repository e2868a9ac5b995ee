//! The loopback HTTP half of `benches/per_agent.sh --http` (issue 17): a mock
//! OpenAI-compatible endpoint with a fixed latency, and the bare `reqwest`
//! client Arbor's provider is compared with.
//!
//! ```text
//! http_endpoint serve [--latency-ms 50]
//!     Serves POST /v1/chat/completions on a free loopback port and prints
//!     its base URL (`http://127.0.0.1:PORT/v1`) as the first line of stdout.
//!     Each request waits --latency-ms, then gets a fixed chat completion
//!     (as server-sent events if the request says `"stream":true`).
//!     GET /stats: what it served since the last POST /stats/reset (JSON:
//!     requests, their median body bytes, the most in flight at once, and the
//!     seconds from the first request's arrival to the last one's reply).
//! http_endpoint bare --url URL [--concurrency 1000] [--requests 10000] [--body-bytes 600]
//!     Sends --requests chat requests from --concurrency tasks on one
//!     `reqwest::Client` (serialising each body, parsing each JSON reply),
//!     and prints a JSON line: requests, wall and CPU seconds.
//! http_endpoint provider --url URL [same options]
//!     The same with Arbor's provider client alone (`HttpModel::complete`,
//!     non-streamed) in place of reqwest: no agents, no runtime. Between the
//!     bare client and `arbor loadtest --model`, it tells the provider's
//!     share of the gap from the runtime's.
//! ```
//!
//! Both sides read the rate from the server's `/stats`: the same clock and
//! the same window (first arrival to last reply) for Arbor and the bare
//! client. A separate process from either client, so neither's CPU figure
//! includes the server's.
//!
//! Built with the release profile (it is an example only so that
//! `cargo build --release --example http_endpoint` shares the release build's
//! dependencies): `cargo build --release --example http_endpoint`.

#![allow(clippy::expect_used)]

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{Value, json};

use arbor::actors::{Delta, Message, Model, ModelRequest, RequestMeta};
use arbor::providers::{HttpModel, HttpSection, ProviderKind, ProviderSettings};

// The same allocator as the `arbor` binary, so the comparison is of the
// clients, not of allocators.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const REPLY: &str = r#"{"id":"c1","object":"chat.completion","model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"The answer is forty-two, as computed by the deep thought engine over seven and a half million years."},"finish_reason":"stop"}],"usage":{"prompt_tokens":120,"completion_tokens":24,"total_tokens":144}}"#;

/// [`REPLY`] as a stream, for a model configured with `stream = true`.
const STREAM_REPLY: &str = concat!(
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"The answer is forty-two.\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":6,\"total_tokens\":126}}\n\n",
    "data: [DONE]\n\n",
);

/// What the server counts between resets.
#[derive(Default)]
struct Stats {
    seen: Mutex<Seen>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// The requests since the reset, under one lock.
#[derive(Default)]
struct Seen {
    /// Each request's body size, for the median (a tree's last request, the
    /// root's, carries every child's answer and would skew a mean); its
    /// length is the number of requests.
    body_bytes: Vec<usize>,
    /// First arrival and last reply.
    window: Option<(Instant, Instant)>,
}

impl Stats {
    fn arrived(&self, bytes: usize) {
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.max_in_flight.fetch_max(now, Ordering::Relaxed);
        let mut seen = self.seen.lock().expect("stats lock");
        seen.body_bytes.push(bytes);
        seen.window.get_or_insert_with(|| {
            let t = Instant::now();
            (t, t)
        });
    }

    fn replied(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        if let Some((_, last)) = self.seen.lock().expect("stats lock").window.as_mut() {
            *last = Instant::now();
        }
    }

    fn snapshot(&self) -> Value {
        let seen = self.seen.lock().expect("stats lock");
        let secs = seen
            .window
            .map_or(0.0, |(first, last)| (last - first).as_secs_f64());
        json!({
            "requests": seen.body_bytes.len(),
            "medianBodyBytes": median(&seen.body_bytes),
            "maxInFlight": self.max_in_flight.load(Ordering::Relaxed),
            "windowSecs": secs,
        })
    }

    fn reset(&self) {
        *self.seen.lock().expect("stats lock") = Seen::default();
        self.max_in_flight.store(0, Ordering::Relaxed);
    }
}

fn median(sizes: &[usize]) -> usize {
    let mut sorted = sizes.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or(0)
}

async fn serve(latency: Duration) {
    let stats = Arc::new(Stats::default());
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(
                move |State(stats): State<Arc<Stats>>, body: axum::body::Bytes| async move {
                    stats.arrived(body.len());
                    tokio::time::sleep(latency).await;
                    stats.replied();
                    if body.windows(13).any(|w| w == b"\"stream\":true") {
                        ([(header::CONTENT_TYPE, "text/event-stream")], STREAM_REPLY)
                            .into_response()
                    } else {
                        ([(header::CONTENT_TYPE, "application/json")], REPLY).into_response()
                    }
                },
            ),
        )
        // The root's last request carries every child's answer.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .route(
            "/stats",
            get(|State(stats): State<Arc<Stats>>| async move { axum::Json(stats.snapshot()) }),
        )
        .route(
            "/stats/reset",
            post(|State(stats): State<Arc<Stats>>| async move { stats.reset() }),
        )
        .with_state(stats);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("its address");
    println!("http://{addr}/v1");
    axum::serve(listener, app).await.expect("serve");
}

/// Which client sends the requests.
#[derive(Clone, Copy, PartialEq)]
enum Client {
    /// A bare `reqwest::Client`: serialise the body, POST, parse the reply.
    Bare,
    /// Arbor's provider client alone (`HttpModel::complete`, non-streamed):
    /// no agents, no runtime.
    Provider,
}

async fn drive(which: Client, url: String, concurrency: usize, requests: usize, body_bytes: usize) {
    let system = "You are one node of a load-test tree.";
    let mut task = String::new();
    let body_of = |task: &str| {
        json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": task},
            ],
        })
    };
    // A user message that brings the body to `body_bytes`.
    let empty = serde_json::to_vec(&body_of("")).expect("serialise").len();
    while task.len() + empty < body_bytes {
        task.push_str("lorem ipsum ");
    }
    task.truncate(body_bytes.saturating_sub(empty).max(1));
    let request = Arc::new(body_of(&task));
    let client = reqwest::Client::new();
    let endpoint = format!("{url}/chat/completions");
    let model = Arc::new(provider(&url));
    let message: Arc<Message> = Arc::new(Message::user(task.clone()));
    let next = Arc::new(AtomicUsize::new(0));
    let cpu_start = cpu_secs();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (client, endpoint, request, next) = (
            client.clone(),
            endpoint.clone(),
            request.clone(),
            next.clone(),
        );
        let (model, message) = (model.clone(), message.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = 0usize;
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                match which {
                    Client::Bare => {
                        let body = serde_json::to_vec(&*request).expect("serialise");
                        let reply = client
                            .post(&endpoint)
                            .header(header::CONTENT_TYPE, "application/json")
                            .body(body)
                            .send()
                            .await
                            .expect("send")
                            .error_for_status()
                            .expect("a 2xx reply")
                            .bytes()
                            .await
                            .expect("the reply's body");
                        let reply: Value = serde_json::from_slice(&reply).expect("a JSON reply");
                        assert!(reply["choices"][0]["message"]["content"].is_string());
                    }
                    Client::Provider => {
                        let request = ModelRequest {
                            system_prompt: Arc::from(system),
                            messages: std::iter::once(message.clone()).collect(),
                            tools: Default::default(),
                            meta: RequestMeta::default(),
                        };
                        let sink: Arc<dyn Fn(Delta) + Send + Sync> = Arc::new(|_| {});
                        let reply = model.complete(request, sink).await.expect("a reply");
                        assert_eq!(reply.usage.output_tokens, 24);
                    }
                }
                done += 1;
            }
            done
        }));
    }
    let mut sent = 0;
    for task in tasks {
        sent += task.await.expect("a client task");
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu_start;
    println!(
        "{}",
        json!({"requests": sent, "wallSecs": wall, "cpuSecs": cpu, "concurrency": concurrency})
    );
}

/// Arbor's OpenAI-compatible client on `url`, non-streamed, as a config's
/// `[models.x]` with only `base_url`, `model` and `stream = false` builds it.
fn provider(url: &str) -> HttpModel {
    let section: HttpSection = serde_json::from_value(json!({
        "base_url": url, "model": "m", "stream": false
    }))
    .expect("a model section");
    let settings =
        ProviderSettings::from_section(ProviderKind::OpenAi, &section).expect("settings");
    HttpModel::new("bench", settings).expect("a model")
}

/// This process's user + system CPU seconds.
fn cpu_secs() -> f64 {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage");
    let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    secs(usage.user_time()) + secs(usage.system_time())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str, default: &str| -> String {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or_else(|| default.to_owned())
    };
    let number = |name: &str, default: &str| -> usize {
        let value = flag(name, default);
        value.parse().unwrap_or_else(|_| {
            eprintln!("http_endpoint: {name} takes a whole number, not {value:?}");
            std::process::exit(2)
        })
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match args.first().map(String::as_str) {
        Some("serve") => {
            let latency = Duration::from_millis(number("--latency-ms", "50") as u64);
            runtime.block_on(serve(latency));
        }
        Some(mode @ ("bare" | "provider")) => {
            let url = flag("--url", "");
            if url.is_empty() {
                eprintln!("http_endpoint {mode}: --url is required");
                std::process::exit(2);
            }
            let which = if mode == "bare" {
                Client::Bare
            } else {
                Client::Provider
            };
            runtime.block_on(drive(
                which,
                url,
                number("--concurrency", "1000"),
                number("--requests", "10000"),
                number("--body-bytes", "600"),
            ));
        }
        _ => {
            eprintln!(
                "usage: http_endpoint serve [--latency-ms N] | bare|provider --url URL \
                 [--concurrency N] [--requests N] [--body-bytes N]"
            );
            std::process::exit(2);
        }
    }
}
