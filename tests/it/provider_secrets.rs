//! API keys: sent to the endpoint, and nowhere else — not in events, errors,
//! final states, `Debug` output, or anything the `arbor` binary prints (debug
//! logs included), even when the server echoes the key back.
//!
//! The in-process tests put the key into the settings as `from_section` would
//! after reading the variable (setting a variable in-process needs `unsafe`,
//! which the workspace forbids); the binary tests set the variable for real.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arbor::Config;
use arbor::actors::{AgentStatus, AgentTemplate, Event, Model, ModelError, RunResult};
use arbor::providers::{ApiKey, HttpModel, ProviderKind, ProviderSettings};
use arbor::supervisor::{StartRequest, Supervisor, TreeLimits};
use arbor_test_support::{catalog, run_request};
use serde_json::json;

use crate::support::{self, FakeOpenAi, Fault, FaultFn, collector, guarded, retry_events};

const VAR: &str = "ARBOR_TEST_SENTINEL_KEY";
const SENTINEL: &str = "sk-SENTINEL-4f1c9e";
const UNSET_VAR: &str = "ARBOR_TEST_SURELY_UNSET_KEY_7d2a";

/// Answers 401 unless the request carries the sentinel as a bearer token.
fn require_sentinel() -> FaultFn {
    Arc::new(|_, authorization: &str| {
        (authorization != format!("Bearer {SENTINEL}")).then(|| Fault {
            status: 401,
            retry_after: None,
            body: json!({"error": {"message": "missing or wrong API key"}}).to_string(),
        })
    })
}

/// Echoes the key it was sent in every error: first a 429 (retried), then 401.
fn echo_the_key() -> FaultFn {
    Arc::new(|n, authorization: &str| {
        let key = authorization
            .strip_prefix("Bearer ")
            .unwrap_or(authorization);
        Some(if n == 0 {
            Fault {
                status: 429,
                retry_after: Some("0"),
                body: json!({"error": {"message": format!("rate limit exceeded for key {key}")}})
                    .to_string(),
            }
        } else {
            Fault {
                status: 401,
                retry_after: None,
                body: json!({"error": {"message": format!("invalid key {key}")}}).to_string(),
            }
        })
    })
}

/// Settings for the fake server with the sentinel key, as read from `VAR`.
fn sentinel_settings(server: &FakeOpenAi) -> ProviderSettings {
    let mut settings = support::settings(ProviderKind::OpenAi, &server.uri);
    settings.stream = false;
    settings.api_key_env = Some(VAR.into());
    settings.api_key = Some(ApiKey::new(SENTINEL.into()));
    settings
}

/// A tree of a lead spawning two workers on `model`.
fn supervisor(model: Arc<dyn Model>) -> Supervisor {
    let mut lead = AgentTemplate::new("lead", "m");
    lead.system_prompt = Arc::from("spawn worker 2");
    lead.spawnable_agents = vec!["worker".into()];
    let mut worker = AgentTemplate::new("worker", "m");
    worker.system_prompt = Arc::from("answer");
    Supervisor::new(
        catalog(vec![("m", model)], vec![lead, worker], Vec::new()),
        TreeLimits::default(),
    )
}

async fn run(supervisor: &Supervisor) -> (RunResult, Vec<Arc<Event>>) {
    let start = StartRequest {
        agent: "lead".into(),
        prompt: "go".into(),
        ..StartRequest::default()
    };
    run_request(supervisor, start, support::GUARD).await
}

/// Fails if the sentinel is in any event or in the final state.
fn assert_no_key_in(result: &RunResult, events: &[Arc<Event>]) {
    assert!(!events.is_empty());
    for event in events {
        let json = serde_json::to_string(&**event).unwrap();
        assert!(
            !json.contains(SENTINEL),
            "the key leaked into an event: {json}"
        );
    }
    let state = serde_json::to_string(&result.state).unwrap();
    assert!(!state.contains(SENTINEL), "the key leaked into the state");
    let value = result.value.to_string();
    assert!(!value.contains(SENTINEL), "the key leaked into the value");
    assert!(!format!("{:?}", result.state).contains(SENTINEL));
}

fn assert_no_key_in_debug(model: &HttpModel) {
    let shown = format!("{:?} {:#?}", model.settings(), model.settings());
    assert!(!shown.contains(SENTINEL), "{shown}");
    assert!(shown.contains("REDACTED"), "{shown}");
    assert!(shown.contains(VAR), "the variable's name may show: {shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_is_sent_as_a_bearer_token_and_appears_nowhere_else() {
    let server = FakeOpenAi::start(Default::default(), Some(require_sentinel())).await;
    let model = Arc::new(HttpModel::new("m", sentinel_settings(&server)).unwrap());
    assert_no_key_in_debug(&model);
    let (result, events) = run(&supervisor(model)).await;

    assert_eq!(
        result.state.status,
        AgentStatus::Completed,
        "{:?}",
        result.state.error_message()
    );
    assert_eq!(server.failures(), 0);
    let sent = server.authorizations();
    assert_eq!(sent.len(), 2 + 2, "two lead steps, one step per worker");
    assert!(sent.iter().all(|a| *a == format!("Bearer {SENTINEL}")));
    assert_no_key_in(&result, &events);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_echoed_back_by_the_server_is_scrubbed_from_errors_events_and_state() {
    // Straight from the model: the retry reason and the error are scrubbed.
    let server = FakeOpenAi::start(Default::default(), Some(echo_the_key())).await;
    let model = HttpModel::new("m", sentinel_settings(&server)).unwrap();
    let (sink, deltas) = collector();
    let error = model
        .complete(support::request(false), sink)
        .await
        .expect_err("the key is refused");
    assert!(
        matches!(&error, ModelError::Rejected { status: 401, .. }),
        "{error:?}"
    );
    let shown = format!("{error} {error:?}");
    assert!(!shown.contains(SENTINEL), "{shown}");
    assert!(shown.contains("invalid key [REDACTED]"), "{shown}");
    let retries = support::retries(&deltas);
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert!(!retries[0].2.contains(SENTINEL), "{retries:?}");
    assert!(retries[0].2.contains("[REDACTED]"), "{retries:?}");
    assert_no_key_in_debug(&model);

    // Through a tree: the root fails on the refusal, nothing shows the key.
    let server = FakeOpenAi::start(Default::default(), Some(echo_the_key())).await;
    let model = Arc::new(HttpModel::new("m", sentinel_settings(&server)).unwrap());
    let (result, events) = run(&supervisor(model.clone())).await;
    assert_eq!(result.state.status, AgentStatus::Failed);
    let error = result.state.error_message().unwrap_or_default();
    assert!(error.contains("401"), "{error}");
    assert!(error.contains("[REDACTED]"), "{error}");
    let retrying = retry_events(&events);
    assert_eq!(retrying.len(), 1, "{retrying:?}");
    assert!(retrying[0].3.contains("[REDACTED]"), "{retrying:?}");
    assert_no_key_in(&result, &events);
    assert_no_key_in_debug(&model);
    // The key was really sent (and echoed), so the checks above mean something.
    let sent = server.authorizations();
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(|a| *a == format!("Bearer {SENTINEL}")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_variable_is_a_clear_error_naming_it() {
    let server = FakeOpenAi::start(Default::default(), None).await;
    let text = format!(
        r#"
[models.m]
provider = "openai"
base_url = "{}"
model = "test"
api_key_env = "{UNSET_VAR}"

[agents.lead]
model = "m"
"#,
        server.base_url
    );
    let config = Config::parse(&text, "missing.toml", PathBuf::new()).expect("valid config");
    let supervisor = Supervisor::new(config.catalog().expect("catalog"), config.limits.clone());
    let (result, events) = run(&supervisor).await;
    assert_eq!(result.state.status, AgentStatus::Failed);
    let error = result.state.error_message().unwrap_or_default();
    assert!(error.contains(UNSET_VAR), "{error}");
    assert!(error.contains("not set"), "{error}");
    assert!(!events.is_empty());
    assert_eq!(server.requests(), 0, "nothing is sent without a key");
}

// ---- the binary ----

/// A config for the binary: one agent on the fake server, key from `VAR`.
fn write_config(dir: &Path, base_url: &str, key_var: &str) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[models.m]
provider = "openai"
base_url = "{base_url}"
model = "test"
stream = false
api_key_env = "{key_var}"
retry = {{ base_delay = "1ms", max_retries = 2 }}

[agents.solo]
model = "m"
system_prompt = "answer"
max_steps = 2
"#
        ),
    )
    .unwrap();
    path
}

/// Runs `arbor ARGS` with the sentinel in `VAR` and debug logging; returns
/// the exit code and stdout + stderr.
async fn arbor(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(args)
        .current_dir(dir)
        .env(VAR, SENTINEL)
        .env_remove(UNSET_VAR)
        .env("RUST_LOG", "debug")
        .env_remove("RUST_LOG_STYLE")
        .kill_on_drop(true)
        .output();
    let out = guarded(out).await.unwrap();
    (
        out.status.code(),
        crate::text(&out.stdout),
        crate::text(&out.stderr),
    )
}

fn assert_no_key_in_output(stdout: &str, stderr: &str) {
    assert!(
        !stdout.contains(SENTINEL),
        "the key leaked to stdout:\n{stdout}"
    );
    assert!(
        !stderr.contains(SENTINEL),
        "the key leaked to stderr:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_sends_the_key_from_the_variable_and_never_prints_it() {
    let server = FakeOpenAi::start(Default::default(), Some(require_sentinel())).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &server.base_url, VAR);
    let config = config.to_str().unwrap();

    let (code, stdout, stderr) =
        arbor(dir.path(), &["run", "--config", config, "--json", "hi"]).await;
    assert_eq!(code, Some(0), "{stderr}");
    let state: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(state["status"], "completed");
    assert!(
        stderr.contains("DEBUG"),
        "debug logging is on, so the check below covers it:\n{stderr}"
    );
    assert_no_key_in_output(&stdout, &stderr);
    assert_eq!(server.authorizations(), vec![format!("Bearer {SENTINEL}")]);

    let (code, stdout, stderr) = arbor(dir.path(), &["models", "--config", config]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains(VAR), "{stdout}");
    assert_no_key_in_output(&stdout, &stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_never_prints_a_key_the_server_echoes() {
    let server = FakeOpenAi::start(Default::default(), Some(echo_the_key())).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &server.base_url, VAR);
    let config = config.to_str().unwrap();

    for args in [
        vec!["run", "--config", config, "--json", "hi"],
        vec!["run", "--config", config, "hi"],
    ] {
        let before = server.requests();
        let (code, stdout, stderr) = arbor(dir.path(), &args).await;
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("DEBUG"), "{stderr}");
        assert_no_key_in_output(&stdout, &stderr);
        if args.contains(&"--json") {
            let state: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            assert_eq!(state["status"], "failed");
            let error = state.to_string();
            assert!(error.contains("[REDACTED]"), "{error}");
        } else {
            assert!(stderr.contains("401"), "{stderr}");
        }
        // The key was sent (and echoed back) on every request of this run.
        let sent = &server.authorizations()[before..];
        assert!(!sent.is_empty());
        assert!(
            sent.iter().all(|a| *a == format!("Bearer {SENTINEL}")),
            "{sent:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_names_a_missing_key_variable() {
    let server = FakeOpenAi::start(Default::default(), None).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &server.base_url, UNSET_VAR);
    let config = config.to_str().unwrap();
    let (code, stdout, stderr) = arbor(dir.path(), &["run", "--config", config, "hi"]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(UNSET_VAR), "{stderr}");
    assert!(stderr.contains("not set"), "{stderr}");
    assert_no_key_in_output(&stdout, &stderr);
    assert_eq!(server.requests(), 0);
}
