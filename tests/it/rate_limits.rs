//! Issue 34: a spent rate-limit bucket no longer closes the endpoint until
//! it is full. Trees run against a token-bucket endpoint on loopback (as
//! llmock's: a bucket refilled continuously, every reply carrying OpenAI's
//! `x-ratelimit-{limit,remaining,reset}-requests`, the reset being when the
//! bucket is full again, and a 429 with `Retry-After` in whole seconds when
//! it is empty): agents go at the bucket's rate, none waits for the full
//! reset, and a wait beyond the tree's deadline says what the endpoint sent.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arbor::actors::{AgentStatus, AgentTemplate, EventKind, Model, RunResult};
use arbor::providers::{HttpModel, ProviderKind};
use arbor::supervisor::{StartRequest, Supervisor, TreeLimits};
use serde_json::json;

use crate::support::{self, GUARD, retry_events};

/// A token bucket of `capacity` requests refilled at `per_second`, holding
/// `level` at the start (others' traffic may have spent it).
#[derive(Clone, Copy, Debug)]
struct Rate {
    capacity: f64,
    per_second: f64,
    level: f64,
}

struct Bucket {
    rate: Rate,
    /// Answer every request 429 with this `Retry-After`, whatever is left.
    refuse: Option<&'static str>,
    state: Mutex<Level>,
}

struct Level {
    level: f64,
    at: Instant,
    served: usize,
    refused: usize,
}

/// A Go duration as OpenAI writes one: `20ms`, `1.5s`, `1m0.5s`.
fn go(wait: Duration) -> String {
    let ms = wait.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (minutes, ms) = (ms / 60_000, ms % 60_000);
    let seconds = format!("{}.{:03}", ms / 1000, ms % 1000);
    let seconds = seconds.trim_end_matches('0').trim_end_matches('.');
    if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

async fn chat(
    axum::extract::State(bucket): axum::extract::State<Arc<Bucket>>,
    body: String,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let rate = bucket.rate;
    let (served, level) = {
        let mut state = bucket.state.lock().unwrap();
        let now = Instant::now();
        let refilled = (now - state.at).as_secs_f64() * rate.per_second;
        state.level = (state.level + refilled).min(rate.capacity);
        state.at = now;
        let served = bucket.refuse.is_none() && state.level >= 1.0;
        if served {
            state.level -= 1.0;
            state.served += 1;
        } else {
            state.refused += 1;
        }
        (served, state.level)
    };
    let mut response = if served {
        let request: serde_json::Value = serde_json::from_str(&body).unwrap();
        axum::Json(tree_reply(&request)).into_response()
    } else {
        let retry_after = bucket.refuse.map_or_else(
            || {
                let secs = ((1.0 - level) / rate.per_second).ceil().max(1.0);
                format!("{secs}")
            },
            str::to_owned,
        );
        let mut response = (
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            axum::Json(json!({"error": {"message": "Rate limit reached", "type": "requests"}})),
        )
            .into_response();
        response
            .headers_mut()
            .insert("retry-after", retry_after.parse().unwrap());
        response
    };
    let full_in = Duration::from_secs_f64((rate.capacity - level) / rate.per_second);
    let headers = response.headers_mut();
    for (name, value) in [
        ("x-ratelimit-limit-requests", format!("{}", rate.capacity)),
        (
            "x-ratelimit-remaining-requests",
            format!("{}", level.floor()),
        ),
        ("x-ratelimit-reset-requests", go(full_in)),
    ] {
        headers.insert(name, value.parse().unwrap());
    }
    response
}

/// The endpoint's reply to one of the tree's requests: a system prompt
/// `spawn TYPE N` spawns N children of TYPE on the first step; `work N`
/// calls `echo` until N - 1 results are in, then answers; anything else is
/// answered with text.
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
        "id": "chatcmpl-bucket", "object": "chat.completion", "model": request["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    })
}

/// The endpoint, on loopback: its base URL and its bucket.
async fn endpoint(rate: Rate, refuse: Option<&'static str>) -> (String, Arc<Bucket>) {
    let bucket = Arc::new(Bucket {
        rate,
        refuse,
        state: Mutex::new(Level {
            level: rate.level,
            at: Instant::now(),
            served: 0,
            refused: 0,
        }),
    });
    let app = axum::Router::new()
        .route(
            support::path(ProviderKind::OpenAi),
            axum::routing::post(chat),
        )
        .with_state(bucket.clone());
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (uri, bucket)
}

/// Runs `root` (with `templates` beside it) on one OpenAI model against the
/// endpoint at `uri`, under a tree deadline of `deadline`.
async fn run(
    uri: &str,
    root: &str,
    templates: Vec<AgentTemplate>,
    deadline: Duration,
) -> (RunResult, Vec<Arc<arbor::actors::Event>>) {
    let mut settings = support::settings(ProviderKind::OpenAi, uri);
    settings.stream = false;
    let model = HttpModel::new("m", settings).unwrap();
    let catalog = arbor_test_support::catalog(
        vec![("m", Arc::new(model) as Arc<dyn Model>)],
        templates,
        vec![arbor_test_support::echo()],
    );
    let limits = TreeLimits {
        deadline: Some(deadline),
        ..TreeLimits::default()
    };
    let supervisor = Supervisor::new(catalog, limits);
    let start = StartRequest {
        agent: root.into(),
        prompt: "go".into(),
        ..StartRequest::default()
    };
    arbor_test_support::run_request(&supervisor, start, GUARD).await
}

fn worker(steps: usize) -> AgentTemplate {
    arbor_test_support::with_echo(
        AgentTemplate::new("worker", "m").system_prompt(&format!("work {steps}")),
    )
    .max_steps(steps as u32 + 1)
}

/// Issue 34 item 1: an endpoint whose bucket of 3,000 requests refills at
/// 50 a second (full again a minute after it is spent) has 6 left; a lead
/// spawns 6 workers making 3 requests each, 20 requests in all, under a
/// 30 s deadline. The 14 beyond the bucket go at its rate (one every 20 ms)
/// instead of the endpoint being closed for the minute it takes to fill
/// (which failed every agent at once, "the endpoint asked to wait 60s"):
/// every agent completes, almost nothing is refused, and no retry waits
/// for anything like the reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spent_bucket_paces_agents_at_its_rate_instead_of_closing_the_endpoint_until_it_is_full()
{
    let rate = Rate {
        capacity: 3000.0,
        per_second: 50.0,
        level: 6.0,
    };
    let (uri, bucket) = endpoint(rate, None).await;
    let lead = AgentTemplate::new("lead", "m")
        .system_prompt("spawn worker 6")
        .spawns(&["worker"])
        .max_steps(4);
    let (result, events) = run(&uri, "lead", vec![lead, worker(3)], Duration::from_secs(30)).await;

    assert_eq!(
        result.state.status,
        AgentStatus::Completed,
        "{:?}",
        result.state.error_message()
    );
    let children: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ChildFinished { status, .. } => Some(*status),
            _ => None,
        })
        .collect();
    assert_eq!(
        children,
        vec![AgentStatus::Completed; 6],
        "every worker completes"
    );
    let state = bucket.state.lock().unwrap();
    assert_eq!(state.served, 2 + 6 * 3, "every request served once");
    // Requests went at the bucket's rate. Released together whenever the
    // bucket had room for one, the workers would be refused again and again;
    // paced, a request is refused only when it reached the endpoint in
    // another order than it was sent in.
    assert!(
        state.refused <= 5,
        "{} requests refused: agents did not pace at the bucket's rate",
        state.refused
    );
    let retries = retry_events(&events);
    assert!(
        retries.iter().all(|(_, _, delay_ms, _)| *delay_ms <= 1000),
        "a retry waited for more than the endpoint's Retry-After: {retries:?}"
    );
}

/// Issue 34 item 1: a wait beyond the tree's deadline says what the
/// endpoint sent. A bucket of 2 requests a minute has 1 left: the agent's
/// second request could go in 30 s (one request's share; the bucket is full
/// in 60), beyond its 10 s deadline, and the error quotes the rate-limit
/// headers instead of saying the endpoint "asked to wait 60s". An endpoint
/// that answers 429 with `Retry-After: 30` is quoted as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_beyond_the_deadline_quotes_what_the_endpoint_sent() {
    let rate = Rate {
        capacity: 2.0,
        per_second: 2.0 / 60.0,
        level: 1.0,
    };
    let (uri, bucket) = endpoint(rate, None).await;
    let (result, _) = run(&uri, "worker", vec![worker(2)], Duration::from_secs(10)).await;
    assert_eq!(result.state.status, AgentStatus::Failed);
    let error = result.state.error_message().unwrap_or_default().to_owned();
    assert!(
        error.contains("the endpoint's rate limit has room for the next request in 30s"),
        "{error}"
    );
    // The reset is the endpoint's, to the millisecond (59.99...s).
    assert!(
        error.contains("(it sent x-ratelimit-remaining-requests: 0, x-ratelimit-reset-requests: ")
            && error.contains("s, x-ratelimit-limit-requests: 2)"),
        "{error}"
    );
    assert!(!error.contains("asked to wait"), "{error}");
    assert_eq!(bucket.state.lock().unwrap().served, 1);

    let (uri, _) = endpoint(rate, Some("30")).await;
    let (result, _) = run(&uri, "worker", vec![worker(2)], Duration::from_secs(10)).await;
    assert_eq!(result.state.status, AgentStatus::Failed);
    let error = result.state.error_message().unwrap_or_default().to_owned();
    assert!(
        error.contains("the endpoint asked to wait 30s, beyond the tree's deadline in"),
        "{error}"
    );
    assert!(error.contains("(it sent retry-after: 30)"), "{error}");
}
