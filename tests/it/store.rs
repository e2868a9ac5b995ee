//! Durable runs through the binary: kill -9 and resume, replay, browsing, and
//! bad store files.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::{arbor_in, fixtures, text};

fn spawn_in(dir: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn crash_config() -> String {
    fixtures().join("crash.toml").display().to_string()
}

/// Reads a child's JSON event lines until `stop` says so, then kills it with
/// SIGKILL. Returns whether it was killed (false: it finished first).
fn kill_when(mut child: Child, mut stop: impl FnMut(&Value) -> bool) -> bool {
    let stderr = child.stderr.take().unwrap();
    let mut killed = false;
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap();
        let Ok(event) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if stop(&event) {
            child.kill().unwrap();
            killed = true;
            break;
        }
    }
    let status = child.wait().unwrap();
    killed && !status.success()
}

fn counter(kind: &'static str, n: usize) -> impl FnMut(&Value) -> bool {
    let mut seen = 0;
    move |e| {
        if e["type"] == kind {
            seen += 1;
        }
        seen >= n
    }
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

/// The backends the CLI's store tests run on: each test runs once on
/// SQLite files and once on a fresh Postgres database (`ARBOR_PG_URL`; fails
/// without it, never skips).
#[derive(Clone, Copy)]
enum Backend {
    Sqlite,
    Postgres,
}

/// The tests `name::sqlite` and `name::postgres`, each running `body` on its
/// backend.
macro_rules! on_both_backends {
    ($($name:ident => $body:ident,)*) => {$(
        mod $name {
            #[test]
            fn sqlite() {
                super::$body(super::Backend::Sqlite);
            }
            #[test]
            fn postgres() {
                super::$body(super::Backend::Postgres);
            }
        }
    )*};
}

on_both_backends! {
    a_tree_killed_five_times_and_resumed_ends_like_an_uninterrupted_one => killed_five_times_and_resumed,
    runs_show_tree_and_gc_read_the_store => browse_the_store,
    two_processes_can_write_one_store_at_once => two_processes_write_one_store,
}

/// One store of a test: what `--store` takes, and the database it owns.
struct StoreAt {
    arg: String,
    _db: Option<crate::support::PgDatabase>,
}

impl StoreAt {
    /// The store `name` of the test `test`: the file `name.db` in the
    /// test's directory, or a fresh database `arbor_{test}_{name}_…`
    /// (dropped with this).
    fn new(backend: Backend, test: &str, name: &str) -> StoreAt {
        match backend {
            Backend::Sqlite => StoreAt {
                arg: format!("{name}.db"),
                _db: None,
            },
            Backend::Postgres => {
                let db = crate::support::PgDatabase::new(&format!("{test}_{name}"));
                StoreAt {
                    arg: db.url(),
                    _db: Some(db),
                }
            }
        }
    }

    fn arg(&self) -> &str {
        &self.arg
    }
}

/// On Postgres, nothing was stored in SQLite files in `dir` by mistake.
fn no_sqlite_files_on_postgres(backend: Backend, dir: &Path) {
    if let Backend::Postgres = backend {
        let files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().contains(".db"))
            .collect();
        assert!(files.is_empty(), "SQLite files on Postgres: {files:?}");
    }
}

fn killed_five_times_and_resumed(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let config = crash_config();
    let whole = StoreAt::new(backend, "kill", "whole");
    let crash = StoreAt::new(backend, "kill", "crash");
    let uninterrupted = json_out(&arbor_in(
        dir.path(),
        &[
            "run",
            "--config",
            &config,
            "--store",
            whole.arg(),
            "--tree-id",
            "crash",
            "--json",
            "-q",
            "go",
        ],
    ));
    assert_eq!(uninterrupted["status"], "completed");
    assert_eq!(uninterrupted["childRunIds"].as_array().unwrap().len(), 5);

    // Five kill points, each chosen from the events the process printed.
    let run = [
        "run",
        "--config",
        &config,
        "--store",
        crash.arg(),
        "--tree-id",
        "crash",
        "--json",
        "--events",
        "go",
    ];
    let resume = [
        "resume",
        "crash",
        "--config",
        &config,
        "--store",
        crash.arg(),
        "--json",
        "--events",
    ];
    // Progress is counted across processes: runs that finished, by id (a
    // resumed run that had finished is merged, not started, so it is not
    // reported again).
    let finished = std::rc::Rc::new(std::cell::RefCell::new(std::collections::HashSet::new()));
    let done = |at: usize| {
        let finished = finished.clone();
        move |e: &Value| {
            if e["type"] == "agentFinished" {
                finished
                    .borrow_mut()
                    .insert(e["runId"].as_str().unwrap().to_owned());
            }
            finished.borrow().len() >= at
        }
    };
    type Point = Box<dyn FnMut(&Value) -> bool>;
    let mut points: Vec<Point> = vec![
        // The root and one worker have started.
        Box::new(counter("agentStarted", 2)),
        // Six agents have finished.
        Box::new(done(6)),
        // Mid-step: right after a model reply once twelve have finished,
        // before that reply's tools ran.
        Box::new({
            let enough = done(12);
            move |e: &Value| enough(e) && e["type"] == "modelResponded"
        }),
        // Twenty have finished.
        Box::new(done(20)),
        // Thirty have finished (the last workers, scribes and the root are left).
        Box::new(done(30)),
    ];
    for (i, point) in points.iter_mut().enumerate() {
        let args: &[&str] = if i == 0 { &run } else { &resume };
        let killed = kill_when(spawn_in(dir.path(), args), point);
        assert!(
            killed,
            "kill point {i} was never reached: the tree finished first"
        );
        let runs = arbor_in(dir.path(), &["runs", "--store", crash.arg(), "--json"]);
        let runs = json_out(&runs);
        assert_eq!(runs[0]["status"], "interrupted", "after kill {i}: {runs}");
    }
    let resumed = json_out(&arbor_in(
        dir.path(),
        &[
            "resume",
            "crash",
            "--config",
            &config,
            "--store",
            crash.arg(),
            "--json",
            "-q",
        ],
    ));
    assert_eq!(resumed, uninterrupted);

    // Every agent is accounted for, and none ran again after it had finished.
    let tree = json_out(&arbor_in(
        dir.path(),
        &["tree", "crash", "--store", crash.arg(), "--json"],
    ));
    let runs = tree["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 36);
    assert!(runs.iter().all(|r| r["status"] == "completed"), "{tree}");
    // A process killed right away may not have recorded its resume.
    let resumes = tree["tree"]["resumes"].as_u64().unwrap();
    assert!((1..=5).contains(&resumes), "{resumes}");
    let export = json_out(&arbor_in(
        dir.path(),
        &["export", "crash", "--store", crash.arg()],
    ));
    let mut finished = std::collections::HashSet::new();
    for event in export["events"].as_array().unwrap() {
        let run = event["runId"].as_str().unwrap().to_owned();
        if event["type"] == "agentStarted" {
            assert!(
                !finished.contains(&run),
                "{run} started again after it finished"
            );
        }
        if event["type"] == "agentFinished" {
            assert!(finished.insert(run.clone()), "{run} finished twice");
        }
    }
    assert_eq!(finished.len(), 36);
    // Same spend as the uninterrupted run: no reply was paid for twice.
    let whole = json_out(&arbor_in(
        dir.path(),
        &["tree", "crash", "--store", whole.arg(), "--json"],
    ));
    assert_eq!(tree["tree"]["inputTokens"], whole["tree"]["inputTokens"]);
    assert_eq!(tree["tree"]["cost"], whole["tree"]["cost"]);
    no_sqlite_files_on_postgres(backend, dir.path());
}

#[test]
fn replay_matches_and_names_the_first_agent_that_diverges_after_an_edit() {
    let dir = tempfile::tempdir().unwrap();
    let config = crash_config();
    let run = arbor_in(
        dir.path(),
        &["run", "--config", &config, "--tree-id", "r1", "-q", "go"],
    );
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(dir.path().join("arbor.db").is_file(), "stored by default");
    let replay = arbor_in(dir.path(), &["replay", "r1"]);
    assert!(
        replay.status.success(),
        "{}{}",
        text(&replay.stdout),
        text(&replay.stderr)
    );
    assert!(
        text(&replay.stdout).starts_with("match: 36 runs"),
        "{}",
        text(&replay.stdout)
    );

    // Edit one recorded reply: worker 0.3's last step (3) says something else.
    // Segments are LZ4-compressed JSON arrays of records; a model call is
    // {"r": run, "s": step, "m": message id}, a message {"m": id, "b": body}.
    let db = rusqlite::Connection::open(dir.path().join("arbor.db")).unwrap();
    let segments: Vec<(i64, Vec<u8>)> = db
        .prepare("SELECT n, body FROM segments WHERE tree_id = 'r1' ORDER BY n")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut edited = 0;
    for (n, body) in segments {
        let json = lz4_flex::decompress_size_prepended(&body).unwrap();
        let mut records: Vec<Value> = serde_json::from_slice(&json).unwrap();
        let at = records
            .iter()
            .position(|r| r["r"] == "r1/0.3" && r["s"] == 3);
        let Some(at) = at else { continue };
        records[at]["m"] = serde_json::json!(999_999);
        records.push(serde_json::json!({"m": 999_999, "b": {"role": "assistant", "content": "worker edited"}}));
        let packed =
            lz4_flex::compress_prepend_size(serde_json::to_string(&records).unwrap().as_bytes());
        edited += db
            .execute(
                "UPDATE segments SET body = ?1 WHERE tree_id = 'r1' AND n = ?2",
                rusqlite::params![packed, n],
            )
            .unwrap();
    }
    assert_eq!(edited, 1);
    drop(db);
    let replay = arbor_in(dir.path(), &["replay", "r1"]);
    assert_eq!(replay.status.code(), Some(1), "{}", text(&replay.stderr));
    let out = text(&replay.stdout);
    assert!(
        out.starts_with("mismatch: run r1/0.3 (worker): message "),
        "{out}"
    );
    assert!(out.contains("worker edited"), "{out}");
}

fn browse_the_store(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreAt::new(backend, "browse", "s");
    let arbor_in = |dir: &Path, args: &[&str]| with_store(dir, &store, args);
    let config = fixtures().join("scripted.toml").display().to_string();
    for id in ["a1", "a2"] {
        let out = arbor_in(
            dir.path(),
            &["run", "--config", &config, "--tree-id", id, "-q", "go"],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let out = arbor_in(dir.path(), &["runs"]);
    let table = text(&out.stdout);
    assert!(table.starts_with("TREE"), "{table}");
    assert_eq!(table.lines().count(), 3, "{table}");
    assert!(
        table.contains("a1") && table.contains("completed"),
        "{table}"
    );
    let limited = json_out(&arbor_in(dir.path(), &["runs", "--limit", "1", "--json"]));
    assert_eq!(limited.as_array().unwrap().len(), 1);
    assert_eq!(limited[0]["treeId"], "a2", "newest first");
    assert_eq!(limited[0]["agents"], 5);
    let failed = json_out(&arbor_in(
        dir.path(),
        &["runs", "--status", "failed", "--json"],
    ));
    assert_eq!(failed.as_array().unwrap().len(), 0);
    let bad = arbor_in(dir.path(), &["runs", "--status", "weird"]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("--status"),
        "{}",
        text(&bad.stderr)
    );

    let state = json_out(&arbor_in(dir.path(), &["show", "a1/0", "--json"]));
    assert_eq!(state["runId"], "a1/0");
    assert_eq!(state["status"], "completed");
    assert_eq!(state["childRunIds"].as_array().unwrap().len(), 3);
    let show = text(&arbor_in(dir.path(), &["show", "a1/0.1"]).stdout);
    assert!(show.starts_with("worker a1/0.1 (completed)"), "{show}");

    let tree = text(&arbor_in(dir.path(), &["tree", "a1"]).stdout);
    let lines: Vec<&str> = tree.lines().collect();
    assert!(
        lines[0].starts_with("tree a1 (completed): 5 agents"),
        "{tree}"
    );
    assert!(
        lines[1].starts_with("✓ lead a1/0 completed: 2 steps"),
        "{tree}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("    ✓ helper a1/0.1.1")),
        "{tree}"
    );

    let gc = arbor_in(dir.path(), &["gc", "--older-than", "1d"]);
    assert_eq!(text(&gc.stdout).trim(), "removed 0 trees (0 segments)");
    let gc = arbor_in(dir.path(), &["gc", "--older-than", "0s"]);
    assert!(
        text(&gc.stdout).starts_with("removed 2 trees ("),
        "{}",
        text(&gc.stdout)
    );
    let after = json_out(&arbor_in(dir.path(), &["runs", "--json"]));
    assert_eq!(after.as_array().unwrap().len(), 0);
    let bad = arbor_in(dir.path(), &["gc", "--older-than", "soon"]);
    assert!(
        text(&bad.stderr).contains("--older-than"),
        "{}",
        text(&bad.stderr)
    );
    no_sqlite_files_on_postgres(backend, dir.path());
}

fn two_processes_write_one_store(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreAt::new(backend, "two", "s");
    let config = crash_config();
    let children: Vec<Child> = ["p1", "p2"]
        .iter()
        .map(|id| {
            spawn_in(
                dir.path(),
                &[
                    "run",
                    "--store",
                    store.arg(),
                    "--config",
                    &config,
                    "--tree-id",
                    id,
                    "-q",
                    "go",
                ],
            )
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    for id in ["p1", "p2"] {
        let tree = json_out(&with_store(dir.path(), &store, &["tree", id, "--json"]));
        assert_eq!(tree["tree"]["status"], "completed");
        assert_eq!(tree["runs"].as_array().unwrap().len(), 36);
    }
    no_sqlite_files_on_postgres(backend, dir.path());
}

/// Runs `arbor` in `dir` with `args` on `store` (`--store` right after the
/// command's name).
fn with_store(dir: &Path, store: &StoreAt, args: &[&str]) -> std::process::Output {
    let mut all = vec![args[0], "--store", store.arg()];
    all.extend_from_slice(&args[1..]);
    arbor_in(dir, &all)
}

/// Each is refused with one line and a non-zero exit, and the file is not touched.
#[test]
fn bad_store_files_and_unknown_trees_are_refused_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let check = |args: &[&str], file: Option<&str>, expect: &str| {
        let before = file.map(|f| std::fs::read(dir.path().join(f)).unwrap());
        let out = arbor_in(dir.path(), args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        if let (Some(file), Some(before)) = (file, before) {
            assert_eq!(
                std::fs::read(dir.path().join(file)).unwrap(),
                before,
                "{file} changed"
            );
            for suffix in ["-wal", "-journal"] {
                assert!(!dir.path().join(format!("{file}{suffix}")).exists());
            }
        }
    };
    // Not SQLite at all.
    std::fs::write(
        dir.path().join("junk.db"),
        b"this is not a database, just text\n".repeat(200),
    )
    .unwrap();
    check(
        &["runs", "--store", "junk.db"],
        Some("junk.db"),
        "is not an Arbor store",
    );
    let config = fixtures().join("scripted.toml").display().to_string();
    check(
        &["run", "--config", &config, "--store", "junk.db", "go"],
        Some("junk.db"),
        "is not an Arbor store",
    );
    // Another program's SQLite file.
    {
        let db = rusqlite::Connection::open(dir.path().join("other.db")).unwrap();
        db.execute_batch("CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes(body) VALUES ('hi');")
            .unwrap();
    }
    check(
        &["runs", "--store", "other.db"],
        Some("other.db"),
        "is not an Arbor store",
    );
    check(
        &["resume", "t1", "--store", "other.db"],
        Some("other.db"),
        "is not an Arbor store",
    );
    // A store from a newer Arbor.
    let out = arbor_in(
        dir.path(),
        &["run", "--config", &config, "--store", "new.db", "-q", "go"],
    );
    assert!(out.status.success());
    {
        let db = rusqlite::Connection::open(dir.path().join("new.db")).unwrap();
        db.pragma_update(None, "user_version", 99).unwrap();
        db.pragma_update(None, "journal_mode", "DELETE").unwrap();
    }
    check(
        &["runs", "--store", "new.db"],
        Some("new.db"),
        "written by a newer Arbor (schema version 99",
    );
    check(
        &["run", "--config", &config, "--store", "new.db", "go"],
        Some("new.db"),
        "upgrade arbor",
    );
    // A tree or run that is not there, and a store that is not there.
    arbor_in(
        dir.path(),
        &["run", "--config", &config, "--store", "ok.db", "-q", "go"],
    );
    check(
        &["resume", "nope", "--store", "ok.db"],
        None,
        "no tree nope in the store",
    );
    check(
        &["replay", "nope", "--store", "ok.db"],
        None,
        "no tree nope in the store",
    );
    check(
        &["tree", "nope", "--store", "ok.db"],
        None,
        "no tree nope in the store",
    );
    check(
        &["show", "nope/0", "--store", "ok.db"],
        None,
        "no run nope/0",
    );
    check(&["runs", "--store", "missing.db"], None, "no store there");
    assert!(!dir.path().join("missing.db").exists());
}

#[test]
fn a_finished_tree_is_not_resumed_and_no_store_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = fixtures().join("scripted.toml").display().to_string();
    let out = arbor_in(
        dir.path(),
        &["run", "--config", &config, "--tree-id", "f1", "go"],
    );
    assert!(
        text(&out.stderr).contains("arbor resume f1"),
        "{}",
        text(&out.stderr)
    );
    let twice = arbor_in(
        dir.path(),
        &["run", "--config", &config, "--tree-id", "f1", "go"],
    );
    assert!(!twice.status.success());
    assert!(
        text(&twice.stderr).contains("the store already has a tree f1"),
        "{}",
        text(&twice.stderr)
    );
    let again = arbor_in(dir.path(), &["resume", "f1"]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("tree f1 cannot be resumed: it already ended (completed)"),
        "{}",
        text(&again.stderr)
    );
    let other = tempfile::tempdir().unwrap();
    let out = arbor_in(
        other.path(),
        &["run", "--config", &config, "--no-store", "go"],
    );
    assert!(out.status.success());
    assert!(
        std::fs::read_dir(other.path()).unwrap().next().is_none(),
        "--no-store wrote a file"
    );
}

#[test]
fn a_truncated_store_and_one_with_a_broken_schema_version_each_get_their_own_message() {
    let dir = tempfile::tempdir().unwrap();
    let config = fixtures().join("scripted.toml").display().to_string();
    for name in ["cut.db", "v0.db", "vneg.db"] {
        let out = arbor_in(
            dir.path(),
            &["run", "--config", &config, "--store", name, "-q", "go"],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    // Truncated: past its header, but most of it gone.
    let cut = dir.path().join("cut.db");
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len().min(20_000)]).unwrap();
    let _ = std::fs::remove_file(dir.path().join("cut.db-wal"));
    let out = arbor_in(dir.path(), &["runs", "--store", "cut.db"]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(!err.contains("is not an Arbor store"), "{err}");
    assert!(err.contains("damaged (truncated or corrupt)"), "{err}");
    // A schema version of 0 or -1 on an Arbor store: named, no SQL printed.
    for (name, version) in [("v0.db", 0), ("vneg.db", -1)] {
        {
            let db = rusqlite::Connection::open(dir.path().join(name)).unwrap();
            db.pragma_update(None, "user_version", version).unwrap();
        }
        let out = arbor_in(dir.path(), &["runs", "--store", name]);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{name}");
        assert!(
            err.contains(&format!("its schema version is {version} (user_version)")),
            "{name}: {err}"
        );
        assert!(!err.contains("CREATE"), "{name}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: {err}");
    }
}

/// A store cut by its last page (`truncate -s $((size-4096))`) was opened
/// for writing and corrupted further: now every command that opens it,
/// for writing or reading, refuses it as damaged and leaves it as it is.
#[test]
fn a_store_cut_by_its_last_page_was_opened_for_writing_and_corrupted_further() {
    let dir = tempfile::tempdir().unwrap();
    let config = fixtures().join("scripted.toml").display().to_string();
    let out = arbor_in(
        dir.path(),
        &["run", "--config", &config, "--store", "cut.db", "-q", "go"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let cut = dir.path().join("cut.db");
    assert!(
        !dir.path().join("cut.db-wal").exists(),
        "the last close checkpointed"
    );
    let size = std::fs::metadata(&cut).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&cut).unwrap();
    file.set_len(size - 4096).unwrap();
    drop(file);
    for args in [
        vec![
            "run", "--config", &config, "--store", "cut.db", "-q", "again",
        ],
        vec!["runs", "--store", "cut.db"],
    ] {
        let out = arbor_in(dir.path(), &args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} opened it");
        assert!(err.contains("damaged (truncated or corrupt)"), "{err}");
        assert!(
            err.contains(&format!("it has {} bytes", size - 4096)),
            "{err}"
        );
    }
    assert_eq!(std::fs::metadata(&cut).unwrap().len(), size - 4096);
}

/// A quick two-agent tree on the simulated model.
const QUICK: &str = r#"
[run]
agent = "a"
[models.sim]
provider = "simulated"
fanout = 1
depth = 1
latency = "0"
[agents.a]
model = "sim"
spawnable_agents = ["b"]
[agents.b]
model = "sim"
"#;

/// A store `s.db` in `dir` holding the finished tree `t`.
fn quick_store(dir: &Path) -> std::path::PathBuf {
    std::fs::write(dir.join("quick.toml"), QUICK).unwrap();
    let out = arbor_in(
        dir,
        &[
            "run",
            "--config",
            "quick.toml",
            "--store",
            "s.db",
            "--tree-id",
            "t",
            "-q",
            "go",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    dir.join("s.db")
}

/// Leaves a write in the store's -wal, not yet in the file (as a process
/// that died, or one still running, leaves it): the tree's cost edited.
fn write_into_wal(store: &Path) {
    let db = rusqlite::Connection::open(store).unwrap();
    db.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )
    .unwrap();
    db.execute("UPDATE trees SET cost = 42.5 WHERE tree_id = 't'", [])
        .unwrap();
}

fn wal(store: &Path) -> std::path::PathBuf {
    store.with_file_name(format!(
        "{}-wal",
        store.file_name().unwrap().to_string_lossy()
    ))
}

/// A file's bytes and modification time.
fn snapshot(path: &Path) -> (Vec<u8>, std::time::SystemTime) {
    (
        std::fs::read(path).unwrap(),
        std::fs::metadata(path).unwrap().modified().unwrap(),
    )
}

/// The read-only commands, each expected to succeed on the store `s.db` of `dir`.
fn read_everything(dir: &Path) -> Vec<String> {
    [
        &["runs", "--store", "s.db", "--json"][..],
        &["tree", "t", "--store", "s.db", "--json"],
        &["show", "t/0", "--store", "s.db", "--json"],
        &["export", "t", "--store", "s.db"],
        &["replay", "t", "--store", "s.db", "--config", "quick.toml"],
    ]
    .iter()
    .map(|args| {
        let out = arbor_in(dir, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    })
    .collect()
}

/// Issue 12, defect 16: read-only commands opened the store for writing, so
/// the last of them to close folded the -wal into the file (a write) and one
/// on a read-only store was refused. They must read what the -wal holds and
/// change neither file.
#[test]
fn read_only_commands_leave_a_store_and_its_wal_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let store = quick_store(dir.path());
    write_into_wal(&store);
    let (file, wal_file) = (snapshot(&store), snapshot(&wal(&store)));
    assert!(!wal_file.0.is_empty(), "no write waits in the -wal");
    let outputs = read_everything(dir.path());
    assert!(outputs[0].contains("\"cost\": 42.5"), "{}", outputs[0]);
    assert!(outputs[4].starts_with("match: 2 runs"), "{}", outputs[4]);
    assert!(snapshot(&store) == file, "the store file was written");
    assert!(snapshot(&wal(&store)) == wal_file, "the -wal was written");
}

/// Issue 12, defect 16: a read-only command on a store of an older schema
/// reads it as it is (no migration, nothing written); a command that runs a
/// tree upgrades it.
#[test]
fn a_read_only_command_does_not_migrate_an_older_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = quick_store(dir.path());
    let version = |db: &rusqlite::Connection| -> i64 {
        db.pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap()
    };
    {
        // Schema version 1: before fencing epochs.
        let db = rusqlite::Connection::open(&store).unwrap();
        db.execute_batch(
            "ALTER TABLE trees DROP COLUMN epoch; ALTER TABLE trees DROP COLUMN config;
             DROP TABLE configs; DROP TABLE controls; ALTER TABLE segments DROP COLUMN last_seq;
             DROP INDEX trees_principal; ALTER TABLE trees DROP COLUMN principal;
             DROP TABLE queued_turns; DROP TABLE webhooks; PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let before = snapshot(&store);
    let outputs = read_everything(dir.path());
    assert!(outputs[0].contains("\"completed\""), "{}", outputs[0]);
    assert!(snapshot(&store) == before, "the older store was written");
    assert_eq!(version(&rusqlite::Connection::open(&store).unwrap()), 1);
    let out = arbor_in(
        dir.path(),
        &[
            "run",
            "--config",
            "quick.toml",
            "--store",
            "s.db",
            "--tree-id",
            "t2",
            "-q",
            "go",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let db = rusqlite::Connection::open(&store).unwrap();
    assert_eq!(version(&db), 10, "running a tree did not upgrade the store");
    let epoch: i64 = db
        .query_row("SELECT epoch FROM trees WHERE tree_id = 't2'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(epoch, 1);
}

/// Runs `arbor ARGS` in `dir` with `dir` mounted read-only (a bind mount in
/// a mount namespace of its own). `None` where this cannot be set up.
fn arbor_on_read_only_mount(dir: &Path, args: &[&str]) -> Option<std::process::Output> {
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let script = format!(
        "mount --bind -o ro '{d}' '{d}' || exit 97; cd '{d}' && exec '{bin}' {args}",
        d = dir.display(),
        bin = env!("CARGO_BIN_EXE_arbor"),
        args = quoted.join(" ")
    );
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .env_remove("RUST_LOG")
        .output()
        .ok()?;
    (out.status.code() != Some(97)).then_some(out)
}

/// Issue 12, defect 16: on a read-only filesystem a store reads (by
/// `runs`, `tree`, `show`, `export`); one whose -wal holds writes that
/// cannot be read there without a -shm gets a message that says so.
#[test]
fn read_only_commands_read_a_store_on_a_read_only_filesystem() {
    let dir = tempfile::tempdir().unwrap();
    let store = quick_store(dir.path());
    let Some(out) = arbor_on_read_only_mount(dir.path(), &["runs", "--store", "s.db"]) else {
        eprintln!("skipped: no read-only bind mount here (needs unshare -m and mount)");
        return;
    };
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("completed"),
        "{}",
        text(&out.stdout)
    );
    for args in [
        &["tree", "t", "--store", "s.db"][..],
        &["show", "t/0", "--store", "s.db"],
        &["export", "t", "--store", "s.db"],
    ] {
        let out = arbor_on_read_only_mount(dir.path(), args).unwrap();
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
    // Writes waiting in the -wal, its -shm index left behind too: read.
    write_into_wal(&store);
    let out = arbor_on_read_only_mount(dir.path(), &["runs", "--store", "s.db", "--json"]).unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("\"cost\": 42.5"),
        "{}",
        text(&out.stdout)
    );
    // Without the -shm, they cannot be read there: said so, in one line.
    let shm = store.with_file_name("s.db-shm");
    if shm.exists() {
        std::fs::remove_file(&shm).unwrap();
    }
    let out = arbor_on_read_only_mount(dir.path(), &["runs", "--store", "s.db"]).unwrap();
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("holds writes not yet in the store"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// Issue 12, defect 16: a writing command (`run`, `resume`, `gc`,
/// `migrate`) on a read-only filesystem said "cannot read it here": its own
/// message says it cannot write there, for a store that is there and for a
/// new one, in one line, and names the commands that do read it there.
#[test]
fn a_writing_command_on_a_read_only_filesystem_says_it_cannot_write_not_read() {
    let dir = tempfile::tempdir().unwrap();
    quick_store(dir.path());
    let run = [
        "run",
        "--config",
        "quick.toml",
        "--store",
        "s.db",
        "-q",
        "go",
    ];
    let Some(out) = arbor_on_read_only_mount(dir.path(), &run) else {
        eprintln!("skipped: no read-only bind mount here (needs unshare -m and mount)");
        return;
    };
    let mut outs = vec![(run.join(" "), out)];
    for args in [
        &[
            "run",
            "--config",
            "quick.toml",
            "--store",
            "new.db",
            "-q",
            "go",
        ][..],
        &["resume", "t", "--config", "quick.toml", "--store", "s.db"],
        &["gc", "--older-than", "1d", "--store", "s.db"],
        &["migrate", "--store", "s.db"],
    ] {
        outs.push((
            args.join(" "),
            arbor_on_read_only_mount(dir.path(), args).unwrap(),
        ));
    }
    for (args, out) in outs {
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args}: {err}");
        assert!(err.contains("cannot write it here"), "{args}: {err}");
        assert!(
            err.contains("read-only directory or filesystem"),
            "{args}: {err}"
        );
        assert!(!err.contains("cannot read"), "{args}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args}: {err}");
    }
    // Nothing was made there: no new store, no -wal or -shm beside the old one.
    assert!(!dir.path().join("new.db").exists());
    assert!(!wal(&dir.path().join("s.db")).exists());
}

#[test]
fn an_edited_config_does_not_change_a_resumed_tree_and_an_override_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    for file in ["crash.toml", "crash.json"] {
        std::fs::copy(fixtures().join(file), dir.path().join(file)).unwrap();
    }
    let start = |tree: &str| {
        let killed = kill_when(
            spawn_in(
                dir.path(),
                &[
                    "run",
                    "--config",
                    "crash.toml",
                    "--store",
                    "s.db",
                    "--tree-id",
                    tree,
                    "--events",
                    "go",
                ],
            ),
            counter("agentStarted", 2),
        );
        assert!(killed, "tree {tree} finished before the kill");
    };
    start("e1");
    // The file changes under the stored tree: no helpers any more (depth 1).
    let path = dir.path().join("crash.toml");
    let original = std::fs::read_to_string(&path).unwrap();
    let edited = original.replace("max_depth = 2", "max_depth = 1");
    assert_ne!(original, edited);
    std::fs::write(&path, &edited).unwrap();

    let resumed = json_out(&arbor_in(
        dir.path(),
        &["resume", "e1", "--store", "s.db", "--json", "-q"],
    ));
    assert_eq!(resumed["status"], "completed", "{resumed}");
    let tree = json_out(&arbor_in(
        dir.path(),
        &["tree", "e1", "--store", "s.db", "--json"],
    ));
    assert_eq!(
        tree["runs"].as_array().unwrap().len(),
        36,
        "the tree grew on the config it started with (depth 2), not the edited one"
    );
    let replay = arbor_in(dir.path(), &["replay", "e1", "--store", "s.db"]);
    assert!(
        text(&replay.stdout).starts_with("match: 36 runs"),
        "{}{}",
        text(&replay.stdout),
        text(&replay.stderr)
    );

    // An explicit --config is an override: said, and recorded with the tree.
    std::fs::write(&path, &original).unwrap();
    start("e2");
    std::fs::write(&path, &edited).unwrap();
    let out = arbor_in(
        dir.path(),
        &[
            "resume",
            "e2",
            "--store",
            "s.db",
            "--config",
            "crash.toml",
            "--json",
            "-q",
        ],
    );
    assert!(
        text(&out.stderr)
            .contains("note: tree e2 runs on crash.toml instead of the config it started with"),
        "{}",
        text(&out.stderr)
    );
    let db = rusqlite::Connection::open(dir.path().join("s.db")).unwrap();
    let stored = |tree: &str| -> String {
        db.query_row(
            "SELECT c.text FROM trees t JOIN configs c ON c.hash = t.config WHERE t.tree_id = ?1",
            [tree],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(stored("e1"), original, "e1 keeps what it started with");
    assert_eq!(stored("e2"), edited, "e2 records the override");
    // One row per distinct text.
    let configs: i64 = db
        .query_row("SELECT count(*) FROM configs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(configs, 2);
}

#[test]
fn an_interrupted_tree_counts_the_runs_it_started_and_its_resume_counts_none_twice() {
    let dir = tempfile::tempdir().unwrap();
    let config = crash_config();
    let run = [
        "run",
        "--config",
        &config,
        "--store",
        "a.db",
        "--tree-id",
        "ag",
        "--events",
        "go",
    ];
    // Killed once eight agents have started, before most have ended.
    assert!(kill_when(
        spawn_in(dir.path(), &run),
        counter("agentStarted", 8)
    ));
    let runs = json_out(&arbor_in(
        dir.path(),
        &["runs", "--config", &config, "--store", "a.db", "--json"],
    ));
    assert_eq!(runs[0]["status"], "interrupted", "{runs}");
    let started = runs[0]["agents"].as_u64().unwrap();
    let tree = json_out(&arbor_in(
        dir.path(),
        &[
            "tree", "ag", "--config", &config, "--store", "a.db", "--json",
        ],
    ));
    let listed = tree["runs"].as_array().unwrap();
    let ended = listed.iter().filter(|r| r["status"] != "running").count();
    assert!(
        started as usize == listed.len() && started as usize > ended,
        "an interrupted tree counts the runs `arbor tree` lists ({}), not only the {ended} that ended: {runs}",
        listed.len()
    );
    let table = text(
        &arbor_in(
            dir.path(),
            &["runs", "--config", &config, "--store", "a.db"],
        )
        .stdout,
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("ag ") && l.contains(&format!(" {started} "))),
        "{table}"
    );
    let resumed = arbor_in(
        dir.path(),
        &["resume", "ag", "--config", &config, "--store", "a.db", "-q"],
    );
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let runs = json_out(&arbor_in(
        dir.path(),
        &["runs", "--config", &config, "--store", "a.db", "--json"],
    ));
    assert_eq!(runs[0]["status"], "completed");
    assert_eq!(runs[0]["agents"], 36, "each run once: {runs}");
}

/// `tests/fixtures/store/before-issue-13.db` was written by the build before
/// issue 13's redesign (commit 6d20b50) with `tests/fixtures/crash.toml`: tree
/// `before13` ran to the end, tree `cut13` was killed (SIGKILL) after 60
/// events (then its owner was renamed to a boot no machine has, so it reads
/// as interrupted anywhere, and both trees' config origin to a bare
/// `crash.toml`, so no path of the machine that wrote it is in the file). This build lists both as that build did, replays the finished one
/// to a match, and resumes the cut one to the end of its 36 runs.
#[test]
fn a_store_written_by_the_build_before_the_redesign_lists_replays_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixtures().join("store/before-issue-13.db"),
        dir.path().join("s.db"),
    )
    .unwrap();
    // The trees record their config file as `crash.toml`, relative: its
    // script resolves from the directory the commands run in.
    for file in ["crash.toml", "crash.json"] {
        std::fs::copy(fixtures().join(file), dir.path().join(file)).unwrap();
    }
    let runs = json_out(&arbor_in(
        dir.path(),
        &["runs", "--store", "s.db", "--json"],
    ));
    let summary = |tree: &str| {
        runs.as_array()
            .unwrap()
            .iter()
            .find(|t| t["treeId"] == tree)
            .cloned()
            .unwrap_or_else(|| panic!("no tree {tree} in {runs}"))
    };
    assert_eq!(summary("before13")["status"], "completed");
    assert_eq!(summary("before13")["agents"], 36);
    assert_eq!(summary("cut13")["status"], "interrupted");

    let replay = arbor_in(dir.path(), &["replay", "before13", "--store", "s.db"]);
    // Issue 34: a child that inherits its parent's toolbox (the scribe) is
    // no longer offered the parent's spawn tools, which refused its every
    // call; that build recorded them. That is the one divergence allowed.
    let said = text(&replay.stdout);
    assert!(
        said.starts_with("match: 36 runs")
            || said.starts_with("mismatch: run before13/0.1.6 (scribe): toolDefinitions differs"),
        "{said}{}",
        text(&replay.stderr)
    );

    let resumed = json_out(&arbor_in(
        dir.path(),
        &["resume", "cut13", "--store", "s.db", "--json", "-q"],
    ));
    assert_eq!(resumed["status"], "completed", "{resumed}");
    let tree = json_out(&arbor_in(
        dir.path(),
        &["tree", "cut13", "--store", "s.db", "--json"],
    ));
    assert_eq!(tree["runs"].as_array().unwrap().len(), 36, "{tree}");
    let replay = arbor_in(dir.path(), &["replay", "cut13", "--store", "s.db"]);
    assert!(
        text(&replay.stdout).starts_with("match: 36 runs"),
        "{}{}",
        text(&replay.stdout),
        text(&replay.stderr)
    );
}

/// `arbor migrate` and `arbor store copy` (issue 16): a database made
/// Arbor's (schema version before and after, then up to date), every tree
/// of a SQLite file copied into it and back unchanged (listed, read and
/// replayed from each), a tree already there skipped and named, and the
/// password of the URL never printed. Needs `ARBOR_PG_URL` (fails without).
#[test]
fn migrate_and_store_copy_move_trees_between_sqlite_and_postgres() {
    let db = crate::support::PgDatabase::new("copy");
    // A password in the URL (trust auth ignores it): never printed.
    let url = db.url().replacen("://arbor@", "://arbor:hunter2@", 1);
    let dir = tempfile::tempdir().unwrap();
    let config = fixtures().join("scripted.toml").display().to_string();
    for id in ["c1", "c2"] {
        let out = arbor_in(
            dir.path(),
            &[
                "run",
                "--config",
                &config,
                "--store",
                "a.db",
                "--tree-id",
                id,
                "-q",
                "go",
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }

    let out = arbor_in(dir.path(), &["migrate", "--store", &url]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("schema version 0 -> "), "{said}");
    assert!(
        !said.contains("hunter2") && said.contains("arbor:***@"),
        "{said}"
    );
    let again = text(&arbor_in(dir.path(), &["migrate", "--store", &url]).stdout);
    assert!(again.contains("up to date"), "{again}");

    let out = arbor_in(dir.path(), &["store", "copy", "a.db", &url]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("copied 2 trees"), "{said}");
    assert!(!said.contains("hunter2"), "{said}");
    let listed = json_out(&arbor_in(dir.path(), &["runs", "--store", &url, "--json"]));
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["treeId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["c2", "c1"], "{listed}");
    let replay = arbor_in(dir.path(), &["replay", "c1", "--store", &url]);
    assert!(
        text(&replay.stdout).starts_with("match: 5 runs"),
        "{}{}",
        text(&replay.stdout),
        text(&replay.stderr)
    );
    // A tree the target has is skipped and named; a copy run again is no
    // failure (issue 34).
    let out = arbor_in(dir.path(), &["store", "copy", "a.db", &url, "--tree", "c1"]);
    assert!(out.status.success());
    assert!(
        text(&out.stderr).contains("skipped c1"),
        "{}",
        text(&out.stderr)
    );

    // And back, into a new SQLite file: the same trees, the same export.
    let out = arbor_in(dir.path(), &["store", "copy", &url, "b.db"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for id in ["c1", "c2"] {
        let a = json_out(&arbor_in(dir.path(), &["export", id, "--store", "a.db"]));
        let b = json_out(&arbor_in(dir.path(), &["export", id, "--store", "b.db"]));
        assert_eq!(a, b, "{id} came back unchanged");
    }
}
