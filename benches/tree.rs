//! Agent trees on the zero-latency simulated model, against a bare ractor tree.
//!
//! - `tree_f10_d4`: 11,111 agents, each inheriting a 100-message history of
//!   200 B messages. `bare_ractor` is `run_bare_tree` (linked actors that spawn,
//!   wait for their children's replies and stop; each deep-copies its parent's
//!   messages); `arbor` is one tree on a supervisor built by
//!   `LoadOptions::supervisor()` (the `arbor loadtest` setup), started and
//!   waited for; `arbor_observed` is the same with the load test's `Collector`
//!   observing every event, as `arbor loadtest` runs. Throughput is per agent.
//! - `history_handoff`: a root and 10 children inheriting 10, 100 or 1000
//!   messages: Arbor hands children a shared history (O(1)), the bare tree
//!   copies it.
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
use arbor::loadtest::{Collector, LoadOptions, run_bare_tree};
use arbor::supervisor::{StartRequest, Supervisor};
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

fn tree_f10_d4(c: &mut Criterion) {
    let rt = runtime();
    let options = LoadOptions {
        shape: vec![10; 4],
        history: 100,
        msg_bytes: 200,
        ..Default::default()
    };
    let root_history = options.root_history();
    let mut group = c.benchmark_group("tree_f10_d4");
    group
        .sample_size(10)
        // One iteration a sample: a tree takes 0.1-0.5 s.
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(options.agents()));
    group.bench_function("bare_ractor", |b| {
        b.to_async(&rt)
            .iter(|| run_bare_tree(&options.shape, options.history, options.msg_bytes));
    });
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
        group.bench_with_input(
            BenchmarkId::new("bare_ractor", messages),
            &options,
            |b, o| {
                b.to_async(&rt)
                    .iter(|| run_bare_tree(&o.shape, o.history, o.msg_bytes));
            },
        );
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
    group.bench_function("bare_ractor", |b| {
        b.to_async(&rt).iter(|| run_bare_tree(&[], 0, 0));
    });
    group.finish();
}

criterion_group!(benches, tree_f10_d4, history_handoff, agent_step);
criterion_main!(benches);
