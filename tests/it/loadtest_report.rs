//! What `arbor loadtest` reports (issue 34): the endpoint's own requests, their
//! failures by kind, thresholds that fail the run, and a plot sampled by event
//! with readable units and a title.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::support::guarded;
use crate::{arbor_in, text};

/// How long the mock endpoint takes to answer a request it answers.
const ANSWER_DELAY: Duration = Duration::from_millis(120);

/// A Chat Completions endpoint on 127.0.0.1 that answers after
/// [`ANSWER_DELAY`], except request 1 of every 4 (503 at once) and request 3
/// of every 8 (429 at once): failures the agents retry.
struct SlowFlakyEndpoint {
    base_url: String,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SlowFlakyEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SlowFlakyEndpoint {
    async fn start() -> Self {
        let requests = Arc::new(AtomicUsize::new(0));
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(reply))
            .with_state(requests.clone());
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        SlowFlakyEndpoint {
            base_url: format!("http://{addr}/v1"),
            requests,
            task,
        }
    }
}

async fn reply(State(requests): State<Arc<AtomicUsize>>) -> Response {
    let n = requests.fetch_add(1, Ordering::SeqCst);
    let error = |status: StatusCode, kind: &str| {
        (
            status,
            [("content-type", "application/json"), ("retry-after", "0")],
            json!({"error": {"message": "not now", "type": kind, "param": null, "code": null}})
                .to_string(),
        )
            .into_response()
    };
    if n % 4 == 1 {
        return error(StatusCode::SERVICE_UNAVAILABLE, "server_error");
    }
    if n % 8 == 3 {
        return error(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error");
    }
    tokio::time::sleep(ANSWER_DELAY).await;
    axum::Json(json!({
        "id": format!("chatcmpl-{n}"), "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": format!("Report number {n}.")}}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24}
    }))
    .into_response()
}

fn config(dir: &std::path::Path, base_url: &str) -> std::path::PathBuf {
    let path = dir.join("slow.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[models.slow]
provider = "openai"
base_url = "{base_url}"
model = "m"
stream = false
retry = {{ max_retries = 6, base_delay = "1ms" }}

[agents.x]
model = "slow"
"#
        ),
    )
    .unwrap();
    path
}

/// The texts of an SVG file's `<text>` elements.
fn svg_texts(path: &std::path::Path) -> Vec<String> {
    let svg = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    doc.descendants()
        .filter(|n| n.tag_name().name() == "text")
        .map(|n| {
            let text: String = n
                .descendants()
                .filter(|t| t.is_text())
                .filter_map(|t| t.text())
                .collect();
            text.trim().to_owned()
        })
        .collect()
}

/// The value of the table row `name` (`  NAME<padding>  VALUE`).
fn row<'a>(stdout: &'a str, name: &str) -> Option<&'a str> {
    stdout.lines().find_map(|l| {
        let rest = l.strip_prefix("  ")?.strip_prefix(name)?;
        rest.starts_with("  ").then(|| rest.trim())
    })
}

/// Real requests took 14–44 s and the report said 16 µs / 217 µs: it timed
/// every step, the load generator's own planned spawns (answered locally in
/// microseconds) among them, and left failed requests out. Now the latency is
/// the endpoint's answered requests', and each failure is counted by kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_test_reports_the_endpoints_request_latency_and_failures_not_its_own_spawn_replies()
 {
    let server = SlowFlakyEndpoint::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server.base_url);
    let out = guarded(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_arbor"))
            .args(["loadtest", "--model", "slow", "--config"])
            .arg(&config)
            .args(["--fanout", "2", "--depth", "2", "--no-store"])
            .args(["--json", "out.json", "--plot", "out.svg"])
            .current_dir(dir.path())
            .env_remove("RUST_LOG")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "status {:?}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out.json")).unwrap())
            .unwrap();
    assert_eq!(json["agentsFinished"], 7, "{json:#}");

    // 7 answers reached the endpoint (the 3 spawning steps are planned
    // locally): the requests it saw are the answered ones and the failures.
    let requests = server.requests.load(Ordering::SeqCst) as u64;
    let endpoint = &json["endpoint"];
    assert_eq!(endpoint["requests"], requests, "{json:#}");
    assert_eq!(endpoint["answered"], 7, "{json:#}");
    let failed = requests - 7;
    assert!(failed >= 3, "the mock fails some requests: {json:#}");
    assert_eq!(endpoint["failed"], failed, "{json:#}");
    let failures = &endpoint["failures"];
    let by_kind =
        failures["http 503"].as_u64().unwrap_or(0) + failures["http 429"].as_u64().unwrap_or(0);
    assert_eq!(
        by_kind, failed,
        "every failure is counted by kind: {json:#}"
    );
    assert!(failures["http 503"].as_u64().unwrap_or(0) > 0, "{json:#}");
    assert!(failures["http 429"].as_u64().unwrap_or(0) > 0, "{json:#}");

    // The latency is the endpoint's: every answered request took the mock's
    // delay, none the microseconds of a planned spawn.
    let latency = &endpoint["latencyUs"];
    assert_eq!(latency["count"], 7, "{json:#}");
    let floor = ANSWER_DELAY.as_micros() as u64;
    assert!(latency["p50"].as_u64().unwrap() >= floor, "{json:#}");
    assert!(latency["p99"].as_u64().unwrap() >= floor, "{json:#}");

    let rows = row(&stdout, "request p50/p90/p99/max").unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        rows.split(" / ").all(|v| v.ends_with(" ms")),
        "request latencies in ms: {stdout}"
    );
    let failures_row = row(&stdout, "request failures").unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        failures_row.contains("http 503: ") && failures_row.contains("http 429: "),
        "{stdout}"
    );
    let requests_row = row(&stdout, "endpoint requests").unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        requests_row.starts_with(&format!("{requests} (7 answered, {failed} failed")),
        "{stdout}"
    );

    // The plot's distribution is of those requests, in ms (not µs up to
    // 800,000), under a title naming the shape and the model.
    let texts = svg_texts(&dir.path().join("out.svg"));
    assert!(
        texts
            .iter()
            .any(|t| t == "request latency distribution (ms)"),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("arbor loadtest: shape 2,2 (7 agents), model slow")),
        "{texts:?}"
    );
    assert!(!texts.iter().any(|t| t.contains("µs")), "{texts:?}");
}

/// A threshold the run crosses fails it as k6's do (exit 99), and the report
/// shows each threshold met (✓) or crossed (✗) with the figure it read.
#[test]
fn a_crossed_threshold_exits_99_and_the_report_marks_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = arbor_in(
        dir.path(),
        &[
            "loadtest",
            "--fanout",
            "3",
            "--depth",
            "1",
            "--no-store",
            "--threshold",
            "p99<1us",
            "--threshold",
            "error_rate<1%",
            "--threshold",
            "failures<=0",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(99),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let verdicts: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("threshold"))
        .map(str::trim)
        .collect();
    assert_eq!(verdicts.len(), 3, "{stdout}");
    assert!(verdicts[0].starts_with("✗ p99<1us (p99 "), "{stdout}");
    assert_eq!(
        verdicts[1], "✓ error_rate<1% (error_rate 0.00%)",
        "{stdout}"
    );
    assert_eq!(verdicts[2], "✓ failures<=0 (failures 0)", "{stdout}");

    // Met thresholds: the run passes.
    let out = arbor_in(
        dir.path(),
        &[
            "loadtest",
            "--fanout",
            "3",
            "--depth",
            "1",
            "--no-store",
            "--threshold",
            "p99<1h",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("✓ p99<1h"));

    // A threshold that does not parse is a usage error naming what is wrong.
    let out = arbor_in(
        dir.path(),
        &["loadtest", "--threshold", "p98<2s", "--no-store"],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--threshold") && stderr.contains("unknown metric \"p98\""),
        "{stderr}"
    );
}

/// `--plot` on a short run had 2 samples (a 50 ms tick) and showed 1 live
/// agent where the report said 90. The timeline is sampled by event now: its
/// peak is the report's, and the plot says what ran.
#[test]
fn the_plot_of_a_short_run_shows_the_live_peak_the_report_gives() {
    let dir = tempfile::tempdir().unwrap();
    let out = arbor_in(
        dir.path(),
        &[
            "loadtest",
            "--fanout",
            "40",
            "--depth",
            "1",
            "--max-live",
            "30",
            "--no-store",
            "--json",
            "out.json",
            "--plot",
            "out.svg",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out.json")).unwrap())
            .unwrap();
    let live_max = json["liveMax"].as_i64().unwrap();
    assert!(live_max > 1, "{json:#}");
    let timeline = json["timeline"].as_array().unwrap();
    let peak = timeline
        .iter()
        .map(|p| p["live"].as_i64().unwrap())
        .max()
        .unwrap();
    assert_eq!(peak, live_max, "the plotted peak is the report's: {json:#}");
    // Agents ended, for the throughput curve: all 41 by the last point.
    assert_eq!(timeline.last().unwrap()["ended"], 41, "{json:#}");

    let texts = svg_texts(&dir.path().join("out.svg"));
    for caption in [
        "live agents over time",
        "throughput: agents ended per second",
    ] {
        assert!(
            texts.iter().any(|t| t == caption),
            "no {caption:?} in {texts:?}"
        );
    }
    assert!(
        texts.iter().any(
            |t| t.starts_with("arbor loadtest: shape 40 (41 agents), latency 0 µs")
                && t.ends_with("max live 30")
        ),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("spawn→reply latency distribution (")),
        "{texts:?}"
    );
}

/// `--repeat` reported the best run ("best of 3"), which hides how much runs
/// differ: it reports the spread now, and compares medians with a baseline.
#[test]
fn repeated_runs_report_their_spread_not_the_best_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = arbor_in(
        dir.path(),
        &[
            "loadtest",
            "--fanout",
            "3",
            "--depth",
            "1",
            "--repeat",
            "3",
            "--no-store",
            "--baseline",
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("\nover 3 runs:\n"), "{stdout}");
    for name in ["wall time", "per agent", "CPU per agent", "agents/s"] {
        let spread = stdout
            .split("over 3 runs:")
            .nth(1)
            .and_then(|after| row(after, name))
            .unwrap_or_else(|| panic!("no spread of {name:?}: {stdout}"));
        assert!(
            spread.starts_with("median ") && spread.contains("–") && spread.contains(", stdev "),
            "{stdout}"
        );
    }
    assert!(stdout.contains("CPU per agent (median of 3)"), "{stdout}");
    assert!(!stdout.contains("best of"), "{stdout}");
}
