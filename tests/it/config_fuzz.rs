//! The config fuzzer (issue 12): mutations of the shipped `config.toml`
//! (deleted lines, wrong types, duplicated keys, negative, zero, huge and NaN
//! numbers and durations, keys the file does not set). Whatever
//! `check-config` accepts, `arbor run` must run without a panic or an abort,
//! and end within its deadline plus [`GRACE`]; whatever it refuses, it
//! refuses with exit code 2 and a message.
//!
//! Every key is mutated, `deadline` and `max_agents` included, and every
//! valued line can get a wrong type (a string, a bool, a list or a table in
//! place of a number, and the other way round). An accepted config runs with
//! the store it configures, in the case's own directory (see
//! [`store_args`]), and with its deadline tightened to at most [`DEADLINE`]
//! (see [`tightened`]): a run that outlives that by [`GRACE`] ignored its
//! deadline, which is the hang.
//!
//! Deterministic: a fixed seed, no persisted failures. `ARBOR_FUZZ_CASES`
//! runs more or fewer random cases (the suite runs 300), after one pass over
//! every valued line of the file set to each value aimed at its kind.

use std::path::{Component, Path};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// The longest deadline a fuzzed run gets: the config's own when it is
/// shorter, else this. Long enough for the shipped tree (well under a
/// second), short enough that a run cut off by it (a legal latency of an
/// hour) costs little.
const DEADLINE: Duration = Duration::from_secs(3);

/// How long after its deadline a run may take to end: start-up, the cut-off
/// tree's cancellation and the store's last writes. Past it the run ignored
/// its deadline: a hang.
const GRACE: Duration = Duration::from_secs(30);

/// `check-config` answers within this, or it hung.
const CHECK_BOUND: Duration = Duration::from_secs(30);

/// The exhaustive pass runs this many cases at once (each one mostly waits
/// on its model's latency or its deadline).
const WORKERS: usize = 4;

/// Values a mutation puts in place of (or beside) a key's.
const VALUES: &[&str] = &[
    "-1",
    "0",
    "1",
    "-3",
    "1000000",
    "4294967296",
    "18446744073709551615",
    "99999999999999999999",
    "1e308",
    "-1.0",
    "nan",
    "inf",
    "-inf",
    "0.5",
    "\"0\"",
    "\"\"",
    "\"1ms\"",
    "\"99999999999999999999ms\"",
    "\"200000000000000d\"",
    "\"-1s\"",
    "\"1.5d\"",
    "\"1h30m\"",
    "\"lognormal:1s,1000\"",
    "\"lognormal:1ms,nan\"",
    "\"lognormal:1s,3\"",
    "\"x\"",
    "true",
    "[1, 2]",
    "[]",
    "{}",
    "{ retry = { max = 1000, backoff = \"1y\" } }",
];

/// Values aimed at one kind of key (half of the replacements use them).
const LATENCIES: &[&str] = &[
    "\"lognormal:1s,1000\"",
    "\"lognormal:1s,nan\"",
    "\"lognormal:1s,inf\"",
    "\"lognormal:1ms,50\"",
    "\"lognormal:99999999999999999999ms,1\"",
    "\"lognormal:1h,3\"",
    "\"lognormal:,\"",
    "\"3600s\"",
    "\"0.000001d\"",
];
const DURATIONS: &[&str] = &[
    "\"0\"",
    "\"0ms\"",
    "\"1ns\"",
    "\"1ms\"",
    "\"200000000000000d\"",
    "\"99999999999999999999ms\"",
    "\"1 year\"",
    "\"1.5d\"",
    "\"0.5w\"",
    "\"PT0S\"",
    "\"-0s\"",
];
const COUNTS: &[&str] = &[
    "0",
    "-1",
    "10000",
    "10001",
    "100000",
    "100000000",
    "1e3",
    "0x10",
];
const STRINGS: &[&str] = &[
    "\"\"",
    "\"x\"",
    "\"simulated\"",
    "\"analyst\"",
    "\"all_messages\"",
    "\"structured_output\"",
    "1",
    "true",
    "[]",
];
const BOOLS: &[&str] = &["false", "true", "\"true\"", "0", "[]"];
const LISTS: &[&str] = &[
    "[]",
    "[\"\"]",
    "[\"researcher\", \"researcher\"]",
    "[\"coordinator\"]",
    "[\"*\"]",
    "[\"nope\"]",
    "\"researcher\"",
    "[1]",
    "{}",
];
const TABLES: &[&str] = &[
    "\"report\"",
    "\"escalate\"",
    "\"retry\"",
    "{}",
    "{ retry = {} }",
    "{ retry = { max = 100, backoff = \"1h\" } }",
    "{ retry = { max = -1 } }",
    "{ retry = { max = 2, backoff = \"1.5d\" } }",
    "[]",
];
/// `[store] path`: the case's directory holds the store, unless a path
/// leaves it (then the run takes `--no-store`, see [`store_args`]).
const STORE_PATHS: &[&str] = &[
    "\"\"",
    "\".\"",
    "\"sub/a.db\"",
    "\"sub/../a.db\"",
    "\"../escape.db\"",
    "\"/abs/a.db\"",
    "\"c.toml\"",
    "\"a\\u0000b.db\"",
    "\"dir/\"",
    "\"sqlite://s.db\"",
    "\"~/a.db\"",
];

/// The aimed values for a key, by its name and, failing that, by the kind
/// of value it holds.
fn aimed(key: &str, value: &str) -> &'static [&'static str] {
    match key.trim() {
        "latency" => LATENCIES,
        "path" => STORE_PATHS,
        k if k.ends_with("timeout") || k == "deadline" => DURATIONS,
        _ => match value.trim_start().chars().next() {
            Some('"') => STRINGS,
            Some('[') => LISTS,
            Some('{') => TABLES,
            Some('t' | 'f') => BOOLS,
            _ => COUNTS,
        },
    }
}

/// Keys the shipped file does not set, each under the table it belongs to.
const EXTRA_KEYS: &[(&str, &str)] = &[
    ("[limits]", "max_tokens"),
    ("[limits]", "max_credits"),
    ("[limits]", "on_budget"),
    ("[models.sim]", "shape"),
    ("[models.sim]", "reply_tokens"),
    ("[agents.coordinator]", "context_window"),
    ("[agents.coordinator]", "compact_at"),
    ("[agents.coordinator]", "step_timeout"),
    ("[agents.coordinator]", "idle_timeout"),
    ("[agents.analyst]", "failure"),
    ("[agents.analyst]", "max_steps"),
    ("[store]", "path"),
    ("[store]", "url"),
    ("[service]", "shutdown_timeout"),
    ("[service]", "body_limit"),
];

#[derive(Clone, Debug)]
enum Mutation {
    Delete(Index),
    Replace(Index, Index, bool),
    Duplicate(Index),
    Insert(Index, Index, bool),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => any::<Index>().prop_map(Mutation::Delete),
        4 => (any::<Index>(), any::<Index>(), any::<bool>())
            .prop_map(|(l, v, aim)| Mutation::Replace(l, v, aim)),
        1 => any::<Index>().prop_map(Mutation::Duplicate),
        2 => (any::<Index>(), any::<Index>(), any::<bool>())
            .prop_map(|(k, v, aim)| Mutation::Insert(k, v, aim)),
    ]
}

/// The shipped config, as lines.
fn base() -> Vec<String> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml")).unwrap();
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for key in [
        "deadline",
        "max_agents",
        "path",
        "enabled",
        "spawnable_agents",
    ] {
        assert!(
            lines.iter().any(|l| key_of(l) == Some(key)),
            "config.toml sets no {key}"
        );
    }
    lines
}

/// The key a `key = value` line sets (not a comment, not a table header).
fn key_of(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    if trimmed.starts_with(['#', '[']) {
        return None;
    }
    line.split_once(" = ").map(|(key, _)| key.trim())
}

fn apply(mut lines: Vec<String>, mutations: &[Mutation]) -> String {
    for m in mutations {
        match m {
            Mutation::Delete(i) if !lines.is_empty() => {
                lines.remove(i.index(lines.len()));
            }
            Mutation::Duplicate(i) if !lines.is_empty() => {
                let n = i.index(lines.len());
                let line = lines[n].clone();
                lines.insert(n, line);
            }
            Mutation::Replace(i, v, aim) => {
                let keyed: Vec<usize> = (0..lines.len())
                    .filter(|&n| key_of(&lines[n]).is_some())
                    .collect();
                if !keyed.is_empty() {
                    let n = keyed[i.index(keyed.len())];
                    let (key, value) = lines[n].split_once(" = ").unwrap_or_default();
                    let pool = if *aim { aimed(key, value) } else { VALUES };
                    lines[n] = format!("{key} = {}", pool[v.index(pool.len())]);
                }
            }
            Mutation::Insert(k, v, aim) => {
                let (table, key) = EXTRA_KEYS[k.index(EXTRA_KEYS.len())];
                let pool = if *aim { aimed(key, "0") } else { VALUES };
                if let Some(n) = lines.iter().position(|l| l == table) {
                    lines.insert(n + 1, format!("{key} = {}", pool[v.index(pool.len())]));
                }
            }
            Mutation::Delete(_) | Mutation::Duplicate(_) => {}
        }
    }
    lines.join("\n") + "\n"
}

/// The config a case runs: `text` with `[limits] deadline` at most
/// [`DEADLINE`]. `arbor run` takes no limits on its command line (the HTTP
/// API's start request does, and they only tighten the config's), so the
/// run's copy of the file is tightened instead: a longer or missing
/// deadline is set to `DEADLINE`, a shorter one is kept. `text` is a config
/// `check-config` accepted.
fn tightened(text: &str) -> Result<String, String> {
    let within = |text: &str| -> Result<bool, String> {
        let table: toml::Table = text
            .parse()
            .map_err(|e| format!("check-config accepted what toml refuses ({e}):\n{text}"))?;
        let deadline = table
            .get("limits")
            .and_then(|limits| limits.get("deadline"))
            .and_then(toml::Value::as_str);
        Ok(deadline
            .and_then(|d| arbor_actors::duration::parse(d).ok())
            .is_some_and(|d| d <= DEADLINE))
    };
    if within(text)? {
        return Ok(text.to_owned());
    }
    let bound = format!("deadline = \"{}s\"", DEADLINE.as_secs());
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    match lines.iter().position(|l| l.trim_end() == "[limits]") {
        Some(header) => {
            let end = (header + 1..lines.len())
                .find(|&n| lines[n].trim_start().starts_with('['))
                .unwrap_or(lines.len());
            match (header + 1..end).find(|&n| key_of(&lines[n]) == Some("deadline")) {
                Some(n) => lines[n] = bound,
                None => lines.insert(header + 1, bound),
            }
        }
        None => lines.extend(["[limits]".to_owned(), bound]),
    }
    let text = lines.join("\n") + "\n";
    if within(&text)? {
        Ok(text)
    } else {
        Err(format!(
            "the fuzzer could not bound the deadline of:\n{text}"
        ))
    }
}

/// The store flag a case runs with: none (the store the config names, in the
/// case's directory), or `--no-store` when that store would be outside it (an
/// absolute path, one that climbs out with `..`, starts with `~`, or a URL).
fn store_args(text: &str) -> &'static [&'static str] {
    let Ok(table) = text.parse::<toml::Table>() else {
        return &["--no-store"];
    };
    let store = table.get("store");
    if store.and_then(|s| s.get("url")).is_some() {
        return &["--no-store"];
    }
    let path = store
        .and_then(|s| s.get("path"))
        .and_then(toml::Value::as_str)
        .unwrap_or("arbor.db");
    if path.starts_with('~') {
        // Not expanded by arbor today; never let a change make it $HOME.
        return &["--no-store"];
    }
    let path = match path.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("sqlite") => rest,
        Some(_) => return &["--no-store"],
        None => path,
    };
    let mut depth = 0i32;
    for component in Path::new(path).components() {
        depth += match component {
            Component::Normal(_) => 1,
            Component::CurDir => 0,
            Component::ParentDir => -1,
            Component::RootDir | Component::Prefix(_) => return &["--no-store"],
        };
        if depth < 0 {
            return &["--no-store"];
        }
    }
    &[]
}

/// What a case came to: refused by check-config, or accepted and run.
enum Outcome {
    Refused,
    Ran,
}

/// Checks `text`, and runs it if check-config accepts it; `Err` says how
/// arbor misbehaved.
fn check_and_run(text: &str) -> Result<Outcome, String> {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(&config, text).unwrap();
    let checked = arbor_bounded(dir.path(), &["check-config", "c.toml"], CHECK_BOUND);
    let (code, err) = checked.ok_or_else(|| format!("check-config hung on:\n{text}"))?;
    match code {
        Some(0) => {}
        Some(2) if err.contains("c.toml") => return Ok(Outcome::Refused),
        _ => return Err(format!("check-config ended {code:?} ({err}) on:\n{text}")),
    }
    let run = tightened(text)?;
    std::fs::write(&config, &run).unwrap();
    let mut args = vec!["run", "--config", "c.toml", "--quiet"];
    args.extend(store_args(&run));
    args.push("go");
    let bound = DEADLINE + GRACE;
    let ran = arbor_bounded(dir.path(), &args, bound);
    let (code, err) = ran.ok_or_else(|| {
        format!("arbor {args:?} ignored its deadline: still running after {bound:?} on:\n{run}")
    })?;
    // 0: the root completed; 1: it failed or hit a limit, and said so.
    // Anything else is a panic (101) or a signal such as an abort (None).
    if matches!(code, Some(0) | Some(1)) && !err.contains("panicked") {
        Ok(Outcome::Ran)
    } else {
        Err(format!("arbor {args:?} ended {code:?} ({err}) on:\n{run}"))
    }
}

/// The address space every fuzzed process gets (`ulimit -v`, in KiB): an
/// input that makes arbor allocate without bound aborts it (which the
/// oracle reports) instead of taking the machine's memory. A run of the
/// shipped tree needs well under a tenth of it.
const MEMORY_CAP_KIB: u64 = 2 * 1024 * 1024;

/// Runs `arbor args` in `dir` (under [`MEMORY_CAP_KIB`]); its exit code and
/// stderr, or `None` if it outlived `bound` (it is killed then).
fn arbor_bounded(dir: &Path, args: &[&str], bound: Duration) -> Option<(Option<i32>, String)> {
    // `sh` sets the cap and execs arbor: same process, so `pid` is arbor's.
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {MEMORY_CAP_KIB} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_arbor"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(bound) {
        Ok(out) => {
            let out = out.unwrap();
            Some((out.status.code(), crate::text(&out.stderr)))
        }
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            None
        }
    }
}

#[test]
fn no_single_out_of_range_value_passes_check_config_and_then_breaks_a_run() {
    // Every valued line of the shipped file (numbers, durations, strings,
    // bools, lists, tables), set in turn to every value aimed at its kind.
    let lines = base();
    let mut cases = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some((key, value)) = line.split_once(" = ").filter(|_| key_of(line).is_some()) else {
            continue;
        };
        for aimed_value in aimed(key, value) {
            let mut mutated = lines.clone();
            mutated[n] = format!("{key} = {aimed_value}");
            cases.push(mutated.join("\n") + "\n");
        }
    }
    let next = AtomicUsize::new(0);
    let (ran, failures) = (AtomicUsize::new(0), Mutex::new(Vec::new()));
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                while let Some(case) = cases.get(next.fetch_add(1, Ordering::Relaxed)) {
                    match check_and_run(case) {
                        Ok(Outcome::Ran) => {
                            ran.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Outcome::Refused) => {}
                        Err(why) => failures.lock().unwrap().push(why),
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} cases broke arbor; the first:\n{}",
        failures.len(),
        cases.len(),
        failures[0]
    );
    let ran = ran.into_inner();
    assert!(
        ran > 0 && ran < cases.len(),
        "{ran} of {} cases passed check-config",
        cases.len()
    );
}

#[test]
fn no_config_that_passes_check_config_panics_aborts_or_hangs_a_run() {
    let cases = std::env::var("ARBOR_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 64,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let lines = base();
    let (accepted, refused) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    runner
        .run(&prop::collection::vec(mutation(), 1..4), |mutations| {
            match check_and_run(&apply(lines.clone(), &mutations)) {
                Ok(Outcome::Ran) => accepted.set(accepted.get() + 1),
                Ok(Outcome::Refused) => refused.set(refused.get() + 1),
                Err(why) => return Err(TestCaseError::fail(why)),
            }
            Ok(())
        })
        .unwrap();
    // The mutations reach both sides of check-config.
    let (accepted, refused) = (accepted.get(), refused.get());
    assert!(
        accepted > 0 && refused > 0,
        "{accepted} accepted, {refused} refused"
    );
}

#[test]
fn the_fuzzer_tightens_the_deadline_and_keeps_the_store_in_the_case_directory() {
    // The harness's own rules, so the oracle above means what it says.
    let limits = "[limits]\ndeadline = \"5m\"\n\n[store]\npath = \"x.db\"\n";
    let tight = tightened(limits).unwrap();
    assert!(
        tight.contains("deadline = \"3s\"") && !tight.contains("5m"),
        "{tight}"
    );
    let short = "[limits]\ndeadline = \"1ms\"\n";
    assert_eq!(tightened(short).unwrap(), short);
    let missing = tightened("[store]\nenabled = true\n").unwrap();
    assert!(
        missing.ends_with("[limits]\ndeadline = \"3s\"\n"),
        "{missing}"
    );
    let inserted = tightened("[limits]\nmax_agents = 5\n[run]\n").unwrap();
    assert!(
        inserted.starts_with("[limits]\ndeadline = \"3s\"\nmax_agents = 5\n"),
        "{inserted}"
    );
    for (path, args) in [
        ("x.db", &[][..]),
        ("sub/../x.db", &[]),
        ("sqlite://x.db", &[]),
        ("../x.db", &["--no-store"]),
        ("sub/../../x.db", &["--no-store"]),
        ("/tmp/x.db", &["--no-store"]),
        ("sqlite:///tmp/x.db", &["--no-store"]),
        ("postgres://h/db", &["--no-store"]),
        ("~/x.db", &["--no-store"]),
    ] {
        let text = format!("[store]\npath = {path:?}\n");
        assert_eq!(store_args(&text), args, "{path}");
    }
    assert_eq!(
        store_args("[store]\nurl = \"sqlite://x.db\"\n"),
        &["--no-store"]
    );
    assert_eq!(store_args("[run]\n"), &[] as &[&str]);
}
