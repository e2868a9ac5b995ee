//! Two processes, one store: fencing epochs on tree claims (issue 12, defect 12) and read-only opens (defect 16).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use crate::support::{Lines, poll, wait_exit};
use crate::{arbor_in, text};

/// A 13-agent tree on the simulated model, half a second a step, at most two
/// agents at a time: it runs for a few seconds.
const SLOW_TREE: &str = r#"
[run]
agent = "lead"

[limits]
max_live_agents = 2

[models.sim]
provider = "simulated"
fanout = 3
depth = 2
latency = "500ms"
reply_tokens = 5

[agents.lead]
model = "sim"
spawnable_agents = ["worker"]

[agents.worker]
model = "sim"
spawnable_agents = ["helper"]

[agents.helper]
model = "sim"
"#;

/// Bounds on what is awaited (none is reached when things work).
const BOUND: Duration = Duration::from_secs(60);

fn spawn(dir: &Path, args: &[&str]) -> (Child, Lines) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::read(child.stderr.take().unwrap());
    (child, lines)
}

fn signal(child: &Child, signal: Signal) {
    kill(Pid::from_raw(child.id() as i32), signal).unwrap();
}

fn event_type(line: &str) -> Option<String> {
    let event: Value = serde_json::from_str(line).ok()?;
    event["type"].as_str().map(str::to_owned)
}

/// Split brain (issue 12, defect 12): process A runs a tree and is paused
/// (SIGSTOP) past its lease; process B resumes the tree; A is continued
/// (SIGCONT) while B runs it. A must see it was fenced out, say so in one
/// line and stop the tree without writing (no UNIQUE constraint failure);
/// B completes the tree, and the store holds one consistent tree: contiguous
/// segments, every run ended, and a replay that matches.
#[test]
fn an_owner_paused_past_its_lease_is_fenced_out_when_it_continues() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("slow.toml"), SLOW_TREE).unwrap();
    let store = dir.path().join("s.db");
    let run = [
        "run",
        "--config",
        "slow.toml",
        "--store",
        "s.db",
        "--tree-id",
        "sb",
        "--events",
        "go",
    ];
    let (mut a, mut a_out) = spawn(dir.path(), &run);
    // The root has answered and its children are under way.
    assert!(
        a_out
            .wait_for(BOUND, |l| event_type(l).as_deref()
                == Some("modelResponded"))
            .is_some(),
        "A never got going: {}",
        a_out.rest()
    );
    // Paused while this test holds the store's write lock, so A cannot be
    // paused holding it (B could not claim the tree then).
    {
        let db = rusqlite::Connection::open(&store).unwrap();
        db.busy_timeout(BOUND).unwrap();
        db.execute_batch("BEGIN IMMEDIATE").unwrap();
        signal(&a, Signal::SIGSTOP);
        db.execute_batch("ROLLBACK").unwrap();
    }
    // A stopped process's heartbeat decides: B sees the tree interrupted once
    // it is stale (the lease, 5 s).
    let interrupted = poll(BOUND, || {
        let out = arbor_in(
            dir.path(),
            &[
                "runs",
                "--store",
                "s.db",
                "--status",
                "interrupted",
                "--json",
            ],
        );
        let trees: Value = serde_json::from_slice(&out.stdout).ok()?;
        (trees.as_array()?.len() == 1).then_some(())
    });
    if interrupted.is_none() {
        signal(&a, Signal::SIGCONT);
        let _ = a.kill();
        panic!("the paused owner's tree never went stale");
    }
    let (mut b, mut b_out) = spawn(dir.path(), &["resume", "sb", "--store", "s.db", "--events"]);
    // B has claimed the tree once it emits anything; A goes on meanwhile.
    let started = b_out.wait_for(BOUND, |l| event_type(l).is_some());
    signal(&a, Signal::SIGCONT);
    assert!(started.is_some(), "B did not resume: {}", b_out.rest());
    let a_status = wait_exit(&mut a, BOUND);
    let a_err = a_out.rest();
    let b_status = wait_exit(&mut b, BOUND);
    let b_err = b_out.rest();
    assert!(!a_err.contains("UNIQUE"), "A: {a_err}");
    let fenced: Vec<&str> = a_err
        .lines()
        .filter(|l| l.contains("fenced out of tree sb"))
        .collect();
    assert_eq!(fenced.len(), 1, "A: {a_err}");
    assert!(
        fenced[0].contains("WARN") && fenced[0].contains("epoch 2 there, 1 here"),
        "{}",
        fenced[0]
    );
    assert!(!a_status.success(), "A finished the tree it lost: {a_err}");
    assert!(b_status.success(), "B: {b_err}");
    assert!(!b_err.contains("UNIQUE"), "B: {b_err}");

    // One consistent tree.
    let db = rusqlite::Connection::open(&store).unwrap();
    let (segments, epoch, status): (i64, i64, String) = db
        .query_row(
            "SELECT segments, epoch, status FROM trees WHERE tree_id = 'sb'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((epoch, status.as_str()), (2, "completed"));
    let numbers: Vec<i64> = db
        .prepare("SELECT n FROM segments WHERE tree_id = 'sb' ORDER BY n")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(numbers, (1..=segments).collect::<Vec<_>>());
    let tree = arbor_in(dir.path(), &["tree", "sb", "--store", "s.db", "--json"]);
    let tree: Value = serde_json::from_slice(&tree.stdout).unwrap();
    assert_eq!(tree["tree"]["status"], "completed");
    let runs = tree["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 13);
    assert!(runs.iter().all(|r| r["status"] == "completed"), "{runs:?}");
    let replay = arbor_in(dir.path(), &["replay", "sb", "--store", "s.db"]);
    assert!(
        text(&replay.stdout).starts_with("match: 13 runs"),
        "{}{}",
        text(&replay.stdout),
        text(&replay.stderr)
    );
}
