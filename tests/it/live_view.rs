//! The live tree `arbor run` draws on a terminal (issue 38), driven in a
//! real one: tmux (`ARBOR_TMUX`, else `/usr/bin/tmux`; `.ci/run` installs
//! it), its keys sent with send-keys and its screen read with
//! capture-pane. A 3-level tree on the scripted model: one branch ends
//! early (its subtree folds to one line), a leaf runs a slow tool, another
//! asks for approval.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::poll;
use crate::{arbor_in, text};

const GUARD: Duration = Duration::from_secs(60);

const CONFIG: &str = r#"
[run]
agent = "lead"

[store]
path = "arbor.db"

[models.script]
provider = "scripted"
file = "script.json"

[tools.pause]
description = "Waits some seconds."
input_schema = { type = "object", properties = { secs = { type = "string" } }, required = ["secs"] }
command = ["sleep", "{secs}"]

[tools.echo]
description = "Echoes its word."
input_schema = { type = "object", properties = { word = { type = "string" } }, required = ["word"] }
command = ["echo", "{word}"]

[agents.lead]
model = "script"
spawnable_agents = ["branch"]

[agents.branch]
model = "script"
spawnable_agents = ["leaf"]

[agents.leaf]
model = "script"
tools = ["pause", "echo"]
approve = ["echo"]
"#;

/// The scene: `sleepy` sleeps `secs` seconds; `ask` waits `ask_after_ms`
/// on its model, then calls echo, which needs approval.
fn scene(dir: &Path, secs: u32, ask_after_ms: u64) {
    std::fs::write(dir.join("config.toml"), CONFIG).unwrap();
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "spawn_agents", "input": {"agents": [
                {"agent_type": "branch", "prompt": "fast"},
                {"agent_type": "branch", "prompt": "slow"}
            ]}}]},
            {"text": "all done"}
        ]},
        {"agent": "branch", "prompt": "fast", "steps": [
            {"toolCalls": [{"name": "spawn_agents", "input": {"agents": [
                {"agent_type": "leaf", "prompt": "quick"}
            ]}}]},
            {"text": "fast done"}
        ]},
        {"agent": "branch", "prompt": "slow", "steps": [
            {"toolCalls": [{"name": "spawn_agents", "input": {"agents": [
                {"agent_type": "leaf", "prompt": "sleepy"},
                {"agent_type": "leaf", "prompt": "ask"}
            ]}}]},
            {"text": "slow done"}
        ]},
        {"agent": "leaf", "prompt": "quick", "steps": [{"text": "quick"}]},
        {"agent": "leaf", "prompt": "sleepy", "steps": [
            {"toolCalls": [{"name": "pause", "input": {"secs": secs.to_string()}}]},
            {"text": "slept"}
        ]},
        {"agent": "leaf", "prompt": "ask", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"word": "hi"}}], "delayMs": ask_after_ms},
            {"text": "asked"}
        ]}
    ]});
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
}

/// A tmux server of the test's own, with one window running a command.
pub struct Tmux {
    tmux: String,
    socket: String,
}

impl Tmux {
    /// Starts `command` (run by sh, in `dir`) in a `cols`×`rows` terminal;
    /// the window stays after it ends, with `EXIT=<status>` printed.
    pub fn start(dir: &Path, cols: u16, rows: u16, command: &str) -> Option<Self> {
        let tmux = std::env::var("ARBOR_TMUX").unwrap_or_else(|_| "/usr/bin/tmux".into());
        if !Path::new(&tmux).exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "no tmux at {tmux}: install Debian's `tmux` (or set ARBOR_TMUX); .ci/run does"
            );
            eprintln!("skipped: no tmux at {tmux}");
            return None;
        }
        let socket = format!("arbor-test-{}-{cols}", std::process::id());
        let t = Tmux { tmux, socket };
        let wrapped = format!("{command}; echo EXIT=$?; sleep 600");
        let status = t
            .cmd()
            .args(["new-session", "-d", "-s", "view", "-x"])
            .arg(cols.to_string())
            .arg("-y")
            .arg(rows.to_string())
            .arg("-c")
            .arg(dir)
            .args(["sh", "-c", &wrapped])
            .status()
            .unwrap();
        assert!(status.success());
        Some(t)
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.tmux);
        c.args(["-L", &self.socket, "-f", "/dev/null"]);
        c
    }

    /// The screen as text (`escapes`: with its colour codes).
    pub fn screen(&self, escapes: bool) -> String {
        let mut c = self.cmd();
        c.args(["capture-pane", "-p", "-t", "view"]);
        if escapes {
            c.arg("-e");
        }
        text(&c.output().unwrap().stdout)
    }

    /// Waits until the screen shows `what`; the screen then.
    pub fn wait_for(&self, what: &str) -> String {
        poll(GUARD, || {
            let s = self.screen(false);
            s.contains(what).then_some(s)
        })
        .unwrap_or_else(|| panic!("never showed {what:?}:\n{}", self.screen(false)))
    }

    pub fn keys(&self, keys: &[&str]) {
        let status = self
            .cmd()
            .args(["send-keys", "-t", "view"])
            .args(keys)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").status();
    }
}

fn arbor_cmd(extra: &str) -> String {
    format!(
        "{extra} {} run --tree-id live go",
        env!("CARGO_BIN_EXE_arbor")
    )
}

#[test]
fn the_live_view_shows_each_agent_at_work_folds_ended_subtrees_and_keeps_the_approval_question_intact()
 {
    let dir = tempfile::tempdir().unwrap();
    scene(dir.path(), 4, 2500);
    let Some(tmux) = Tmux::start(dir.path(), 100, 30, &arbor_cmd("env -u NO_COLOR")) else {
        return;
    };
    // While the slow tool runs: its line, the folded fast branch, the
    // footer.
    let running = tmux.wait_for("running pause (1 left)");
    assert!(running.contains("▸ lead 0  waiting for "), "{running}");
    let fast = poll(GUARD, || {
        let s = tmux.screen(false);
        s.contains("✓ branch 0.1  2 agents (2 completed)")
            .then_some(s)
    });
    assert!(fast.is_some(), "{}", tmux.screen(false));
    assert!(
        !running.contains("quick"),
        "the folded subtree hides its leaf: {running}"
    );
    let footer = tmux.screen(false);
    assert!(
        footer
            .lines()
            .any(|l| l.contains(" running · ") && l.contains(" done · ")),
        "{footer}"
    );
    // Colours on a terminal without NO_COLOR.
    assert!(tmux.screen(true).contains("\x1b["), "no colour drawn");
    // The question: asked below the log, and no frame drawn over it.
    let asked = tmux.wait_for("[e]dit input:");
    std::thread::sleep(Duration::from_millis(600));
    let still = tmux.screen(false);
    let tail: Vec<&str> = still.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        tail.last().is_some_and(|l| l.contains("approve? [y]es")),
        "the question is the last line, six frames later: {still}\n(asked: {asked})"
    );
    assert!(
        still.contains("approval needed: run live/0.2.2 wants to call echo"),
        "{still}"
    );
    tmux.keys(&["y", "Enter"]);
    let done = tmux.wait_for("EXIT=");
    assert!(done.contains("EXIT=0"), "{done}");
    assert!(done.contains("Finished tree live in "), "{done}");
    assert!(done.contains("all done"), "{done}");
    // The summary's tokens are the tree's, as `arbor tree` counts them.
    let tree = arbor_in(dir.path(), &["tree", "live", "--json"]);
    let doc: Value = serde_json::from_slice(&tree.stdout).unwrap();
    let tokens: u64 = doc["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["inputTokens"].as_u64().unwrap() + r["outputTokens"].as_u64().unwrap())
        .sum();
    assert!(
        done.contains(&format!("{tokens} tokens in all")),
        "{tokens} tokens: {done}"
    );
}

#[test]
fn c_in_the_live_view_cancels_the_selected_tree_and_80_columns_without_colour_read_well() {
    let dir = tempfile::tempdir().unwrap();
    scene(dir.path(), 30, 60_000);
    let Some(tmux) = Tmux::start(dir.path(), 80, 24, &arbor_cmd("env NO_COLOR=1")) else {
        return;
    };
    let running = tmux.wait_for("running pause (1 left)");
    for line in running.lines() {
        assert!(
            console_width(line) <= 80,
            "a line wider than the terminal: {line:?}"
        );
    }
    assert!(
        !tmux.screen(true).contains("\x1b[3"),
        "colour under NO_COLOR"
    );
    // The first line is the root's: selected, then cancelled.
    tmux.keys(&["Down"]);
    let selected = tmux.wait_for("›▸ lead 0");
    assert!(selected.contains("›"), "{selected}");
    tmux.keys(&["c"]);
    let done = tmux.wait_for("EXIT=");
    assert!(done.contains("tree live cancelled from the view"), "{done}");
    assert!(done.contains("EXIT=1"), "{done}");
    // The terminal is back in line mode: what is typed is echoed.
    tmux.keys(&["echo typed-back", "Enter"]);
    let _ = tmux.wait_for("typed-back");
}

/// Issue 38: a reply the model streams shows on its agent's line as it
/// comes ("writing: …"), word by word, before the step ends.
#[test]
fn a_streamed_reply_shows_in_the_terminal_view_as_it_comes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[models.script]\nprovider = \"scripted\"\nfile = \"script.json\"\n\n\
         [agents.writer]\nmodel = \"script\"\n",
    )
    .unwrap();
    let script = json!({"replies": [{"agent": "writer", "steps": [
        {"text": "alpha beta gamma delta epsilon zeta eta theta", "wordMs": 400}
    ]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let command = format!(
        "env -u NO_COLOR {} run --no-store --agent writer go",
        env!("CARGO_BIN_EXE_arbor")
    );
    // (90 columns: each test's tmux server is named by its width.)
    let Some(tmux) = Tmux::start(dir.path(), 90, 24, &command) else {
        return;
    };
    let first = tmux.wait_for("writing: alpha");
    assert!(!first.contains("theta"), "the whole reply at once: {first}");
    let later = tmux.wait_for("writing: alpha beta gamma");
    assert!(later.contains("▸ writer 0  model, step 1"), "{later}");
    let done = tmux.wait_for("EXIT=");
    assert!(done.contains("EXIT=0"), "{done}");
}

/// Columns a line takes (every character one column here but the tree's
/// marks, which are one too).
fn console_width(line: &str) -> usize {
    line.chars().count()
}
