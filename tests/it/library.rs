//! The embedding API: a `Runtime` built in code, a started tree's events,
//! cancel, result and lookups (paused tokio time: the simulated model's
//! latency passes without waiting).

use std::sync::Arc;
use std::time::Duration;

use arbor::Runtime;
use arbor::actors::models::{Latency, SimulatedConfig, SimulatedModel};
use arbor::actors::{AgentStatus, AgentTemplate, Model};
use arbor::supervisor::{Catalog, TreeLimits};

/// A tree id from a test's literal.
fn as_tree(id: &str) -> arbor::TreeId {
    id.parse().unwrap()
}

fn runtime(latency: Duration) -> Runtime {
    let model = SimulatedModel::new(
        "sim",
        SimulatedConfig {
            latency: Latency::Fixed(latency),
            ..SimulatedConfig::tree(2, 2)
        },
    );
    let catalog = Catalog::builder()
        .model(Arc::new(model) as Arc<dyn Model>)
        .template(AgentTemplate::new("boss", "sim").spawns(&["boss"]))
        .build()
        .unwrap();
    Runtime::from_catalog(catalog, TreeLimits::default())
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_tree_built_in_code_streams_its_events_and_ends_with_its_result() {
    let runtime = runtime(Duration::from_millis(50));
    assert!(runtime.config().is_none());
    let mut run = runtime.start("boss", "plan", None).await.unwrap();
    assert_eq!(run.run_id, format!("{}/0", run.tree_id));
    let mut events = run.take_events();
    let mut started = Vec::new();
    let mut last = None;
    while let Some(event) = events.recv().await {
        if event.kind.name() == "agentStarted" {
            started.push(event.run_id.clone());
        }
        last = Some(event);
    }
    // 1 + 2 + 4 agents; the stream ends with the root's final event.
    assert_eq!(started.len(), 7);
    let last = last.unwrap();
    assert_eq!(
        (&last.run_id, last.kind.name()),
        (&run.run_id, "agentFinished")
    );
    let result = run.result().await.unwrap();
    assert_eq!(result.state.status, AgentStatus::Completed);
    // Any run by id.
    let child = runtime.state(&started[1]).await.unwrap();
    assert_eq!(child.run_id, started[1]);
    assert!(runtime.state(&"t-none/0".parse().unwrap()).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_tree_cancelled_through_its_handle_ends_cancelled() {
    let runtime = runtime(Duration::from_secs(3600));
    let mut run = runtime.start("boss", "wait", None).await.unwrap();
    let mut events = run.take_events();
    let cancel = run.canceller();
    // Cancel once its first model call is under way (an hour long).
    while let Some(event) = events.recv().await {
        if event.kind.name() == "stepStarted" {
            cancel.cancel();
        }
    }
    let result = run.result().await.unwrap();
    assert_eq!(result.state.status, AgentStatus::Cancelled);
}

/// The events are taken once; taking them again gives a stream that has ended.
#[tokio::test(start_paused = true)]
async fn events_taken_twice_give_an_ended_stream_the_second_time() {
    let runtime = runtime(Duration::ZERO);
    let mut run = runtime.start("boss", "twice", None).await.unwrap();
    let mut first = run.take_events();
    let mut second = run.take_events();
    assert!(second.recv().await.is_none());
    assert!(first.recv().await.is_some());
    run.result().await.unwrap();
}

/// A config of one simulated model that spawns `fanout` children (depth 1).
fn sim_config(fanout: usize) -> arbor::Config {
    let text = format!(
        "[models.sim]\nprovider = \"simulated\"\nfanout = {fanout}\ndepth = 1\nlatency = \"300ms\"\n\n\
         [agents.boss]\nmodel = \"sim\"\nspawnable_agents = [\"boss\"]\n\n[limits]\nmax_depth = 1\n"
    );
    arbor::Config::parse(&text, "sim.toml", std::path::PathBuf::from(".")).unwrap()
}

/// Starts a tree on fanout 3 and hands it over at once, as a SIGTERM does.
async fn a_handed_over_tree(store: &std::path::Path, tree: &str) {
    let runtime = Runtime::builder(sim_config(3))
        .store(store)
        .build()
        .unwrap();
    let run = runtime
        .start_with(arbor::supervisor::StartRequest {
            agent: "boss".into(),
            prompt: "go".into(),
            tree_id: Some(tree.parse().unwrap()),
            ..Default::default()
        })
        .await
        .unwrap();
    let released: Vec<String> = runtime
        .supervisor()
        .release()
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(released, [tree]);
    run.cancel();
}

#[tokio::test]
async fn a_service_restarted_on_an_edited_config_resumes_trees_on_the_one_they_started_with() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    a_handed_over_tree(&store, "p1").await;
    // Restarted on a config that spawns one child, not three.
    let runtime = Runtime::builder(sim_config(1))
        .store(&store)
        .per_tree_configs()
        .build()
        .unwrap();
    let handle = runtime.supervisor().resume(&as_tree("p1")).await.unwrap();
    let result = handle.wait().await.unwrap();
    assert_eq!(result.state.status, AgentStatus::Completed);
    assert_eq!(
        result.state.child_run_ids.len(),
        3,
        "the tree ran on the config it started with"
    );

    // Without per-tree configs, the runtime's own config is used: an
    // override, recorded with the tree.
    a_handed_over_tree(&store, "p2").await;
    let runtime = Runtime::builder(sim_config(1))
        .store(&store)
        .build()
        .unwrap();
    let result = runtime
        .supervisor()
        .resume(&as_tree("p2"))
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert_eq!(result.state.child_run_ids.len(), 1);
    let (record, _) = runtime
        .supervisor()
        .read_store_now(|s| s.tree(&as_tree("p2")))
        .await
        .unwrap();
    assert!(
        record.config.as_deref().unwrap().contains("fanout = 1"),
        "the override is recorded"
    );
}
