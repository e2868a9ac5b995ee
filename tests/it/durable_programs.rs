//! Durable programs through the binary (issue 37): a multi-yield
//! `handleSteps` program killed -9 at five points and resumed each time
//! completes with no tool run twice (its side effects counted in a file),
//! draws the same random numbers and clock readings on every resume, and
//! `arbor replay` matches; a program whose file was edited is refused on
//! resume naming the first differing yield, unless `--restart-programs`
//! starts it over.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::{arbor_in, text};

/// Five tools and a spawn, a model step between them, and what it drew
/// (`Math.random`, `Date.now`) in its tools' inputs and its output.
const PROGRAM: &str = r#"
const definition = {
  id: 'durable',
  model: 'x',
  toolNames: ['mark', 'spawn_agents', 'set_output'],
  spawnableAgents: ['helper'],
  handleSteps: function* ({ prompt }) {
    const r = Math.random()
    const one = yield { toolName: 'mark', input: { n: 'one', r: String(r) } }
    const at = Date.now()
    const two = yield { toolName: 'mark', input: { n: 'two', at: String(at) } }
    const step = yield 'STEP'
    const spawned = yield { toolName: 'spawn_agents', input: { agents: [{ agent_type: 'helper', prompt: 'help' }] } }
    const five = yield { toolName: 'mark', input: { n: 'five', r: String(Math.random()) } }
    yield {
      toolName: 'set_output',
      input: {
        r, at, again: Math.random(), when: new Date().getTime(),
        one: one.toolResult, two: two.toolResult, five: five.toolResult,
        spawned: spawned.toolResult, stepEnded: step.stepsComplete,
      },
    }
  },
}
export default definition
"#;

/// The scripted replies: the program's one model step calls `mark` too,
/// and the helper it spawns marks once.
fn script() -> Value {
    json!({"replies": [
        // By step: steps 1 and 2 are the program's tool calls, which never
        // ask the model.
        {"agent": "durable", "steps": [
            {"text": "never sent"},
            {"text": "never sent"},
            {"text": "Marking.", "toolCalls": [{"name": "mark", "input": {"n": "three"}}]},
        ]},
        {"agent": "helper", "steps": [
            {"toolCalls": [{"name": "mark", "input": {"n": "helper"}}]},
            {"text": "Helped."}
        ]}
    ]})
}

/// A program agent, the helper it spawns, and `mark`: it sleeps, then
/// writes `end-N` to `marks.log` (a run killed mid-call leaves no mark:
/// its process dies with Arbor).
fn setup(dir: &Path) {
    std::fs::create_dir_all(dir.join("agents")).unwrap();
    std::fs::write(dir.join("agents/durable.js"), PROGRAM).unwrap();
    let log = dir.join("marks.log").display().to_string();
    let mark = format!("echo start-$0 >> {log}; sleep 0.6; echo end-$0 >> {log}; echo marked $0");
    std::fs::write(
        dir.join("config.toml"),
        format!(
            r#"
[models.script]
provider = "scripted"
file = "script.json"

[tools.mark]
description = "Marks a name in the log."
input_schema = {{ type = "object", properties = {{ n = {{ type = "string" }} }}, required = ["n"] }}
command = ["sh", "-c", {mark:?}, "{{n}}"]

[agents.durable]
model = "script"
program = "agents/durable.js"
tools = ["mark"]
spawnable_agents = ["helper"]
output_mode = "structured_output"

[agents.helper]
model = "script"
tools = ["mark"]
"#
        ),
    )
    .unwrap();
    std::fs::write(dir.join("script.json"), script().to_string()).unwrap();
}

const RUN: [&str; 11] = [
    "run",
    "--config",
    "config.toml",
    "--store",
    "s.db",
    "--tree-id",
    "dur",
    "--agent",
    "durable",
    "--events",
    "go",
];

const RESUME: [&str; 7] = [
    "resume",
    "dur",
    "--config",
    "config.toml",
    "--store",
    "s.db",
    "--events",
];

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

/// An event of the root run.
fn root(e: &Value) -> bool {
    e["runId"] == "dur/0"
}

/// How many times each name's `mark` started and ended.
fn marks(dir: &Path, name: &str) -> (usize, usize) {
    let log = std::fs::read_to_string(dir.join("marks.log")).unwrap_or_default();
    let count = |what: &str| {
        log.lines()
            .filter(|l| *l == format!("{what}-{name}"))
            .count()
    };
    (count("start"), count("end"))
}

fn final_state(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("no final state: {}{}", text(&out.stdout), text(&out.stderr)))
}

#[test]
fn a_program_killed_at_five_points_resumes_without_running_a_tool_twice_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    setup(dir);
    // 1: between yields: its first tool's result journaled, the second's
    // tool not yet done.
    let first_done = |e: &Value| root(e) && e["type"] == "toolCalled" && e["step"] == 1;
    assert!(run_until_killed(dir, &RUN, first_done, 100), "yield 1 ran");
    // 2: in the middle of its second tool call.
    let second = |e: &Value| root(e) && e["type"] == "stepStarted" && e["step"] == 2;
    assert!(run_until_killed(dir, &RESUME, second, 300), "yield 2 began");
    // 3: in the middle of its model step, the reply in, its tool running.
    let stepping = |e: &Value| root(e) && e["type"] == "modelResponded" && e["step"] == 3;
    assert!(
        run_until_killed(dir, &RESUME, stepping, 300),
        "the STEP began"
    );
    // 4: after the spawn, while the helper's tool runs.
    let spawned = |e: &Value| root(e) && e["type"] == "childSpawned";
    assert!(
        run_until_killed(dir, &RESUME, spawned, 300),
        "the helper spawned"
    );
    // 5: before its end, in its last tool call.
    let last = |e: &Value| root(e) && e["type"] == "stepStarted" && e["step"] == 5;
    assert!(run_until_killed(dir, &RESUME, last, 300), "yield 5 began");
    let resume_json: Vec<&str> = RESUME
        .iter()
        .copied()
        .filter(|a| *a != "--events")
        .chain(["--json"])
        .collect();
    let out = arbor_in(dir, &resume_json);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state = final_state(&out);
    assert_eq!(state["status"], "completed", "{state}");
    // Every tool that ended ended once: a call cut short left no mark and
    // ran again; one whose result was journaled was served it.
    for name in ["one", "two", "three", "helper", "five"] {
        assert_eq!(marks(dir, name).1, 1, "{name}: {:?}", marks(dir, name));
    }
    // The first tool, journaled before the first kill, never ran again;
    // the ones cut short ran again.
    assert_eq!(marks(dir, "one").0, 1, "the first tool started once");
    for cut in ["two", "three", "helper", "five"] {
        assert!(marks(dir, cut).0 >= 2, "{cut} was cut short");
    }
    let output = &state["output"];
    assert!(output["one"].to_string().contains("marked one"), "{output}");
    assert!(
        output["five"].to_string().contains("marked five"),
        "{output}"
    );
    assert!(
        output["spawned"].to_string().contains("Helped."),
        "{output}"
    );
    assert_eq!(output["stepEnded"], false, "{output}");
    // What it drew is what it drew the first time: the random number and
    // the clock reading in the journaled inputs of yields 1 and 2.
    let mark_input = |n: &str| {
        state["messageHistory"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .find(|p| p["toolName"] == "mark" && p["input"]["n"] == n)
            .map(|p| p["input"].clone())
            .unwrap_or_else(|| panic!("no mark {n} in {state}"))
    };
    assert_eq!(mark_input("one")["r"], output["r"].to_string());
    assert_eq!(mark_input("two")["at"], output["at"].to_string());
    // The replay runs the program again on the record and gets the same
    // final states (the same draws included).
    let replay = arbor_in(
        dir,
        &[
            "replay",
            "dur",
            "--config",
            "config.toml",
            "--store",
            "s.db",
        ],
    );
    assert!(
        replay.status.success() && text(&replay.stdout).contains("match:"),
        "{}{}",
        text(&replay.stdout),
        text(&replay.stderr)
    );
}

#[test]
fn an_edited_program_is_refused_on_resume_naming_the_first_differing_yield_unless_restarted() {
    for restart in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        setup(dir);
        let second = |e: &Value| root(e) && e["type"] == "stepStarted" && e["step"] == 2;
        assert!(run_until_killed(dir, &RUN, second, 300), "yield 2 began");
        let edited = PROGRAM.replace("n: 'one'", "n: 'uno'");
        std::fs::write(dir.join("agents/durable.js"), edited).unwrap();
        let mut args = vec![
            "resume",
            "dur",
            "--config",
            "config.toml",
            "--store",
            "s.db",
            "--json",
        ];
        if restart {
            args.push("--restart-programs");
        }
        let out = arbor_in(dir, &args);
        let state = final_state(&out);
        if restart {
            // Started over: the edited program ran from its start, live.
            assert_eq!(state["status"], "completed", "{state}");
            assert_eq!(marks(dir, "uno"), (1, 1));
            assert_eq!(marks(dir, "one"), (1, 1));
            continue;
        }
        assert_eq!(state["status"], "failed", "{state}");
        assert_eq!(state["errorKind"], "program", "{state}");
        let error = state["output"]["errorMessage"].as_str().unwrap_or_default();
        assert!(
            error.contains("differs from its record at yield 1")
                && error.contains(r#""n":"one""#)
                && error.contains(r#""n":"uno""#)
                && error.contains("--restart-programs"),
            "{error}"
        );
        // Nothing of the edited program ran.
        assert_eq!(marks(dir, "uno"), (0, 0));
    }
}
