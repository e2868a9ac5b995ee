//! Tool processes die with Arbor, even on SIGKILL (issue 34, item 5): a
//! command tool that double-forks a `setsid` grandchild leaves nothing behind
//! when its call ends or when `arbor run` is killed with SIGKILL, and a
//! resumed call is not started again while its earlier attempt lives. The
//! checks read the process table (`/proc`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use arbor::actors::{Tool, ToolContext, ToolOutput};
use arbor::tools::command::CommandToolSection;
use serde_json::{Value, json};

use crate::support::poll;

/// The bound on every wait of these tests (never a pass by itself).
const BOUND: Duration = Duration::from_secs(30);

/// The tool: appends "PID PPID FIRST_ALIVE" to `starts` (FIRST_ALIVE: whether
/// the first attempt's shell still lives), then, unless `fast` exists,
/// double-forks a `setsid sleep` grandchild, starts a `sleep` child, writes
/// "PID PPID GRANDCHILD CHILD" to `ready` and waits.
const WORK_SH: &str = r#"first=$(head -n 1 starts 2>/dev/null | cut -d' ' -f1)
alive=no
if [ -n "$first" ] && kill -0 "$first" 2>/dev/null; then alive=yes; fi
echo "$$ $PPID $alive" >> starts
if [ -e fast ]; then echo fast; exit 0; fi
( setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > grandchild )
sleep 300 &
echo $! > child
echo "$$ $PPID $(cat grandchild) $!" > ready.tmp
mv ready.tmp ready
wait
"#;

const CONFIG: &str = r#"
[run]
agent = "lead"

[models.script]
provider = "scripted"
file = "script.json"

[tools.work]
description = "Works for a long time."
input_schema = { type = "object" }
command = ["sh", "work.sh"]
timeout = "60s"

[agents.lead]
model = "script"
tools = ["work"]
"#;

/// A temp dir with the config, the script (the lead calls `work` once, then
/// says "done") and the tool.
fn scene() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), CONFIG).unwrap();
    std::fs::write(dir.path().join("work.sh"), WORK_SH).unwrap();
    let script = json!({"replies": [{"agent": "lead", "steps": [
        {"toolCalls": [{"name": "work", "input": {}}]},
        {"text": "done"}
    ]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    dir
}

/// Whether `pid` is a live process (not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z' | 'X' | 'x'))
        }
    }
}

/// Every live process whose working directory is `dir` (the tool and all
/// it started run there).
fn living_in(dir: &Path) -> Vec<u32> {
    let dir = dir.canonicalize().unwrap();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd == dir) && alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// The tool's `ready` line: (its shell, its parent (the keeper, or Arbor),
/// the setsid grandchild, the sleep child).
fn ready(dir: &Path) -> (u32, u32, u32, u32) {
    let text = poll(BOUND, || {
        std::fs::read_to_string(dir.join("ready"))
            .ok()
            .filter(|t| t.ends_with('\n'))
    })
    .expect("the tool never got going");
    let pids: Vec<u32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    (pids[0], pids[1], pids[2], pids[3])
}

fn starts(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("starts"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn spawn(dir: &Path, program: &str, args: &[&str]) -> Child {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn sigkill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

/// Kills (SIGKILL) whatever a failed test left running in `dir`.
struct Cleanup<'a>(&'a Path);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for pid in living_in(self.0) {
            sigkill(pid);
        }
    }
}

#[test]
fn kill_9_of_arbor_run_leaves_no_tool_process_or_setsid_grandchild_running() {
    let dir = scene();
    let _cleanup = Cleanup(dir.path());
    let mut run = spawn(
        dir.path(),
        env!("CARGO_BIN_EXE_arbor"),
        &[
            "run",
            "--config",
            "config.toml",
            "--store",
            "s.db",
            "--tree-id",
            "k9",
            "go",
        ],
    );
    let (shell, _parent, grandchild, child) = ready(dir.path());
    for pid in [shell, grandchild, child] {
        assert!(alive(pid), "process {pid} of the tool is not running");
    }
    run.kill().unwrap(); // SIGKILL
    run.wait().unwrap();
    let left = poll(BOUND, || {
        let left: Vec<u32> = [shell, grandchild, child]
            .into_iter()
            .chain(living_in(dir.path()))
            .filter(|p| alive(*p))
            .collect();
        left.is_empty().then_some(())
    });
    assert!(
        left.is_some(),
        "after kill -9 of arbor run these processes of the tool still run: {:?} \
         (shell {shell}, setsid grandchild {grandchild}, child {child})",
        living_in(dir.path())
    );
}

#[tokio::test]
async fn a_setsid_grandchild_does_not_outlive_its_command_tool_call() {
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = Cleanup(dir.path());
    let tool = toml::from_str::<CommandToolSection>(&format!(
        "description = \"forks\"\ncommand = [\"sh\", \"-c\", \"( setsid sleep 300 & echo $! > grandchild ); echo started\"]\ncwd = {:?}\ntimeout = \"20s\"\n[input_schema]\ntype = \"object\"\n",
        dir.path().display().to_string()
    ))
    .unwrap()
    .build("forks", dir.path())
    .unwrap();
    let ctx = ToolContext {
        tree_id: "setsid".parse().unwrap(),
        run_id: "setsid/0".parse().unwrap(),
        agent_type: "tester".into(),
        call_id: format!("call-{}", std::process::id()),
        workspace: None,
    };
    let out = tokio::time::timeout(BOUND, tool.call(json!({}), ctx))
        .await
        .expect("the call did not end in time");
    let Ok(ToolOutput::Json(Value::String(text))) = out else {
        panic!("expected the tool's stdout, got {out:?}");
    };
    assert!(text.starts_with("started"), "{text}");
    assert!(
        !text.contains("stopped reading"),
        "the grandchild held the output open: {text}"
    );
    let grandchild: u32 = std::fs::read_to_string(dir.path().join("grandchild"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let gone = poll(BOUND, || (!alive(grandchild)).then_some(()));
    assert!(
        gone.is_some(),
        "the setsid grandchild {grandchild} outlived the call"
    );
}

/// Runs `argv` under a python child subreaper, so that a process orphaned by
/// the SIGKILL of Arbor is re-parented to it (same session, another group)
/// and its process group is not orphaned: the kernel then does not wake a
/// stopped keeper with SIGHUP + SIGCONT, and the test decides when it runs.
const SUBREAPER_PY: &str = r#"
import ctypes, os, sys
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
"#;

/// Reads `child`'s stderr lines on a thread; `rx` gets each line.
fn lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

#[test]
fn a_resumed_call_is_not_started_again_while_its_earlier_attempt_lives() {
    let dir = scene();
    let _cleanup = Cleanup(dir.path());
    std::fs::write(dir.path().join("subreaper.py"), SUBREAPER_PY).unwrap();
    let mut helper = spawn(
        dir.path(),
        "python3",
        &[
            "subreaper.py",
            env!("CARGO_BIN_EXE_arbor"),
            "run",
            "--config",
            "config.toml",
            "--store",
            "s.db",
            "--tree-id",
            "r1",
            "go",
        ],
    );
    let (shell, keeper, grandchild, _child) = ready(dir.path());
    // The earlier attempt stays alive: its keeper is stopped before Arbor dies.
    let stat = std::fs::read_to_string(format!("/proc/{keeper}/stat")).unwrap();
    let arbor: u32 = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let _ = Command::new("kill")
        .args(["-STOP", &keeper.to_string()])
        .status();
    sigkill(arbor);
    // The tool's next start is quick.
    std::fs::write(dir.path().join("fast"), "").unwrap();
    assert!(alive(shell) && alive(grandchild), "the first attempt died");

    let mut resume = spawn(
        dir.path(),
        env!("CARGO_BIN_EXE_arbor"),
        &["resume", "r1", "--store", "s.db", "--json"],
    );
    let stderr = lines(&mut resume);
    // Either the resumed call says it waits, or (the bug) it starts again.
    let deadline = std::time::Instant::now() + BOUND;
    let mut log = Vec::new();
    let waited = loop {
        if starts(dir.path()).len() > 1 {
            break false;
        }
        if let Ok(line) = stderr.recv_timeout(Duration::from_millis(50)) {
            let found = line.contains("an earlier attempt of this call");
            log.push(line);
            if found {
                break true;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the resumed call neither waited nor started: {log:?}"
        );
    };
    assert!(
        waited,
        "the call was started again while its earlier attempt (shell {shell}) ran: starts {:?}, log {log:?}",
        starts(dir.path())
    );
    assert_eq!(starts(dir.path()).len(), 1, "{log:?}");
    assert!(alive(shell), "the earlier attempt ended by itself");

    // The keeper runs again: it sees Arbor gone, ends the first attempt, and
    // only then does the resumed call start.
    let _ = Command::new("kill")
        .args(["-CONT", &keeper.to_string()])
        .status();
    let out = resume.wait_with_output().unwrap();
    let result: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(result["status"], "completed", "{result}");
    let starts = starts(dir.path());
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert!(
        starts[1].ends_with(" no"),
        "the second attempt started while the first one's shell lived: {starts:?}"
    );
    for pid in [shell, grandchild, keeper] {
        assert!(!alive(pid), "process {pid} of the first attempt still runs");
    }
    helper.wait().unwrap();
}

/// An MCP server over stdio that double-forks a `setsid sleep` grandchild
/// when it starts and never answers `tools/call` (it writes `called`).
const MCP_PY: &str = r#"
import json, os, sys
os.system("( setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > mcp_grandchild )")
with open("mcp_grandchild") as f:
    grandchild = f.read().strip()
with open("mcp_ready.tmp", "w") as f:
    f.write(f"{os.getpid()} {grandchild}\n")
os.rename("mcp_ready.tmp", "mcp_ready")
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, mid = msg.get("method"), msg["id"]
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "py", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "hang", "inputSchema": {"type": "object"}}]}
    elif method == "tools/call":
        open("called", "w").close()
        continue
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}) + "\n")
    sys.stdout.flush()
"#;

#[test]
fn kill_9_of_arbor_run_leaves_no_mcp_server_or_its_grandchild_running() {
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = Cleanup(dir.path());
    std::fs::write(dir.path().join("server.py"), MCP_PY).unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        r#"
[run]
agent = "lead"

[models.script]
provider = "scripted"
file = "script.json"

[mcp_servers.py]
command = "python3"
args = ["server.py"]

[agents.lead]
model = "script"
tools = ["py/*"]
"#,
    )
    .unwrap();
    let script = json!({"replies": [{"agent": "lead", "steps": [
        {"toolCalls": [{"name": "py__hang", "input": {}}]},
        {"text": "done"}
    ]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let mut run = spawn(
        dir.path(),
        env!("CARGO_BIN_EXE_arbor"),
        &["run", "--config", "config.toml", "--store", "s.db", "go"],
    );
    // The call is in flight at the server.
    poll(BOUND, || dir.path().join("called").exists().then_some(()))
        .expect("the MCP call never reached the server");
    let ready = std::fs::read_to_string(dir.path().join("mcp_ready")).unwrap();
    let pids: Vec<u32> = ready
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    let (server, grandchild) = (pids[0], pids[1]);
    assert!(alive(server) && alive(grandchild));
    run.kill().unwrap(); // SIGKILL
    run.wait().unwrap();
    let left = poll(BOUND, || {
        let left: Vec<u32> = [server, grandchild]
            .into_iter()
            .chain(living_in(dir.path()))
            .filter(|p| alive(*p))
            .collect();
        left.is_empty().then_some(())
    });
    assert!(
        left.is_some(),
        "after kill -9 of arbor run the MCP server {server} or its setsid grandchild {grandchild} still runs: {:?}",
        living_in(dir.path())
    );
}
