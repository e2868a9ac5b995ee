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

/// Waits (bounded) until the store (the config's, or the one `store`
/// names) lists the tree as running: its row is written after the process
/// printed that it started it.
fn wait_stored(dir: &Path, tree: &str, store: &[&str]) {
    let mut args = vec!["runs", "--json"];
    args.extend_from_slice(store);
    let listed = crate::support::poll(GUARD, || {
        let out = arbor(dir, &args);
        let trees: Value = serde_json::from_slice(&out.stdout).ok()?;
        trees
            .as_array()?
            .iter()
            .any(|t| t["treeId"] == tree && t["status"] == "running")
            .then_some(())
    });
    assert!(listed.is_some(), "tree {tree} was never stored as running");
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
    wait_stored(dir.path(), &tree, &[]);
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
    // An `arbor serve` on the store resumes nothing.
    let mut server = crate::serve::Server::start(
        dir.path(),
        &["--bind", "127.0.0.1:0"],
        Some(crate::serve::TOKEN),
    );
    let ready = server.wait_for("ready");
    assert!(ready.contains("trees=0"), "{ready}");
    assert_eq!(status(dir.path(), &tree), "cancelled");
}

#[test]
fn arbor_cancel_ends_an_interrupted_tree_on_the_store_so_nothing_adopts_it() {
    cancel_an_interrupted_tree(&[]);
}

#[test]
fn arbor_cancel_ends_an_interrupted_tree_on_postgres_so_nothing_adopts_it() {
    let db = crate::support::PgDatabase::new("cancel_interrupted");
    cancel_an_interrupted_tree(&["--store", &db.url()]);
}

/// Runs a tree on the store `store` names (the config's when empty), kills
/// its process, then cancels it with `arbor cancel`.
fn cancel_an_interrupted_tree(store: &[&str]) {
    let dir = scene(CONFIG, slow());
    let with = |args: &[&str]| -> Vec<String> {
        args.iter().chain(store).map(|a| (*a).to_owned()).collect()
    };
    let run_args = with(&["run", "go"]);
    let run_args: Vec<&str> = run_args.iter().map(String::as_str).collect();
    let (mut run, mut stderr) = spawn(dir.path(), &run_args);
    let tree = tree_line(&mut stderr);
    stderr
        .wait_for(GUARD, |l| l.contains("▸ lead"))
        .expect("the root never started");
    wait_stored(dir.path(), &tree, store);
    signal(&run, nix::sys::signal::Signal::SIGKILL);
    wait_exit(&mut run, GUARD);
    let status = |dir: &Path| {
        let args = with(&["runs", "--json"]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = arbor(dir, &args);
        let trees: Value = serde_json::from_slice(&out.stdout).unwrap();
        trees[0]["status"].as_str().unwrap_or_default().to_owned()
    };
    assert_eq!(status(dir.path()), "interrupted");

    let cancel = with(&["cancel", &tree]);
    let cancel: Vec<&str> = cancel.iter().map(String::as_str).collect();
    let out = arbor(dir.path(), &cancel);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("no process resumes or adopts it"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(status(dir.path()), "cancelled");
    // A tree that has ended: refused, naming how it ended.
    let again = arbor(dir.path(), &cancel);
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
    wait_stored(dir.path(), &tree, &[]);
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
    wait_stored(dir.path(), &tree, &[]);
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

#[test]
fn migrate_prints_the_schema_versions_of_a_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let out = arbor(dir.path(), &["migrate", "--store", "new.db"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    let to = said
        .trim()
        .strip_prefix("new.db: schema version 0 -> ")
        .unwrap_or_else(|| panic!("{said}"));
    let again = text(&arbor(dir.path(), &["migrate", "--store", "new.db"]).stdout);
    assert_eq!(
        again.trim(),
        format!("new.db: schema version {to}, up to date")
    );
}

#[test]
fn store_copy_run_twice_exits_0_and_a_missing_source_names_no_flag_it_lacks() {
    let dir = scene(CONFIG, json!([{"text": "copied"}]));
    let out = arbor(dir.path(), &["run", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let first = arbor(dir.path(), &["store", "copy", "arbor.db", "b.db"]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    assert!(
        text(&first.stdout).contains("copied 1 tree from"),
        "{}",
        text(&first.stdout)
    );
    let again = arbor(dir.path(), &["store", "copy", "arbor.db", "b.db"]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert!(text(&again.stdout).contains("(1 skipped: already there)"));
    let missing = arbor(dir.path(), &["store", "copy", "nothing.db", "c.db"]);
    assert_eq!(missing.status.code(), Some(1));
    let said = text(&missing.stderr);
    assert!(
        said.contains("no store at nothing.db to copy from"),
        "{said}"
    );
    assert!(!said.contains("--store"), "{said}");
}

#[test]
fn approve_with_an_empty_call_id_says_it_is_empty_not_no_such_route() {
    let dir = tempfile::tempdir().unwrap();
    let out = arbor(
        dir.path(),
        &["approve", "t1", "", "--server", "http://127.0.0.1:9"],
    );
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(said.contains("the call id is empty"), "{said}");
}

#[test]
fn tree_given_a_run_id_says_it_is_a_run_id() {
    let dir = scene(CONFIG, json!([{"text": "done"}]));
    let out = arbor(dir.path(), &["run", "--tree-id", "trun", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = arbor(dir.path(), &["tree", "trun/0"]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(
        said.contains("trun/0 is a run id, not a tree id") && said.contains("arbor tree trun"),
        "{said}"
    );
}

/// A server on a loopback port that answers every request 401, as `arbor
/// serve` does without a token; returns its URL.
fn refusing_server() -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4) {
            let Ok(mut stream) = stream else { return };
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head);
            let body = r#"{"error":{"code":"unauthorized","message":"send an API token: Authorization: Bearer <token>"}}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

#[test]
fn say_without_a_token_names_the_token_flag_and_variable_not_an_http_header() {
    let dir = tempfile::tempdir().unwrap();
    let server = refusing_server();
    let out = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(["say", "t1/0", "hello", "--server", &server])
        .current_dir(dir.path())
        .env_remove("ARBOR_API_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(
        said.contains("--token") && said.contains("$ARBOR_API_TOKEN"),
        "{said}"
    );
    assert!(!said.contains("Authorization: Bearer"), "{said}");
}

#[test]
fn the_insecure_bind_error_names_the_tokens_variable_not_a_tokens_key() {
    let dir = scene(CONFIG, json!([]));
    let out = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(["serve", "--bind", "0.0.0.0:0"])
        .current_dir(dir.path())
        .env_remove("ARBOR_API_TOKENS")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(said.contains("without API tokens"), "{said}");
    assert!(
        said.contains("ARBOR_API_TOKENS (the variable [service] tokens_env names)"),
        "{said}"
    );
    assert!(!said.contains("[service] tokens ("), "{said}");
}

#[test]
fn ping_to_a_closed_port_fails_at_once_and_says_its_error_once() {
    let config = r#"
[models.m]
provider = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "x"
retry = { max_retries = 4, base_delay = "2s", max_delay = "2s" }
"#;
    let dir = scene(config, json!([]));
    let out = arbor(dir.path(), &["ping", "m"]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stdout);
    assert_eq!(said.matches("Connection refused").count(), 1, "{said}");
    assert!(!said.contains("retries"), "{said}");
    // One attempt: not the four retries of its config, each after 2 s.
    assert!(said.starts_with("m: failed after "), "{said}");
}

#[test]
fn replay_of_a_multi_turn_tree_names_the_turn_it_replayed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), CONFIG).unwrap();
    let script = json!({"replies": [
        {"agent": "lead", "prompt": "first", "steps": [{"text": "one"}]},
        {"agent": "lead", "prompt": "again", "steps": [{"text": "two"}]}
    ]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let out = arbor(dir.path(), &["run", "--tree-id", "tturns", "first"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = arbor(dir.path(), &["run", "--continue", "tturns", "again"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = arbor(dir.path(), &["replay", "tturns"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("turn 1 (run tturns/0~1, its latest"),
        "{said}"
    );
}

#[test]
fn the_tree_view_says_1_child_not_1_children() {
    let config = crate::fixtures().join("scripted.toml");
    let dir = tempfile::tempdir().unwrap();
    let out = arbor(
        dir.path(),
        &[
            "run",
            "--no-store",
            "--config",
            config.to_str().unwrap(),
            "go",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stderr);
    assert!(said.contains("(1 child, "), "{said}");
    assert!(!said.contains("1 children"), "{said}");
}

#[test]
fn a_tree_paused_on_its_budget_shows_paused_in_tree_and_runs_not_running() {
    let config = CONFIG.replace("max_steps = 5", "max_steps = 1");
    let steps = json!([
        {"toolCalls": [{"name": "echo", "input": {"word": "hi"}}]},
        {"text": "never reached"}
    ]);
    let dir = scene(&config, steps);
    let (mut run, mut stderr) = spawn(dir.path(), &["run", "go"]);
    let tree = tree_line(&mut stderr);
    stderr
        .wait_for(GUARD, |l| l.contains("paused"))
        .expect("the lead never paused on its budget");
    // Once its budgetReached is stored.
    let shown = crate::support::poll(GUARD, || {
        let out = arbor(dir.path(), &["tree", &tree]);
        let shown = text(&out.stdout);
        shown.contains("(paused)").then_some(shown)
    })
    .unwrap_or_else(|| panic!("tree {tree} never shown paused"));
    assert!(
        shown.starts_with(&format!("tree {tree} (paused)")),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("arbor budget {tree} --add-steps N raises it")),
        "{shown}"
    );
    assert!(
        shown.contains("‖ lead") && shown.contains("paused on max_steps"),
        "{shown}"
    );
    let listed = text(&arbor(dir.path(), &["runs"]).stdout);
    let row = listed
        .lines()
        .find(|l| l.starts_with(&tree))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(row.contains(" paused "), "{listed}");
    signal(&run, nix::sys::signal::Signal::SIGINT);
    wait_exit(&mut run, GUARD);
}

#[test]
fn follow_up_turns_are_not_counted_as_resumes() {
    turns_and_resumes(&[]);
}

#[test]
fn follow_up_turns_are_not_counted_as_resumes_on_postgres() {
    let db = crate::support::PgDatabase::new("turns_not_resumes");
    turns_and_resumes(&["--store", &db.url()]);
}

/// A tree asked two follow-up turns on the store `store` names (the
/// config's when empty) has been resumed 0 times.
fn turns_and_resumes(store: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), CONFIG).unwrap();
    let script = json!({"replies": [
        {"agent": "lead", "prompt": "first", "steps": [{"text": "one"}]},
        {"agent": "lead", "prompt": "again", "steps": [{"text": "two"}]},
        {"agent": "lead", "prompt": "more", "steps": [{"text": "three"}]}
    ]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let with = |args: &[&str]| -> Vec<String> {
        args.iter().chain(store).map(|a| (*a).to_owned()).collect()
    };
    let run = |args: &[&str]| {
        let args = with(args);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = arbor(dir.path(), &args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        out
    };
    run(&["run", "--tree-id", "tres", "first"]);
    for prompt in ["again", "more"] {
        run(&["run", "--continue", "tres", prompt]);
    }
    let listed = run(&["runs", "--json"]);
    let trees: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(trees[0]["treeId"], "tres");
    assert_eq!(trees[0]["resumes"], 0, "{trees}");
}

#[test]
fn the_approval_question_is_not_overwritten_by_progress_lines() {
    use std::io::{Read as _, Write as _};
    // util-linux's `script` gives arbor run a terminal (its flags differ elsewhere).
    let util_linux = Command::new("script").arg("--version").output();
    if !util_linux.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: no `script` to give arbor run a terminal");
        return;
    }
    let config = CONFIG.replace(
        "tools = [\"echo\"]\n",
        "tools = [\"echo\"]\napprove = [\"echo\"]\n",
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), &config).unwrap();
    // Two workers: one asks to run echo, the other finishes while the
    // question is up.
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "spawn_agents", "input": {"agents": [
                {"agent_type": "worker", "prompt": "ask"},
                {"agent_type": "worker", "prompt": "quick"}
            ]}}]},
            {"text": "done"}
        ]},
        {"agent": "worker", "prompt": "ask", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"word": "hi"}}]},
            {"text": "asked"}
        ]},
        {"agent": "worker", "prompt": "quick", "steps": [{"text": "worked", "delayMs": 1000}]}
    ]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let arbor_bin = env!("CARGO_BIN_EXE_arbor");
    let mut child = Command::new("script")
        .args([
            "-qec",
            &format!("{arbor_bin} run --tree-id tasked go"),
            "/dev/null",
        ])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let shown = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reading = shown.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            reading
                .lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    const QUESTION: &str =
        "approve? [y]es / [a]lways (every echo call in this tree) / [n]o / [e]dit input: ";
    let asked = crate::support::poll(GUARD, || {
        shown.lock().unwrap().contains(QUESTION).then_some(())
    });
    assert!(asked.is_some(), "never asked: {}", shown.lock().unwrap());
    // The worker ends while the question is up (its end is stored).
    let ended = crate::support::poll(GUARD, || {
        let out = arbor(dir.path(), &["tree", "--json", "tasked"]);
        let doc: Value = serde_json::from_slice(&out.stdout).ok()?;
        doc["runs"]
            .as_array()?
            .iter()
            .any(|r| r["runId"] == "tasked/0.2" && r["status"] == "completed")
            .then_some(())
    });
    assert!(ended.is_some(), "the worker never ended");
    stdin.write_all(b"y\n").unwrap();
    stdin.flush().unwrap();
    let status = wait_exit(&mut child, GUARD);
    drop(stdin);
    let shown = shown.lock().unwrap().clone();
    assert!(status.success(), "{shown}");
    // Nothing was printed after the question until it was answered.
    let after = &shown[shown.find(QUESTION).unwrap() + QUESTION.len()..];
    assert!(after.trim_start().starts_with('y'), "{shown}");
    assert!(shown.contains("✓ worker 0.2"), "{shown}");
}

#[test]
fn a_limit_message_names_the_run_it_stopped() {
    let config = CONFIG
        .replace("max_steps = 5", "max_steps = 1")
        .replace("on_budget = \"pause\"", "on_budget = \"fail\"");
    let steps = json!([
        {"toolCalls": [{"name": "echo", "input": {"word": "hi"}}]},
        {"text": "never reached"}
    ]);
    let dir = scene(&config, steps);
    let out = arbor(dir.path(), &["run", "--tree-id", "tlimit", "go"]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(
        said.lines()
            .any(|l| l.starts_with("! 0 stopped: limit max_steps reached")),
        "{said}"
    );
    // Quiet, the one line that says why names the run too.
    let out = arbor(
        dir.path(),
        &["run", "--quiet", "--tree-id", "tlimit2", "go"],
    );
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(
        said.contains("error: the root agent (run tlimit2/0) failed: limit max_steps reached"),
        "{said}"
    );
}

#[test]
fn budget_and_cancel_through_a_server_say_a_tree_has_ended_and_reach_a_tree_arbor_run_runs() {
    use crate::serve::{Server, TOKEN};
    let dir = scene(CONFIG, json!([{"text": "done"}]));
    let out = arbor(dir.path(), &["run", "--tree-id", "tended", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut server = Server::start(dir.path(), &["--bind", "127.0.0.1:0"], Some(TOKEN));
    server.wait_for("ready");
    let client = |args: &[&str]| {
        let mut args: Vec<&str> = args.to_vec();
        args.extend(["--server", &server.base, "--token", TOKEN]);
        arbor(dir.path(), &args)
    };
    let shown = client(&["budget", "tended"]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    assert_eq!(
        text(&shown.stdout).trim(),
        "tree tended: max_steps 5, max_tokens unlimited, max_credits unlimited"
    );
    let raised = client(&["budget", "tended", "--add-steps", "1"]);
    assert_eq!(raised.status.code(), Some(1));
    let said = text(&raised.stderr);
    assert!(said.contains("tree tended has ended (completed)"), "{said}");
    assert!(!said.contains("no tree"), "{said}");
    let cancelled = client(&["cancel", "tended"]);
    assert_eq!(cancelled.status.code(), Some(1));
    let said = text(&cancelled.stderr);
    assert!(said.contains("is not running (it is completed)"), "{said}");

    // A tree `arbor run` runs on the server's store: the server forwards
    // the cancel, and `arbor run` takes it.
    std::fs::write(
        dir.path().join("script.json"),
        json!({"replies": [{"agent": "lead", "steps": slow()}]}).to_string(),
    )
    .unwrap();
    let (mut run, mut stderr) = spawn(dir.path(), &["run", "--tree-id", "tslow", "go"]);
    stderr
        .wait_for(GUARD, |l| l.contains("▸ lead"))
        .expect("the root never started");
    wait_stored(dir.path(), "tslow", &[]);
    let out = client(&["cancel", "tslow"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("cancelling: run tslow/0"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        wait_exit(&mut run, GUARD).code(),
        Some(1),
        "{}",
        stderr.rest()
    );
    assert_eq!(status(dir.path(), "tslow"), "cancelled");
}

#[test]
fn ctrl_c_on_a_queued_follow_up_takes_it_out_of_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), CONFIG).unwrap();
    let script = json!({"replies": [
        {"agent": "lead", "prompt": "first", "steps": [{"text": "slow", "delayMs": 60_000}]},
        {"agent": "lead", "prompt": "again", "steps": [{"text": "given up"}]},
        {"agent": "lead", "prompt": "more", "steps": [{"text": "three"}]}
    ]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let (mut first, mut first_err) = spawn(dir.path(), &["run", "--tree-id", "tq", "first"]);
    first_err
        .wait_for(GUARD, |l| l.contains("▸ lead"))
        .expect("the root never started");
    wait_stored(dir.path(), "tq", &[]);
    let (mut queued, mut queued_err) = spawn(dir.path(), &["run", "--continue", "tq", "again"]);
    queued_err
        .wait_for(GUARD, |l| l.contains("queued as tq/0~1"))
        .expect("the follow-up was never queued");
    signal(&queued, nix::sys::signal::Signal::SIGINT);
    assert_eq!(wait_exit(&mut queued, GUARD).code(), Some(130));
    assert!(
        queued_err
            .rest()
            .contains("turn 1 of tree tq taken out of its queue"),
        "{}",
        queued_err.rest()
    );
    let out = arbor(dir.path(), &["cancel", "tq"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_exit(&mut first, GUARD);
    // The next turn is turn 1 again: nothing waited in the queue.
    let out = arbor(dir.path(), &["run", "--json", "--continue", "tq", "more"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["runId"], "tq/0~1", "{}", text(&out.stderr));
    assert_eq!(state["finalText"], "three");
}

#[test]
fn a_budget_pause_of_an_unstored_run_does_not_point_at_arbor_budget() {
    let config = CONFIG.replace("max_steps = 5", "max_steps = 1");
    let steps = json!([
        {"toolCalls": [{"name": "echo", "input": {"word": "hi"}}]},
        {"text": "never reached"}
    ]);
    let dir = scene(&config, steps);
    let (mut run, mut stderr) = spawn(dir.path(), &["run", "--no-store", "go"]);
    let paused = stderr
        .wait_for(GUARD, |l| l.contains("paused"))
        .expect("the lead never paused on its budget");
    assert!(paused.contains("the tree is not stored"), "{paused}");
    assert!(!paused.contains("arbor budget t"), "{paused}");
    signal(&run, nix::sys::signal::Signal::SIGINT);
    assert_eq!(wait_exit(&mut run, GUARD).code(), Some(130));
}

/// A `--tree-id` that is not a tree id is refused where it is typed, as a
/// usage error naming the flag and the rule (issue 35: the id is a `TreeId`
/// from the command line on); before, the tree's start refused it (exit 1).
#[test]
fn a_tree_id_that_is_not_one_is_refused_at_its_flag() {
    let dir = scene(CONFIG, json!([{"text": "never"}]));
    let out = arbor(dir.path(), &["run", "--tree-id", "a b", "go"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--tree-id"), "{stderr}");
    assert!(
        stderr.contains("use 1 to 128 letters, digits, '-', '_', '.' or ':'"),
        "{stderr}"
    );
}

/// The config's own `[policy]` is the supervisor's, not the command line's
/// request: a rule there that names a structural built-in (which it neither
/// gives nor takes) does not stop `arbor run`, nor is it blamed on a flag
/// nobody gave. Between ac70852 and the fix, `arbor run` sent the config's
/// rules as its request and exited 2 with "--deny-tools: ...".
#[test]
fn a_configs_policy_naming_a_structural_built_in_is_not_blamed_on_a_flag() {
    let config = format!("{CONFIG}\n[policy]\ndeny_tools = [\"end_turn\"]\n");
    let dir = scene(&config, json!([{"text": "done"}]));
    let out = arbor(dir.path(), &["run", "--no-store", "go"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("--deny-tools"),
        "{}",
        text(&out.stderr)
    );
}
