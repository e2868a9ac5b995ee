//! A worktree per parallel writer, through the binary (issue 36): a planner
//! spawns four editors with `isolation = "worktree"` into a real git
//! repository with a failing test; each reads, edits and runs the
//! repository's test in its own worktree; their reports name their
//! branches and diffs; the planner merges them with the shell tool. The
//! same under kill -9 at three points, resumed; and `arbor replay` of the
//! tree on the repository as it was.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::{arbor_in, text};

const FILES: [&str; 4] = ["a.txt", "b.txt", "c.txt", "d.txt"];

/// The repository's test: every file named (all four by default) says
/// `fixed`.
const CHECK: &str = r#"#!/bin/sh
files="$*"
[ -n "$files" ] || files="a.txt b.txt c.txt d.txt"
for f in $files; do
  grep -qx fixed "$f" || { echo "$f is broken"; exit 1; }
done
echo ok
"#;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=test", "-c", "user.email=test@localhost"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// A repository whose test fails (four broken files), a config whose
/// planner spawns four editors and a reviewer, each in a worktree, and the
/// script: each editor reads, edits and tests its file (the test marks
/// that it started in `marks/FILE`, then sleeps `sleep` seconds); the
/// reviewer only reads; the planner looks at
/// its checkout, then merges every `arbor/` branch and runs the test.
/// Returns the repository and its first commit.
fn setup(dir: &Path, sleep: u32) -> (std::path::PathBuf, String) {
    let ws = dir.join("repo");
    std::fs::create_dir_all(&ws).unwrap();
    for f in FILES {
        std::fs::write(ws.join(f), "broken\n").unwrap();
    }
    std::fs::write(ws.join("check.sh"), CHECK).unwrap();
    git(&ws, &["init", "-q", "-b", "main"]);
    git(&ws, &["add", "."]);
    git(&ws, &["commit", "-q", "-m", "four broken files"]);
    let first = git(&ws, &["rev-parse", "HEAD"]).trim().to_owned();
    let ws = std::fs::canonicalize(&ws).unwrap();
    std::fs::write(
        dir.join("config.toml"),
        r#"
[models.script]
provider = "scripted"
file = "script.json"

[agents.planner]
model = "script"
tools = ["workspace/*"]
tool_names = "claude"
spawnable_agents = ["editor", "reviewer"]

[agents.editor]
model = "script"
tools = ["workspace/*"]
tool_names = "claude"
isolation = "worktree"

[agents.reviewer]
model = "script"
tools = ["workspace/*"]
tool_names = "claude"
isolation = "worktree"
"#,
    )
    .unwrap();
    // Each editor's test marks that it started here.
    let marks = dir.join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let marks = marks.display();
    let mut replies = vec![json!({"agent": "planner", "steps": [
        {"toolCalls": [{"name": "spawn_agents", "input": {"agents": [
            {"agent_type": "editor", "prompt": "fix a.txt"},
            {"agent_type": "editor", "prompt": "fix b.txt"},
            {"agent_type": "editor", "prompt": "fix c.txt"},
            {"agent_type": "editor", "prompt": "fix d.txt"},
            {"agent_type": "reviewer", "prompt": "review the test"}
        ]}}]},
        {"toolCalls": [{"name": "Bash", "input": {
            "command": "git status --porcelain; cat a.txt b.txt c.txt d.txt",
            "description": "look at the checkout"}}]},
        {"toolCalls": [{"name": "Bash", "input": {
            "command": format!("sleep {sleep}; for b in $(git for-each-ref --format='%(refname:short)' refs/heads/arbor/); do git -c user.name=planner -c user.email=planner@localhost merge --no-edit -q \"$b\" || exit 1; done; sh check.sh"),
            "description": "merge the editors' branches and test"}}]},
        {"text": "Merged."}
    ]})];
    for f in FILES {
        replies.push(
            json!({"agent": "editor", "prompt": format!("fix {f}"), "steps": [
                {"toolCalls": [{"name": "Read", "input": {"file_path": f}}]},
                {"toolCalls": [{"name": "Edit", "input": {
                    "file_path": f, "old_string": "broken", "new_string": "fixed"}}]},
                {"toolCalls": [{"name": "Bash", "input": {
                    "command": format!("touch '{marks}/{f}'; sleep {sleep}; sh check.sh {f}"),
                    "description": "test"}}]},
                {"text": format!("Fixed {f}.")}
            ]}),
        );
    }
    replies.push(json!({"agent": "reviewer", "steps": [
        {"toolCalls": [{"name": "Read", "input": {"file_path": "check.sh"}}]},
        {"text": "The test looks right."}
    ]}));
    std::fs::write(
        dir.join("script.json"),
        json!({ "replies": replies }).to_string(),
    )
    .unwrap();
    (ws, first)
}

fn run_args(ws: &str) -> Vec<&str> {
    vec![
        "run",
        "--config",
        "config.toml",
        "--store",
        "s.db",
        "--tree-id",
        "swarm",
        "--workspace",
        ws,
        "--agent",
        "planner",
        "--events",
        "fix the repository",
    ]
}

/// The planner's final state, from the store.
fn planner_state(dir: &Path) -> Value {
    let out = arbor_in(
        dir,
        &[
            "show",
            "swarm/0",
            "--json",
            "--config",
            "config.toml",
            "--store",
            "s.db",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The tool results of the planner's history, in order.
fn tool_results(state: &Value) -> Vec<Value> {
    state["messageHistory"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].clone())
        .collect()
}

/// What the swarm must have done, whatever happened on the way: every
/// editor's report names its branch (one commit, its one file changed) and
/// a kept worktree; the reviewer's worktree had no changes and is gone; the
/// checkout was untouched until the merge; after it, the test passes.
fn assert_swarm_done(dir: &Path, ws: &Path) {
    let state = planner_state(dir);
    assert_eq!(state["status"], "completed", "{state}");
    let results = tool_results(&state);
    assert_eq!(results.len(), 3, "{results:?}");
    let spawned = results[0].to_string();
    let spawned: Value = serde_json::from_str(&spawned).unwrap();
    let entries = spawned[0]["value"].as_array().cloned().unwrap_or_else(|| {
        // The spawn result is one JSON part holding the entries.
        spawned[0]["value"]["value"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    });
    assert_eq!(entries.len(), 5, "{spawned}");
    let mut branches = Vec::new();
    for (entry, f) in entries.iter().zip(FILES) {
        let worktree = &entry["value"]["worktree"];
        let branch = worktree["branch"].as_str().unwrap().to_owned();
        assert!(branch.starts_with("arbor/editor-"), "{entry}");
        assert_eq!(worktree["commits"].as_array().unwrap().len(), 1, "{entry}");
        assert_eq!(
            worktree["files"],
            json!([{"path": f, "added": 1, "removed": 1}])
        );
        assert_eq!(
            worktree["summary"],
            "1 file changed, 1 insertion(+), 1 deletion(-)"
        );
        let path = Path::new(worktree["path"].as_str().unwrap());
        assert_eq!(
            std::fs::read_to_string(path.join(f)).unwrap(),
            "fixed\n",
            "the edit is in the kept worktree, once"
        );
        branches.push(branch);
    }
    let reviewer = &entries[4]["value"]["worktree"];
    assert!(reviewer["path"].is_null(), "{reviewer}");
    assert_eq!(reviewer["summary"], "no changes");
    // Before the merge, the planner's checkout had no change at all.
    let looked = results[1].to_string();
    assert!(
        looked.contains("broken\\nbroken\\nbroken\\nbroken"),
        "{looked}"
    );
    assert!(
        !looked.contains("??") && !looked.contains(" M "),
        "{looked}"
    );
    // After it, the repository's test passes in the checkout.
    assert!(results[2].to_string().contains("ok"), "{}", results[2]);
    for f in FILES {
        assert_eq!(std::fs::read_to_string(ws.join(f)).unwrap(), "fixed\n");
    }
    // Kept: the four editors' branches; gone: the reviewer's.
    let listed = git(
        ws,
        &["branch", "--list", "arbor/*", "--format=%(refname:short)"],
    );
    let mut listed: Vec<&str> = listed.lines().collect();
    listed.sort_unstable();
    branches.sort();
    assert_eq!(listed, branches);
    let worktrees = git(ws, &["worktree", "list", "--porcelain"]);
    assert_eq!(worktrees.matches("worktree ").count(), 5, "{worktrees}");
    assert!(!worktrees.contains("reviewer"), "{worktrees}");
}

/// Back to the repository as it was: no worktree, no branch, no merge.
fn reset(ws: &Path, first: &str) {
    let listed = git(ws, &["worktree", "list", "--porcelain"]);
    for line in listed.lines().skip(1) {
        if let Some(path) = line.strip_prefix("worktree ") {
            git(ws, &["worktree", "remove", "--force", path]);
        }
    }
    let branches = git(
        ws,
        &["branch", "--list", "arbor/*", "--format=%(refname:short)"],
    );
    for b in branches.lines() {
        git(ws, &["branch", "-q", "-D", b]);
    }
    git(ws, &["reset", "-q", "--hard", first]);
}

#[test]
fn four_editors_in_worktrees_fix_a_repository_and_the_planner_merges_their_branches() {
    let dir = tempfile::tempdir().unwrap();
    let (ws, first) = setup(dir.path(), 0);
    let ws_arg = ws.display().to_string();
    let out = arbor_in(dir.path(), &run_args(&ws_arg));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_swarm_done(dir.path(), &ws);
    // Every sealed worktree is an event; `arbor tree` lists the kept ones.
    let sealed = text(&out.stderr).matches("\"worktreeSealed\"").count();
    assert_eq!(sealed, 5);
    let tree = arbor_in(
        dir.path(),
        &[
            "tree",
            "swarm",
            "--config",
            "config.toml",
            "--store",
            "s.db",
        ],
    );
    let listed = text(&tree.stdout);
    assert_eq!(
        listed.matches("worktree kept: arbor/editor-").count(),
        4,
        "{listed}"
    );
    assert!(listed.contains("1 file changed"), "{listed}");
    // A replay runs the tools again: on the repository as it was, it
    // makes the same commits and the same merge.
    reset(&ws, &first);
    let replay = arbor_in(
        dir.path(),
        &[
            "replay",
            "swarm",
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

/// Regression: an isolated editor that failed (here, out of steps after
/// its edit) left its edit uncommitted in a worktree nobody was told of,
/// and its parent read only the error. Now its work is committed on its
/// branch, its error value names the branch, `arbor tree` lists it; a
/// failed run that changed nothing leaves no worktree.
#[test]
fn a_failed_editors_edit_is_kept_on_its_branch_and_its_parent_is_told_where() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("repo");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "broken\n").unwrap();
    git(&ws, &["init", "-q", "-b", "main"]);
    git(&ws, &["add", "."]);
    git(&ws, &["commit", "-q", "-m", "broken"]);
    let ws = std::fs::canonicalize(&ws).unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        r#"
[models.script]
provider = "scripted"
file = "script.json"

[agents.planner]
model = "script"
spawnable_agents = ["editor", "reader"]

[agents.editor]
model = "script"
tools = ["workspace/*"]
tool_names = "claude"
isolation = "worktree"
max_steps = 1

[agents.reader]
model = "script"
tools = ["workspace/*"]
tool_names = "claude"
isolation = "worktree"
max_steps = 1
"#,
    )
    .unwrap();
    let script = json!({"replies": [
        {"agent": "planner", "steps": [
            {"toolCalls": [{"name": "spawn_agents", "input": {"agents": [
                {"agent_type": "editor", "prompt": "fix a.txt"},
                {"agent_type": "reader", "prompt": "read a.txt"}
            ]}}]},
            {"text": "Both failed."}
        ]},
        {"agent": "editor", "steps": [
            {"toolCalls": [{"name": "Edit", "input": {
                "file_path": "a.txt", "old_string": "broken", "new_string": "fixed"}}]},
            {"text": "never reached"}
        ]},
        {"agent": "reader", "steps": [
            {"toolCalls": [{"name": "Read", "input": {"file_path": "a.txt"}}]},
            {"text": "never reached"}
        ]}
    ]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let ws_arg = ws.display().to_string();
    let mut args = run_args(&ws_arg);
    args.retain(|a| *a != "--events");
    let out = arbor_in(dir.path(), &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state = planner_state(dir.path());
    let spawned = tool_results(&state)[0].to_string();
    let spawned: Value = serde_json::from_str(&spawned).unwrap();
    let entries = spawned[0]["value"].as_array().cloned().unwrap_or_else(|| {
        spawned[0]["value"]["value"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    });
    assert_eq!(entries.len(), 2, "{spawned}");
    let editor = &entries[0]["value"];
    assert!(
        editor["errorMessage"]
            .as_str()
            .is_some_and(|m| m.contains("max_steps")),
        "{editor}"
    );
    let branch = editor["worktree"]["branch"].as_str().unwrap().to_owned();
    assert!(branch.starts_with("arbor/editor-"), "{editor}");
    assert_eq!(
        editor["worktree"]["files"],
        json!([{"path": "a.txt", "added": 1, "removed": 1}])
    );
    // The edit is committed on the branch; the checkout is untouched.
    assert_eq!(git(&ws, &["show", &format!("{branch}:a.txt")]), "fixed\n");
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "broken\n"
    );
    assert_eq!(git(&ws, &["status", "--porcelain"]), "");
    // The reader changed nothing: its worktree and branch are gone.
    let reader = &entries[1]["value"];
    assert!(reader["errorMessage"].is_string(), "{reader}");
    assert!(reader["worktree"]["path"].is_null(), "{reader}");
    let branches = git(
        &ws,
        &["branch", "--list", "arbor/*", "--format=%(refname:short)"],
    );
    assert_eq!(branches.trim(), branch);
    let worktrees = git(&ws, &["worktree", "list", "--porcelain"]);
    assert_eq!(worktrees.matches("worktree ").count(), 2, "{worktrees}");
    let tree = arbor_in(
        dir.path(),
        &[
            "tree",
            "swarm",
            "--config",
            "config.toml",
            "--store",
            "s.db",
        ],
    );
    let listed = text(&tree.stdout);
    assert!(
        listed.contains(&format!("worktree kept: {branch}")),
        "{listed}"
    );
}

/// Runs `args` with `--events`, and kills it -9 once `at` is true of an
/// event and `after` more has passed; false when it ended first.
fn run_until_killed(dir: &Path, args: &[&str], at: impl Fn(&Value) -> bool, after: u64) -> bool {
    run_until_killed_once(dir, args, at, || true, after)
}

/// `run_until_killed`, waiting after the event until `also` holds too (for
/// at most a minute).
fn run_until_killed_once(
    dir: &Path,
    args: &[&str],
    at: impl Fn(&Value) -> bool,
    also: impl Fn() -> bool,
    after: u64,
) -> bool {
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
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while !also() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        seen = also();
        std::thread::sleep(Duration::from_millis(after));
    }
    let _ = child.kill();
    let _ = child.wait();
    seen
}

#[test]
fn the_worktree_swarm_killed_at_three_points_resumes_without_applying_an_edit_twice_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let (ws, first) = setup(dir.path(), 2);
    let ws_arg = ws.display().to_string();
    let resume = [
        "resume",
        "swarm",
        "--config",
        "config.toml",
        "--store",
        "s.db",
        "--events",
    ];
    // 1: while the editors run the test in their worktrees, edits made:
    // every editor's test has started (a call that may change something
    // starts only once what led to it is stored, so the reads and edits
    // before are on record; a test run again on resume changes nothing).
    let editing =
        |e: &Value| e["type"] == "stepStarted" && e["step"] == 3 && e["runId"] != "swarm/0";
    let testing = || {
        FILES
            .iter()
            .all(|f| dir.path().join("marks").join(f).exists())
    };
    assert!(
        run_until_killed_once(dir.path(), &run_args(&ws_arg), editing, testing, 100),
        "the editors reached their tests"
    );
    // 2: once the first worktree is sealed.
    let sealed = |e: &Value| e["type"] == "worktreeSealed";
    assert!(
        run_until_killed(dir.path(), &resume, sealed, 300),
        "a worktree was sealed"
    );
    // 3: while the planner's merge waits to start.
    let merging =
        |e: &Value| e["type"] == "stepStarted" && e["step"] == 3 && e["runId"] == "swarm/0";
    assert!(
        run_until_killed(dir.path(), &resume, merging, 700),
        "the planner reached its merge"
    );
    let out = arbor_in(dir.path(), &resume);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Each edit is in its branch once, as one commit (asserted within).
    assert_swarm_done(dir.path(), &ws);
    reset(&ws, &first);
    let replay = arbor_in(
        dir.path(),
        &[
            "replay",
            "swarm",
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

/// A service's run shows what its agent is doing: `GET /v1/runs/{id}` has
/// the todo list its last `TodoWrite` wrote and its sealed worktree, and
/// the live page, in real Chromium, shows both in the run's details.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_and_the_page_show_an_agents_todo_list_and_its_worktree() {
    use crate::serve::{Server, TOKEN, get, post};
    use crate::support::browser::Browser;
    let browser = Browser::new();
    let dir = tempfile::tempdir().unwrap();
    let (ws, _) = setup(dir.path(), 0);
    let script = json!({"replies": [
        {"agent": "planner", "steps": [
            {"toolCalls": [{"name": "spawn_agents", "input": {"agents": [
                {"agent_type": "editor", "prompt": "fix a.txt"}]}}]},
            {"text": "Done."}
        ]},
        {"agent": "editor", "steps": [
            {"toolCalls": [{"name": "TodoWrite", "input": {"todos": [
                {"content": "Fix a.txt", "status": "completed", "activeForm": "Fixing a.txt"},
                {"content": "Run the test", "status": "in_progress", "activeForm": "Running the test"}
            ]}}]},
            {"toolCalls": [{"name": "Read", "input": {"file_path": "a.txt"}}]},
            {"toolCalls": [{"name": "Edit", "input": {
                "file_path": "a.txt", "old_string": "broken", "new_string": "fixed"}}]},
            {"text": "Fixed."}
        ]}
    ]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let config = std::fs::read_to_string(dir.path().join("config.toml")).unwrap()
        + &format!(
            "\n[store]\npath = \"arbor.db\"\n\n[service]\nbind = \"127.0.0.1:0\"\nshutdown_timeout = \"5s\"\n\n[workspace]\nroots = [{:?}]\n",
            ws.display().to_string()
        );
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let config = dir.path().join("config.toml");
    let mut server = Server::start(
        dir.path(),
        &["--config", config.to_str().unwrap()],
        Some(TOKEN),
    );
    server.wait_for("ready");
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "planner", "prompt": "fix it", "limits": {"workspace": {"root": ws}}}),
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{created}");
    let tree = created["treeId"].as_str().unwrap().to_owned();
    let root = created["runId"].as_str().unwrap().to_owned();
    crate::approvals_restart::read_until(&server, &root, "event: agentFinished", 2).await;
    let editor = format!("{root}.1");
    let (status, run) = get(
        &server,
        &format!("/v1/runs/{}", crate::serve::encoded(&editor)),
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{run}");
    assert_eq!(
        run["todos"],
        json!([
            {"content": "Fix a.txt", "status": "completed", "activeForm": "Fixing a.txt"},
            {"content": "Run the test", "status": "in_progress", "activeForm": "Running the test"}
        ])
    );
    let worktree = &run["state"]["worktree"];
    assert_eq!(
        worktree["summary"],
        "1 file changed, 1 insertion(+), 1 deletion(-)"
    );
    // The planner wrote no todo list: none is shown.
    let (_, planner) = get(
        &server,
        &format!("/v1/runs/{}", crate::serve::encoded(&root)),
    )
    .await;
    assert!(planner.get("todos").is_none(), "{planner}");

    let report = browser
        .drive(
            &browser.script("page_todos.mjs"),
            &[server.base.as_str(), TOKEN, tree.as_str(), editor.as_str()],
            &[],
        )
        .await;
    assert_eq!(report["todoHeading"], "Todos (1/2 done)", "{report:#}");
    assert_eq!(report["todos"][0]["status"], "completed", "{report:#}");
    assert_eq!(report["todos"][0]["text"], "☑ Fix a.txt", "{report:#}");
    assert_eq!(
        report["todos"][1]["text"], "▶ Running the test",
        "{report:#}"
    );
    let line = report["worktree"].as_str().unwrap();
    assert!(
        line.starts_with("arbor/editor-")
            && line.contains("1 file changed")
            && line.contains("kept at"),
        "{report:#}"
    );
    assert_eq!(report["consoleErrors"], json!([]), "{report:#}");
}
