//! The shell: where it runs, what it gets, and that a timeout or a
//! cancelled call leaves no process behind.

use std::time::{Duration, Instant};

use arbor_tools::workspace::{Access, Workspace};
use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde_json::json;

use super::{call, ctx, json as value, open, text};

/// Whether the process `pid` is gone, waiting up to five seconds.
fn gone(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if kill(Pid::from_raw(pid), None).is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The pid a command wrote to `file`, waiting up to five seconds for it.
fn pid_in(file: &std::path::Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(text) = std::fs::read_to_string(file)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no pid in {}", file.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn a_command_runs_in_its_directory_and_reports_its_exit_and_output() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let handle = open(dir.path(), Access::ReadWrite);
    let ctx = ctx(&handle, "agent-1");
    let out = call(
        "workspace/shell",
        json!({"command": "pwd; echo oops >&2; exit 3", "cwd": "sub"}),
        &ctx,
    )
    .await
    .unwrap();
    let v = value(&out);
    let sub = dir.path().canonicalize().unwrap().join("sub");
    assert_eq!(v["stdout"], format!("{}\n", sub.display()));
    assert_eq!(v["stderr"], "oops\n");
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["cwd"], "sub");
    let out = call("run_terminal_command", json!({"command": "echo hi"}), &ctx)
        .await
        .unwrap();
    assert_eq!(
        value(&out),
        json!({"command": "echo hi", "startingCwd": ".", "stdout": "hi\n", "stderr": "", "exitCode": 0})
    );
    let out = call(
        "Bash",
        json!({"command": "echo out; echo err >&2", "description": "echo"}),
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(text(&out), "out\nerr");
    let e = call("Bash", json!({"command": "echo failing; exit 1"}), &ctx)
        .await
        .unwrap_err();
    assert_eq!(e.message, "failing\nexit code 1");
    let e = call(
        "Bash",
        json!({"command": "sleep 1", "run_in_background": true}),
        &ctx,
    )
    .await
    .unwrap_err();
    assert!(
        e.message.contains("run_in_background is not offered"),
        "{e}"
    );
}

#[tokio::test]
async fn the_environment_is_the_allow_list_and_path() {
    let dir = tempfile::tempdir().unwrap();
    let handle = Workspace::open(dir.path(), Access::ReadWrite)
        .unwrap()
        .with_shell_env(vec!["CARGO_PKG_NAME".to_owned()])
        .into_handle();
    let ctx = ctx(&handle, "agent-1");
    // Cargo sets both for a test; only the listed one (and PATH) gets through.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let out = call(
        "Bash",
        json!({"command": "echo ${CARGO_PKG_NAME:-unset} ${CARGO_MANIFEST_DIR:-unset}; test -n \"$PATH\" && echo path"}),
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(text(&out), "arbor-tools unset\npath");
}

#[tokio::test]
async fn a_timeout_kills_the_commands_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let handle = open(dir.path(), Access::ReadWrite);
    let ctx = ctx(&handle, "agent-1");
    let started = Instant::now();
    let e = call(
        "Bash",
        json!({"command": "sleep 30 & echo $! > child.pid; wait", "timeout": 500}),
        &ctx,
    )
    .await
    .unwrap_err();
    assert!(
        e.message
            .contains("timed out after 500ms (process group killed)"),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let child = pid_in(&dir.path().join("child.pid"));
    assert!(gone(child), "the child sleep {child} outlived the timeout");
    let out = call(
        "run_terminal_command",
        json!({"command": "sleep 30", "timeout_seconds": 0.3}),
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(
        value(&out)["message"],
        "timed out after 300ms (process group killed)"
    );
}

#[tokio::test]
async fn a_cancelled_call_kills_the_commands_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let handle = open(dir.path(), Access::ReadWrite);
    let ctx = ctx(&handle, "agent-1");
    let call_ctx = ctx.clone();
    let running = tokio::spawn(async move {
        call(
            "workspace/shell",
            json!({"command": "sleep 30 & echo $! > child.pid; wait"}),
            &call_ctx,
        )
        .await
    });
    // Cancelled once the child is up, as a cancelled agent drops the call.
    let file = dir.path().join("child.pid");
    let child = tokio::task::spawn_blocking(move || pid_in(&file))
        .await
        .unwrap();
    assert!(!running.is_finished(), "the command ended");
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    assert!(
        gone(child),
        "the child sleep {child} outlived the cancelled call"
    );
}
