//! `compact_at` through the binary (issue 37): a long run with big tool
//! results has its old results cut before one step and its old turns
//! summarised by a model call before a later one; every compaction is
//! journaled, the requests that follow are the shorter history, `arbor
//! replay` matches, and a run killed -9 after a compaction resumes on the
//! recorded summary without asking the model for it again.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::{arbor_in, text};

const SUMMARY: &str = "Summary: read three big files, then waited.";

/// Steps 1–3 read a big file each (3000 characters), with some text (800
/// characters, so that once their results are cut they still hold a
/// summary's worth: a quarter of the threshold); step
/// 4 thinks at length (7000 characters, kept verbatim) and waits; step 5
/// waits; step 6 ends. At 2000 tokens (half the window), keeping one step:
/// before step 4 the first two results are cut, which is enough; before
/// step 5 the third is cut, which is not, so the turns before step 4 are
/// summarised.
fn script(summary: Value) -> Value {
    let note = "n".repeat(800);
    let big = json!({"text": note, "toolCalls": [{"name": "big", "input": {}}]});
    json!({"replies": [{
        "agent": "lead",
        "steps": [
            big, big, big,
            {"text": "y".repeat(7000), "toolCalls": [{"name": "slow", "input": {}}]},
            {"toolCalls": [{"name": "slow", "input": {}}]},
            {"text": "Done."}
        ],
        "summary": summary
    }]})
}

fn setup(dir: &Path) {
    std::fs::write(
        dir.join("config.toml"),
        r#"
[models.script]
provider = "scripted"
file = "script.json"

[tools.big]
description = "Reads a big file."
input_schema = { type = "object" }
command = ["sh", "-c", "head -c 3000 /dev/zero | tr '\\000' x"]

[tools.slow]
description = "Waits a while."
input_schema = { type = "object" }
command = ["sh", "-c", "sleep 1; echo waited"]

[agents.lead]
model = "script"
tools = ["big", "slow"]
context_window = 4000
compact_at = 0.5
compact_keep = 1
"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("script.json"),
        script(json!({"text": SUMMARY})).to_string(),
    )
    .unwrap();
}

fn run_args(tree: &str) -> Vec<&str> {
    vec![
        "run",
        "--config",
        "config.toml",
        "--store",
        "s.db",
        "--tree-id",
        tree,
        "--agent",
        "lead",
        "--events",
        "--json",
        "go",
    ]
}

fn events(stderr: &[u8]) -> Vec<Value> {
    text(stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

fn replay_matches(dir: &Path, tree: &str) {
    let out = arbor_in(
        dir,
        &["replay", tree, "--config", "config.toml", "--store", "s.db"],
    );
    assert!(
        out.status.success() && text(&out.stdout).starts_with("match:"),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn a_long_run_cuts_old_tool_results_then_summarises_old_turns_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    setup(dir);
    let out = arbor_in(dir, &run_args("cmp"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["status"], "completed", "{state}");
    let events = events(&out.stderr);
    let compacted = of_type(&events, "historyCompacted");
    assert_eq!(compacted.len(), 2, "{compacted:?}");
    // Before step 4: the results of steps 1 and 2 cut, no summary.
    let (cut, summary) = (compacted[0], compacted[1]);
    assert_eq!(cut["step"], 4, "{cut}");
    assert!(cut["tokens"].as_u64().unwrap() >= 2000, "{cut}");
    let ids: Vec<&str> = cut["cut"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["toolCallId"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{cut}");
    assert_eq!(cut["cut"][0]["toolName"], "big");
    assert_eq!(cut["summarized"], 0);
    assert!(cut.get("summary").is_none(), "{cut}");
    // Before step 5: step 3's result cut, and the 7 messages before step 4
    // summarised by a billed model call.
    assert_eq!(summary["step"], 5, "{summary}");
    assert_eq!(summary["cut"].as_array().unwrap().len(), 1, "{summary}");
    assert_eq!(summary["summarized"], 7, "{summary}");
    assert_eq!(summary["summary"], SUMMARY);
    assert!(summary["usage"]["inputTokens"].as_u64().unwrap() > 0);
    // The requests that followed were the shorter history: the scripted
    // model's usage is its request's size.
    let input = |step: u64| {
        of_type(&events, "modelResponded")
            .into_iter()
            .find(|e| e["step"] == step)
            .map(|e| e["usage"]["inputTokens"].as_u64().unwrap())
            .unwrap()
    };
    assert!(input(4) < input(3), "{} {}", input(4), input(3));
    assert!(input(5) < 2000, "{}", input(5));
    // The history kept: the summary, then steps 4 to 6 verbatim.
    let history = state["messageHistory"].as_array().unwrap();
    assert_eq!(history[0]["role"], "user");
    assert_eq!(history[0]["tags"], json!(["COMPACT_SUMMARY"]));
    assert!(history[0]["content"].as_str().unwrap().ends_with(SUMMARY));
    assert_eq!(
        history[1]["content"][0]["text"].as_str().map(str::len),
        Some(7000)
    );
    assert_eq!(history.len(), 1 + 2 + 2 + 1, "{history:?}");
    let all = serde_json::to_string(&state).unwrap();
    assert!(!all.contains(&"x".repeat(3000)), "no big result is left");
    replay_matches(dir, "cmp");
}

/// Runs `args`, and kills it -9 once `at` is true of an event and `after`
/// ms more have passed; false when it ended first.
fn run_until_killed(dir: &Path, args: &[&str], at: impl Fn(&Value) -> bool, after: u64) -> bool {
    let mut child = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut seen = false;
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        if serde_json::from_str::<Value>(&line).is_ok_and(|e| at(&e)) {
            seen = true;
            break;
        }
    }
    if seen {
        std::thread::sleep(Duration::from_millis(after));
    }
    let _ = child.kill();
    let _ = child.wait();
    seen
}

#[test]
fn a_run_killed_after_a_summary_resumes_on_the_recorded_summary_without_asking_again() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    setup(dir);
    // Killed while step 5's tool runs, its compaction journaled.
    let summarised = |e: &Value| e["type"] == "historyCompacted" && e["step"] == 5;
    assert!(
        run_until_killed(dir, &run_args("kill"), summarised, 500),
        "the summary was made"
    );
    // A summary asked for again would now fail the run.
    std::fs::write(
        dir.join("script.json"),
        script(json!({"error": "the summary was asked for again"})).to_string(),
    )
    .unwrap();
    let out = arbor_in(
        dir,
        &[
            "resume",
            "kill",
            "--config",
            "config.toml",
            "--store",
            "s.db",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["status"], "completed", "{state}");
    let history = state["messageHistory"].as_array().unwrap();
    assert!(history[0]["content"].as_str().unwrap().ends_with(SUMMARY));
    assert_eq!(history.last().unwrap()["content"][0]["text"], "Done.");
    replay_matches(dir, "kill");
}
