//! `/metrics`: counters fed by a bus observer (an event in, numbers out; no
//! reaching into agents), and the pending approvals the supervisor lists, read
//! when scraped; encoded by `prometheus-client` in the OpenMetrics text format
//! Prometheus scrapes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arbor_actors::sync::LockExt as _;
use arbor_actors::{Event, EventKind};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabel {
    model: String,
    /// `input` or `output`.
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

/// What the observer remembers of a live run.
struct Track {
    model: Arc<str>,
    step_started: Option<Instant>,
    in_model_call: bool,
    /// It gave its live slot back (waiting for children, a person, a budget).
    suspended: bool,
}

pub struct Metrics {
    registry: Registry,
    live_agents: Gauge,
    /// Agents alive that hold no live slot: waiting for children, for a
    /// person's decision or for a budget to be raised.
    agents_parked: Gauge,
    /// Tool calls waiting for a person's decision: the length of the
    /// supervisor's list, set when scraped (`encode`).
    approvals_pending: Gauge,
    agents_spawned: Counter,
    runs_finished: Family<StatusLabel, Counter>,
    steps: Counter,
    requests: Family<ModelLabel, Counter>,
    errors: Family<ModelLabel, Counter>,
    retries: Family<ModelLabel, Counter>,
    tokens: Family<TokenLabel, Counter>,
    cost: Family<ModelLabel, Counter<f64, std::sync::atomic::AtomicU64>>,
    step_seconds: Histogram,
    /// Trees admitted and not ended (the service's count of running trees).
    pub trees_running: Gauge,
    /// The model each agent type runs on, and each tree's override.
    models: HashMap<String, Arc<str>>,
    tree_models: Mutex<HashMap<Arc<str>, Arc<str>>>,
    runs: Mutex<HashMap<Arc<str>, Track>>,
}

impl Metrics {
    /// `models`: agent type → model name, from the catalog's templates.
    pub fn new(models: HashMap<String, Arc<str>>) -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("arbor"),
            live_agents: Gauge::default(),
            agents_parked: Gauge::default(),
            approvals_pending: Gauge::default(),
            agents_spawned: Counter::default(),
            runs_finished: Family::default(),
            steps: Counter::default(),
            requests: Family::default(),
            errors: Family::default(),
            retries: Family::default(),
            tokens: Family::default(),
            cost: Family::default(),
            // 5 ms to about 80 s.
            step_seconds: Histogram::new(exponential_buckets(0.005, 2.0, 15)),
            trees_running: Gauge::default(),
            models,
            tree_models: Mutex::new(HashMap::new()),
            runs: Mutex::new(HashMap::new()),
        };
        let r = &mut m.registry;
        r.register(
            "live_agents",
            "Agent actors alive now",
            m.live_agents.clone(),
        );
        r.register(
            "agents_parked",
            "Agents alive that hold no live slot (waiting for children, an approval or a budget)",
            m.agents_parked.clone(),
        );
        r.register(
            "approvals_pending",
            "Tool calls waiting for a person's decision",
            m.approvals_pending.clone(),
        );
        r.register(
            "trees_running",
            "Trees running in this process",
            m.trees_running.clone(),
        );
        r.register(
            "agents_spawned",
            "Agents started (roots and children)",
            m.agents_spawned.clone(),
        );
        r.register(
            "runs_finished",
            "Runs ended, by final status",
            m.runs_finished.clone(),
        );
        r.register("steps", "Agent steps started", m.steps.clone());
        r.register(
            "model_requests",
            "Model requests sent, retries included",
            m.requests.clone(),
        );
        r.register(
            "model_errors",
            "Model requests that failed (retried or not)",
            m.errors.clone(),
        );
        r.register(
            "model_retries",
            "Model requests tried again after a failure",
            m.retries.clone(),
        );
        r.register("tokens", "Tokens the models reported", m.tokens.clone());
        r.register(
            "cost_credits",
            "Credits the models reported",
            m.cost.clone(),
        );
        r.register(
            "step_duration_seconds",
            "Time from a step's start to the next step or the run's end",
            m.step_seconds.clone(),
        );
        m
    }

    /// The tree runs every agent on `model` (a start request's override).
    pub fn tree_model(&self, tree_id: &str, model: &str) {
        self.tree_models
            .locked()
            .insert(tree_id.into(), model.into());
    }

    /// A tree that did not start after all.
    pub fn forget_tree(&self, tree_id: &str) {
        self.tree_models.locked().remove(tree_id);
    }

    pub fn observe(&self, event: &Event) {
        let mut runs = self.runs.locked();
        let label = |track: &Track| ModelLabel {
            model: track.model.to_string(),
        };
        match &event.kind {
            EventKind::AgentStarted { agent_type, .. } => {
                self.live_agents.inc();
                self.agents_spawned.inc();
                let model = self
                    .tree_models
                    .locked()
                    .get(&event.tree_id)
                    .cloned()
                    .or_else(|| self.models.get(agent_type).cloned())
                    .unwrap_or_else(|| Arc::from("unknown"));
                runs.insert(
                    event.run_id.clone(),
                    Track {
                        model,
                        step_started: None,
                        in_model_call: false,
                        suspended: false,
                    },
                );
            }
            EventKind::StepStarted { .. } => {
                self.steps.inc();
                if let Some(track) = runs.get_mut(&event.run_id) {
                    let now = Instant::now();
                    if let Some(started) = track.step_started.replace(now) {
                        self.step_seconds
                            .observe(now.duration_since(started).as_secs_f64());
                    }
                    track.in_model_call = true;
                    self.requests.get_or_create(&label(track)).inc();
                }
            }
            EventKind::Suspended | EventKind::Resumed => {
                let suspended = matches!(event.kind, EventKind::Suspended);
                if let Some(track) = runs.get_mut(&event.run_id)
                    && track.suspended != suspended
                {
                    track.suspended = suspended;
                    self.agents_parked.inc_by(if suspended { 1 } else { -1 });
                }
            }
            EventKind::ModelRetrying { .. } => {
                if let Some(track) = runs.get(&event.run_id) {
                    let l = label(track);
                    self.errors.get_or_create(&l).inc();
                    self.retries.get_or_create(&l).inc();
                    self.requests.get_or_create(&l).inc();
                }
            }
            EventKind::ModelResponded { usage, .. } => {
                if let Some(track) = runs.get_mut(&event.run_id) {
                    track.in_model_call = false;
                    let model = track.model.to_string();
                    for (kind, n) in [
                        ("input", usage.input_tokens),
                        ("output", usage.output_tokens),
                    ] {
                        self.tokens
                            .get_or_create(&TokenLabel {
                                model: model.clone(),
                                kind: kind.into(),
                            })
                            .inc_by(n);
                    }
                    self.cost
                        .get_or_create(&ModelLabel { model })
                        .inc_by(usage.cost);
                }
            }
            kind => {
                let Some(state) = kind.final_state() else {
                    return;
                };
                self.live_agents.dec();
                self.runs_finished
                    .get_or_create(&StatusLabel {
                        status: state.status.as_str().to_owned(),
                    })
                    .inc();
                if let Some(track) = runs.remove(&event.run_id) {
                    if track.suspended {
                        self.agents_parked.dec();
                    }
                    if let Some(started) = track.step_started {
                        self.step_seconds.observe(started.elapsed().as_secs_f64());
                    }
                    if track.in_model_call && matches!(kind, EventKind::AgentFailed { .. }) {
                        self.errors.get_or_create(&label(&track)).inc();
                    }
                }
                if state.parent_id.is_none() {
                    self.tree_models.locked().remove(&event.tree_id);
                }
            }
        }
    }

    /// The metrics as OpenMetrics text; `approvals_pending`: the number of
    /// tool calls waiting for a decision now (`Supervisor::approvals(None)`).
    pub fn encode(&self, approvals_pending: usize) -> String {
        self.approvals_pending
            .set(i64::try_from(approvals_pending).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
