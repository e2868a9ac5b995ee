//! Agent trees on the zero-latency simulated model, against bare trees.
//!
//! - `tree_f10_d4` (11,111 agents) and `tree_f10_d2` (111 agents), each agent
//!   inheriting a 100-message history of 200 B messages. `arbor` is one tree
//!   on a supervisor built by `LoadOptions::supervisor()` (the `arbor loadtest`
//!   setup), started and waited for; `arbor_observed` is the same with the load
//!   test's `Collector` observing every event, as `arbor loadtest` runs. The
//!   baselines are `run_bare` of each `BareKind`: `bare_shared` (linked actors
//!   that spawn, wait for their children's replies and stop, each holding its
//!   parent's history by reference: the baseline that counts), `bare_none` (no
//!   history), `bare_copied` (a deep-copied `Vec` per actor, the old baseline)
//!   and `bare_tokio` (tasks in `JoinSet`s, no actors, shared history).
//!   Throughput is per agent.
//! - `history_handoff`: a root and 10 children inheriting 10, 100 or 1000
//!   messages: Arbor hands children a shared history (O(1)); `bare_shared`
//!   shares it too, `bare_copied` copies it.
//! - `agent_step`: a tree of one agent that answers at once: start, one step,
//!   finish.
//!
//! The supervisor and the root's history are built outside the timed part.
//! The allocator is the binary's (mimalloc unless built without the feature).
//!
//! Run: `cargo bench --bench tree` (a few minutes on 2 cores).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use arbor::actors::AgentStatus;
use arbor::actors::history::History;
use arbor::supervisor::{StartRequest, Supervisor};
use arbor_cli::loadtest::{BareKind, Collector, LoadOptions, run_bare};
use criterion::{
    BatchSize, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs one tree on `supervisor` to the end; returns the supervisor so that
/// dropping it is not timed.
async fn run_tree(supervisor: Supervisor, history: History) -> Supervisor {
    let handle = supervisor
        .start(StartRequest {
            agent: "node".into(),
            prompt: "Measure the tree".into(),
            history: Some(history),
            ..StartRequest::default()
        })
        .await
        .expect("start");
    let result = handle.wait().await.expect("result");
    assert_eq!(result.state.status, AgentStatus::Completed);
    supervisor
}

fn observed(options: &LoadOptions) -> Supervisor {
    let supervisor = options.supervisor().expect("supervisor");
    let collector = Arc::new(Collector::default());
    supervisor.events().observe(move |e| collector.observe(e));
    supervisor
}

/// One group: Arbor's tree (plain and observed) and every bare tree, at
/// fanout 10 and `depth`, with a 100-message history.
fn tree_group(c: &mut Criterion, depth: usize, measurement: Duration) {
    let rt = runtime();
    let options = LoadOptions {
        shape: vec![10; depth],
        history: 100,
        msg_bytes: 200,
        ..Default::default()
    };
    let root_history = options.root_history();
    let mut group = c.benchmark_group(format!("tree_f10_d{depth}"));
    group
        .sample_size(10)
        // One iteration a sample: a tree takes 0.1-0.5 s.
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(measurement)
        .throughput(Throughput::Elements(options.agents()));
    for kind in BareKind::ALL {
        group.bench_function(format!("bare_{kind}"), |b| {
            b.to_async(&rt).iter(|| {
                run_bare(
                    kind,
                    &options.shape,
                    options.history,
                    options.msg_bytes,
                    None,
                )
            });
        });
    }
    group.bench_function("arbor", |b| {
        b.to_async(&rt).iter_batched(
            || options.supervisor().expect("supervisor"),
            |supervisor| run_tree(supervisor, root_history.clone()),
            BatchSize::PerIteration,
        );
    });
    group.bench_function("arbor_observed", |b| {
        b.to_async(&rt).iter_batched(
            || observed(&options),
            |supervisor| run_tree(supervisor, root_history.clone()),
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

fn tree_f10_d4(c: &mut Criterion) {
    tree_group(c, 4, Duration::from_secs(5));
}

fn tree_f10_d2(c: &mut Criterion) {
    tree_group(c, 2, Duration::from_secs(3));
}

fn history_handoff(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("history_handoff");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for messages in [10, 100, 1000] {
        let options = LoadOptions {
            shape: vec![10],
            history: messages,
            msg_bytes: 200,
            ..Default::default()
        };
        let root_history = options.root_history();
        group.bench_with_input(BenchmarkId::new("arbor", messages), &options, |b, o| {
            b.to_async(&rt).iter_batched(
                || o.supervisor().expect("supervisor"),
                |supervisor| run_tree(supervisor, root_history.clone()),
                BatchSize::SmallInput,
            );
        });
        for kind in [BareKind::Shared, BareKind::Copied] {
            group.bench_with_input(
                BenchmarkId::new(format!("bare_{kind}"), messages),
                &options,
                |b, o| {
                    b.to_async(&rt)
                        .iter(|| run_bare(kind, &o.shape, o.history, o.msg_bytes, None));
                },
            );
        }
    }
    group.finish();
}

fn agent_step(c: &mut Criterion) {
    let rt = runtime();
    let options = LoadOptions {
        shape: vec![],
        ..Default::default()
    };
    let mut group = c.benchmark_group("agent_step");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("arbor", |b| {
        b.to_async(&rt).iter_batched(
            || options.supervisor().expect("supervisor"),
            |supervisor| run_tree(supervisor, History::new()),
            BatchSize::SmallInput,
        );
    });
    group.bench_function("bare_none", |b| {
        b.to_async(&rt)
            .iter(|| run_bare(BareKind::None, &[], 0, 0, None));
    });
    group.finish();
}

criterion_group!(
    benches,
    tree_f10_d4,
    tree_f10_d2,
    history_handoff,
    agent_step
);
criterion_main!(benches);
