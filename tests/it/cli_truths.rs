//! Issue 34, item 10: the CLI says what is true. One test per symptom a
//! newcomer met following the README, each through the real binary.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Lines, wait_exit};
use crate::{arbor_in, text};

/// The most any one wait may take before the test fails (never a pass).
const GUARD: Duration = Duration::from_secs(60);

/// A lead that answers from the script, a `pause` budget of steps, an `echo`
/// command tool, a worker it may spawn, and a store in the scene's dir.
const CONFIG: &str = r#"
[run]
agent = "lead"

[store]
path = "arbor.db"

[limits]
max_steps = 5
on_budget = "pause"

[models.script]
provider = "scripted"
file = "script.json"

[tools.echo]
description = "Echoes its word."
input_schema = { type = "object", properties = { word = { type = "string" } }, required = ["word"] }
command = ["echo", "{word}"]

[agents.lead]
model = "script"
tools = ["echo"]
spawnable_agents = ["worker"]

[agents.worker]
model = "script"
tools = ["echo"]
"#;

/// A temp dir with `config` as config.toml and the lead's `steps` as the script.
fn scene(config: &str, steps: Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let script = json!({"replies": [{"agent": "lead", "steps": steps}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    dir
}

/// A lead that waits a minute on its first step (a tree to stop or cancel).
fn slow() -> Value {
    json!([{"text": "too late", "delayMs": 60_000}])
}

/// `arbor args…` started in `dir`, stdin closed, stdout and stderr piped.
fn spawn(dir: &Path, args: &[&str]) -> (Child, Lines) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("ARBOR_SERVER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = Lines::read(child.stderr.take().unwrap());
    (child, stderr)
}

/// The tree id of `arbor run`'s first line (`tree T (…)`), once it is out.
fn tree_line(stderr: &mut Lines) -> String {
    let line = stderr
        .wait_for(GUARD, |l| l.starts_with("tree "))
        .expect("arbor run never named its tree");
    line.split_whitespace().nth(1).unwrap().to_owned()
}

/// `arbor args…` in `dir`, with $ARBOR_SERVER unset.
fn arbor(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("ARBOR_SERVER")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The status `arbor runs --json` lists the tree with.
fn status(dir: &Path, tree: &str) -> String {
    let out = arbor_in(dir, &["runs", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let trees: Value = serde_json::from_slice(&out.stdout).unwrap();
    trees
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["treeId"] == tree)
        .map(|t| t["status"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("tree {tree} not listed: {trees}"))
}

fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
}

#[test]
fn a_tree_stopped_with_ctrl_c_is_cancelled_not_left_for_serve_to_adopt() {
    let dir = scene(CONFIG, slow());
    let (mut run, mut stderr) = spawn(dir.path(), &["run", "go"]);
    let tree = tree_line(&mut stderr);
    stderr
        .wait_for(GUARD, |l| l.contains("▸ lead"))
        .expect("the root never started");
    signal(&run, nix::sys::signal::Signal::SIGINT);
    let code = wait_exit(&mut run, GUARD).code();
    let said = stderr.rest();
    assert_eq!(code, Some(130), "{said}");
    assert!(
        said.contains(&format!("stopped: tree {tree} cancelled")),
        "{said}"
    );
    // Ended, so no `arbor serve` on this store adopts it (it claims only
    // trees stored as running whose process is gone).
    assert_eq!(status(dir.path(), &tree), "cancelled");
    let resume = arbor_in(dir.path(), &["resume", &tree]);
    assert_eq!(resume.status.code(), Some(1));
    assert!(
        text(&resume.stderr).contains("already ended (cancelled)"),
        "{}",
        text(&resume.stderr)
    );
}

#[test]
fn arbor_cancel_ends_an_interrupted_tree_on_the_store_so_nothing_adopts_it() {
    let dir = scene(CONFIG, slow());
    let (mut run, mut stderr) = spawn(dir.path(), &["run", "go"]);
    let tree = tree_line(&mut stderr);
    stderr
        .wait_for(GUARD, |l| l.contains("▸ lead"))
        .expect("the root never started");
    signal(&run, nix::sys::signal::Signal::SIGKILL);
    wait_exit(&mut run, GUARD);
    assert_eq!(status(dir.path(), &tree), "interrupted");

    let out = arbor(dir.path(), &["cancel", &tree]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("no process resumes or adopts it"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(status(dir.path(), &tree), "cancelled");
    // A tree that has ended: refused, naming how it ended.
    let again = arbor(dir.path(), &["cancel", &tree]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stderr).contains("has already ended (cancelled)"),
        "{}",
        text(&again.stderr)
    );
}

#[test]
fn arbor_cancel_on_the_store_stops_a_tree_that_arbor_run_runs() {
    let dir = scene(CONFIG, slow());
    let (mut run, mut stderr) = spawn(dir.path(), &["run", "go"]);
    let tree = tree_line(&mut stderr);
    stderr
        .wait_for(GUARD, |l| l.contains("▸ lead"))
        .expect("the root never started");
    let out = arbor(dir.path(), &["cancel", &tree]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), format!("{tree}: cancelled"));
    // The run ends with its root cancelled, not after its minute.
    let code = wait_exit(&mut run, GUARD).code();
    assert_eq!(code, Some(1), "{}", stderr.rest());
    assert_eq!(status(dir.path(), &tree), "cancelled");
}

#[test]
fn run_store_flag_is_not_ignored_when_the_config_disables_the_store() {
    let config = CONFIG.replace("path = \"arbor.db\"", "enabled = false");
    let dir = scene(&config, json!([{"text": "stored"}]));
    let out = arbor(dir.path(), &["run", "--store", "flag.db", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        dir.path().join("flag.db").is_file(),
        "{}",
        text(&out.stderr)
    );
    let listed = arbor(dir.path(), &["runs", "--store", "flag.db", "--json"]);
    let trees: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(trees.as_array().unwrap().len(), 1, "{trees}");
    assert!(!dir.path().join("arbor.db").exists());
}

#[test]
fn run_json_and_show_json_give_a_last_message_agents_final_text_a_field() {
    let dir = scene(CONFIG, json!([{"text": "the answer"}]));
    let out = arbor(dir.path(), &["run", "--json", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["output"], Value::Null);
    assert_eq!(state["finalText"], "the answer", "{state}");
    let run_id = state["runId"].as_str().unwrap();
    let shown = arbor(dir.path(), &["show", "--json", run_id]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    let state: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(state["finalText"], "the answer", "{state}");
}

#[test]
fn budget_with_no_flags_shows_the_budgets_in_force_and_an_ended_tree_is_named_ended() {
    let dir = scene(CONFIG, json!([{"text": "done"}]));
    let out = arbor(dir.path(), &["run", "--json", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tree = state["runId"].as_str().unwrap().strip_suffix("/0").unwrap();
    let shown = arbor(dir.path(), &["budget", tree]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    assert_eq!(
        text(&shown.stdout).trim(),
        format!("tree {tree}: max_steps 5, max_tokens unlimited, max_credits unlimited")
    );
    let raised = arbor(dir.path(), &["budget", tree, "--add-steps", "3"]);
    assert_eq!(raised.status.code(), Some(1));
    let said = text(&raised.stderr);
    assert!(
        said.contains(&format!("tree {tree} has ended (completed)")),
        "{said}"
    );
    assert!(!said.contains("no tree"), "{said}");
}

#[test]
fn a_budget_pause_in_arbor_run_is_raised_by_arbor_budget_as_it_says() {
    let config = CONFIG.replace("max_steps = 5", "max_steps = 1");
    let steps = json!([
        {"toolCalls": [{"name": "echo", "input": {"word": "hi"}}]},
        {"text": "raised and done"}
    ]);
    let dir = scene(&config, steps);
    let (mut run, mut stderr) = spawn(dir.path(), &["run", "go"]);
    let tree = tree_line(&mut stderr);
    let paused = stderr
        .wait_for(GUARD, |l| l.contains("paused"))
        .expect("the lead never paused on its budget");
    assert!(paused.contains(&format!("arbor budget {tree}")), "{paused}");
    let out = arbor(dir.path(), &["budget", &tree, "--add-steps", "1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("max_steps 2"),
        "{}",
        text(&out.stdout)
    );
    let status = wait_exit(&mut run, GUARD);
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut run.stdout.take().unwrap(), &mut stdout).unwrap();
    assert!(status.success(), "{}", stderr.rest());
    assert_eq!(stdout.trim(), "raised and done");
}

#[test]
fn tools_lists_only_the_tools_each_agent_is_offered() {
    let config = format!("{CONFIG}\n[policy]\ndeny_tools = [\"echo\"]\n");
    let dir = scene(&config, json!([]));
    let out = arbor(dir.path(), &["tools", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap();
    let agents = |name: &str| {
        listing
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| t["agents"].clone())
            .unwrap_or_else(|| panic!("{name} not listed: {listing}"))
    };
    // [policy] refuses echo to every agent.
    assert_eq!(agents("echo"), json!([]));
    // Only the lead may spawn.
    assert_eq!(agents("spawn_agents"), json!(["lead"]));
    assert_eq!(agents("end_turn"), json!(["lead", "worker"]));
}

#[test]
fn a_bad_tool_flag_pattern_exits_2_like_a_config_error_and_end_turn_cannot_be_denied() {
    let dir = scene(CONFIG, json!([{"text": "never"}]));
    let bad = arbor(dir.path(), &["run", "--allow-tools", "a b", "go"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    assert!(
        text(&bad.stderr).contains("--allow-tools"),
        "{}",
        text(&bad.stderr)
    );
    let structural = arbor(dir.path(), &["run", "--deny-tools", "end_turn", "go"]);
    assert_eq!(structural.status.code(), Some(2));
    assert!(
        text(&structural.stderr).contains("end_turn is a structural built-in"),
        "{}",
        text(&structural.stderr)
    );
}

#[test]
fn completions_print_a_shell_script_that_knows_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = arbor(dir.path(), &["completions", "bash"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let script = text(&out.stdout);
    assert!(script.contains("_arbor()"), "{script}");
    for command in ["cancel", "budget", "completions", "run"] {
        assert!(script.contains(command), "{command} missing");
    }
}
