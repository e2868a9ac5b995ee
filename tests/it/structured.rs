//! Native structured output against wiremock on loopback: a config's
//! `structured_output` agent on an OpenAI model sends its output schema as
//! `response_format` json_schema (the Responses API as `text.format`), offers
//! no `set_output`, and its JSON reply is the run's output; a reply that is
//! not JSON is answered with a message naming the error and another step;
//! on Anthropic `auto` keeps `set_output`, and `native` sends
//! `output_config.format`. The shapes are documented in docs/providers.md.

use std::path::PathBuf;

use arbor::Config;
use arbor::actors::AgentStatus;
use arbor::providers::ProviderKind;
use arbor::supervisor::{StartRequest, Supervisor};
use arbor_test_support::run_request;
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, MODEL_ID, wire};

/// A schema in OpenAI's strict subset.
const STRICT: &str = r#"{ type = "object", additionalProperties = false, required = ["score", "verdict"], properties = { score = { type = "number" }, verdict = { type = "string" } } }"#;

/// A config with model `m` of `provider` at `uri` (whole replies, no key)
/// and agent `judge` on it.
fn config(provider: &str, uri: &str, model_extra: &str, agent_extra: &str) -> Config {
    let kind = if provider == "anthropic" {
        ProviderKind::Anthropic
    } else {
        ProviderKind::OpenAi
    };
    let text = format!(
        "[models.m]\nprovider = \"{provider}\"\nbase_url = \"{}\"\nmodel = \"{MODEL_ID}\"\n\
         stream = false\nretry = {{ max_retries = 0 }}\n{model_extra}\n\n\
         [agents.judge]\nmodel = \"m\"\nsystem_prompt = \"Judge.\"\nmax_steps = 3\n\
         output_mode = \"structured_output\"\noutput_schema = {STRICT}\n{agent_extra}\n",
        support::base_url(kind, uri)
    );
    Config::parse(&text, "structured.toml", PathBuf::new()).expect("the config is valid")
}

async fn run(config: &Config) -> arbor::actors::RunResult {
    let supervisor = Supervisor::new(config.catalog().unwrap(), config.limits.clone());
    let start = StartRequest {
        agent: "judge".into(),
        prompt: "Is 2 + 2 = 4?".into(),
        ..StartRequest::default()
    };
    run_request(&supervisor, start, support::GUARD).await.0
}

/// Serves `replies` in order, one request each.
async fn server(route: &str, replies: Vec<Value>) -> MockServer {
    let server = MockServer::start().await;
    for reply in replies {
        Mock::given(method("POST"))
            .and(path(route))
            .respond_with(ResponseTemplate::new(200).set_body_json(reply))
            .up_to_n_times(1)
            .mount(&server)
            .await;
    }
    server
}

async fn bodies(server: &MockServer) -> Vec<Value> {
    server
        .received_requests()
        .await
        .expect("recording is on")
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

/// The names of the tools a request offers (Chat Completions, Responses or Messages).
fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
        .iter()
        .map(|t| {
            t.pointer("/function/name")
                .or_else(|| t.get("name"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

fn schema() -> Value {
    json!({"type": "object", "additionalProperties": false, "required": ["score", "verdict"],
           "properties": {"score": {"type": "number"}, "verdict": {"type": "string"}}})
}

const ANSWER: &str = r#"{"score": 1, "verdict": "true"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sends_the_schema_as_response_format_and_the_json_reply_is_the_output() {
    let server = server(
        support::path(ProviderKind::OpenAi),
        vec![wire::text_json(ProviderKind::OpenAi, ANSWER)],
    )
    .await;
    // `structured` absent: auto, native on an openai model.
    let result = run(&config("openai", &server.uri(), "", "")).await;
    assert_eq!(
        result.state.status,
        AgentStatus::Completed,
        "{:?}",
        result.state.error_message()
    );
    assert_eq!(
        result.value,
        json!({"type": "structuredOutput", "value": {"score": 1, "verdict": "true"}})
    );
    let sent = bodies(&server).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0]["response_format"],
        json!({"type": "json_schema", "json_schema": {
            "name": "judge", "schema": schema(), "strict": true
        }})
    );
    assert!(
        !tool_names(&sent[0]).contains(&"set_output".to_owned()),
        "{:?}",
        tool_names(&sent[0])
    );
    assert!(tool_names(&sent[0]).contains(&"end_turn".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_is_not_json_gets_a_message_naming_the_error_and_another_step() {
    let server = server(
        support::path(ProviderKind::OpenAi),
        vec![
            wire::text_json(ProviderKind::OpenAi, "It is true, with a score of 1."),
            wire::text_json(ProviderKind::OpenAi, ANSWER),
        ],
    )
    .await;
    let result = run(&config(
        "openai",
        &server.uri(),
        "",
        "structured = \"native\"",
    ))
    .await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    assert_eq!(
        result.state.output,
        Some(json!({"score": 1, "verdict": "true"}))
    );
    let sent = bodies(&server).await;
    assert_eq!(sent.len(), 2, "one retry");
    let last = sent[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user", "{last}");
    let told = last["content"].as_str().unwrap();
    assert!(told.starts_with("Your reply is not valid JSON: "), "{told}");
    // The refused reply is in the history the model sees again.
    assert!(
        sent[1]
            .to_string()
            .contains("It is true, with a score of 1.")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_responses_api_sends_the_schema_as_the_texts_format() {
    let reply = json!({
        "id": "resp_1", "object": "response", "status": "completed", "model": MODEL_ID,
        "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": ANSWER, "annotations": []}]}],
        "usage": {"input_tokens": 20, "output_tokens": 8, "total_tokens": 28}
    });
    let server = server("/v1/responses", vec![reply]).await;
    let result = run(&config("openai", &server.uri(), "api = \"responses\"", "")).await;
    assert_eq!(
        result.state.status,
        AgentStatus::Completed,
        "{:?}",
        result.state.error_message()
    );
    assert_eq!(
        result.state.output,
        Some(json!({"score": 1, "verdict": "true"}))
    );
    let sent = bodies(&server).await;
    assert_eq!(
        sent[0]["text"],
        json!({"format": {"type": "json_schema", "name": "judge", "schema": schema(), "strict": true}})
    );
    assert!(!tool_names(&sent[0]).contains(&"set_output".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_keeps_set_output_on_anthropic_and_native_sends_output_config() {
    let server = server(
        support::path(ProviderKind::Anthropic),
        vec![wire::text_json(ProviderKind::Anthropic, ANSWER)],
    )
    .await;
    // auto: the tool, and a JSON text reply is only text.
    let result = run(&config("anthropic", &server.uri(), "", "")).await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    assert_eq!(result.state.output, None);
    let sent = bodies(&server).await;
    assert!(tool_names(&sent[0]).contains(&"set_output".to_owned()));
    assert!(sent[0].get("output_config").is_none(), "{}", sent[0]);

    let server = server_again(ANSWER).await;
    let result = run(&config(
        "anthropic",
        &server.uri(),
        "",
        "structured = \"native\"",
    ))
    .await;
    assert_eq!(
        result.state.output,
        Some(json!({"score": 1, "verdict": "true"}))
    );
    let sent = bodies(&server).await;
    assert_eq!(
        sent[0]["output_config"],
        json!({"format": {"type": "json_schema", "schema": schema()}})
    );
    assert!(!tool_names(&sent[0]).contains(&"set_output".to_owned()));
    let request = &server.received_requests().await.unwrap()[0];
    assert!(request.headers.get("anthropic-beta").is_none());
}

async fn server_again(text: &str) -> MockServer {
    server(
        support::path(ProviderKind::Anthropic),
        vec![wire::text_json(ProviderKind::Anthropic, text)],
    )
    .await
}
