//! Anthropic prompt caching, thinking and truncation against a loopback server
//! (wiremock capturing the request bodies), from fixtures in
//! tests/fixtures/anthropic: two siblings spawned from one parent send the same
//! bytes up to the breakpoint that ends their shared prefix (requests built
//! by hand, and requests sent by two children a parent really spawned in a
//! tree from a config), a reply's cache
//! reads and writes are priced at the cache prices, a reply's thinking blocks
//! go back with their signatures unchanged, and a reply cut at max_tokens is
//! never acted on.

use std::collections::BTreeMap;
use std::sync::Arc;

use arbor::Config;
use arbor::actors::message::Message;
use arbor::actors::model::RequestMeta;
use arbor::actors::state::ToolDefinition;
use arbor::actors::{AgentStatus, EventKind, Usage};
use arbor::actors::{Model, ModelError, ModelRequest, ModelResponse};
use arbor::providers::{HttpModel, Pricing, ProviderKind, ProviderSettings};
use arbor::supervisor::{StartRequest, Supervisor};
use arbor_test_support::{call, run_request, spawn_call};
use serde_json::{Value, json};
use wiremock::matchers::{body_string_contains, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, collector, guarded, sse, wire};

const KIND: ProviderKind = ProviderKind::Anthropic;
/// A breakpoint as it is sent.
const BREAKPOINT: &str = r#""cache_control":{"type":"ephemeral"}"#;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(crate::fixtures().join("anthropic").join(name)).unwrap()
}

fn messages(value: &Value) -> Vec<Message> {
    serde_json::from_value(value.clone()).unwrap()
}

fn tools() -> Arc<BTreeMap<String, ToolDefinition>> {
    let mut tools = BTreeMap::new();
    for (name, description) in [
        ("get_weather", "Current weather in a city"),
        ("web_search", "Searches the web"),
    ] {
        tools.insert(
            name.to_owned(),
            ToolDefinition {
                description: description.into(),
                input_schema: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
            },
        );
    }
    Arc::new(tools)
}

async fn mount_once(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path(support::path(KIND)))
        .respond_with(response)
        .up_to_n_times(1)
        .mount(server)
        .await;
}

/// The bodies the server received, as sent (bytes) and parsed.
async fn bodies(server: &MockServer) -> Vec<(String, Value)> {
    server
        .received_requests()
        .await
        .expect("recording is on")
        .iter()
        .map(|r| {
            let text = String::from_utf8(r.body.clone()).unwrap();
            let value = serde_json::from_str(&text).unwrap();
            (text, value)
        })
        .collect()
}

async fn complete(settings: &ProviderSettings, request: ModelRequest) -> ModelResponse {
    let model = HttpModel::new("m", settings.clone()).expect("client builds");
    let (sink, _) = collector();
    guarded(model.complete(request, sink))
        .await
        .expect("the reply is complete")
}

/// The byte offsets just past each breakpoint of a body's text.
fn breakpoint_ends(text: &str) -> Vec<usize> {
    text.match_indices(BREAKPOINT)
        .map(|(at, m)| at + m.len())
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn siblings_share_their_prefix_bytes_up_to_the_same_breakpoint_and_pay_cache_prices() {
    let fixture: Value = serde_json::from_str(&fixture("siblings.json")).unwrap();
    let server = MockServer::start().await;
    for child in ["oslo", "lisbon"] {
        let reply = ResponseTemplate::new(200).set_body_json(&fixture["replies"][child]);
        mount_once(&server, reply).await;
    }
    let mut settings = support::settings(KIND, &server.uri());
    settings.stream = false;
    settings.pricing = serde_json::from_value::<Pricing>(fixture["pricing"].clone()).unwrap();
    let shared = messages(&fixture["shared"]);
    let mut usages = Vec::new();
    for child in ["oslo", "lisbon"] {
        let mut history = shared.clone();
        history.extend(messages(&fixture["own"][child]));
        let request = ModelRequest {
            system_prompt: fixture["system_prompt"].as_str().unwrap().into(),
            messages: history.into_iter().collect(),
            tools: tools(),
            meta: RequestMeta {
                shared_prefix: shared.len(),
                ..RequestMeta::default()
            },
        };
        usages.push(complete(&settings, request).await.usage);
    }

    let bodies = bodies(&server).await;
    assert_eq!(bodies.len(), 2);
    let (oslo, lisbon) = (&bodies[0], &bodies[1]);
    // Tools, system, end of the shared prefix, end of the history: four, the
    // API's limit.
    for (text, body) in [oslo, lisbon] {
        assert_eq!(breakpoint_ends(text).len(), 4, "{body:#}");
        assert_eq!(
            body["tools"][1]["cache_control"],
            json!({"type": "ephemeral"})
        );
        assert_eq!(
            body["system"][0]["cache_control"],
            json!({"type": "ephemeral"})
        );
        // The parent's background and the child's prompt are one user turn;
        // the prefix ends on the background's block.
        let turn = &body["messages"][2]["content"];
        assert_eq!(turn[0]["text"], shared[3].text());
        assert_eq!(turn[0]["cache_control"], json!({"type": "ephemeral"}));
        assert_eq!(turn[1]["cache_control"], json!({"type": "ephemeral"}));
    }
    // The same bytes up to and including the prefix breakpoint, then not.
    let prefix_end = breakpoint_ends(&oslo.0)[2];
    assert_eq!(prefix_end, breakpoint_ends(&lisbon.0)[2]);
    assert_eq!(oslo.0[..prefix_end], lisbon.0[..prefix_end]);
    assert_ne!(oslo.0[prefix_end..], lisbon.0[prefix_end..]);
    assert!(oslo.0[prefix_end..].contains("Research Oslo"));

    // Cache writes and reads count as input and are priced at their own prices.
    let pricing = settings.pricing;
    let (write, read) = (&usages[0], &usages[1]);
    assert_eq!(
        (
            write.input_tokens,
            write.cache_write_tokens,
            write.cache_read_tokens
        ),
        (21 + 1800, 1800, 0)
    );
    assert_eq!(
        (
            read.input_tokens,
            read.cache_write_tokens,
            read.cache_read_tokens
        ),
        (26 + 1800, 0, 1800)
    );
    assert!(close(
        write.cost,
        (21.0 * 3.0 + 14.0 * 15.0 + 1800.0 * 3.75) / 1e6
    ));
    assert!(close(
        read.cost,
        (26.0 * 3.0 + 12.0 * 15.0 + 1800.0 * 0.3) / 1e6
    ));
    assert!(close(read.cost, pricing.cost(26, 12, 1800, 0)));
    // The read is cheaper than the same tokens at the input price.
    assert!(read.cost < pricing.cost(26 + 1800, 12, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_reply_goes_back_with_its_signature_unchanged() {
    let server = MockServer::start().await;
    mount_once(&server, sse(fixture("thinking_tool.sse"))).await;
    mount_once(&server, sse(wire::text_stream(KIND, "It is -3C in Oslo."))).await;
    let settings = support::settings(KIND, &server.uri());
    let ask = Message::user("What is the weather in Oslo?");
    let request = |messages: Vec<Message>| ModelRequest {
        system_prompt: "You are a test.".into(),
        messages: messages.into_iter().collect(),
        tools: tools(),
        meta: RequestMeta::default(),
    };

    let reply = complete(&settings, request(vec![ask.clone()]))
        .await
        .message;
    let call = reply.tool_calls().next().expect("a tool call").clone();
    // The history stores the message (a journal, a checkpoint) and reads it back.
    let stored: Message = serde_json::from_value(serde_json::to_value(&reply).unwrap()).unwrap();
    let result = Message::tool_result(&call, json!("-3C"));
    let answer = complete(&settings, request(vec![ask, stored, result])).await;
    assert_eq!(answer.message.text(), "It is -3C in Oslo.");

    let bodies = bodies(&server).await;
    assert_eq!(bodies.len(), 2);
    let expected: Value = serde_json::from_str(&fixture("thinking_tool.blocks.json")).unwrap();
    let sent = &bodies[1].1["messages"][1];
    assert_eq!(sent["role"], "assistant");
    assert_eq!(sent["content"], expected, "in order, thinking first");
    // The signature's exact bytes are in the request.
    let signature = expected[0]["signature"].as_str().unwrap();
    assert!(
        bodies[1]
            .0
            .contains(&format!(r#""signature":"{signature}""#))
    );
    // The call's result answers it in the next user turn.
    assert_eq!(
        bodies[1].1["messages"][2]["content"][0]["tool_use_id"],
        "toolu_01Oslo"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_at_max_tokens_is_truncated_and_not_retried() {
    let server = MockServer::start().await;
    let mut cut = wire::text_json(KIND, "The answer is");
    cut["stop_reason"] = json!("max_tokens");
    mount_once(&server, ResponseTemplate::new(200).set_body_json(cut)).await;
    let mut settings = support::settings(KIND, &server.uri());
    settings.stream = false;
    let model = HttpModel::new("m", settings).expect("client builds");
    let (sink, _) = collector();
    let error = guarded(model.complete(support::request(false), sink))
        .await
        .expect_err("a cut reply is not a reply");
    assert!(matches!(error, ModelError::Truncated { .. }), "{error}");
    assert!(error.to_string().contains("max_tokens"), "{error}");
    assert_eq!(bodies(&server).await.len(), 1);
}

/// Caching end to end: a parent (scripted) that has used a tool spawns two
/// children of an Anthropic template with `include_message_history`, and
/// the two requests the children really send (concurrently, in either
/// order) carry the same bytes up to the breakpoint that ends the history
/// they took from the parent, with the breakpoints where docs/anthropic.md
/// puts them; their replies' cache writes and reads are priced at the
/// cache prices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_siblings_send_the_same_bytes_up_to_their_shared_prefix_breakpoint() {
    let fixture: Value = serde_json::from_str(&fixture("siblings.json")).unwrap();
    let own = |child: &str| {
        fixture["own"][child][0]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let server = MockServer::start().await;
    // Each child gets its fixture reply, told apart by its own prompt.
    for child in ["oslo", "lisbon"] {
        Mock::given(method("POST"))
            .and(path(support::path(KIND)))
            .and(body_string_contains(own(child)))
            .respond_with(ResponseTemplate::new(200).set_body_json(&fixture["replies"][child]))
            .up_to_n_times(1)
            .mount(&server)
            .await;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = json!({"replies": [{"agent": "lead", "steps": [
        {"toolCalls": [call("note", json!({"word": "two-cities"}))]},
        {"toolCalls": [spawn_call(&[("reader", &own("oslo")), ("reader", &own("lisbon"))])]},
        {"text": "merged"}
    ]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let text = format!(
        r#"
[models.script]
provider = "scripted"
file = "script.json"

[models.claude]
provider = "anthropic"
base_url = "{uri}"
model = "{model}"
stream = false
retry = {{ max_retries = 0 }}
pricing = {{ input = 3.0, output = 15.0, cache_read = 0.3, cache_write = 3.75 }}

[tools.note]
description = "Notes a word."
input_schema = {{ type = "object", properties = {{ word = {{ type = "string" }} }}, required = ["word"] }}
command = ["echo", "{{word}}"]

[agents.lead]
model = "script"
system_prompt = "You split the work."
tools = ["note"]
spawnable_agents = ["reader"]

[agents.reader]
model = "claude"
description = "Researches one city."
system_prompt = {system:?}
include_message_history = true
"#,
        uri = server.uri(),
        model = support::MODEL_ID,
        system = fixture["system_prompt"].as_str().unwrap(),
    );
    let config = Config::parse(&text, "cache.toml", dir.path().to_path_buf()).unwrap();
    let supervisor = Supervisor::new(config.catalog().unwrap(), config.limits.clone());
    let start = StartRequest {
        agent: "lead".into(),
        prompt: fixture["shared"][1]["content"].as_str().unwrap().into(),
        ..StartRequest::default()
    };
    let (result, events) = run_request(&supervisor, start, support::GUARD).await;
    assert_eq!(result.state.status, AgentStatus::Completed);

    let mut bodies = bodies(&server).await;
    assert_eq!(bodies.len(), 2);
    bodies.sort_by_key(|(text, _)| !text.contains(&own("oslo")));
    let (oslo, lisbon) = (&bodies[0], &bodies[1]);
    for ((text, body), child) in [(oslo, "oslo"), (lisbon, "lisbon")] {
        // Tools, system, end of the shared prefix, end of the history.
        assert_eq!(breakpoint_ends(text).len(), 4, "{body:#}");
        let tools = body["tools"].as_array().unwrap();
        let last = tools.len() - 1;
        for (i, tool) in tools.iter().enumerate() {
            assert_eq!(tool.get("cache_control").is_some(), i == last, "{body:#}");
        }
        assert_eq!(
            body["system"],
            json!([{"type": "text", "text": fixture["system_prompt"],
                    "cache_control": {"type": "ephemeral"}}])
        );
        // The parent's prompt, its tool call, then one user turn: the
        // call's result, the sub-agent notice, which ends the prefix (the
        // spawn call, still open, is left out), and the child's own prompt,
        // which ends the history.
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3, "{body:#}");
        assert_eq!(
            messages[0],
            json!({"role": "user", "content": fixture["shared"][1]["content"]})
        );
        assert_eq!(messages[1]["role"], "assistant");
        assert_eq!(messages[1]["content"][0]["name"], "note", "{body:#}");
        assert_eq!(messages[2]["content"][0]["type"], "tool_result", "{body:#}");
        let turn = messages[2]["content"].as_array().unwrap();
        let (notice, prompt) = (&turn[turn.len() - 2], &turn[turn.len() - 1]);
        assert!(
            notice["text"].as_str().unwrap().contains("sub-agent"),
            "{body:#}"
        );
        assert_eq!(notice["cache_control"], json!({"type": "ephemeral"}));
        assert_eq!(prompt["text"], own(child).as_str());
        assert_eq!(prompt["cache_control"], json!({"type": "ephemeral"}));
        let in_messages = serde_json::to_string(messages).unwrap();
        assert_eq!(in_messages.matches(BREAKPOINT).count(), 2, "{body:#}");
    }
    // The same bytes up to and including the prefix breakpoint, then not.
    let prefix_end = breakpoint_ends(&oslo.0)[2];
    assert_eq!(prefix_end, breakpoint_ends(&lisbon.0)[2]);
    assert_eq!(oslo.0[..prefix_end], lisbon.0[..prefix_end]);
    // The parent's tool exchange is inside the shared bytes.
    assert!(oslo.0[..prefix_end].contains(r#""content":"two-cities\n""#));
    assert!(oslo.0[prefix_end..].contains(&own("oslo")));
    assert!(lisbon.0[prefix_end..].contains(&own("lisbon")));

    // The children's usage: a cache write, then a read, at the cache prices.
    let mut usages: Vec<Usage> = events
        .iter()
        .filter(|e| e.run_id != result.state.run_id)
        .filter_map(|e| match &e.kind {
            EventKind::ModelResponded { usage, .. } => Some(*usage),
            _ => None,
        })
        .collect();
    usages.sort_by_key(|u| u.cache_read_tokens);
    assert_eq!(usages.len(), 2, "{usages:?}");
    let (write, read) = (&usages[0], &usages[1]);
    assert_eq!(
        (write.cache_write_tokens, read.cache_read_tokens),
        (1800, 1800)
    );
    assert!(close(
        write.cost,
        (21.0 * 3.0 + 14.0 * 15.0 + 1800.0 * 3.75) / 1e6
    ));
    assert!(close(
        read.cost,
        (26.0 * 3.0 + 12.0 * 15.0 + 1800.0 * 0.3) / 1e6
    ));
}
