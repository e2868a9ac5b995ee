//! HTTP providers against a misbehaving server (wiremock, or a small axum
//! server for stalled streams): rate limits, server errors, refusals, cut and
//! stalled streams, malformed replies. Every case runs for both wire formats.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arbor::actors::message::Message;
use arbor::actors::{AgentStatus, AgentTemplate, Delta, Model, ModelError};
use arbor::providers::{HttpModel, ProviderKind, ProviderSettings};
use arbor::supervisor::{StartRequest, Supervisor, TreeLimits};
use arbor_test_support::{catalog, echo, run_request};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, MODEL_ID, collector, count, request, retries, retry_events, sse, wire};

/// Runs each case once per wire format: `provider_faults::openai::CASE` and
/// `provider_faults::anthropic::CASE`.
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
    rate_limit_honours_retry_after_zero,
    rate_limit_honours_retry_after_ms,
    server_errors_are_retried_with_increasing_attempts,
    unauthorized_is_rejected_without_retry,
    bad_request_and_not_found_are_not_retried,
    a_stream_cut_mid_tool_call_is_retried_whole,
    a_stream_cut_mid_tool_call_leaves_one_assistant_message_in_a_tree,
    a_request_slower_than_the_request_timeout_fails_naming_it,
    a_stream_stalled_beyond_the_idle_timeout_fails_naming_it,
    a_malformed_stream_chunk_is_retried_then_reported_as_malformed,
    a_non_json_reply_is_malformed,
);

async fn mount(server: &MockServer, kind: ProviderKind, response: ResponseTemplate, times: u64) {
    Mock::given(method("POST"))
        .and(path(support::path(kind)))
        .respond_with(response)
        .up_to_n_times(times)
        .mount(server)
        .await;
}

async fn received(server: &MockServer) -> Vec<wiremock::Request> {
    server.received_requests().await.expect("recording is on")
}

fn model(settings: ProviderSettings) -> HttpModel {
    HttpModel::new("m", settings).expect("client builds")
}

async fn rate_limit_honours(kind: ProviderKind, header: &str, value: &str, expected_ms: u64) {
    let server = MockServer::start().await;
    mount(
        &server,
        kind,
        ResponseTemplate::new(429)
            .insert_header(header, value)
            .set_body_json(wire::error_json(kind, "Rate limit reached")),
        1,
    )
    .await;
    mount(
        &server,
        kind,
        sse(wire::text_stream(kind, "hello")),
        u64::MAX,
    )
    .await;
    let mut settings = support::settings(kind, &server.uri());
    // Backoff alone would wait at least a second: only the header gives a short delay.
    settings.retry.base_delay = Duration::from_secs(2);
    settings.retry.max_delay = Duration::from_secs(30);
    let (sink, deltas) = collector();
    let response = model(settings)
        .complete(request(false), sink)
        .await
        .expect("the retry succeeds");
    assert_eq!(response.message.text(), "hello");
    let retries = retries(&deltas);
    assert_eq!(retries.len(), 1, "{retries:?}");
    let (attempt, delay_ms, reason) = &retries[0];
    assert_eq!((*attempt, *delay_ms), (1, expected_ms), "{reason}");
    assert!(reason.contains("Rate limit reached"), "{reason}");
    assert_eq!(received(&server).await.len(), 2);
}

async fn rate_limit_honours_retry_after_zero(kind: ProviderKind) {
    rate_limit_honours(kind, "retry-after", "0", 0).await;
}

async fn rate_limit_honours_retry_after_ms(kind: ProviderKind) {
    rate_limit_honours(kind, "retry-after-ms", "5", 5).await;
}

async fn server_errors_are_retried_with_increasing_attempts(kind: ProviderKind) {
    let server = MockServer::start().await;
    mount(
        &server,
        kind,
        ResponseTemplate::new(500).set_body_json(wire::error_json(kind, "internal oops")),
        2,
    )
    .await;
    mount(
        &server,
        kind,
        sse(wire::text_stream(kind, "fine")),
        u64::MAX,
    )
    .await;
    let (sink, deltas) = collector();
    let response = model(support::settings(kind, &server.uri()))
        .complete(request(false), sink)
        .await
        .expect("the third attempt succeeds");
    assert_eq!(response.message.text(), "fine");
    let retries = retries(&deltas);
    let attempts: Vec<u32> = retries.iter().map(|r| r.0).collect();
    assert_eq!(attempts, vec![1, 2], "{retries:?}");
    for (attempt, delay_ms, reason) in &retries {
        // base 1 ms, doubled per attempt, jittered down: never above the cap of the attempt.
        assert!(*delay_ms <= 1 << (attempt - 1), "{retries:?}");
        assert!(reason.contains("internal oops"), "{reason}");
    }
    assert_eq!(received(&server).await.len(), 3);
}

async fn rejected(kind: ProviderKind, status: u16, api_message: &str) {
    let server = MockServer::start().await;
    mount(
        &server,
        kind,
        ResponseTemplate::new(status).set_body_json(wire::error_json(kind, api_message)),
        u64::MAX,
    )
    .await;
    let (sink, deltas) = collector();
    let error = model(support::settings(kind, &server.uri()))
        .complete(request(false), sink)
        .await
        .expect_err("the request is refused");
    assert_eq!(
        received(&server).await.len(),
        1,
        "{status} must not be retried"
    );
    assert!(retries(&deltas).is_empty());
    assert!(!error.is_retryable());
    match &error {
        ModelError::Rejected {
            model,
            status: got,
            message,
        } => {
            assert_eq!(*got, status);
            assert!(
                model == &format!("m ({} {MODEL_ID})", kind.name()),
                "{model}"
            );
            assert!(message.contains(api_message), "{message}");
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    let shown = error.to_string();
    for part in [
        "model m",
        MODEL_ID,
        kind.name(),
        &status.to_string(),
        api_message,
    ] {
        assert!(shown.contains(part), "{part:?} not in {shown:?}");
    }
}

async fn unauthorized_is_rejected_without_retry(kind: ProviderKind) {
    rejected(kind, 401, "Incorrect API key provided").await;
}

async fn bad_request_and_not_found_are_not_retried(kind: ProviderKind) {
    rejected(kind, 400, "messages: field required").await;
    rejected(kind, 404, "The model test-model does not exist").await;
}

async fn a_stream_cut_mid_tool_call_is_retried_whole(kind: ProviderKind) {
    let server = MockServer::start().await;
    let chunks = ["{\"te", "xt\": ", "\"hi\"}"];
    mount(
        &server,
        kind,
        sse(wire::tool_stream_cut(kind, "call_1", "echo", &chunks[..2])),
        1,
    )
    .await;
    mount(
        &server,
        kind,
        sse(wire::tool_stream(kind, "call_1", "echo", &chunks)),
        u64::MAX,
    )
    .await;
    let (sink, deltas) = collector();
    let response = model(support::settings(kind, &server.uri()))
        .complete(request(true), sink)
        .await
        .expect("the second attempt succeeds");
    let calls: Vec<_> = response.message.tool_calls().cloned().collect();
    assert_eq!(calls.len(), 1, "{:?}", response.message);
    assert_eq!(calls[0].tool_name, "echo");
    assert_eq!(calls[0].tool_call_id, "call_1");
    assert_eq!(calls[0].input, json!({"text": "hi"}));
    let retries = retries(&deltas);
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert_eq!(retries[0].0, 1);
    assert!(retries[0].2.contains("stream"), "{retries:?}");
    // The cut attempt streamed part of the arguments before the retry was announced.
    let deltas = deltas.lock().unwrap().clone();
    let retry_at = deltas
        .iter()
        .position(|d| matches!(d, Delta::Retry { .. }))
        .unwrap();
    let args = |ds: &[Delta]| -> String {
        ds.iter()
            .filter_map(|d| match d {
                Delta::ToolCallArgs { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(args(&deltas[..retry_at]), "{\"text\": ");
    assert_eq!(args(&deltas[retry_at..]), "{\"text\": \"hi\"}");
    assert_eq!(received(&server).await.len(), 2);
}

/// The same fault inside a one-agent tree: the agent calls `echo` (the first
/// stream is cut), then answers. Its history holds the step's reply once.
async fn a_stream_cut_mid_tool_call_leaves_one_assistant_message_in_a_tree(kind: ProviderKind) {
    let server = MockServer::start().await;
    let chunks = ["{\"te", "xt\": ", "\"hi\"}"];
    mount(
        &server,
        kind,
        sse(wire::tool_stream_cut(kind, "call_1", "echo", &chunks[..2])),
        1,
    )
    .await;
    mount(
        &server,
        kind,
        sse(wire::tool_stream(kind, "call_1", "echo", &chunks)),
        1,
    )
    .await;
    mount(
        &server,
        kind,
        sse(wire::text_stream(kind, "all done")),
        u64::MAX,
    )
    .await;
    let model: Arc<dyn Model> = Arc::new(model(support::settings(kind, &server.uri())));
    let mut template = AgentTemplate::new("solo", "m");
    template.tools.push("echo".into());
    template.max_steps = 4;
    let supervisor = Supervisor::new(
        catalog(vec![("m", model)], vec![template], vec![echo()]),
        TreeLimits::default(),
    );
    let start = StartRequest {
        agent: "solo".into(),
        prompt: "echo hi, then say all done".into(),
        ..StartRequest::default()
    };
    let (result, events) = run_request(&supervisor, start, support::GUARD).await;
    let state = &result.state;
    assert_eq!(
        state.status,
        AgentStatus::Completed,
        "{:?}",
        state.error_message()
    );

    let history: Vec<&Message> = state.message_history.iter().map(|m| &**m).collect();
    let roles: Vec<&str> = history.iter().map(|m| m.role()).collect();
    assert_eq!(
        roles,
        vec!["user", "assistant", "tool", "assistant"],
        "{history:#?}"
    );
    let calls: Vec<_> = history.iter().flat_map(|m| m.tool_calls()).collect();
    assert_eq!(calls.len(), 1, "{history:#?}");
    assert_eq!(calls[0].input, json!({"text": "hi"}));
    let result_value = serde_json::to_value(history[2]).unwrap();
    assert_eq!(
        result_value["content"][0]["value"],
        json!({"echo": {"text": "hi"}})
    );
    assert_eq!(history[3].text(), "all done");

    let retrying = retry_events(&events);
    assert_eq!(retrying.len(), 1, "{retrying:?}");
    assert_eq!((retrying[0].0, retrying[0].1), (1, 1), "{retrying:?}");
    assert_eq!(count(&events, "modelResponded"), 2);
    assert_eq!(count(&events, "toolCalled"), 1);

    // The second step's request carries the step-1 reply once.
    let requests = received(&server).await;
    assert_eq!(requests.len(), 3);
    let body: Value = serde_json::from_slice(&requests[2].body).unwrap();
    let assistants = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .count();
    assert_eq!(assistants, 1, "{body:#}");
}

async fn a_request_slower_than_the_request_timeout_fails_naming_it(kind: ProviderKind) {
    let server = MockServer::start().await;
    mount(
        &server,
        kind,
        sse(wire::text_stream(kind, "too late")).set_delay(Duration::from_secs(120)),
        u64::MAX,
    )
    .await;
    let mut settings = support::settings(kind, &server.uri());
    settings.timeouts.request = Duration::from_millis(200);
    settings.retry.max_retries = 1;
    let (sink, deltas) = collector();
    let error = model(settings)
        .complete(request(false), sink)
        .await
        .expect_err("no reply in time");
    let retries = retries(&deltas);
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert!(
        retries[0].2.contains("within 200ms"),
        "the reason names the timeout: {retries:?}"
    );
    match &error {
        ModelError::Transient { message, .. } => {
            assert!(message.contains("within 200ms"), "{message}")
        }
        other => panic!("expected Transient, got {other:?}"),
    }
    assert_eq!(received(&server).await.len(), 2);
}

/// A server that sends the headers and one SSE comment, then nothing.
async fn stalling_server(kind: ProviderKind) -> (String, tokio::task::JoinHandle<()>) {
    use axum::body::{Body, Bytes};
    use futures::StreamExt;

    async fn stall() -> axum::response::Response {
        let first = futures::stream::once(async {
            Ok::<_, std::io::Error>(Bytes::from_static(b": keep-alive\n\n"))
        });
        let body = Body::from_stream(first.chain(futures::stream::pending()));
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(body)
            .unwrap()
    }
    let app = axum::Router::new().route(support::path(kind), axum::routing::post(stall));
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (uri, task)
}

async fn a_stream_stalled_beyond_the_idle_timeout_fails_naming_it(kind: ProviderKind) {
    let (uri, server) = stalling_server(kind).await;
    let mut settings = support::settings(kind, &uri);
    settings.timeouts.idle = Duration::from_millis(200);
    settings.retry.max_retries = 1;
    let (sink, deltas) = collector();
    let error = model(settings)
        .complete(request(false), sink)
        .await
        .expect_err("the stream stalls");
    server.abort();
    let retries = retries(&deltas);
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert!(
        retries[0].2.contains("idle for 200ms"),
        "the reason names the timeout: {retries:?}"
    );
    match &error {
        ModelError::Transient { message, .. } => {
            assert!(message.contains("idle for 200ms"), "{message}")
        }
        other => panic!("expected Transient, got {other:?}"),
    }
}

async fn a_malformed_stream_chunk_is_retried_then_reported_as_malformed(kind: ProviderKind) {
    // Retried, then the good reply.
    let server = MockServer::start().await;
    mount(&server, kind, sse(wire::malformed_stream(kind)), 1).await;
    mount(
        &server,
        kind,
        sse(wire::text_stream(kind, "better")),
        u64::MAX,
    )
    .await;
    let (sink, deltas) = collector();
    let response = model(support::settings(kind, &server.uri()))
        .complete(request(false), sink)
        .await
        .expect("the second attempt succeeds");
    assert_eq!(response.message.text(), "better");
    let first = retries(&deltas);
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(
        first[0].2.to_lowercase().contains("json"),
        "the reason says the chunk is malformed: {first:?}"
    );

    // With no retries left, the error is Malformed.
    let server = MockServer::start().await;
    mount(&server, kind, sse(wire::malformed_stream(kind)), u64::MAX).await;
    let mut settings = support::settings(kind, &server.uri());
    settings.retry.max_retries = 0;
    let (sink, deltas) = collector();
    let error = model(settings)
        .complete(request(false), sink)
        .await
        .expect_err("malformed");
    assert!(
        matches!(&error, ModelError::Malformed { model, .. } if model.contains(MODEL_ID)),
        "{error:?}"
    );
    assert!(retries(&deltas).is_empty());
    assert_eq!(received(&server).await.len(), 1);
}

async fn a_non_json_reply_is_malformed(kind: ProviderKind) {
    for body in [
        "<html><body>502 Bad Gateway</body></html>".to_owned(),
        json!({"unexpected": "shape"}).to_string(),
    ] {
        let server = MockServer::start().await;
        mount(
            &server,
            kind,
            ResponseTemplate::new(200)
                .insert_header("content-type", "application/json")
                .set_body_string(body.clone()),
            u64::MAX,
        )
        .await;
        let mut settings = support::settings(kind, &server.uri());
        settings.stream = false;
        settings.retry.max_retries = 0;
        let (sink, _) = collector();
        let error = model(settings)
            .complete(request(false), sink)
            .await
            .expect_err("malformed");
        assert!(
            matches!(&error, ModelError::Malformed { model, .. } if model.contains(MODEL_ID)),
            "{body}: {error:?}"
        );
        assert!(error.is_retryable());
        assert_eq!(received(&server).await.len(), 1);
    }

    // A good non-streamed reply after one that is not JSON: retried once.
    let server = MockServer::start().await;
    mount(
        &server,
        kind,
        ResponseTemplate::new(200).set_body_string("not json at all"),
        1,
    )
    .await;
    mount(
        &server,
        kind,
        ResponseTemplate::new(200).set_body_json(wire::text_json(kind, "parsed")),
        u64::MAX,
    )
    .await;
    let mut settings = support::settings(kind, &server.uri());
    settings.stream = false;
    let (sink, deltas) = collector();
    let response = model(settings)
        .complete(request(false), sink)
        .await
        .expect("the second attempt succeeds");
    assert_eq!(response.message.text(), "parsed");
    let retries = retries(&deltas);
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert!(retries[0].2.contains("not JSON"), "{retries:?}");
}
