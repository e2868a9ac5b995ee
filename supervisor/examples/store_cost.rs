//! What the store costs a tree, per backend: one simulated tree (fanout 10,
//! depth 3: 1,111 agents, zero model latency, the root starting with 100
//! history messages of 200 bytes, every agent inheriting its parent's
//! history) run to its end and flushed, with no store, with a SQLite file,
//! and with a Postgres database (the URL given, or none).
//!
//! `cargo run --release -p arbor-supervisor --example store_cost [postgres://…] [runs]`

#![allow(clippy::expect_used)]

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbor_actors::models::{Latency, SimulatedConfig, SimulatedModel};
use arbor_actors::{AgentTemplate, History, Message, Model};
use arbor_supervisor::store::{PgStore, SqliteStore, Store};
use arbor_supervisor::{Catalog, Retain, StartRequest, Supervisor, TreeLimits};

fn supervisor(store: Option<Arc<dyn Store>>) -> Supervisor {
    let config = SimulatedConfig {
        latency: Latency::Fixed(Duration::ZERO),
        ..SimulatedConfig::tree(10, 3)
    };
    let model: Arc<dyn Model> = Arc::new(SimulatedModel::new("load", config));
    let mut node = AgentTemplate::new("node", "load")
        .spawns(&["node"])
        .max_steps(4)
        .system_prompt("You are one node of a load-test tree.");
    node.include_message_history = true;
    let catalog = Catalog::builder()
        .model_as("load", model)
        .template(node)
        .build()
        .expect("the catalog is valid");
    let limits = TreeLimits {
        max_depth: Some(3),
        max_children_per_call: NonZeroUsize::new(10),
        ..TreeLimits::default()
    };
    let sup = Supervisor::with_retention(catalog, limits, Retain::Roots);
    match store {
        Some(store) => sup.with_store(store).expect("the store opens"),
        None => sup,
    }
}

fn history() -> History {
    (0..100)
        .map(|i| {
            let mut text = format!("message {i}: ");
            while text.len() < 200 {
                text.push_str("lorem ipsum ");
            }
            if i % 2 == 0 {
                Message::user(text)
            } else {
                Message::assistant_text(text)
            }
        })
        .collect()
}

/// One tree to its end, everything written: the wall time.
async fn run(store: Option<Arc<dyn Store>>, n: usize) -> Duration {
    let sup = supervisor(store);
    let start = Instant::now();
    let handle = sup
        .start(StartRequest {
            agent: "node".into(),
            prompt: "Measure the tree".into(),
            history: Some(history()),
            tree_id: Some(format!("bench-{n}").parse().expect("a tree id")),
            ..StartRequest::default()
        })
        .await
        .expect("the tree starts");
    handle.wait().await.expect("the tree ends");
    sup.flush().await.expect("the store takes it");
    start.elapsed()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().filter(|a| a.starts_with("postgres"));
    let runs: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(5);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sqlite: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&dir.path().join("bench.db")).expect("the SQLite store"));
    let pg: Option<Arc<dyn Store>> = url
        .as_deref()
        .map(|u| Arc::new(PgStore::open(u).expect("the Postgres store")) as Arc<dyn Store>);
    let mut rows = vec![("no store", None), ("sqlite", Some(sqlite))];
    if let Some(pg) = pg {
        rows.push(("postgres", Some(pg)));
    }
    // One warm-up tree each, then `runs` measured.
    let mut n = 0;
    for (name, store) in rows {
        let mut times = Vec::new();
        for i in 0..=runs {
            n += 1;
            let t = run(store.clone(), n).await;
            if i > 0 {
                times.push(t);
            }
        }
        let m = median(times.clone());
        println!(
            "{name:>9}: median {:>7.1} ms over {runs} trees of 1111 agents (min {:.1}, max {:.1})",
            m.as_secs_f64() * 1e3,
            times.iter().min().unwrap_or(&m).as_secs_f64() * 1e3,
            times.iter().max().unwrap_or(&m).as_secs_f64() * 1e3,
        );
    }
}
