//! `arbor loadtest`: huge trees on the simulated model to measure Arbor, or
//! agent-shaped load on a configured real model to measure an endpoint.

mod bare;
mod collect;
mod report;
mod shaped;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbor_actors::history::History;
use arbor_actors::message::Message;
use arbor_actors::models::{Latency, SimulatedConfig, SimulatedModel};
use arbor_actors::{AgentStatus, AgentTemplate, Model};
use arbor_supervisor::{Catalog, Retain, StartRequest, Supervisor, TreeLimits};

pub use bare::{BareKind, BareRun, UnknownBareKind, run_bare};
pub use collect::{Answers, Collector, Measured, Percentiles, TokenFigures};
pub use report::{BaselineMemory, BaselineReport, LoadReport, cpu_time, write_plot};
use shaped::ShapedModel;

/// What to run.
#[derive(Clone)]
pub struct LoadOptions {
    /// Children per level: `[10, 10, 10, 10]` is fanout 10, depth 4.
    pub shape: Vec<usize>,
    /// Messages the root starts with (every child inherits them, shared).
    pub history: usize,
    /// Bytes per inherited message.
    pub msg_bytes: usize,
    /// How long each simulated model step takes (fixed, or drawn from a
    /// distribution). A run on an endpoint (`model`) ignores it: the endpoint
    /// takes the time it takes.
    pub latency: Latency,
    /// Words in each answer of the simulated model (a leaf's answer, or a
    /// parent's merge of its children's), padded with filler text.
    pub reply_tokens: usize,
    /// At most this many agents stepping at once (the tree's
    /// `max_live_agents`); `None` is no limit.
    pub max_live: Option<usize>,
    /// Drive this model (from the catalog) instead of the simulated one.
    pub model: Option<Arc<dyn Model>>,
    /// How many trees `arbor loadtest` runs one after the other, each on a
    /// fresh supervisor (at least 1; `run_once` runs one whatever it says).
    pub repeat: usize,
    /// Store the trees here: a SQLite file or a Postgres database (the run
    /// then includes writing it).
    pub store: Option<crate::config::StoreLocation>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            shape: vec![10; 4],
            history: 0,
            msg_bytes: 200,
            latency: Latency::Fixed(Duration::ZERO),
            reply_tokens: 20,
            max_live: None,
            model: None,
            repeat: 1,
            store: None,
        }
    }
}

impl LoadOptions {
    /// How many agents a tree of `shape` has, the root included
    /// (`[10, 10]` is 1 + 10 + 100).
    pub fn agents(&self) -> u64 {
        SimulatedConfig {
            shape: self.shape.clone(),
            ..SimulatedConfig::default()
        }
        .agents()
    }

    fn simulated(&self) -> SimulatedModel {
        SimulatedModel::new(
            "load",
            SimulatedConfig {
                shape: self.shape.clone(),
                latency: self.latency,
                reply_tokens: self.reply_tokens,
            },
        )
    }

    /// The supervisor of one run: one template that spawns itself, on the
    /// simulated model (or on `model`, shaped by the simulated one), kept to
    /// `shape` by its tree limits and storing into `store` when set.
    ///
    /// # Errors
    ///
    /// The store file cannot be opened, or the catalog is invalid.
    pub fn supervisor(&self) -> Result<Supervisor, arbor_supervisor::Error> {
        let model: Arc<dyn Model> = match &self.model {
            Some(endpoint) => {
                let planner = LoadOptions {
                    latency: Latency::Fixed(Duration::ZERO),
                    ..self.clone()
                };
                Arc::new(ShapedModel::new(planner.simulated(), endpoint.clone()))
            }
            None => Arc::new(self.simulated()),
        };
        let mut node = AgentTemplate::new("node", "load")
            .spawns(&["node"])
            .max_steps(4)
            .system_prompt("You are one node of a load-test tree.");
        node.include_message_history = self.history > 0;
        let catalog = Catalog::builder()
            .model_as("load", model)
            .template(node)
            .build()?;
        let limits = TreeLimits {
            max_depth: Some(self.shape.len()),
            max_children_per_call: self.shape.iter().copied().max().and_then(NonZeroUsize::new),
            max_live_agents: self.max_live.and_then(NonZeroUsize::new),
            ..TreeLimits::default()
        };
        let supervisor = Supervisor::with_retention(catalog, limits, Retain::Roots);
        match &self.store {
            Some(location) => supervisor.with_store(location.open()?),
            None => Ok(supervisor),
        }
    }

    /// The root's initial history: `history` alternating user/assistant
    /// messages of `msg_bytes` bytes.
    pub fn root_history(&self) -> History {
        (0..self.history)
            .map(|i| {
                let mut text = format!("message {i}: ");
                while text.len() < self.msg_bytes {
                    text.push_str("lorem ipsum ");
                }
                text.truncate(self.msg_bytes.max(1));
                if i % 2 == 0 {
                    Message::user(text)
                } else {
                    Message::assistant_text(text)
                }
            })
            .collect()
    }
}

/// Runs one tree on `supervisor`, measuring it with `collector` (already
/// observing the supervisor's events). `tick` is called about every 50 ms.
pub async fn run_once(
    options: &LoadOptions,
    supervisor: &Supervisor,
    collector: &Arc<Collector>,
    mut tick: impl FnMut(&Collector),
) -> Result<LoadReport, arbor_supervisor::Error> {
    let rss_before = report::rss_bytes().unwrap_or(0);
    let start = Instant::now();
    let cpu_start = cpu_time().unwrap_or_default();
    let handle = supervisor
        .start(StartRequest {
            agent: "node".into(),
            prompt: "Measure the tree".into(),
            history: Some(options.root_history()),
            ..StartRequest::default()
        })
        .await?;
    let tree_id = handle.tree_id.to_string();
    let wait = handle.wait();
    tokio::pin!(wait);
    let mut ticker = tokio::time::interval(Duration::from_millis(50));
    let result = loop {
        tokio::select! {
            result = &mut wait => break result?,
            _ = ticker.tick() => {
                collector.sample();
                tick(collector);
            }
        }
    };
    // A stored run is done when it is all written.
    let tree_done = start.elapsed();
    supervisor.flush().await?;
    let wall = start.elapsed();
    let cpu = cpu_time().unwrap_or_default().saturating_sub(cpu_start);
    collector.sample();
    tick(collector);
    let mut report = LoadReport::new(
        options,
        collector,
        tree_id,
        (wall, cpu),
        result.state.status == AgentStatus::Completed,
        rss_before,
    );
    report.store_bytes = options
        .store
        .as_ref()
        .and_then(|s| s.sqlite_path())
        .map(report::store_bytes);
    report.store_tail_secs = options
        .store
        .as_ref()
        .map(|_| (wall - tree_done).as_secs_f64());
    Ok(report)
}

/// Runs one bare tree of `kind` on the shape and history of `options` (see
/// [`BareKind`]) and measures its wall and CPU time. With `first_in_process`
/// (nothing else has run in this process: `arbor loadtest --baseline-only`)
/// the report has its memory figures too.
pub async fn run_baseline(
    kind: BareKind,
    options: &LoadOptions,
    first_in_process: bool,
) -> BaselineReport {
    let rss_before = first_in_process.then(|| report::rss_bytes().unwrap_or(0));
    let start = Instant::now();
    let cpu_start = cpu_time().unwrap_or_default();
    let run = run_bare(kind, &options.shape, options.history, options.msg_bytes).await;
    let wall = start.elapsed();
    let cpu = cpu_time().unwrap_or_default().saturating_sub(cpu_start);
    BaselineReport::new(kind, run, (wall, cpu), rss_before)
}
