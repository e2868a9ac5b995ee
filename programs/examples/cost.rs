//! What one programmatic agent costs (BENCHMARKS.md): the time from a run's
//! start to its program's first yield (a fresh QuickJS runtime, the module
//! evaluated, the generator started), and the engine's memory while the
//! program waits at a yield, for the file-explorer fixture.
//!
//! `cargo run --release -p arbor-programs --example cost -- tests/fixtures/codebuff-agents 1000`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Instant;

use arbor_actors::handler::{Resume, StepHandler, Yield};
use arbor_actors::state::AgentState;
use arbor_programs::{JsHandler, Limits, load_agent_file};
use serde_json::json;

fn main() {
    let mut args = std::env::args().skip(1);
    let root = PathBuf::from(args.next().expect("the agents directory"));
    let n: usize = args.next().map_or(1000, |a| a.parse().expect("a count"));
    let limits = Limits::default();
    let loaded = Instant::now();
    let file = load_agent_file(&root, &root.join("file-explorer.ts"), limits).expect("loads");
    let load_time = loaded.elapsed();
    let handler = JsHandler::new(file.program.expect("a program"), limits);
    let state = AgentState::of_run("t1/0".parse().unwrap());
    let params = json!({"prompts": ["auth", "storage"]});
    let mut programs = Vec::with_capacity(n);
    let before = rss_kb();
    let started = Instant::now();
    for _ in 0..n {
        let mut program = handler.start();
        let first = program.resume(Resume::Start {
            prompt: Some("goal"),
            params: Some(&params),
            state: &state,
        });
        assert!(matches!(first, Yield::Calls(_)), "{first:?}");
        programs.push(program);
    }
    let per_start = started.elapsed() / n as u32;
    let grown = rss_kb() - before;
    println!("load (bundle, strip, evaluate once): {load_time:?}");
    println!("start to first yield, mean of {n}: {per_start:?}");
    println!(
        "{n} programs waiting at a yield: +{grown} KiB resident, {} KiB each",
        grown / n as i64
    );
    drop(programs);
}

/// The process's resident set, in KiB.
fn rss_kb() -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
