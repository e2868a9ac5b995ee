//! Wire conformance of the HTTP providers against the aimock mock LLM server.
//!
//! Every case is written once, as a function of the provider (OpenAI Chat
//! Completions or Anthropic Messages) and of `stream`, and runs for all four
//! combinations; the combination is in the test's name and in every failure
//! message. The replies come from `tests/fixtures/aimock/*.json`; each test
//! sends its own `X-Test-Id` header (through the model's `headers`) so aimock's
//! per-test sequence counters and journal never mix two tests.
//!
//! The server is started outside the tests (`.ci/run` does it; by hand:
//! `npm ci --prefix tests/mock && eval "$(tests/mock/start)"`) and found
//! through `ARBOR_AIMOCK_URL`. Without it these tests fail: they never skip.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arbor::Config;
use arbor::actors::message::{Content, Message, Part, ToolResultPart};
use arbor::actors::{
    AgentState, AgentStatus, Delta, Event, EventKind, RunId, RunResult, Tool, ToolContext,
    ToolError, ToolOutput,
};
use arbor::config::ModelSection;
use arbor::providers::ProviderKind;
use arbor::supervisor::{Catalog, StartRequest, Supervisor};
use arbor_test_support::drain;
use async_trait::async_trait;
use serde_json::{Value, json};

/// How long one tree may take before the test gives up (the mock answers in ms).
const GUARD: Duration = Duration::from_secs(60);

/// Credits per million tokens: 1 credit per input token, 2 per output token.
const PRICE_INPUT: f64 = 1_000_000.0;
const PRICE_OUTPUT: f64 = 2_000_000.0;

/// The mock's base URL, from `ARBOR_AIMOCK_URL`. Panics (never skips) without it.
fn mock_url() -> String {
    match std::env::var("ARBOR_AIMOCK_URL") {
        Ok(url) if !url.trim().is_empty() => url.trim().trim_end_matches('/').to_owned(),
        _ => panic!(
            "ARBOR_AIMOCK_URL is not set: the aimock wire tests need the mock LLM server.\n\
             Start it from the repository root with\n\
             \n    npm ci --prefix tests/mock && tests/mock/start\n\n\
             then run the `export ARBOR_AIMOCK_URL=http://127.0.0.1:PORT` line it prints \
             (or do both at once: `eval \"$(tests/mock/start)\"`) and run the tests again. \
             `.ci/run` starts the mock by itself."
        ),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Provider {
    OpenAi,
    Anthropic,
}

impl Provider {
    fn name(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
        }
    }

    /// The model id sent to the API (fixtures may match on it).
    fn api_model(self) -> &'static str {
        match self {
            Provider::OpenAi => "gpt-4o",
            Provider::Anthropic => "claude-sonnet-4-5",
        }
    }

    fn base_url(self, mock: &str) -> String {
        match self {
            Provider::OpenAi => format!("{mock}/v1"),
            Provider::Anthropic => mock.to_owned(),
        }
    }
}

/// One of the four combinations a case runs for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Combo {
    provider: Provider,
    stream: bool,
}

impl fmt::Display for Combo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stream = if self.stream { "stream" } else { "no stream" };
        write!(f, "{}, {stream}", self.provider.name())
    }
}

impl Combo {
    /// The catalog name of the model (errors name it).
    fn model_name(self) -> String {
        format!("mock_{}", self.provider.name())
    }

    /// How errors describe the model: `NAME (PROVIDER API-MODEL)`.
    fn model_label(self) -> String {
        format!(
            "{} ({} {})",
            self.model_name(),
            self.provider.name(),
            self.provider.api_model()
        )
    }

    /// A prompt for the fixture keyed `key`, naming the combination (so the
    /// mock's journal and debug log show who asked).
    fn prompt(self, key: &str) -> String {
        format!("{key} ({self})")
    }
}

/// Runs one case for all four combinations, one test each.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            use super::{Combo, Provider};

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn openai_stream() {
                super::$case(Combo { provider: Provider::OpenAi, stream: true }).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn openai_no_stream() {
                super::$case(Combo { provider: Provider::OpenAi, stream: false }).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn anthropic_stream() {
                super::$case(Combo { provider: Provider::Anthropic, stream: true }).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn anthropic_no_stream() {
                super::$case(Combo { provider: Provider::Anthropic, stream: false }).await;
            }
        }
    )*};
}

conformance!(
    plain_text,
    two_tool_calls_and_their_results,
    streaming_deltas,
    system_prompt_reaches_the_api,
    retry_after_a_rate_limit,
    retry_after_an_overload,
    a_rejected_request_fails_once,
);

/// An `X-Test-Id` no other test (nor an earlier run against the same server) uses.
fn test_id(case: &str, combo: Combo) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let stream = if combo.stream { "stream" } else { "nostream" };
    format!(
        "{case}-{}-{stream}-{}-{nanos}-{}",
        combo.provider.name(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The `[models.NAME]` table of `combo`, pointing at the mock.
fn model_toml(combo: Combo, test_id: &str) -> String {
    let mock = mock_url();
    format!(
        r#"
[models.{name}]
provider = "{provider}"
base_url = "{base_url}"
model = "{api_model}"
stream = {stream}
max_tokens = 256
pricing = {{ input = {PRICE_INPUT:.1}, output = {PRICE_OUTPUT:.1} }}
limits = {{ max_concurrent = 8 }}
retry = {{ max_retries = 2, base_delay = "1ms", max_delay = "20ms" }}
timeouts = {{ connect = "5s", request = "30s", idle = "10s" }}
headers = {{ "X-Test-Id" = "{test_id}" }}
"#,
        name = combo.model_name(),
        provider = combo.provider.name(),
        base_url = combo.provider.base_url(&mock),
        api_model = combo.provider.api_model(),
        stream = combo.stream,
    )
}

/// A supervisor from the model table of `combo` and `agents` (TOML whose
/// `model = "MODEL"` is replaced by the combination's model), with `tools`
/// registered and given to every agent.
fn supervisor(combo: Combo, test_id: &str, agents: &str, tools: Vec<Arc<dyn Tool>>) -> Supervisor {
    let text = format!(
        "{}\n{}",
        model_toml(combo, test_id),
        agents.replace("\"MODEL\"", &format!("\"{}\"", combo.model_name()))
    );
    let config = Config::parse(&text, &format!("<aimock {combo}>"), PathBuf::new())
        .unwrap_or_else(|e| panic!("[{combo}] the test config is invalid: {e}\n{text}"));
    let catalog = if tools.is_empty() {
        config
            .catalog()
            .unwrap_or_else(|e| panic!("[{combo}] no catalog: {e}"))
    } else {
        // Config templates may only name built-in tools, so this catalog is
        // built by hand around the config's own HTTP model.
        let mut builder = Catalog::builder();
        for (name, section) in config.model_sections() {
            let (kind, section) = match section {
                ModelSection::Openai(s) => (ProviderKind::OpenAi, s),
                ModelSection::Anthropic(s) => (ProviderKind::Anthropic, s),
                other => panic!("[{combo}] unexpected model {}", other.provider()),
            };
            let model = config
                .http_model(name, kind, section)
                .unwrap_or_else(|e| panic!("[{combo}] no model: {e}"));
            builder = builder.model_as(name, Arc::new(model));
        }
        let names: Vec<String> = tools.iter().map(|t| t.name().to_owned()).collect();
        for tool in tools {
            builder = builder.tool(tool);
        }
        for mut template in config.templates.clone() {
            template.tools.extend(names.iter().cloned());
            builder = builder.template(template);
        }
        builder
            .build()
            .unwrap_or_else(|e| panic!("[{combo}] invalid catalog: {e}"))
    };
    Supervisor::new(catalog, config.limits.clone())
}

/// One agent on the combination's model.
const SOLO: &str = r#"
[agents.solo]
model = "MODEL"
system_prompt = "You are the conformance checker."
max_steps = 4
"#;

/// Runs `agent` on `prompt` to the end; returns the result and every event.
async fn run(
    combo: Combo,
    sup: &Supervisor,
    agent: &str,
    prompt: &str,
) -> (RunResult, Vec<Arc<Event>>) {
    let mut rx = sup.subscribe();
    let request = StartRequest {
        agent: agent.to_owned(),
        prompt: prompt.to_owned(),
        ..StartRequest::default()
    };
    let result = tokio::time::timeout(GUARD, sup.run(request))
        .await
        .unwrap_or_else(|_| panic!("[{combo}] the tree did not end within {GUARD:?}"))
        .unwrap_or_else(|e| panic!("[{combo}] the tree did not run: {e}"));
    (result, drain(&mut rx))
}

/// Asserts a run completed, showing its error and history otherwise.
fn assert_completed(combo: Combo, state: &AgentState) {
    assert_eq!(
        state.status,
        AgentStatus::Completed,
        "[{combo}] run {} did not complete; output: {:?}\nhistory: {:#?}",
        state.run_id,
        state.output,
        state.message_history
    );
}

/// The text of the last assistant message.
fn final_text(combo: Combo, state: &AgentState) -> String {
    state
        .message_history
        .iter()
        .rev()
        .find(|m| m.is_assistant())
        .map(|m| m.text())
        .unwrap_or_else(|| {
            panic!(
                "[{combo}] no assistant message in {:#?}",
                state.message_history
            )
        })
}

fn cost(input: u64, output: u64) -> f64 {
    (input as f64 * PRICE_INPUT + output as f64 * PRICE_OUTPUT) / 1e6
}

/// Deltas of the run `run_id`, in order.
fn deltas<'a>(events: &'a [Arc<Event>], run_id: &'a RunId) -> impl Iterator<Item = &'a Delta> + 'a {
    events.iter().filter_map(move |e| match &e.kind {
        EventKind::ModelDelta { delta, .. } if e.run_id == *run_id => Some(delta),
        _ => None,
    })
}

/// `(attempt, delay_ms, reason)` of every `ModelRetrying` event.
fn retries(events: &[Arc<Event>]) -> Vec<(u32, u64, String)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModelRetrying {
                attempt,
                delay_ms,
                reason,
                ..
            } => Some((*attempt, *delay_ms, reason.clone())),
            _ => None,
        })
        .collect()
}

/// The mock's journal for one test id: the `X-Total-Count` header and the entries.
async fn journal(combo: Combo, test_id: &str) -> (usize, Vec<Value>) {
    let url = format!("{}/__aimock/journal?testId={test_id}", mock_url());
    let response = reqwest::get(&url)
        .await
        .unwrap_or_else(|e| panic!("[{combo}] GET {url}: {e}"));
    assert!(
        response.status().is_success(),
        "[{combo}] GET {url}: {}",
        response.status()
    );
    let total = response
        .headers()
        .get("x-total-count")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("[{combo}] GET {url}: no X-Total-Count header"));
    let entries: Vec<Value> = response
        .json()
        .await
        .unwrap_or_else(|e| panic!("[{combo}] GET {url}: not a JSON array: {e}"));
    (total, entries)
}

/// The HTTP statuses the mock answered `test_id` with, in order.
async fn statuses(combo: Combo, test_id: &str) -> Vec<u64> {
    let (_, entries) = journal(combo, test_id).await;
    entries
        .iter()
        .map(|e| e["response"]["status"].as_u64().unwrap_or_default())
        .collect()
}

// ---------------------------------------------------------------------------
// (a) A plain text reply: text, tokens and cost.

async fn plain_text(combo: Combo) {
    let id = test_id("plain", combo);
    let sup = supervisor(combo, &id, SOLO, Vec::new());
    let (result, _) = run(
        combo,
        &sup,
        "solo",
        &combo.prompt("conformance: plain text reply"),
    )
    .await;
    let state = &result.state;
    assert_completed(combo, state);
    assert_eq!(
        state.message_history.len(),
        2,
        "[{combo}] user + assistant: {:#?}",
        state.message_history
    );
    assert_eq!(
        final_text(combo, state),
        "Plain reply from the conformance fixture.",
        "[{combo}] reply text"
    );
    assert_eq!(
        state.context_token_count, 18,
        "[{combo}] contextTokenCount = the fixture's 11 input + 7 output tokens"
    );
    assert_eq!(
        state.direct_credits_used,
        cost(11, 7),
        "[{combo}] directCreditsUsed from pricing"
    );
    assert_eq!(
        state.credits_used,
        cost(11, 7),
        "[{combo}] creditsUsed of a childless run"
    );
    assert_eq!(statuses(combo, &id).await, [200], "[{combo}] one request");
}

// ---------------------------------------------------------------------------
// (b) Text and two tool calls, their results, then the final text.

/// Answers `{"value": "value of KEY"}`.
struct Lookup;

#[async_trait]
impl Tool for Lookup {
    fn name(&self) -> &str {
        "lookup"
    }
    fn description(&self) -> &str {
        "Looks a key up."
    }
    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"]
        })
    }
    async fn call(&self, input: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let key = input["key"]
            .as_str()
            .ok_or_else(|| ToolError::new("no key"))?;
        Ok(json!({ "value": format!("value of {key}") }).into())
    }
}

fn lookup_args() -> [Value; 2] {
    [
        json!({"key": "alpha", "options": {"exact": true, "limit": 2}}),
        json!({"key": "beta", "tags": ["x", "y"], "note": "café \"quoted\""}),
    ]
}

/// A message as `(role, text, [(call id, tool, input)], tool result (id, value))`.
type Shape = (
    &'static str,
    String,
    Vec<(String, String, Value)>,
    Option<(String, Value)>,
);

fn shape(m: &Message) -> Shape {
    let calls = m
        .tool_calls()
        .map(|c| (c.tool_call_id.clone(), c.tool_name.clone(), c.input.value()))
        .collect();
    let result = match m {
        Message::Tool {
            tool_call_id,
            content,
            ..
        } => {
            let value = match content.as_slice() {
                [ToolResultPart::Json { value }] => value.clone(),
                other => json!({ "unexpected parts": format!("{other:?}") }),
            };
            Some((tool_call_id.clone(), value))
        }
        _ => None,
    };
    let text = match m {
        Message::Tool { .. } => String::new(),
        _ => m.text(),
    };
    (m.role(), text, calls, result)
}

async fn two_tool_calls_and_their_results(combo: Combo) {
    let id = test_id("tools", combo);
    let sup = supervisor(combo, &id, SOLO, vec![Arc::new(Lookup)]);
    let prompt = combo.prompt("conformance: two tool calls");
    let (result, events) = run(combo, &sup, "solo", &prompt).await;
    let state = &result.state;
    assert_completed(combo, state);

    let [a, b] = lookup_args();
    let shapes: Vec<Shape> = state.message_history.iter().map(|m| shape(m)).collect();
    let expected: Vec<Shape> = vec![
        ("user", prompt.clone(), vec![], None),
        (
            "assistant",
            "Looking up two keys.".into(),
            vec![
                ("call_a".into(), "lookup".into(), a.clone()),
                ("call_b".into(), "lookup".into(), b.clone()),
            ],
            None,
        ),
        (
            "tool",
            String::new(),
            vec![],
            Some(("call_a".into(), json!({"value": "value of alpha"}))),
        ),
        (
            "tool",
            String::new(),
            vec![],
            Some(("call_b".into(), json!({"value": "value of beta"}))),
        ),
        (
            "assistant",
            "Alpha and beta looked up.".into(),
            vec![],
            None,
        ),
    ];
    assert_eq!(shapes, expected, "[{combo}] final history");

    // The text comes before the calls inside the assistant message.
    let Some(Message::Assistant {
        content: Content::Parts(parts),
        ..
    }) = state.message_history.get(1).map(|m| &**m)
    else {
        panic!(
            "[{combo}] the first reply has no parts: {:#?}",
            state.message_history
        );
    };
    let kinds: Vec<&str> = parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { .. } => Some("text"),
            Part::ToolCall(_) => Some("call"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["text", "call", "call"], "[{combo}] part order");

    // Tokens and cost of both steps.
    assert_eq!(
        state.context_token_count, 35,
        "[{combo}] contextTokenCount of the last call"
    );
    assert_eq!(
        state.direct_credits_used,
        cost(20, 10) + cost(30, 5),
        "[{combo}] directCreditsUsed of two calls"
    );

    // The second request carried both results, in call order, after the calls.
    let (total, entries) = journal(combo, &id).await;
    assert_eq!(total, 2, "[{combo}] two requests: {entries:#?}");
    let messages = entries[1]["body"]["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("[{combo}] no messages in {}", entries[1]));
    let tail: Vec<(String, String)> = messages
        .iter()
        .skip_while(|m| m["role"] != "assistant")
        .map(|m| {
            let what = match m["role"].as_str() {
                Some("tool") => m["tool_call_id"].as_str().unwrap_or("?").to_owned(),
                _ => m["tool_calls"]
                    .as_array()
                    .map(|c| {
                        c.iter()
                            .filter_map(|c| c["id"].as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default(),
            };
            (m["role"].as_str().unwrap_or("?").to_owned(), what)
        })
        .collect();
    assert_eq!(
        tail,
        [
            ("assistant".to_owned(), "call_a,call_b".to_owned()),
            ("tool".to_owned(), "call_a".to_owned()),
            ("tool".to_owned(), "call_b".to_owned()),
        ],
        "[{combo}] the follow-up request (as aimock normalised it): {messages:#?}"
    );
    for (m, key) in messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .zip(["alpha", "beta"])
    {
        let content = m["content"].to_string();
        assert!(
            content.contains(&format!("value of {key}")),
            "[{combo}] the result of {key} reached the API: {m}"
        );
    }

    // Streamed argument deltas, grouped by index, are the calls' arguments.
    let mut by_index: BTreeMap<usize, (usize, String)> = BTreeMap::new();
    for (order, delta) in deltas(&events, &state.run_id).enumerate() {
        if let Delta::ToolCallArgs { index, text } = delta {
            by_index
                .entry(*index)
                .or_insert((order, String::new()))
                .1
                .push_str(text);
        }
    }
    let mut groups: Vec<(usize, String)> = by_index.into_values().collect();
    groups.sort();
    let streamed: Vec<Value> = groups
        .iter()
        .map(|(_, text)| {
            serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("[{combo}] streamed arguments {text:?}: {e}"))
        })
        .collect();
    if combo.stream {
        assert_eq!(streamed, [a, b], "[{combo}] tool-call argument deltas");
    } else {
        assert!(streamed.is_empty(), "[{combo}] no deltas without streaming");
    }
}

// ---------------------------------------------------------------------------
// (c) Streaming deltas add up to the reply; no deltas without streaming.

async fn streaming_deltas(combo: Combo) {
    let id = test_id("deltas", combo);
    let sup = supervisor(combo, &id, SOLO, Vec::new());
    let (result, events) = run(
        combo,
        &sup,
        "solo",
        &combo.prompt("conformance: streamed deltas"),
    )
    .await;
    let state = &result.state;
    assert_completed(combo, state);
    let text = final_text(combo, state);
    assert_eq!(
        text, "Streamed reply, sent in several chunks: one, two, three, four, five — café, fin.",
        "[{combo}] reply text"
    );
    let all: Vec<&Delta> = deltas(&events, &state.run_id).collect();
    let texts: Vec<&str> = all
        .iter()
        .filter_map(|d| match d {
            Delta::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    if combo.stream {
        assert!(
            texts.len() > 1,
            "[{combo}] the fixture streams in 8-character chunks: {texts:?}"
        );
        assert_eq!(texts.concat(), text, "[{combo}] text deltas concatenated");
        assert!(
            texts.iter().all(|t| !t.is_empty()),
            "[{combo}] no empty text deltas: {texts:?}"
        );
    } else {
        assert!(
            all.is_empty(),
            "[{combo}] no deltas without streaming: {all:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// (d) The system prompt reaches the API (the fixture matches on it).

async fn system_prompt_reaches_the_api(combo: Combo) {
    let id = test_id("system", combo);
    let sup = supervisor(combo, &id, SOLO, Vec::new());
    let (result, _) = run(
        combo,
        &sup,
        "solo",
        &combo.prompt("conformance: system prompt"),
    )
    .await;
    assert_completed(combo, &result.state);
    assert_eq!(
        final_text(combo, &result.state),
        "The system prompt arrived.",
        "[{combo}] the fixture matching systemMessage answered"
    );
    let (_, entries) = journal(combo, &id).await;
    let first = &entries[0]["body"]["messages"][0];
    assert_eq!(
        (
            first["role"].as_str(),
            first["content"]
                .to_string()
                .contains("You are the conformance checker.")
        ),
        (Some("system"), true),
        "[{combo}] the system prompt as aimock normalised the request: {first}"
    );
}

// ---------------------------------------------------------------------------
// (e) A 429 (Retry-After: 0), then a reply: one retry event.

async fn retry_after_a_rate_limit(combo: Combo) {
    let id = test_id("ratelimit", combo);
    let sup = supervisor(combo, &id, SOLO, Vec::new());
    let prompt = combo.prompt("conformance: retry after rate limit");
    let (result, events) = run(combo, &sup, "solo", &prompt).await;
    assert_completed(combo, &result.state);
    assert_eq!(
        final_text(combo, &result.state),
        "Recovered after a rate limit.",
        "[{combo}] the reply after the retry"
    );
    let retries = retries(&events);
    assert_eq!(
        retries.len(),
        1,
        "[{combo}] one ModelRetrying event: {retries:?}"
    );
    let (attempt, delay_ms, reason) = &retries[0];
    assert_eq!(*attempt, 1, "[{combo}] first retry");
    assert_eq!(*delay_ms, 0, "[{combo}] Retry-After: 0 is honoured");
    assert!(
        reason.contains("Rate limited (conformance)"),
        "[{combo}] the reason carries the API's message: {reason}"
    );
    assert_eq!(statuses(combo, &id).await, [429, 200], "[{combo}] requests");
    // Only the successful attempt is paid for.
    assert_eq!(
        result.state.message_history.len(),
        2,
        "[{combo}] the failed attempt left nothing in the history"
    );
}

/// A 503 (OpenAI) or 529 (Anthropic) without Retry-After, then a reply.
async fn retry_after_an_overload(combo: Combo) {
    let id = test_id("overload", combo);
    let sup = supervisor(combo, &id, SOLO, Vec::new());
    let prompt = combo.prompt("conformance: retry after overload");
    let (result, events) = run(combo, &sup, "solo", &prompt).await;
    assert_completed(combo, &result.state);
    assert_eq!(
        final_text(combo, &result.state),
        "Recovered after an overload.",
        "[{combo}] the reply after the retry"
    );
    let retries = retries(&events);
    assert_eq!(
        retries.len(),
        1,
        "[{combo}] one ModelRetrying event: {retries:?}"
    );
    let (attempt, delay_ms, reason) = &retries[0];
    assert_eq!(*attempt, 1, "[{combo}] first retry");
    assert!(
        *delay_ms <= 1,
        "[{combo}] backoff from base_delay 1ms: {delay_ms}ms"
    );
    let (status, message) = match combo.provider {
        Provider::OpenAi => (503, "Service unavailable (conformance)"),
        Provider::Anthropic => (529, "Overloaded (conformance)"),
    };
    assert!(
        reason.contains(message),
        "[{combo}] the reason carries the API's message: {reason}"
    );
    assert_eq!(
        statuses(combo, &id).await,
        [status, 200],
        "[{combo}] requests"
    );
}

// ---------------------------------------------------------------------------
// (f) A 401 is not retried: the agent fails naming the model and the status.

async fn a_rejected_request_fails_once(combo: Combo) {
    let id = test_id("rejected", combo);
    let sup = supervisor(combo, &id, SOLO, Vec::new());
    let (result, events) = run(
        combo,
        &sup,
        "solo",
        &combo.prompt("conformance: rejected request"),
    )
    .await;
    let state = &result.state;
    assert_eq!(
        state.status,
        AgentStatus::Failed,
        "[{combo}] a 401 fails the agent: {:#?}",
        state.message_history
    );
    let error = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::AgentFailed { error, .. } => Some(error.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("[{combo}] no AgentFailed event"));
    for needle in [
        combo.model_label().as_str(),
        "401",
        "Invalid API key (conformance)",
    ] {
        assert!(
            error.contains(needle),
            "[{combo}] the error names {needle:?}: {error}"
        );
    }
    assert_eq!(
        state.error_message(),
        Some(error.as_str()),
        "[{combo}] the failed state carries the error"
    );
    assert!(retries(&events).is_empty(), "[{combo}] no retry of a 401");
    let (total, entries) = journal(combo, &id).await;
    assert_eq!(
        total, 1,
        "[{combo}] exactly one request reached the server: {entries:#?}"
    );
    assert_eq!(
        entries[0]["response"]["status"], 401,
        "[{combo}] answered 401"
    );
}

// ---------------------------------------------------------------------------
// A tree over the mock: a root spawns three children, streaming on.

const TREE: &str = r#"
[agents.planner]
model = "MODEL"
system_prompt = "You plan and delegate."
spawnable_agents = ["worker"]
max_steps = 4

[agents.worker]
model = "MODEL"
system_prompt = "You do one part."
max_steps = 2
"#;

/// The children's prompts, replies and `(input, output)` tokens, in request
/// order. The fixtures delay alpha most and gamma not at all, so the children
/// normally finish in reverse; the merge must not depend on it (not asserted:
/// wall-clock order on a busy machine is not deterministic).
const CHILDREN: [(&str, &str, (u64, u64)); 3] = [
    ("tree: child alpha", "alpha result", (10, 1)),
    ("tree: child beta", "beta result", (20, 2)),
    ("tree: child gamma", "gamma result", (30, 3)),
];

async fn tree_of_three(provider: Provider) {
    let combo = Combo {
        provider,
        stream: true,
    };
    let id = test_id("tree", combo);
    let sup = supervisor(combo, &id, TREE, Vec::new());
    let (result, events) = run(
        combo,
        &sup,
        "planner",
        &combo.prompt("tree: plan three children"),
    )
    .await;
    let root = &result.state;
    assert_completed(combo, root);
    assert_eq!(
        final_text(combo, root),
        "All three workers reported.",
        "[{combo}] the root's last reply"
    );

    // childRunIds: the three children, in request order.
    assert_eq!(
        root.child_run_ids.len(),
        3,
        "[{combo}] {:?}",
        root.child_run_ids
    );
    let mut children_credits = 0.0;
    for (run_id, (prompt, reply, (input, output))) in root.child_run_ids.iter().zip(CHILDREN) {
        let child = sup
            .finished_state(run_id)
            .unwrap_or_else(|| panic!("[{combo}] child {run_id} not kept"));
        assert_completed(combo, &child);
        let first = child.message_history.get(0).map(|m| m.text());
        assert_eq!(
            first.as_deref(),
            Some(prompt),
            "[{combo}] child {run_id}'s prompt"
        );
        assert_eq!(
            final_text(combo, &child),
            reply,
            "[{combo}] child {run_id}'s reply"
        );
        assert_eq!(
            child.direct_credits_used,
            cost(input, output),
            "[{combo}] child {run_id}'s cost"
        );
        assert_eq!(child.parent_id.as_ref(), Some(&root.agent_id));
        children_credits += child.credits_used;
    }

    // The spawn result lists them in order, with their values.
    let spawn_result = root
        .message_history
        .iter()
        .find_map(|m| match &**m {
            Message::Tool {
                tool_name, content, ..
            } if tool_name == "spawn_agents" => {
                Some(serde_json::to_value(content).ok()?[0]["value"].clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| {
            panic!(
                "[{combo}] no spawn_agents result: {:#?}",
                root.message_history
            )
        });
    let entries = spawn_result
        .as_array()
        .unwrap_or_else(|| panic!("[{combo}] spawn result is not a list: {spawn_result}"));
    assert_eq!(entries.len(), 3, "[{combo}] {spawn_result}");
    for ((entry, run_id), (_, reply, _)) in entries.iter().zip(&root.child_run_ids).zip(CHILDREN) {
        assert_eq!(
            entry["runId"],
            json!(run_id),
            "[{combo}] entry order: {spawn_result}"
        );
        assert_eq!(entry["agentType"], "worker", "[{combo}] {entry}");
        assert_eq!(entry["value"]["type"], "lastMessage", "[{combo}] {entry}");
        let texts: Vec<String> = entry["value"]["value"]
            .as_array()
            .map(|turn| {
                turn.iter()
                    .map(|m| match &m["content"] {
                        Value::String(s) => s.clone(),
                        Value::Array(parts) => {
                            parts.iter().filter_map(|p| p["text"].as_str()).collect()
                        }
                        other => other.to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(texts, [reply], "[{combo}] entry value: {entry}");
    }

    // Credits: the root's own two calls, plus the children's.
    let own = cost(100, 50) + cost(200, 10);
    assert_eq!(
        root.direct_credits_used, own,
        "[{combo}] the root's own cost"
    );
    let children: f64 = CHILDREN.iter().map(|(_, _, (i, o))| cost(*i, *o)).sum();
    assert_eq!(children_credits, children, "[{combo}] the children's cost");
    assert_eq!(
        root.credits_used,
        own + children,
        "[{combo}] creditsUsed = own + children's"
    );

    // Every agent streamed its text.
    for run_id in std::iter::once(&root.run_id).chain(&root.child_run_ids) {
        assert!(
            deltas(&events, run_id).any(|d| matches!(d, Delta::Text { .. })),
            "[{combo}] run {run_id} streamed no text"
        );
    }
    assert_eq!(
        statuses(combo, &id).await,
        [200; 5],
        "[{combo}] root, three children, root again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_of_three_over_openai() {
    tree_of_three(Provider::OpenAi).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_of_three_over_anthropic() {
    tree_of_three(Provider::Anthropic).await;
}

// ---------------------------------------------------------------------------

/// The mock serves this checkout's fixtures (not stale or foreign ones).
#[tokio::test]
async fn the_mock_serves_the_fixtures_of_this_checkout() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/aimock");
    let mut expected = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let file: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            expected += file["fixtures"].as_array().map_or(0, Vec::len);
        }
    }
    let url = format!("{}/__aimock/fixtures", mock_url());
    let served: Value = reqwest::get(&url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .json()
        .await
        .unwrap();
    assert_eq!(
        served["count"],
        json!(expected),
        "the mock at {url} serves another set of fixtures than {}: restart it (tests/mock/start)",
        dir.display()
    );
}
