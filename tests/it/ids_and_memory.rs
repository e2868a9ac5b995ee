//! Issue 33, items 9 and 10: tree ids that cannot collide (and the old ones
//! still work), and `arbor serve` reading many trees at once without keeping
//! a thread, and its allocator memory, per read.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use serde_json::Value;

use crate::serve::{Server, TOKEN};
use crate::support::{listening_pid, poll, raise_open_files_limit};
use crate::{arbor_in, fixtures, text};

/// How long any one wait may take before the test fails (never a pass).
const GUARD: Duration = Duration::from_secs(60);

/// The trees of `tests/fixtures/store/old-tree-ids.db`, written by the build
/// before issue 33 (commit adc3458) with `tests/fixtures/crash.toml` and ids
/// it generated (`t` and 12 hex digits): the first ran to the end, the
/// second was killed (SIGKILL) after 60 events. Then both owners were
/// renamed to a boot no machine has, so the second reads as interrupted
/// anywhere, and their config origin to a bare `crash.toml`, so no path of
/// the machine that wrote it is in the file.
const OLD_COMPLETED: &str = "td1314585eeba";
const OLD_INTERRUPTED: &str = "te5c47d1e7a51";

/// A scratch directory holding a copy of the old store as `s.db`, and the
/// config and script its trees name (relative: they resolve from the
/// directory the commands run in).
fn old_store() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixtures().join("store/old-tree-ids.db"),
        dir.path().join("s.db"),
    )
    .unwrap();
    for file in ["crash.toml", "crash.json"] {
        std::fs::copy(fixtures().join(file), dir.path().join(file)).unwrap();
    }
    dir
}

fn json_out(output: &std::process::Output) -> Value {
    assert!(
        output.status.success(),
        "stdout: {}\nstderr: {}",
        text(&output.stdout),
        text(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Whether `id` is a tree id this build generates: `t` and 32 lowercase
/// hex digits.
fn generated(id: &str) -> bool {
    id.len() == 33
        && id.starts_with('t')
        && id[1..]
            .bytes()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// Trees stored with the old 12-digit ids list, read, replay and resume
/// as before, and a tree started in the same store gets a new 128-bit id
/// and lists first.
#[test]
fn a_store_with_tree_ids_of_the_old_format_lists_replays_and_resumes_them() {
    let dir = old_store();
    let at = dir.path();
    let runs = json_out(&arbor_in(at, &["runs", "--store", "s.db", "--json"]));
    let status = |runs: &Value, tree: &str| {
        runs.as_array()
            .unwrap()
            .iter()
            .find(|t| t["treeId"] == tree)
            .unwrap_or_else(|| panic!("no tree {tree} in {runs}"))["status"]
            .clone()
    };
    assert_eq!(status(&runs, OLD_COMPLETED), "completed");
    assert_eq!(status(&runs, OLD_INTERRUPTED), "interrupted");

    let replay = arbor_in(at, &["replay", OLD_COMPLETED, "--store", "s.db"]);
    // Issue 34: a child that inherits its parent's toolbox (the scribe) is
    // no longer offered the parent's spawn tools, which refused its every
    // call; the old build recorded them. That is the one divergence allowed.
    let said = text(&replay.stdout);
    assert!(
        said.starts_with("match: 36 runs")
            || said.starts_with(&format!(
                "mismatch: run {OLD_COMPLETED}/0.1.6 (scribe): toolDefinitions differs"
            )),
        "{said}{}",
        text(&replay.stderr)
    );
    let root = json_out(&arbor_in(
        at,
        &[
            "show",
            &format!("{OLD_COMPLETED}/0"),
            "--store",
            "s.db",
            "--json",
        ],
    ));
    assert_eq!(root["runId"], format!("{OLD_COMPLETED}/0"), "{root}");

    let resumed = json_out(&arbor_in(
        at,
        &["resume", OLD_INTERRUPTED, "--store", "s.db", "--json", "-q"],
    ));
    assert_eq!(resumed["status"], "completed", "{resumed}");
    let tree = json_out(&arbor_in(
        at,
        &["tree", OLD_INTERRUPTED, "--store", "s.db", "--json"],
    ));
    assert_eq!(tree["runs"].as_array().unwrap().len(), 36, "{tree}");

    // A new tree beside them: a generated id of the new form, listed first
    // (newest), and read back by it.
    let new = arbor_in(
        at,
        &[
            "run",
            "--config",
            "crash.toml",
            "--store",
            "s.db",
            "--json",
            "-q",
            "go",
        ],
    );
    let new = json_out(&new);
    let new_run = new["runId"].as_str().unwrap().to_owned();
    let (new_tree, root) = new_run.split_once('/').unwrap();
    assert!(generated(new_tree), "{new_run}");
    assert_eq!(root, "0");
    let runs = json_out(&arbor_in(at, &["runs", "--store", "s.db", "--json"]));
    let listed: Vec<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["treeId"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 3, "{runs}");
    assert_eq!(listed[0], new_tree, "{runs}");
    assert_eq!(status(&runs, OLD_INTERRUPTED), "completed");
    let table = text(&arbor_in(at, &["runs", "--store", "s.db"]).stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&format!("{new_tree} "))),
        "{table}"
    );
    let tree = json_out(&arbor_in(
        at,
        &["tree", new_tree, "--store", "s.db", "--json"],
    ));
    assert_eq!(tree["runs"].as_array().unwrap().len(), 36, "{tree}");
}

/// How many threads process `pid` has.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

/// `GET path` on `addr` over a connection of its own (opened before the
/// barrier, the request sent after it, so every read arrives at once);
/// answers the status line and the body.
fn get_at_once(addr: &str, path: &str, barrier: &Barrier) -> (String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(GUARD)).unwrap();
    stream.set_write_timeout(Some(GUARD)).unwrap();
    barrier.wait();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, body.to_owned())
}

/// Issue 33: 300 `GET /v1/trees/{id}` at once made `arbor serve` start a
/// blocking thread for nearly every one (~250), and each kept its
/// allocator memory: 38 MB at start, 470-690 MB idle after. The reads now
/// share a few threads (tokio's threads live on 10 s after their last task,
/// so those counted just after the reads are all it started). Served on the
/// old store: its interrupted tree resumes under `arbor serve` too.
#[test]
fn reading_300_trees_at_once_leaves_no_thread_per_read_holding_memory() {
    const READS: usize = 300;
    raise_open_files_limit(READS as u64 + 256);
    let dir = old_store();
    let config = fixtures().join("serve.toml").display().to_string();
    let mut server = Server::start(
        dir.path(),
        &["--config", &config, "--store", "s.db"],
        Some(TOKEN),
    );
    server.wait_for("ready");
    let addr = server.base.trim_start_matches("http://").to_owned();
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let pid = listening_pid(port).expect("the server's pid");

    // The old interrupted tree resumes here and ends.
    let finished = poll(GUARD, || {
        let barrier = Barrier::new(1);
        let (status, body) = get_at_once(&addr, &format!("/v1/trees/{OLD_INTERRUPTED}"), &barrier);
        let view: Value = serde_json::from_str(&body).ok()?;
        (status.contains(" 200 ") && view["tree"]["status"] == "completed").then_some(view)
    })
    .expect("the old interrupted tree completes under arbor serve");
    assert_eq!(finished["nodes"].as_array().unwrap().len(), 36);

    let before = threads(pid);
    let barrier = Arc::new(Barrier::new(READS));
    let readers: Vec<_> = (0..READS)
        .map(|i| {
            let barrier = barrier.clone();
            let addr = addr.clone();
            let tree = [OLD_COMPLETED, OLD_INTERRUPTED][i % 2];
            std::thread::spawn(move || {
                (
                    tree,
                    get_at_once(&addr, &format!("/v1/trees/{tree}"), &barrier),
                )
            })
        })
        .collect();
    for reader in readers {
        let (tree, (status, body)) = reader.join().unwrap();
        assert!(status.contains(" 200 "), "{tree}: {status} {body}");
        let view: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(view["tree"]["treeId"], tree, "{body}");
    }
    let after = threads(pid);
    // The runtime's blocking threads (8) and a few to spare; it was ~250.
    assert!(
        after <= before + 16,
        "arbor serve had {before} threads before {READS} reads at once and {after} after"
    );
}

/// Issue 33: an idle `arbor serve` grew by 11 MB in seconds with no CPU
/// spent: mimalloc asks for transparent huge pages on its arenas, and the
/// kernel's khugepaged then fills each 2 MiB region a few pages of which are
/// in use. A service turns them off for itself (the freed memory it gives
/// back when idle would be filled again otherwise).
#[test]
fn an_idle_service_asks_for_no_huge_pages_that_would_fill_its_memory() {
    let dir = tempfile::tempdir().unwrap();
    let config = fixtures().join("serve.toml").display().to_string();
    let mut server = Server::start(
        dir.path(),
        &["--config", &config, "--store", "s.db"],
        Some(TOKEN),
    );
    server.wait_for("ready");
    let addr = server.base.trim_start_matches("http://").to_owned();
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let pid = listening_pid(port).expect("the server's pid");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    // Linux 5.0 and later say whether a process may have huge pages.
    let Some(line) = status.lines().find(|l| l.starts_with("THP_enabled:")) else {
        eprintln!("this kernel does not say (no THP_enabled in /proc/PID/status)");
        return;
    };
    assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
}
