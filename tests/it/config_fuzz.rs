//! The config fuzzer (issue 12): mutations of the shipped `config.toml`
//! (deleted lines, wrong types, duplicated keys, negative, zero, huge and NaN
//! numbers and durations, keys the file does not set). Whatever
//! `check-config` accepts, `arbor run` must run without a panic, an abort or
//! a hang; whatever it refuses, it refuses with exit code 2 and a message.
//!
//! Deterministic: a fixed seed, no persisted failures. `ARBOR_FUZZ_CASES`
//! runs more random cases (the suite runs 100), after one
//! pass over every number and duration of the file set to each value aimed
//! at its kind.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Lines the mutations leave alone: they bound every run (the tree's size
/// and its wall-clock), so a run that outlasts [`RUN_BOUND`] is a hang, not
/// a big tree.
const PROTECTED: &[&str] = &["max_agents = ", "deadline = "];

/// A run that passed `check-config` ends within this, or it hung.
const RUN_BOUND: Duration = Duration::from_secs(60);

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
];
const DURATIONS: &[&str] = &[
    "\"0\"",
    "\"0ms\"",
    "\"1ns\"",
    "\"200000000000000d\"",
    "\"99999999999999999999ms\"",
    "\"1 year\"",
    "\"1.5d\"",
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

/// The aimed values for a key, by its name.
fn aimed(key: &str) -> &'static [&'static str] {
    match key.trim() {
        "latency" => LATENCIES,
        k if k.ends_with("timeout") || k == "deadline" => DURATIONS,
        _ => COUNTS,
    }
}

/// Keys the shipped file does not set, each under the table it belongs to.
const EXTRA_KEYS: &[(&str, &str)] = &[
    ("[limits]", "max_tokens"),
    ("[limits]", "max_credits"),
    ("[limits]", "max_steps"),
    ("[models.sim]", "shape"),
    ("[models.sim]", "reply_tokens"),
    ("[agents.coordinator]", "context_window"),
    ("[agents.coordinator]", "step_timeout"),
    ("[agents.coordinator]", "idle_timeout"),
    ("[agents.analyst]", "failure"),
    ("[agents.analyst]", "max_steps"),
    ("[store]", "path"),
    ("[service]", "shutdown_timeout"),
    ("[service]", "body_limit"),
];

#[derive(Clone, Debug)]
enum Mutation {
    Delete(Index),
    Replace(Index, Index, bool),
    Duplicate(Index),
    Insert(Index, Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => any::<Index>().prop_map(Mutation::Delete),
        4 => (any::<Index>(), any::<Index>(), any::<bool>())
            .prop_map(|(l, v, aim)| Mutation::Replace(l, v, aim)),
        1 => any::<Index>().prop_map(Mutation::Duplicate),
        2 => (any::<Index>(), any::<Index>()).prop_map(|(k, v)| Mutation::Insert(k, v)),
    ]
}

/// The shipped config with a 10 s deadline, so every run is bounded.
fn base() -> Vec<String> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml")).unwrap();
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with("deadline = ") {
                "deadline = \"10s\"".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect();
    assert!(lines.iter().any(|l| l == "deadline = \"10s\""));
    assert!(lines.iter().any(|l| l.starts_with("max_agents = ")));
    lines
}

fn apply(mut lines: Vec<String>, mutations: &[Mutation]) -> String {
    let free = |lines: &[String], i: &Index| -> Option<usize> {
        let candidates: Vec<usize> = (0..lines.len())
            .filter(|&n| !PROTECTED.iter().any(|p| lines[n].starts_with(p)))
            .collect();
        (!candidates.is_empty()).then(|| candidates[i.index(candidates.len())])
    };
    for m in mutations {
        match m {
            Mutation::Delete(i) => {
                if let Some(n) = free(&lines, i) {
                    lines.remove(n);
                }
            }
            Mutation::Duplicate(i) => {
                if let Some(n) = free(&lines, i) {
                    let line = lines[n].clone();
                    lines.insert(n, line);
                }
            }
            Mutation::Replace(i, v, aim) => {
                let keyed: Vec<usize> = (0..lines.len()).filter(|&n| valued(&lines[n])).collect();
                if !keyed.is_empty() {
                    let n = keyed[i.index(keyed.len())];
                    let key = lines[n].split(" = ").next().unwrap_or_default().to_owned();
                    let pool = if *aim { aimed(&key) } else { VALUES };
                    lines[n] = format!("{key} = {}", pool[v.index(pool.len())]);
                }
            }
            Mutation::Insert(k, v) => {
                let (table, key) = EXTRA_KEYS[k.index(EXTRA_KEYS.len())];
                if let Some(n) = lines.iter().position(|l| l == table) {
                    lines.insert(n + 1, format!("{key} = {}", VALUES[v.index(VALUES.len())]));
                }
            }
        }
    }
    lines.join("\n") + "\n"
}

/// Whether `line` sets a number or a duration (what the replacements aim at).
fn valued(line: &str) -> bool {
    if PROTECTED.iter().any(|p| line.starts_with(p)) || line.trim_start().starts_with('#') {
        return false;
    }
    line.split_once(" = ").is_some_and(|(_, value)| {
        let value = value.trim_start_matches('"');
        value.starts_with(|c: char| c.is_ascii_digit() || c == '-')
            || value.starts_with("lognormal")
    })
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
    std::fs::write(dir.path().join("c.toml"), text).unwrap();
    let checked = arbor_bounded(dir.path(), &["check-config", "c.toml"], RUN_BOUND);
    let (code, err) = checked.ok_or_else(|| format!("check-config hung on:\n{text}"))?;
    match code {
        Some(0) => {}
        Some(2) if err.contains("c.toml") => return Ok(Outcome::Refused),
        _ => return Err(format!("check-config ended {code:?} ({err}) on:\n{text}")),
    }
    let ran = arbor_bounded(
        dir.path(),
        &["run", "--config", "c.toml", "--no-store", "--quiet", "go"],
        RUN_BOUND,
    );
    let (code, err) =
        ran.ok_or_else(|| format!("arbor run hung past {RUN_BOUND:?} on:\n{text}"))?;
    // 0: the root completed; 1: it failed or hit a limit, and said so.
    // Anything else is a panic (101) or a signal such as an abort (None).
    if matches!(code, Some(0) | Some(1)) && !err.contains("panicked") {
        Ok(Outcome::Ran)
    } else {
        Err(format!("arbor run ended {code:?} ({err}) on:\n{text}"))
    }
}

/// Runs `arbor args` in `dir`; its exit code and stderr, or `None` if it
/// outlived `bound` (it is killed then).
fn arbor_bounded(dir: &Path, args: &[&str], bound: Duration) -> Option<(Option<i32>, String)> {
    let child = Command::new(env!("CARGO_BIN_EXE_arbor"))
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
    // Every number and duration of the shipped file, set in turn to every
    // value aimed at its kind.
    let lines = base();
    let mut ran = 0;
    for n in (0..lines.len()).filter(|&n| valued(&lines[n])) {
        let key = lines[n].split(" = ").next().unwrap_or_default().to_owned();
        for value in aimed(&key) {
            let mut mutated = lines.clone();
            mutated[n] = format!("{key} = {value}");
            match check_and_run(&(mutated.join("\n") + "\n")) {
                Ok(Outcome::Ran) => ran += 1,
                Ok(Outcome::Refused) => {}
                Err(why) => panic!("{why}"),
            }
        }
    }
    assert!(ran > 0, "no mutation passed check-config");
}

#[test]
fn no_config_that_passes_check_config_panics_aborts_or_hangs_a_run() {
    let cases = std::env::var("ARBOR_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100);
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
