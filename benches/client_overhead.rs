//! Client overhead per request against a zero-latency local endpoint.
//!
//! Baseline: a bare `reqwest` POST of the same body, reading and parsing the JSON
//! reply. Arbor: `HttpModel::complete` (history conversion, limiter, retry loop,
//! reply assembly, usage and cost), non-streamed and streamed (SSE). Both talk
//! to the same in-process axum server on loopback, in the same run.
//!
//! Run: `cargo bench --bench client_overhead` (N requests each, sequential).

#![allow(clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use arbor::actors::Model;
use arbor::actors::{Delta, Message, ModelRequest, RequestMeta};
use arbor::providers::{HttpModel, HttpSection, ProviderKind, ProviderSettings};
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{Value, json};

const N: usize = 3000;
const WARMUP: usize = 200;

const REPLY: &str = r#"{"id":"c1","object":"chat.completion","model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"The answer is forty-two, as computed by the deep thought engine over seven and a half million years."},"finish_reason":"stop"}],"usage":{"prompt_tokens":120,"completion_tokens":24,"total_tokens":144}}"#;

fn stream_body() -> String {
    let mut body = String::new();
    for word in "The answer is forty-two, as computed by the deep thought engine over seven and a half million years.".split_inclusive(' ') {
        body.push_str(&format!(
            "data: {}\n\n",
            json!({"choices":[{"index":0,"delta":{"content":word},"finish_reason":null}]})
        ));
    }
    body.push_str(
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    );
    body.push_str("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":24,\"total_tokens\":144}}\n\n");
    body.push_str("data: [DONE]\n\n");
    body
}

async fn serve() -> String {
    let sse = Arc::new(stream_body());
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |body: axum::body::Bytes| {
            let sse = sse.clone();
            async move {
                let streaming = body.windows(13).any(|w| w == b"\"stream\":true");
                if streaming {
                    (
                        [(header::CONTENT_TYPE, "text/event-stream")],
                        sse.as_str().to_owned(),
                    )
                        .into_response()
                } else {
                    ([(header::CONTENT_TYPE, "application/json")], REPLY).into_response()
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}

fn history() -> Vec<Arc<Message>> {
    (0..10)
        .map(|i| {
            Arc::new(if i % 2 == 0 {
                Message::user(format!(
                    "Question {i}: what does the step machine decide next?"
                ))
            } else {
                Message::assistant_text(format!(
                    "Answer {i}: it builds the next request from the history view."
                ))
            })
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn measure<F, Fut>(mut f: F) -> (Duration, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..WARMUP {
        f().await;
    }
    let mut samples = Vec::with_capacity(N);
    for _ in 0..N {
        let start = Instant::now();
        f().await;
        samples.push(start.elapsed());
    }
    samples.sort();
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

fn model(base_url: &str, stream: bool) -> HttpModel {
    let section: HttpSection = serde_json::from_value(json!({
        "base_url": base_url, "model": "bench", "stream": stream
    }))
    .expect("section");
    let settings =
        ProviderSettings::from_section(ProviderKind::OpenAi, &section).expect("settings");
    HttpModel::new("bench", settings).expect("model")
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let base = serve().await;
        let messages = history();
        let raw_body = json!({
            "model": "bench",
            "max_tokens": 4096,
            "messages": messages.iter().map(|m| json!({"role": m.role(), "content": m.text()})).collect::<Vec<_>>(),
        });
        let client = reqwest::Client::new();
        let url = format!("{base}/chat/completions");
        let baseline = measure(|| {
            let client = client.clone();
            let url = url.clone();
            let body = raw_body.clone();
            async move {
                let reply = client.post(&url).json(&body).send().await.expect("send");
                let value: Value = reply.json().await.expect("json");
                assert!(value.get("choices").is_some());
            }
        })
        .await;
        let sink: Arc<dyn Fn(Delta) + Send + Sync> = Arc::new(|_| {});
        let mut rows = vec![("reqwest + serde_json (baseline)", baseline)];
        for (label, stream) in [("HttpModel, non-streamed", false), ("HttpModel, streamed (SSE)", true)] {
            let model = Arc::new(model(&base, stream));
            let result = measure(|| {
                let model = model.clone();
                let sink = sink.clone();
                let request = ModelRequest {
                    system_prompt: Arc::from("You are a benchmark."),
                    messages: messages.iter().cloned().collect(),
                    tools: Default::default(),
                    meta: RequestMeta::default(),
                };
                async move {
                    let reply = model.complete(request, sink).await.expect("reply");
                    assert_eq!(reply.usage.output_tokens, 24);
                }
            })
            .await;
            rows.push((label, result));
        }
        println!("client overhead, {N} sequential requests each (after {WARMUP} warm-up), loopback, zero-latency server");
        println!("{:<34} {:>10} {:>10} {:>12} {:>12}", "client", "p50 µs", "p99 µs", "p50 ratio", "p99 ratio");
        for (label, (p50, p99)) in &rows {
            println!(
                "{label:<34} {:>10.1} {:>10.1} {:>12.2} {:>12.2}",
                p50.as_secs_f64() * 1e6,
                p99.as_secs_f64() * 1e6,
                p50.as_secs_f64() / baseline.0.as_secs_f64(),
                p99.as_secs_f64() / baseline.1.as_secs_f64()
            );
        }
    });
}
