//! Memory follows live agents, not waiting ones (issue 34): a child waiting
//! for a live slot is a plan in its parent's launch, materialised (state,
//! history, actor) only when it gets its slot, and a launch's children wait
//! in line as one waiter. A tree too large to finish runs to its deadline.

use std::sync::Arc;
use std::time::Duration;

use arbor_cli::loadtest::{Collector, LoadOptions, run_once};

use crate::{arbor, text};

/// A wide tree at a small live cap: thousands of children wait for a slot at
/// once, but only the agents holding a slot and the parents waiting for their
/// children are materialised (an actor and a state), counted from the events.
/// Paused time on one thread: the counts are exact.
#[tokio::test(start_paused = true)]
async fn a_wide_tree_at_a_small_live_cap_materialises_only_its_live_agents_and_open_parents() {
    const CAP: usize = 8;
    let options = LoadOptions {
        shape: vec![400, 25],
        max_live: Some(CAP),
        latency: arbor::actors::models::Latency::Fixed(Duration::from_millis(10)),
        ..Default::default()
    };
    let supervisor = options.supervisor().unwrap();
    let collector = Arc::new(Collector::default());
    {
        let collector = collector.clone();
        supervisor.events().observe(move |e| collector.observe(e));
    }
    let report = run_once(&options, &supervisor, &collector, |_| {})
        .await
        .unwrap();
    assert!(report.completed, "{report:?}");
    assert_eq!(report.agents_started, 1 + 400 + 400 * 25);
    assert_eq!(report.agents_finished, report.agents_started);
    assert_eq!(
        report.live_max, CAP as i64,
        "the cap is reached, never passed"
    );
    // 399 of the root's children wait at first, and each parent that runs
    // adds 25: none of them exists as an agent until it has its slot. At
    // most: the agents stepping, the parents whose children run (each took a
    // slot once), the root and one agent ending as another starts; not the
    // thousands waiting.
    assert!(
        report.alive_max <= 2 * CAP as i64 + 2,
        "{} agents materialised at once at a cap of {CAP}",
        report.alive_max
    );
}

/// A tree too large to finish within the run (`--duration`, its deadline)
/// runs to it and reports what it did, instead of running for hours.
#[test]
fn a_tree_too_large_to_finish_runs_to_its_duration_and_reports_what_it_did() {
    let out = arbor(&[
        "loadtest",
        "--shape",
        "2000,2000",
        "--latency",
        "200ms",
        "--max-live",
        "20",
        "--duration",
        "600ms",
        "--no-store",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    // The root did not complete: the run says so with exit 1, the report whole.
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let agents = stdout
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("agents "))
        .unwrap_or_else(|| panic!("{stdout}"))
        .trim();
    let started: u64 = agents.split(' ').next().unwrap().parse().unwrap();
    assert!(started > 1 && started < 4_002_001, "{stdout}");
    assert!(stdout.contains("limit deadline"), "{stdout}");
}
