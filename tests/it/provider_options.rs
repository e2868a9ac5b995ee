//! Request options from a config file to the wire: a `[models.X] options`
//! table and an `[agents.Y] model_options` table over it, read by
//! `Config::parse`, run as a real tree (supervisor, agent, step machine,
//! HTTP model) against wiremock on loopback, and the captured request body
//! compared with the shape the provider documents: Anthropic's Messages API
//! (docs/anthropic.md, "Request options") and OpenAI's Chat Completions
//! (docs/providers.md). OpenAI's own API gets `max_completion_tokens`: that
//! one is checked through the `arbor` binary, whose HTTP client honours
//! `HTTP_PROXY`, so a request for `api.openai.com` reaches a loopback server.

use std::path::PathBuf;

use arbor::Config;
use arbor::actors::AgentStatus;
use arbor::providers::ProviderKind;
use arbor::supervisor::{StartRequest, Supervisor};
use arbor_test_support::run_request;
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, MODEL_ID, guarded, wire};

/// A server that answers every request to `kind`'s path with a whole text reply.
async fn server(kind: ProviderKind) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(support::path(kind)))
        .respond_with(ResponseTemplate::new(200).set_body_json(wire::text_json(kind, "done")))
        .mount(&server)
        .await;
    server
}

fn parse(text: &str) -> Config {
    Config::parse(text, "options.toml", PathBuf::new()).expect("the config is valid")
}

/// Runs `agent` of `config` as a tree of its own, to completion, and
/// returns the body of the one request it sent (the last one `server` got).
async fn sent_by(config: &Config, server: &MockServer, agent: &str) -> Value {
    let before = server.received_requests().await.unwrap().len();
    let supervisor = Supervisor::new(config.catalog().unwrap(), config.limits.clone());
    let start = StartRequest {
        agent: agent.into(),
        prompt: "Is 2 + 2 = 4?".into(),
        ..StartRequest::default()
    };
    let (result, _) = run_request(&supervisor, start, support::GUARD).await;
    assert_eq!(
        result.state.status,
        AgentStatus::Completed,
        "{agent}: {:?}",
        result.state.error_message()
    );
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), before + 1, "{agent} sent one request");
    serde_json::from_slice(&requests[before].body).unwrap()
}

/// The body without the conversation and the tool definitions (each test
/// checks those where they matter), in the order it was sent.
fn options_of(body: &Value) -> Value {
    let mut body = body.clone();
    let object = body.as_object_mut().unwrap();
    for key in ["messages", "system", "tools"] {
        object.shift_remove(key);
    }
    body
}

fn keys(body: &Value) -> Vec<&str> {
    body.as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect()
}

/// The names of the tools a request offers (Messages or Chat Completions).
fn tool_names(body: &Value) -> Vec<&str> {
    body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t.get("name")
                .or_else(|| t.pointer("/function/name"))
                .and_then(Value::as_str)
                .unwrap()
        })
        .collect()
}

// --- Anthropic --------------------------------------------------------------

/// Model `claude` sets every option Anthropic has a field for; agent `plain`
/// runs on it as it is, agent `tuned` lays its own `model_options` over it.
fn anthropic_config(uri: &str) -> Config {
    parse(&format!(
        r#"
[models.claude]
provider = "anthropic"
base_url = "{uri}"
model = "{MODEL_ID}"
stream = false
max_tokens = 1024
retry = {{ max_retries = 0 }}
options = {{ temperature = 0.5, top_p = 0.9, stop = ["END"], seed = 42, tool_choice = "required", parallel_tool_calls = false, reasoning = {{ effort = "low" }}, extra_body = {{ top_k = 5, metadata = {{ user_id = "u-1" }} }} }}

[agents.plain]
model = "claude"
system_prompt = "Answer."

[agents.tuned]
model = "claude"
system_prompt = "Answer."
model_options = {{ temperature = 0.2, stop = ["</answer>", "END"], tool_choice = "end_turn", extra_body = {{ top_k = 7, temperature = 0.3 }} }}
"#
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_options_from_the_config_reach_the_wire_as_the_messages_api_names_them() {
    let server = server(ProviderKind::Anthropic).await;
    let config = anthropic_config(&server.uri());

    let plain = sent_by(&config, &server, "plain").await;
    assert!(tool_names(&plain).contains(&"end_turn"), "{plain:#}");
    // `stop` is `stop_sequences`; `tool_choice = "required"` is `any`, with
    // `parallel_tool_calls = false` inside it; `seed` and `reasoning.effort`
    // have no Messages API field; `extra_body` comes last.
    assert_eq!(
        options_of(&plain),
        json!({
            "model": MODEL_ID,
            "max_tokens": 1024,
            "temperature": 0.5,
            "top_p": 0.9,
            "stop_sequences": ["END"],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "top_k": 5,
            "metadata": {"user_id": "u-1"}
        })
    );
    // In the documented order: the prompt as the API caches it, then the
    // options, then `extra_body`'s keys (among themselves in the order the
    // TOML table gives them).
    let order = keys(&plain);
    assert_eq!(
        order[..9],
        [
            "model",
            "max_tokens",
            "tools",
            "system",
            "messages",
            "temperature",
            "top_p",
            "stop_sequences",
            "tool_choice"
        ]
    );
    let mut extra = order[9..].to_vec();
    extra.sort_unstable();
    assert_eq!(extra, ["metadata", "top_k"]);
    for absent in ["seed", "reasoning", "reasoning_effort", "thinking", "stop"] {
        assert!(plain.get(absent).is_none(), "{absent} in {plain:#}");
    }

    // The agent's keys win one by one; the model's `top_p` and
    // `parallel_tool_calls` stay; the two `extra_body` tables merge, and
    // `extra_body` replaces the typed `temperature` in its place.
    let tuned = sent_by(&config, &server, "tuned").await;
    assert_eq!(
        options_of(&tuned),
        json!({
            "model": MODEL_ID,
            "max_tokens": 1024,
            "temperature": 0.3,
            "top_p": 0.9,
            "stop_sequences": ["</answer>", "END"],
            "tool_choice": {"type": "tool", "name": "end_turn", "disable_parallel_tool_use": true},
            "top_k": 7,
            "metadata": {"user_id": "u-1"}
        })
    );
    assert_eq!(keys(&tuned)[5], "temperature", "{tuned:#}");
}

/// Thinking set on the model (`options.reasoning.budget_tokens`) and on an
/// agent (`model_options.reasoning.budget_tokens` over a model without
/// options): `thinking` is sent, and `max_tokens` is raised past the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_thinking_budget_sends_thinking_and_raises_max_tokens() {
    let server = server(ProviderKind::Anthropic).await;
    let uri = server.uri();
    let config = parse(&format!(
        r#"
[models.thinker]
provider = "anthropic"
base_url = "{uri}"
model = "{MODEL_ID}"
stream = false
max_tokens = 1024
retry = {{ max_retries = 0 }}
options = {{ reasoning = {{ budget_tokens = 2048 }}, tool_choice = "auto", parallel_tool_calls = false }}

[models.bare]
provider = "anthropic"
base_url = "{uri}"
model = "{MODEL_ID}"
stream = false
max_tokens = 8000
retry = {{ max_retries = 0 }}

[agents.ponder]
model = "thinker"
system_prompt = "Think, then answer."

[agents.deep]
model = "bare"
system_prompt = "Think, then answer."
model_options = {{ reasoning = {{ budget_tokens = 4096 }}, extra_body = {{ metadata = {{ user_id = "u-2" }} }} }}

[agents.deeper]
model = "thinker"
system_prompt = "Think, then answer."
model_options = {{ reasoning = {{ budget_tokens = 3000 }}, tool_choice = "none" }}
"#
    ));

    // 1024 is not more than 2048: the reply keeps its 1024 on top.
    let ponder = sent_by(&config, &server, "ponder").await;
    assert_eq!(
        options_of(&ponder),
        json!({
            "model": MODEL_ID,
            "max_tokens": 2048 + 1024,
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 2048}
        })
    );
    // 8000 is more than 4096: sent as configured. No tool choice is set, so
    // none is sent; `extra_body` comes last.
    let deep = sent_by(&config, &server, "deep").await;
    assert_eq!(
        options_of(&deep),
        json!({
            "model": MODEL_ID,
            "max_tokens": 8000,
            "thinking": {"type": "enabled", "budget_tokens": 4096},
            "metadata": {"user_id": "u-2"}
        })
    );
    assert_eq!(keys(&deep).last(), Some(&"metadata"));
    // The agent's budget replaces the model's; `none` takes no other field.
    let deeper = sent_by(&config, &server, "deeper").await;
    assert_eq!(
        deeper["thinking"],
        json!({"type": "enabled", "budget_tokens": 3000})
    );
    assert_eq!(deeper["max_tokens"], json!(3000 + 1024));
    assert_eq!(deeper["tool_choice"], json!({"type": "none"}));
}

// --- OpenAI Chat Completions ---------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_options_from_the_config_reach_the_wire_as_chat_completions_names_them() {
    let server = server(ProviderKind::OpenAi).await;
    let config = parse(&format!(
        r#"
[models.gpt]
provider = "openai"
base_url = "{}"
model = "{MODEL_ID}"
stream = false
max_tokens = 300
retry = {{ max_retries = 0 }}
options = {{ temperature = 0.7, top_p = 0.9, stop = ["END"], seed = 42, tool_choice = "required", parallel_tool_calls = false, reasoning = {{ effort = "low", budget_tokens = 2048 }}, extra_body = {{ cache_prompt = true, top_k = 20 }} }}

[agents.plain]
model = "gpt"
system_prompt = "Answer."

[agents.tuned]
model = "gpt"
system_prompt = "Answer."
model_options = {{ temperature = 0.1, stop = ["</answer>"], seed = 7, tool_choice = "end_turn", parallel_tool_calls = true, reasoning = {{ effort = "high" }}, extra_body = {{ top_k = 40, seed = 8 }} }}

[agents.quiet]
model = "gpt"
system_prompt = "Answer."
model_options = {{ tool_choice = "none" }}
"#,
        support::base_url(ProviderKind::OpenAi, &server.uri())
    ));

    // Each option under its Chat Completions name; a compatible server (not
    // api.openai.com) gets `max_tokens`; `reasoning.budget_tokens` has no
    // field here; `extra_body` comes last.
    let plain = sent_by(&config, &server, "plain").await;
    assert!(tool_names(&plain).contains(&"end_turn"), "{plain:#}");
    assert_eq!(
        plain["messages"][0],
        json!({"role": "system", "content": "Answer."})
    );
    assert_eq!(
        options_of(&plain),
        json!({
            "model": MODEL_ID,
            "max_tokens": 300,
            "temperature": 0.7,
            "top_p": 0.9,
            "stop": ["END"],
            "seed": 42,
            "tool_choice": "required",
            "parallel_tool_calls": false,
            "reasoning_effort": "low",
            "cache_prompt": true,
            "top_k": 20
        })
    );
    assert_eq!(
        &keys(&plain)[keys(&plain).len() - 2..],
        ["cache_prompt", "top_k"]
    );
    for absent in ["max_completion_tokens", "stream", "thinking", "reasoning"] {
        assert!(plain.get(absent).is_none(), "{absent} in {plain:#}");
    }

    // The agent's keys win; a tool's name is a named function; `extra_body`
    // tables merge and replace the typed `seed`.
    let tuned = sent_by(&config, &server, "tuned").await;
    assert_eq!(
        options_of(&tuned),
        json!({
            "model": MODEL_ID,
            "max_tokens": 300,
            "temperature": 0.1,
            "top_p": 0.9,
            "stop": ["</answer>"],
            "seed": 8,
            "tool_choice": {"type": "function", "function": {"name": "end_turn"}},
            "parallel_tool_calls": true,
            "reasoning_effort": "high",
            "cache_prompt": true,
            "top_k": 40
        })
    );

    let quiet = sent_by(&config, &server, "quiet").await;
    assert_eq!(quiet["tool_choice"], json!("none"));
    assert_eq!(quiet["temperature"], json!(0.7));
}

/// OpenAI's own API refuses `max_tokens` on its reasoning models, so a
/// model whose `base_url` is api.openai.com sends `max_completion_tokens`.
/// The branch is keyed on the host, and an in-process test cannot aim that
/// host at loopback (setting `HTTP_PROXY` in-process needs `unsafe`); the
/// `arbor` binary can: its client honours `HTTP_PROXY`, so the request for
/// `http://api.openai.com/v1/chat/completions` goes, in absolute form, to
/// the wiremock server posing as the proxy. Nothing leaves loopback (a
/// client sending through a proxy resolves nothing itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_itself_gets_max_completion_tokens_on_the_wire() {
    let server = server(ProviderKind::OpenAi).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        r#"
[models.openai]
provider = "openai"
base_url = "http://api.openai.com/v1"
model = "gpt-5-mini"
api_key_env = "ARBOR_TEST_OPENAI_KEY"
stream = false
max_tokens = 300
retry = { max_retries = 0 }
options = { reasoning = { effort = "minimal" } }

[agents.solo]
model = "openai"
system_prompt = "Answer."
"#,
    )
    .unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_arbor"));
    for proxy in [
        "NO_PROXY",
        "no_proxy",
        "ALL_PROXY",
        "all_proxy",
        "HTTPS_PROXY",
        "https_proxy",
    ] {
        command.env_remove(proxy);
    }
    let out = guarded(
        command
            .args([
                "run",
                "--config",
                "config.toml",
                "--agent",
                "solo",
                "--quiet",
                "hi",
            ])
            .current_dir(dir.path())
            .env_remove("RUST_LOG")
            .env("HTTP_PROXY", server.uri())
            .env("http_proxy", server.uri())
            .env("ARBOR_TEST_OPENAI_KEY", support::TEST_KEY)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap();
    let (stdout, stderr) = (crate::text(&out.stdout), crate::text(&out.stderr));
    assert!(
        out.status.success(),
        "status {:?}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    assert_eq!(stdout.trim(), "done");
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1);
    // The request was for OpenAI's host (the proxy saw its absolute URL).
    assert_eq!(requests[0].url.host_str(), Some("api.openai.com"));
    assert_eq!(requests[0].url.path(), "/v1/chat/completions");
    let body: Value = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(body["model"], "gpt-5-mini");
    assert_eq!(body["max_completion_tokens"], json!(300));
    assert!(body.get("max_tokens").is_none(), "{body:#}");
    assert_eq!(body["reasoning_effort"], "minimal");
}

// --- The workspace tools on the wire ------------------------------------------

/// What a model is sent for `workspace/*` under each family (issue 36): the
/// recorded request of an agent per family offers exactly that family's
/// names, each with its documented input schema, as Anthropic's Messages
/// API carries them (`tools[].name`, `input_schema`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_familys_workspace_tools_reach_the_model_with_its_names_and_schemas() {
    let server = server(ProviderKind::Anthropic).await;
    let config = parse(&format!(
        r#"
[models.claude]
provider = "anthropic"
base_url = "{uri}"
model = "{MODEL_ID}"
stream = false
max_tokens = 1024
retry = {{ max_retries = 0 }}

[agents.arbor]
model = "claude"
tools = ["workspace/*"]

[agents.codebuff]
model = "claude"
tools = ["workspace/*"]
tool_names = "codebuff"

[agents.claude]
model = "claude"
tools = ["workspace/*"]
tool_names = "claude"
"#,
        uri = server.uri()
    ));
    let expected: [(&str, &[&str]); 3] = [
        (
            "arbor",
            &[
                "workspace/read",
                "workspace/write",
                "workspace/edit",
                "workspace/list",
                "workspace/glob",
                "workspace/grep",
                "workspace/shell",
                "workspace/todos",
                "workspace/think",
            ],
        ),
        (
            "codebuff",
            &[
                "read_files",
                "write_file",
                "str_replace",
                "find_files",
                "code_search",
                "run_terminal_command",
                "write_todos",
                "think_deeply",
            ],
        ),
        (
            "claude",
            &[
                "Read",
                "Write",
                "Edit",
                "MultiEdit",
                "LS",
                "Glob",
                "Grep",
                "Bash",
                "TodoWrite",
            ],
        ),
    ];
    for (agent, names) in expected {
        let body = sent_by(&config, &server, agent).await;
        let mut sent: Vec<&str> = tool_names(&body)
            .into_iter()
            .filter(|n| !["set_output", "end_turn"].contains(n))
            .collect();
        sent.sort_unstable();
        // A name with `/` travels as `__` (the APIs' tool names allow
        // neither `/` nor `.`), and reads back as it was.
        let mut want: Vec<String> = names.iter().map(|n| n.replace('/', "__")).collect();
        want.sort_unstable();
        assert_eq!(sent, want, "{agent}");
    }
    // The schemas the models of each family were written against.
    let body = sent_by(&config, &server, "claude").await;
    let schema = |name: &str| {
        body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap()["input_schema"]
            .clone()
    };
    assert_eq!(schema("Read")["required"], json!(["file_path"]));
    assert!(schema("Read")["properties"]["offset"].is_object());
    assert_eq!(
        schema("Edit")["required"],
        json!(["file_path", "old_string", "new_string"])
    );
    assert_eq!(schema("Bash")["required"], json!(["command"]));
    let body = sent_by(&config, &server, "codebuff").await;
    let read_files = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "read_files")
        .unwrap();
    assert_eq!(read_files["input_schema"]["required"], json!(["paths"]));
    assert_eq!(
        read_files["input_schema"]["properties"]["paths"]["type"],
        "array"
    );
}
