//! The OpenAI-compatible provider against servers replaying the documented
//! quirks of Ollama, llama.cpp and OpenAI itself (wiremock on loopback; the
//! recorded shapes are in `tests/fixtures/openai_quirks/`, the rules in
//! `docs/providers.md`). Each test captures the request body and compares it
//! with the shape the server documents.

use std::sync::Arc;

use arbor::actors::model::ModelOptions;
use arbor::actors::{AgentStatus, AgentTemplate, Delta, FailureKind, Model, ModelError};
use arbor::providers::{HttpModel, ProviderKind, ProviderSettings};
use arbor::supervisor::{StartRequest, Supervisor, TreeLimits};
use arbor_test_support::{catalog, echo, run_request};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use crate::support::{self, collector, count, request, retry_events, sse, wire};

const OPENAI: ProviderKind = ProviderKind::OpenAi;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(crate::fixtures().join("openai_quirks").join(name))
        .unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

fn model(settings: ProviderSettings) -> HttpModel {
    HttpModel::new("m", settings).expect("client builds")
}

/// A server answering every chat request with what `respond` makes of it.
async fn server(
    respond: impl Fn(&Value) -> ResponseTemplate + Send + Sync + 'static,
) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(support::path(OPENAI)))
        .respond_with(move |request: &Request| {
            let body: Value = serde_json::from_slice(&request.body).expect("a JSON body");
            respond(&body)
        })
        .mount(&server)
        .await;
    server
}

/// Every request body the server received, in order.
async fn bodies(server: &MockServer) -> Vec<Value> {
    server
        .received_requests()
        .await
        .expect("recording is on")
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

fn messages(body: &Value) -> &[Value] {
    body["messages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn has_role(body: &Value, role: &str) -> bool {
    messages(body).iter().any(|m| m["role"] == role)
}

/// One agent that may call `echo`, over `model`.
fn supervisor(model: HttpModel) -> Supervisor {
    let model: Arc<dyn Model> = Arc::new(model);
    let mut template = AgentTemplate::new("solo", "m");
    template.tools.push("echo".into());
    template.max_steps = 4;
    Supervisor::new(
        catalog(vec![("m", model)], vec![template], vec![echo()]),
        TreeLimits::default(),
    )
}

fn start(prompt: &str) -> StartRequest {
    StartRequest {
        agent: "solo".into(),
        prompt: prompt.into(),
        ..StartRequest::default()
    }
}

// --- Ollama: every parallel call of a stream at `index: 0` ---------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_parallel_calls_all_at_index_0_are_not_merged_into_one() {
    let server = server(|_| sse(fixture("ollama_parallel_index0.sse"))).await;
    let (sink, deltas) = collector();
    let response = model(support::settings(OPENAI, &server.uri()))
        .complete(request(true), sink)
        .await
        .expect("the reply is whole");
    let calls: Vec<(String, String, Value)> = response
        .message
        .tool_calls()
        .map(|c| (c.tool_call_id.clone(), c.tool_name.clone(), c.input.value()))
        .collect();
    assert_eq!(
        calls,
        vec![
            (
                "call_x7k2p9aq".into(),
                "echo".into(),
                json!({"text": "hello.py"})
            ),
            (
                "call_m3d8w1zt".into(),
                "echo".into(),
                json!({"text": "world.py"})
            ),
        ]
    );
    // Each call's argument deltas carry its own index in the reply.
    let indexes: Vec<usize> = deltas
        .lock()
        .unwrap()
        .iter()
        .filter_map(|d| match d {
            Delta::ToolCallArgs { index, .. } => Some(*index),
            _ => None,
        })
        .collect();
    assert_eq!(indexes, vec![0, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_parallel_calls_all_at_index_0_both_run_and_both_results_go_back() {
    let server = server(|body| {
        if has_role(body, "tool") {
            sse(wire::text_stream(OPENAI, "both written"))
        } else {
            sse(fixture("ollama_parallel_index0.sse"))
        }
    })
    .await;
    let supervisor = supervisor(model(support::settings(OPENAI, &server.uri())));
    let (result, events) = run_request(&supervisor, start("write both"), support::GUARD).await;
    let state = &result.state;
    assert_eq!(
        state.status,
        AgentStatus::Completed,
        "{:?}",
        state.error_message()
    );
    assert_eq!(count(&events, "toolCalled"), 2);
    let roles: Vec<&str> = state.message_history.iter().map(|m| m.role()).collect();
    assert_eq!(
        roles,
        vec!["user", "assistant", "tool", "tool", "assistant"]
    );

    let bodies = bodies(&server).await;
    assert_eq!(bodies.len(), 2);
    let sent: Vec<&Value> = messages(&bodies[1])
        .iter()
        .filter(|m| m["role"] != "system")
        .collect();
    assert_eq!(
        sent[1],
        &json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_x7k2p9aq", "type": "function",
             "function": {"name": "echo", "arguments": "{\"text\":\"hello.py\"}"}},
            {"id": "call_m3d8w1zt", "type": "function",
             "function": {"name": "echo", "arguments": "{\"text\":\"world.py\"}"}}
        ]})
    );
    assert_eq!(sent[2]["tool_call_id"], json!("call_x7k2p9aq"));
    assert_eq!(sent[3]["tool_call_id"], json!("call_m3d8w1zt"));
}

// --- llama.cpp: a request without `tool_choice` is one without tools -----------

/// llama.cpp's server as documented: with `tools` but no `tool_choice` it
/// renders the prompt without the tools, so the model answers in text.
fn llama_cpp(body: &Value) -> ResponseTemplate {
    if body.get("tools").is_some() && body.get("tool_choice").is_some() {
        sse(wire::tool_stream(
            OPENAI,
            "call_1",
            "echo",
            &["{\"text\":", "\"hi\"}"],
        ))
    } else {
        sse(wire::text_stream(OPENAI, "I have no tools."))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_cpp_sees_the_tools_because_tool_choice_auto_is_sent_with_them() {
    let server = server(llama_cpp).await;
    let (sink, _) = collector();
    let response = model(support::settings(OPENAI, &server.uri()))
        .complete(request(true), sink)
        .await
        .expect("the reply is whole");
    let calls: Vec<_> = response.message.tool_calls().collect();
    assert_eq!(calls.len(), 1, "{:?}", response.message);
    assert_eq!(calls[0].input, json!({"text": "hi"}));

    let body = &bodies(&server).await[0];
    assert_eq!(body["tool_choice"], json!("auto"));
    assert_eq!(body["tools"][0]["function"]["name"], json!("echo"));
    // A compatible server reads `max_tokens`.
    assert_eq!(body["max_tokens"], json!(256));
    assert!(body.get("max_completion_tokens").is_none(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tools_no_tool_choice_is_sent() {
    let server = server(llama_cpp).await;
    let mut settings = support::settings(OPENAI, &server.uri());
    settings.options.tool_choice = Some(arbor::actors::model::ToolChoice::Required);
    settings.options.parallel_tool_calls = Some(true);
    let (sink, _) = collector();
    model(settings)
        .complete(request(false), sink)
        .await
        .expect("a text reply");
    let body = &bodies(&server).await[0];
    for key in ["tools", "tool_choice", "parallel_tool_calls"] {
        assert!(body.get(key).is_none(), "{key} in {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_effective_options_reach_the_wire_in_the_documented_shape() {
    let server = server(llama_cpp).await;
    let mut settings = support::settings(OPENAI, &server.uri());
    settings.options = serde_json::from_value(json!({
        "temperature": 0.7, "seed": 42, "tool_choice": "required",
        "extra_body": {"cache_prompt": true, "top_k": 20}
    }))
    .unwrap();
    let template: ModelOptions = serde_json::from_value(json!({
        "temperature": 0.1, "top_p": 0.95, "stop": ["</answer>"],
        "tool_choice": "echo", "parallel_tool_calls": false,
        "reasoning": {"effort": "low"},
        "extra_body": {"top_k": 40}
    }))
    .unwrap();
    let mut request = request(true);
    request.meta.options = Arc::new(template);
    let (sink, _) = collector();
    model(settings)
        .complete(request, sink)
        .await
        .expect("the reply is whole");
    let mut body = bodies(&server).await.remove(0);
    body.as_object_mut().unwrap().remove("messages");
    assert_eq!(
        body,
        json!({
            "model": support::MODEL_ID,
            "max_tokens": 256,
            "temperature": 0.1,
            "top_p": 0.95,
            "stop": ["</answer>"],
            "seed": 42,
            "tools": [{"type": "function", "function": {
                "name": "echo", "description": "Answers with its input.",
                "parameters": {"type": "object"}
            }}],
            "tool_choice": {"type": "function", "function": {"name": "echo"}},
            "parallel_tool_calls": false,
            "reasoning_effort": "low",
            "stream": true,
            "stream_options": {"include_usage": true},
            "cache_prompt": true,
            "top_k": 40
        })
    );
}

// --- `content: null` on an assistant message is refused by some servers -------

/// Whether a server like llama.cpp (and older Ollama) refuses the body: an
/// assistant message whose `content` is null or missing.
fn refuses(body: &Value) -> bool {
    messages(body)
        .iter()
        .any(|m| m["role"] == "assistant" && !(m["content"].is_string() || m["content"].is_array()))
}

#[test]
fn the_strict_server_refuses_content_null_and_missing_content() {
    let call =
        json!([{"id": "c", "type": "function", "function": {"name": "echo", "arguments": "{}"}}]);
    assert!(refuses(
        &json!({"messages": [{"role": "assistant", "content": null, "tool_calls": call}]})
    ));
    assert!(refuses(
        &json!({"messages": [{"role": "assistant", "tool_calls": call}]})
    ));
    assert!(!refuses(
        &json!({"messages": [{"role": "assistant", "content": "", "tool_calls": call}]})
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_step_after_a_tool_call_without_text_is_not_refused_for_content_null() {
    let server = server(|body| {
        if refuses(body) {
            ResponseTemplate::new(500)
                .insert_header("content-type", "application/json")
                .set_body_string(fixture("llamacpp_invalid_content.json"))
        } else if has_role(body, "assistant") {
            sse(wire::text_stream(OPENAI, "all done"))
        } else {
            // `content: null` beside the call, as OpenAI streams it.
            sse(wire::tool_stream(
                OPENAI,
                "call_1",
                "echo",
                &["{\"text\": ", "\"hi\"}"],
            ))
        }
    })
    .await;
    let supervisor = supervisor(model(support::settings(OPENAI, &server.uri())));
    let (result, events) = run_request(&supervisor, start("echo hi"), support::GUARD).await;
    let state = &result.state;
    assert_eq!(
        state.status,
        AgentStatus::Completed,
        "{:?}",
        state.error_message()
    );
    assert_eq!(state.message_history.last().unwrap().text(), "all done");
    assert_eq!(retry_events(&events), vec![], "no step was refused");

    let bodies = bodies(&server).await;
    assert_eq!(bodies.len(), 2);
    let assistant = messages(&bodies[1])
        .iter()
        .find(|m| m["role"] == "assistant")
        .expect("the step-1 reply is sent back");
    assert_eq!(
        assistant,
        &json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "echo", "arguments": "{\"text\":\"hi\"}"}}
        ]})
    );
}

// --- `finish_reason: "length"`: the reply was cut at the output limit ---------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_reply_cut_at_max_tokens_is_truncated_and_not_retried() {
    let server = server(|_| sse(fixture("truncated_tool_call.sse"))).await;
    let (sink, _) = collector();
    let error = model(support::settings(OPENAI, &server.uri()))
        .complete(request(true), sink)
        .await
        .expect_err("a cut reply is no reply");
    let ModelError::Truncated { message, .. } = &error else {
        panic!("{error:?}");
    };
    assert!(message.contains("finish_reason \"length\""), "{message}");
    assert!(message.contains("after 256 output tokens"), "{message}");
    assert!(message.contains("`echo`"), "{message}");
    assert!(error.to_string().contains("output limit"), "{error}");
    assert_eq!(error.kind(), FailureKind::ModelTruncated);
    assert_eq!(bodies(&server).await.len(), 1, "not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_reply_cut_at_max_tokens_is_truncated_and_not_retried() {
    let server = server(|_| {
        let mut reply = wire::text_json(OPENAI, "The answer is");
        reply["choices"][0]["finish_reason"] = json!("length");
        ResponseTemplate::new(200).set_body_json(reply)
    })
    .await;
    let mut settings = support::settings(OPENAI, &server.uri());
    settings.stream = false;
    let (sink, _) = collector();
    let error = model(settings)
        .complete(request(false), sink)
        .await
        .expect_err("a cut reply is no reply");
    let ModelError::Truncated { message, .. } = &error else {
        panic!("{error:?}");
    };
    assert!(message.contains("text may be incomplete"), "{message}");
    assert_eq!(bodies(&server).await.len(), 1, "not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_cut_at_max_tokens_is_never_run() {
    let server = server(|_| sse(fixture("truncated_tool_call.sse"))).await;
    let supervisor = supervisor(model(support::settings(OPENAI, &server.uri())));
    let (result, events) =
        run_request(&supervisor, start("echo a long text"), support::GUARD).await;
    let state = &result.state;
    assert_eq!(state.status, AgentStatus::Failed);
    assert_eq!(state.error_kind, Some(FailureKind::ModelTruncated));
    assert_eq!(count(&events, "toolCalled"), 0);
    assert!(
        state
            .message_history
            .iter()
            .all(|m| m.tool_calls().next().is_none()),
        "{:#?}",
        state.message_history
    );
}

// --- A reply cut at max_tokens, asked for again with more room -----------------

/// Settings for the server at `uri` from a `[models]` table with
/// `max_tokens = 256`, no transient retries, and `extra` (`on_truncated`).
fn table_settings(kind: ProviderKind, uri: &str, extra: &str) -> ProviderSettings {
    let section: arbor::providers::HttpSection = toml::from_str(&format!(
        "base_url = \"{}\"\nmodel = \"{}\"\nmax_tokens = 256\nstream = false\n\
         retry = {{ max_retries = 0 }}\n{extra}\n",
        support::base_url(kind, uri),
        support::MODEL_ID,
    ))
    .unwrap();
    let mut settings = ProviderSettings::from_section(kind, &section).expect("a valid table");
    settings.api_key = Some(arbor::providers::ApiKey::new(support::TEST_KEY.into()));
    settings
}

/// A whole OpenAI reply, cut at the output limit when the request asked
/// for fewer than `enough` tokens in `field`.
fn cut_below(field: &'static str, enough: u64) -> impl Fn(&Value) -> ResponseTemplate {
    move |body: &Value| {
        let mut reply = wire::text_json(OPENAI, "The whole answer.");
        if body[field].as_u64().is_none_or(|asked| asked < enough) {
            reply["choices"][0]["message"]["content"] = json!("The whole");
            reply["choices"][0]["finish_reason"] = json!("length");
        }
        ResponseTemplate::new(200).set_body_json(reply)
    }
}

/// `body` without its `field`: what a retry with more room keeps unchanged.
fn without(body: &Value, field: &str) -> Value {
    let mut body = body.clone();
    body.as_object_mut().unwrap().remove(field);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_at_max_tokens_is_asked_again_once_with_on_truncateds_max_tokens() {
    let server = server(cut_below("max_tokens", 8192)).await;
    let settings = table_settings(
        OPENAI,
        &server.uri(),
        "on_truncated = { max_tokens = 8192 }",
    );
    let supervisor = supervisor(model(settings));
    let (result, events) = run_request(&supervisor, start("answer"), support::GUARD).await;
    assert_eq!(result.state.status, AgentStatus::Completed, "{result:?}");
    let last = result.state.message_history.last().expect("a reply");
    assert_eq!(last.text(), "The whole answer.");
    let sent = bodies(&server).await;
    assert_eq!(sent.len(), 2, "the cut reply and its retry");
    assert_eq!(sent[0]["max_tokens"], json!(256));
    assert_eq!(sent[1]["max_tokens"], json!(8192));
    assert_eq!(
        without(&sent[0], "max_tokens"),
        without(&sent[1], "max_tokens"),
        "the same request otherwise"
    );
    // Counted as a retry, as the other retries are (the metrics count
    // `modelRetrying`), at once: nothing is wrong with the endpoint.
    let retries = retry_events(&events);
    assert_eq!(retries.len(), 1, "{retries:?}");
    let (step, attempt, delay_ms, reason) = &retries[0];
    assert_eq!((*step, *attempt, *delay_ms), (1, 1, 0));
    assert!(
        reason.contains("finish_reason \"length\"")
            && reason.contains("asking again with max_tokens 8192"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_again_after_the_retry_with_more_room_is_the_truncated_error() {
    let server = server(cut_below("max_tokens", u64::MAX)).await;
    let settings = table_settings(
        OPENAI,
        &server.uri(),
        "on_truncated = { max_tokens = 8192 }",
    );
    let (sink, deltas) = collector();
    let error = model(settings)
        .complete(request(false), sink)
        .await
        .expect_err("cut twice");
    let ModelError::Truncated { message, .. } = &error else {
        panic!("{error:?}");
    };
    assert!(
        message.contains("cut again after a retry with max_tokens 8192"),
        "{message}"
    );
    let sent = bodies(&server).await;
    assert_eq!(sent.len(), 2, "one retry, not more");
    assert_eq!(sent[1]["max_tokens"], json!(8192));
    assert_eq!(support::retries(&deltas).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_on_truncated_a_cut_reply_is_one_request_and_the_truncated_error() {
    let server = server(cut_below("max_tokens", 8192)).await;
    let settings = table_settings(OPENAI, &server.uri(), "");
    let supervisor = supervisor(model(settings));
    let (result, events) = run_request(&supervisor, start("answer"), support::GUARD).await;
    assert_eq!(result.state.status, AgentStatus::Failed);
    assert_eq!(result.state.error_kind, Some(FailureKind::ModelTruncated));
    assert_eq!(bodies(&server).await.len(), 1, "not retried");
    assert!(retry_events(&events).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_retry_with_more_room_keeps_the_thinking_budget_on_top() {
    const ANTHROPIC: ProviderKind = ProviderKind::Anthropic;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(support::path(ANTHROPIC)))
        .respond_with(|request: &Request| {
            let body: Value = serde_json::from_slice(&request.body).unwrap();
            let mut reply = wire::text_json(ANTHROPIC, "The whole answer.");
            if body["max_tokens"].as_u64().is_none_or(|asked| asked < 9000) {
                reply["stop_reason"] = json!("max_tokens");
            }
            ResponseTemplate::new(200).set_body_json(reply)
        })
        .mount(&server)
        .await;
    // A budget of 1024 over max_tokens 256: the first request asks for
    // 1024 + 256; the retry for 1024 + 8192, room 8192 for the reply.
    let settings = table_settings(
        ANTHROPIC,
        &server.uri(),
        "options = { reasoning = { budget_tokens = 1024 } }\n\
         on_truncated = { max_tokens = 8192 }",
    );
    let (sink, _) = collector();
    let reply = HttpModel::new("m", settings)
        .unwrap()
        .complete(request(false), sink)
        .await
        .expect("the retry has room");
    assert_eq!(reply.message.text(), "The whole answer.");
    let sent = bodies(&server).await;
    let asked: Vec<&Value> = sent.iter().map(|b| &b["max_tokens"]).collect();
    assert_eq!(asked, [&json!(1280), &json!(9216)]);
    for body in &sent {
        assert_eq!(
            body["thinking"],
            json!({"type": "enabled", "budget_tokens": 1024})
        );
    }
}

// --- Options a run-time model refuses, refused before the tree starts ----------

/// A config whose agents run on the simulated model, which refuses nothing,
/// beside an Anthropic model with extended thinking on (never reached):
/// `writer` asks for temperature 0.3, which Anthropic refuses with
/// thinking; `lead` may spawn it; `plain` asks for nothing.
const OVERRIDE_CONFIG: &str = r#"
[service]
bind = "127.0.0.1:0"

[models.sim]
provider = "simulated"
fanout = 0
depth = 0
latency = "0"

[models.an]
provider = "anthropic"
model = "claude-sonnet-4-5"
base_url = "http://127.0.0.1:9"
options = { reasoning = { budget_tokens = 2048 } }

[agents.lead]
model = "sim"
spawnable_agents = ["writer"]

[agents.writer]
model = "sim"
model_options = { temperature = 0.3 }

[agents.plain]
model = "sim"
"#;

/// What naming the refused option says, for `writer` on `an`.
const WRITER_ON_AN: &str = "model \"an\" cannot run agent \"writer\"";
const WRITERS_TEMPERATURE: &str = "agents.writer.model_options.temperature: 0.3 with extended \
     thinking on (models.an.options.reasoning.budget_tokens = 2048): Anthropic accepts only \
     temperature 1 (or none) when thinking is on";

fn override_config() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, OVERRIDE_CONFIG).unwrap();
    let path = path.display().to_string();
    (dir, path)
}

#[test]
fn arbor_run_model_on_a_model_that_refuses_an_agents_options_exits_2_before_the_tree_starts() {
    let (_dir, config) = override_config();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    // Each agent is on a model that takes its options: the config is valid.
    let checked = crate::arbor(&["check-config", &config]);
    assert_eq!(checked.status.code(), Some(0), "{}", text(&checked.stderr));
    let run = |agent: &str, model: &str| {
        crate::arbor(&[
            "run",
            "--no-store",
            "--quiet",
            "--config",
            &config,
            "--agent",
            agent,
            "--model",
            model,
            "go",
        ])
    };
    // On the root, and on an agent the root may spawn (every agent of the
    // tree goes on --model).
    for (agent, reached) in [("writer", ""), ("lead", " (which \"lead\" may spawn)")] {
        let out = run(agent, "an");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{agent}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "error: --model: {WRITER_ON_AN}{reached}: {WRITERS_TEMPERATURE}"
            )),
            "{agent}: {stderr}"
        );
        assert!(
            text(&out.stdout).is_empty(),
            "nothing ran: {}",
            text(&out.stdout)
        );
    }
    // An override that refuses nothing runs.
    let out = run("writer", "sim");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_runs_with_a_model_that_refuses_an_agents_options_is_422_naming_the_agent_and_option()
{
    use crate::serve::{Server, TOKEN, get, post};
    let (dir, config) = override_config();
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    for (agent, reached) in [("writer", ""), ("lead", " (which \"lead\" may spawn)")] {
        let (status, body) = post(
            &server,
            "/v1/runs",
            json!({"agent": agent, "prompt": "go", "model": "an"}),
        )
        .await;
        assert_eq!(status, reqwest::StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["error"]["code"], "invalid_request");
        assert_eq!(
            body["error"]["message"],
            format!("model: {WRITER_ON_AN}{reached}: {WRITERS_TEMPERATURE}"),
        );
    }
    // No tree was started for them.
    let (_, runs) = get(&server, "/v1/runs").await;
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(0), "{runs}");
    // What the model takes is started.
    for (agent, model) in [("plain", "an"), ("writer", "sim")] {
        let (status, body) = post(
            &server,
            "/v1/runs",
            json!({"agent": agent, "prompt": "go", "model": model}),
        )
        .await;
        assert_eq!(
            status,
            reqwest::StatusCode::CREATED,
            "{agent} on {model}: {body}"
        );
    }
}

/// The library refuses the same override with the same words as the command
/// line and HTTP (issue 35: the supervisor owns the check, which the config
/// gives it): before, `Runtime::start_with` started the tree and the
/// provider refused each request of the writer.
#[tokio::test]
async fn start_with_a_model_that_refuses_an_agents_options_is_refused_as_over_http() {
    let (_dir, config) = override_config();
    let config = arbor::config::Config::load(std::path::Path::new(&config)).unwrap();
    let runtime = arbor::Runtime::new(config).unwrap();
    let refused = runtime
        .start_with(arbor::StartRequest {
            agent: "lead".into(),
            prompt: "go".into(),
            model: Some("an".into()),
            ..arbor::StartRequest::default()
        })
        .await
        .err()
        .expect("refused")
        .to_string();
    assert_eq!(
        refused,
        format!("model: {WRITER_ON_AN} (which \"lead\" may spawn): {WRITERS_TEMPERATURE}")
    );
}
