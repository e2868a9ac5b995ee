//! The OpenAI Responses API (`provider = "openai"`, `api = "responses"`)
//! against wiremock on loopback: the request's documented shape, a two-step
//! tool exchange whose second request carries the call, its output and the
//! reasoning item back, truncation, errors, and streamed and whole replies of
//! one response being the same reply. Fixtures: tests/fixtures/responses/.

use std::path::PathBuf;
use std::sync::Arc;

use arbor::Config;
use arbor::actors::message::Message;
use arbor::actors::{AgentStatus, AgentTemplate, Model, ModelError};
use arbor::config::ModelSection;
use arbor::providers::{Api, HttpModel, ProviderKind, ProviderSettings};
use arbor::supervisor::{StartRequest, Supervisor, TreeLimits};
use arbor_test_support::{catalog, echo, run_request};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, MODEL_ID, TEST_KEY, collector, sse, wire};

const PATH: &str = "/v1/responses";

fn fixture(name: &str) -> String {
    std::fs::read_to_string(crate::fixtures().join("responses").join(name)).unwrap()
}

fn json_fixture(name: &str) -> Value {
    serde_json::from_str(&fixture(name)).unwrap()
}

/// Settings for the server at `uri`, speaking the Responses API.
fn settings(uri: &str, stream: bool) -> ProviderSettings {
    let mut settings = support::settings(ProviderKind::OpenAi, uri);
    settings.api = Api::Responses;
    settings.stream = stream;
    settings
}

fn model(settings: ProviderSettings) -> HttpModel {
    HttpModel::new("m", settings).expect("client builds")
}

async fn mount(server: &MockServer, response: ResponseTemplate, times: u64) {
    Mock::given(method("POST"))
        .and(path(PATH))
        .respond_with(response)
        .up_to_n_times(times)
        .mount(server)
        .await;
}

async fn bodies(server: &MockServer) -> Vec<Value> {
    server
        .received_requests()
        .await
        .expect("recording is on")
        .iter()
        .map(|r| {
            assert_eq!(r.url.path(), PATH);
            serde_json::from_slice(&r.body).unwrap()
        })
        .collect()
}

#[tokio::test]
async fn the_request_has_the_documented_shape_and_the_reply_its_items() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(200).set_body_json(json_fixture("echo_call.json")),
        1,
    )
    .await;
    let mut request = support::request(true);
    request.meta.options = Arc::new(
        serde_json::from_value(json!({
            "temperature": 0.5, "tool_choice": "required", "parallel_tool_calls": false,
            "reasoning": {"effort": "low"}, "extra_body": {"service_tier": "flex"}
        }))
        .unwrap(),
    );
    let (sink, _) = collector();
    let reply = support::guarded(model(settings(&server.uri(), false)).complete(request, sink))
        .await
        .unwrap();

    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].headers.get("authorization").unwrap(),
        &format!("Bearer {TEST_KEY}")
    );
    assert_eq!(
        bodies(&server).await[0],
        json!({
            "model": MODEL_ID,
            "instructions": "You are a test.",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "tools": [{"type": "function", "name": "echo", "description": "Answers with its input.",
                       "parameters": {"type": "object"}, "strict": false}],
            "max_output_tokens": 256,
            "store": false,
            "include": ["reasoning.encrypted_content"],
            "temperature": 0.5,
            "tool_choice": "required",
            "parallel_tool_calls": false,
            "reasoning": {"effort": "low"},
            "service_tier": "flex"
        })
    );
    let calls: Vec<_> = reply.message.tool_calls().collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].tool_call_id.as_str(), calls[0].input.value()),
        ("call_echo", json!({"text": "hi"}))
    );
    assert_eq!(
        reply.message.meta().provider_options,
        Some(json!({"openai": {"reasoning": [{
            "id": "rs_echo", "encrypted_content": "gAAAAB-enc-echo",
            "summary": [{"type": "summary_text", "text": "Use echo."}]
        }]}}))
    );
    assert_eq!(
        (reply.usage.input_tokens, reply.usage.output_tokens),
        (30, 9)
    );
}

/// An agent with `echo`: step 1 calls it (with a reasoning item), step 2
/// answers. The second request carries the reasoning item, the call and its
/// output back, in that order.
async fn a_tool_exchange(stream: bool) {
    let server = MockServer::start().await;
    let (first, second) = if stream {
        (
            sse(fixture("echo_call.sse")),
            sse(fixture("text_reply.sse")),
        )
    } else {
        (
            ResponseTemplate::new(200).set_body_json(json_fixture("echo_call.json")),
            ResponseTemplate::new(200).set_body_json(json_fixture("text_reply.json")),
        )
    };
    mount(&server, first, 1).await;
    mount(&server, second, 1).await;
    let model: Arc<dyn Model> = Arc::new(model(settings(&server.uri(), stream)));
    let mut template = AgentTemplate::new("solo", "m");
    template.system_prompt = "Use your tools.".into();
    template.tools.push("echo".into());
    template.max_steps = 3;
    let supervisor = Supervisor::new(
        catalog(vec![("m", model)], vec![template], vec![echo()]),
        TreeLimits::default(),
    );
    let start = StartRequest {
        agent: "solo".into(),
        prompt: "echo hi".into(),
        ..StartRequest::default()
    };
    let (result, _) = run_request(&supervisor, start, support::GUARD).await;
    let state = &result.state;
    assert_eq!(
        state.status,
        AgentStatus::Completed,
        "{:?}",
        state.error_message()
    );
    let history: Vec<&Message> = state.message_history.iter().map(|m| &**m).collect();
    assert_eq!(
        history.last().unwrap().text(),
        "Paris is 18°C; Berlin has no station."
    );

    let bodies = bodies(&server).await;
    assert_eq!(bodies.len(), 2);
    for body in &bodies {
        assert_eq!(body.get("stream").is_some(), stream, "{body}");
    }
    assert_eq!(bodies[1]["instructions"], "Use your tools.");
    let input = bodies[1]["input"].as_array().unwrap();
    let tail = &input[input.len() - 3..];
    assert_eq!(
        tail[0],
        json!({"type": "reasoning", "id": "rs_echo", "encrypted_content": "gAAAAB-enc-echo",
               "summary": [{"type": "summary_text", "text": "Use echo."}]})
    );
    assert_eq!(
        tail[1],
        json!({"type": "function_call", "call_id": "call_echo", "name": "echo",
               "arguments": "{\"text\":\"hi\"}"})
    );
    assert_eq!(tail[2]["type"], "function_call_output");
    assert_eq!(tail[2]["call_id"], "call_echo");
    let output: Value = serde_json::from_str(tail[2]["output"].as_str().unwrap()).unwrap();
    assert_eq!(output, json!({"echo": {"text": "hi"}}));
    // Before them, only user (and system) messages: the prompt the run made.
    assert!(
        input[..input.len() - 3]
            .iter()
            .all(|i| i["role"] == "user" || i["role"] == "system"),
        "{input:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_exchange_sends_the_reasoning_the_call_and_its_output_back() {
    a_tool_exchange(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_tool_exchange_sends_the_reasoning_the_call_and_its_output_back() {
    a_tool_exchange(true).await;
}

#[tokio::test]
async fn a_stream_and_the_whole_response_are_the_same_reply() {
    for (whole, streamed) in [
        ("tool_reply.json", "tool_reply.sse"),
        ("echo_call.json", "echo_call.sse"),
        ("text_reply.json", "text_reply.sse"),
    ] {
        let server = MockServer::start().await;
        mount(
            &server,
            ResponseTemplate::new(200).set_body_json(json_fixture(whole)),
            1,
        )
        .await;
        mount(&server, sse(fixture(streamed)), 1).await;
        let (sink, _) = collector();
        let a = model(settings(&server.uri(), false))
            .complete(support::request(true), sink.clone())
            .await
            .unwrap();
        let (sink, deltas) = collector();
        let b = model(settings(&server.uri(), true))
            .complete(support::request(true), sink)
            .await
            .unwrap();
        assert_eq!(a.message, b.message, "{whole}");
        assert_eq!(a.usage, b.usage, "{whole}");
        assert!(!deltas.lock().unwrap().is_empty(), "{streamed}: no deltas");
    }
}

#[tokio::test]
async fn a_reply_cut_at_max_output_tokens_is_truncated_and_not_retried() {
    for stream in [false, true] {
        let server = MockServer::start().await;
        let response = if stream {
            sse(fixture("truncated_reply.sse"))
        } else {
            ResponseTemplate::new(200).set_body_json(json_fixture("truncated_reply.json"))
        };
        mount(&server, response, u64::MAX).await;
        let (sink, _) = collector();
        let err = model(settings(&server.uri(), stream))
            .complete(support::request(false), sink)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ModelError::Truncated { message, .. } if message.contains("max_output_tokens")),
            "{err:?}"
        );
        assert_eq!(bodies(&server).await.len(), 1, "stream: {stream}");
    }
}

#[tokio::test]
async fn error_replies_are_rejected_or_retried_as_the_other_formats_do() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(400).set_body_json(wire::error_json(
            ProviderKind::OpenAi,
            "Unknown parameter: 'input[0].foo'.",
        )),
        1,
    )
    .await;
    let (sink, _) = collector();
    let err = model(settings(&server.uri(), false))
        .complete(support::request(false), sink)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ModelError::Rejected { status: 400, message, .. } if message.contains("Unknown parameter")),
        "{err:?}"
    );

    // A 500, then a stream that fails (server_error), then a reply.
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(500).set_body_json(wire::error_json(ProviderKind::OpenAi, "oops")),
        1,
    )
    .await;
    let failed = json!({"type": "response.failed", "sequence_number": 1, "response": {
        "id": "resp_f", "status": "failed", "output": [],
        "error": {"code": "server_error", "message": "The model failed."}}});
    mount(
        &server,
        sse(format!("event: response.failed\ndata: {failed}\n\n")),
        1,
    )
    .await;
    mount(&server, sse(fixture("text_reply.sse")), 1).await;
    let (sink, deltas) = collector();
    let reply = model(settings(&server.uri(), true))
        .complete(support::request(false), sink)
        .await
        .unwrap();
    assert_eq!(
        reply.message.text(),
        "Paris is 18°C; Berlin has no station."
    );
    let retries = support::retries(&deltas);
    assert_eq!(retries.len(), 2, "{retries:?}");
    assert!(retries[1].2.contains("The model failed."), "{retries:?}");
}

fn parse_config(
    provider: &str,
    api: &str,
    uri: &str,
) -> Result<Config, arbor::config::ConfigError> {
    let text = format!(
        r#"
[models.r]
provider = "{provider}"
{api}
base_url = "{uri}/v1"
model = "{MODEL_ID}"
stream = false

[agents.lead]
model = "r"
"#
    );
    Config::parse(&text, "responses.toml", PathBuf::new())
}

#[tokio::test]
async fn api_responses_in_a_config_posts_to_responses_and_api_on_anthropic_is_a_problem() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(200).set_body_json(json_fixture("text_reply.json")),
        1,
    )
    .await;
    let responses = parse_config("openai", "api = \"responses\"", &server.uri()).unwrap();
    let Some((_, ModelSection::Openai(section))) =
        responses.model_sections().find(|(name, _)| *name == "r")
    else {
        panic!("no model r")
    };
    let model = responses
        .http_model("r", ProviderKind::OpenAi, section)
        .unwrap();
    assert_eq!(model.settings().api, Api::Responses);
    let (sink, _) = collector();
    let reply = model.complete(support::request(false), sink).await.unwrap();
    assert_eq!(
        reply.message.text(),
        "Paris is 18°C; Berlin has no station."
    );
    assert_eq!(bodies(&server).await.len(), 1);

    let chat = parse_config("openai", "", &server.uri()).unwrap();
    let Some((_, ModelSection::Openai(section))) = chat.model_sections().find(|(n, _)| *n == "r")
    else {
        panic!()
    };
    assert_eq!(
        chat.http_model("r", ProviderKind::OpenAi, section)
            .unwrap()
            .settings()
            .api,
        Api::Chat
    );

    let err = parse_config("anthropic", "api = \"responses\"", &server.uri())
        .unwrap_err()
        .to_string();
    assert!(err.contains("models.r.api"), "{err}");
    let err = parse_config("openai", "api = \"completions\"", &server.uri())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("models.r.api") && err.contains("responses"),
        "{err}"
    );
}

/// Issue 34: llama-server's `/v1/responses` stream names its items by
/// `item_id` and has no `output_index`. Served as it sends it (fixtures
/// llama_server_calls.sse, llama_server_text_calls.sse): three calls in,
/// three calls out, each streamed under its own index; a message followed
/// by calls keeps its text apart from them.
#[tokio::test]
async fn a_llama_server_stream_without_output_index_keeps_every_call() {
    for (streamed, text, cities) in [
        (
            "llama_server_calls.sse",
            "",
            &["Paris", "Berlin", "Rome"][..],
        ),
        (
            "llama_server_text_calls.sse",
            "Checking both cities.",
            &["Oslo", "Lima"][..],
        ),
    ] {
        let server = MockServer::start().await;
        mount(&server, sse(fixture(streamed)), 1).await;
        let (sink, deltas) = collector();
        let reply = support::guarded(
            model(settings(&server.uri(), true)).complete(support::request(true), sink),
        )
        .await
        .unwrap();
        assert_eq!(reply.message.text(), text, "{streamed}");
        let calls: Vec<(&str, Value)> = reply
            .message
            .tool_calls()
            .map(|call| (call.tool_name.as_str(), call.input.value()))
            .collect();
        let expected: Vec<Value> = cities.iter().map(|city| json!({"city": city})).collect();
        assert_eq!(
            calls,
            expected
                .iter()
                .map(|input| ("get_weather", input.clone()))
                .collect::<Vec<_>>(),
            "{streamed}"
        );
        // Each call's arguments streamed under its own index.
        let mut streamed_args: Vec<String> = vec![String::new(); cities.len()];
        let mut streamed_text = String::new();
        for delta in deltas.lock().unwrap().iter() {
            match delta {
                arbor::actors::Delta::ToolCallArgs { index, text } => {
                    streamed_args[*index].push_str(text)
                }
                arbor::actors::Delta::Text { text } => streamed_text.push_str(text),
                _ => {}
            }
        }
        assert_eq!(streamed_text, text, "{streamed}");
        assert_eq!(
            streamed_args,
            expected.iter().map(Value::to_string).collect::<Vec<_>>(),
            "{streamed}"
        );
    }
}
