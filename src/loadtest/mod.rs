//! `arbor loadtest`: huge trees on the simulated model to measure Arbor, or
//! agent-shaped load on a configured real model to measure an endpoint.

mod bare;
mod collect;
mod endpoint;
mod report;
mod shaped;
pub mod threshold;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbor_actors::history::History;
use arbor_actors::message::Message;
use arbor_actors::models::{Latency, SimulatedConfig, SimulatedModel};
use arbor_actors::{AgentStatus, AgentTemplate, Model};
use arbor_supervisor::{Catalog, Retain, StartRequest, Supervisor, TreeLimits};

pub use bare::{BareKind, BareRun, Pacing, UnknownBareKind, run_bare};
pub use collect::{Answers, Collector, Measured, Percentiles, Point, Timeline, TokenFigures};
pub use endpoint::{EndpointFigures, EndpointStats, request_failure_kind};
pub use report::{
    BaselineMemory, BaselineReport, LoadReport, Spread, cpu_time, human_us, human_us_f64, unit_for,
    write_plot,
};
use shaped::ShapedModel;

/// The documented range of each load-test option that no config key has
/// (inclusive; `--help` states them). The others are read in their config
/// keys' ranges: the shape and `reply_tokens` in a simulated model's
/// ([`arbor::config::ranges`]), `latency` in its grammar, `max_live` in
/// `[limits] max_live_agents`'.
pub mod ranges {
    /// `history`: messages the root starts with.
    pub const HISTORY: (usize, usize) = (0, 100_000);
    /// `msg_bytes`: bytes per inherited message.
    pub const MSG_BYTES: (usize, usize) = (0, 10_000_000);
    /// The whole inherited history, `history × msg_bytes` bytes: built once
    /// and shared by every agent, but written to the store and sent whole in
    /// every request to an endpoint (100 MB; a 100 MB history takes ~0.7 GB
    /// of RSS with the store).
    pub const HISTORY_BYTES: u64 = 100_000_000;
    /// `repeat`: trees run one after the other.
    pub const REPEAT: (usize, usize) = (1, 1_000);
    /// A `copied` bare tree's histories together, agents × history bytes:
    /// every node holds a deep copy of its parent's, all alive at once.
    pub const COPIED_HISTORY_BYTES: u64 = 4_000_000_000;
}

/// The progress bar's layout on a terminal (an `indicatif` template): the
/// time so far, the bar, the agents done of all and the message (agents live,
/// agents per second). No ETA: a tree's rate changes as it goes (one said 42
/// minutes for a run of 6.5 s).
pub const PROGRESS_BAR: &str = "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} agents  {msg}";

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
    pub store: Option<arbor::config::StoreLocation>,
    /// The tree's deadline (`[limits] deadline`): a tree too large to finish
    /// runs to it. `None`: no deadline.
    pub duration: Option<Duration>,
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
            duration: None,
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

    /// Each option outside its range, as `(option, problem)` with the
    /// option's field name (`reply_tokens`, `shape`, `max_live`); empty when
    /// the run can go. A load test checks these before anything runs: a
    /// `reply_tokens` of 2³² once ran for minutes and took 23 GB. The ranges
    /// are the config's where a config key says the same, checked by the same
    /// helper ([`arbor_supervisor::out_of_range`]) in the same words.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        use arbor::config::ranges::{DEPTH, FANOUT, REPLY_TOKENS, SIMULATED_AGENTS};
        use arbor_supervisor::out_of_range;
        let mut out = Vec::new();
        if self.shape.len() > DEPTH.1 {
            let why = format!("has {} levels: at most {}", self.shape.len(), DEPTH.1);
            out.push(("shape", why));
        }
        if let Some(&wide) = self.shape.iter().find(|&&f| f > FANOUT.1) {
            let why = format!("a level of {wide} children: at most {}", FANOUT.1);
            out.push(("shape", why));
        }
        let agents = self.agents();
        if agents > SIMULATED_AGENTS {
            let agents = if agents == u64::MAX {
                "over 2^64".to_owned()
            } else {
                agents.to_string()
            };
            out.push((
                "shape",
                format!("makes a tree of {agents} agents: at most {SIMULATED_AGENTS}"),
            ));
        }
        let sized = self.shape.len() <= DEPTH.1 && self.shape.iter().all(|&f| f <= FANOUT.1);
        if sized && agents <= SIMULATED_AGENTS {
            let config = SimulatedConfig {
                shape: self.shape.clone(),
                reply_tokens: self.reply_tokens.min(REPLY_TOKENS.1),
                ..SimulatedConfig::default()
            };
            let live = self.max_live.map(|n| n as u64);
            let lower = "a lower --max-live or a smaller shape";
            if let Some(why) = arbor::config::peak_problem(&config, live, None, lower) {
                out.push((if live.is_some() { "max_live" } else { "shape" }, why));
            }
        }
        let mut check = |option, value, range| {
            if let Some(why) = out_of_range(value, range) {
                out.push((option, why));
            }
        };
        check("reply_tokens", self.reply_tokens, REPLY_TOKENS);
        check("history", self.history, ranges::HISTORY);
        check("msg_bytes", self.msg_bytes, ranges::MSG_BYTES);
        check("repeat", self.repeat, ranges::REPEAT);
        let bytes = self.history_bytes();
        let each_in_range =
            self.history <= ranges::HISTORY.1 && self.msg_bytes <= ranges::MSG_BYTES.1;
        if each_in_range && bytes > ranges::HISTORY_BYTES {
            out.push((
                "history",
                format!(
                    "{} messages of {} bytes make a {bytes}-byte history: at most {} \
                     (fewer or smaller messages)",
                    self.history,
                    self.msg_bytes,
                    ranges::HISTORY_BYTES
                ),
            ));
        }
        if self.duration.is_some_and(|d| d.is_zero()) {
            out.push(("duration", "must be more than 0".to_owned()));
        }
        if let Some(n) = self.max_live {
            // Read as a config's `[limits] max_live_agents` is: its range (zero
            // included, which a `NonZeroUsize` cannot hold) in its words.
            let limits =
                TreeLimits::deserialize_config(serde_json::json!({ "max_live_agents": n }));
            let why = match limits {
                Err(e) => Some(e.to_string()),
                Ok(limits) => limits.problems().into_iter().next().map(|(_, why)| why),
            };
            if let Some(why) = why {
                out.push(("max_live", why));
            }
        }
        out
    }

    /// The problem of running the bare tree `kind` beside this run, if it
    /// would hold too much: a `copied` tree deep-copies the history into
    /// every node ([`ranges::COPIED_HISTORY_BYTES`]).
    pub fn baseline_problem(&self, kind: BareKind) -> Option<String> {
        let bytes = self.history_bytes().saturating_mul(self.agents());
        (kind == BareKind::Copied && bytes > ranges::COPIED_HISTORY_BYTES).then(|| {
            format!(
                "copied: {} agents each copying a {}-byte history hold {bytes} bytes: at most {} \
                 (a smaller tree or history, or another kind)",
                self.agents(),
                self.history_bytes(),
                ranges::COPIED_HISTORY_BYTES
            )
        })
    }

    /// The bytes of the root's history (`history × msg_bytes`, every message
    /// at least one byte), saturating.
    fn history_bytes(&self) -> u64 {
        (self.history as u64).saturating_mul(self.msg_bytes.max(1) as u64)
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
        self.supervisor_recording(Arc::default())
    }

    /// [`supervisor`](Self::supervisor), its endpoint's requests (with
    /// `model`) recorded in `endpoint` (a [`Collector`]'s, for its report).
    ///
    /// # Errors
    ///
    /// The store file cannot be opened, or the catalog is invalid.
    pub fn supervisor_recording(
        &self,
        endpoint: Arc<EndpointStats>,
    ) -> Result<Supervisor, arbor_supervisor::Error> {
        let model: Arc<dyn Model> = match &self.model {
            Some(model) => {
                let planner = LoadOptions {
                    latency: Latency::Fixed(Duration::ZERO),
                    ..self.clone()
                };
                Arc::new(ShapedModel::new(
                    planner.simulated(),
                    model.clone(),
                    endpoint,
                ))
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
            deadline: self.duration,
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
/// [`BareKind`]), its steps paced by the latency and live cap of `options`
/// ([`Pacing`]), and measures its wall and CPU time. With `first_in_process`
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
    let pacing = Pacing::new(options.latency, options.max_live);
    let run = run_bare(
        kind,
        &options.shape,
        options.history,
        options.msg_bytes,
        pacing,
    )
    .await;
    let wall = start.elapsed();
    let cpu = cpu_time().unwrap_or_default().saturating_sub(cpu_start);
    BaselineReport::new(kind, run, (wall, cpu), rss_before)
}

#[cfg(test)]
mod tests {
    use super::{BareKind, LoadOptions, PROGRESS_BAR};

    /// The options of `arbor loadtest` are checked in their config keys'
    /// ranges: each problem names its option.
    #[test]
    fn loadtest_options_beyond_their_ranges_are_each_named() {
        let problems = |o: LoadOptions| -> Vec<&'static str> {
            o.problems().into_iter().map(|(option, _)| option).collect()
        };
        assert!(problems(LoadOptions::default()).is_empty());
        let huge = LoadOptions {
            reply_tokens: 1 << 32,
            history: 100,
            msg_bytes: 10_000_000,
            repeat: 0,
            max_live: Some(0),
            shape: vec![10_001; 101],
            ..LoadOptions::default()
        };
        assert_eq!(
            problems(huge),
            [
                "shape",
                "shape",
                "shape",
                "reply_tokens",
                "repeat",
                "history",
                "max_live"
            ]
        );
        let fine = LoadOptions {
            history: 100,
            msg_bytes: 1_000_000,
            max_live: Some(1_000_000),
            repeat: 1000,
            reply_tokens: 100_000,
            shape: vec![10_000, 9_000],
            ..LoadOptions::default()
        };
        // Each in its range; together they make a tree past any machine's
        // memory, which is a problem of its own (issue 34).
        let beyond: Vec<(&str, String)> = fine
            .problems()
            .into_iter()
            .filter(|(_, why)| !why.contains("at its peak"))
            .collect();
        assert!(beyond.is_empty(), "{beyond:?}");
        // A copied bare tree holds a history per node: 100 MB × 90,010,001.
        assert!(fine.baseline_problem(BareKind::Copied).is_some());
        assert!(fine.baseline_problem(BareKind::Shared).is_none());
        assert!(
            LoadOptions::default()
                .baseline_problem(BareKind::Copied)
                .is_none()
        );
    }

    /// Defect 24: the terminal's progress bar has no ETA (one read 42
    /// minutes for a run of 6.5 s).
    #[test]
    fn the_loadtest_progress_bar_shows_no_eta() {
        assert!(
            !PROGRESS_BAR.to_lowercase().contains("eta"),
            "{PROGRESS_BAR}"
        );
        assert!(indicatif::ProgressStyle::with_template(PROGRESS_BAR).is_ok());
    }
}
