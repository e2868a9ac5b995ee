//! `/metrics`: counters fed by a bus observer (an event in, numbers out; no
//! reaching into agents), and the pending approvals the supervisor lists, read
//! when scraped; encoded by `prometheus-client` in the OpenMetrics text
//! format, and in the Prometheus text format 0.0.4 (the default) for a scraper
//! that does not ask for OpenMetrics ([`Format::negotiate`]). Every family
//! has its HELP and TYPE.

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
    /// When its model request went out (for the latency histogram).
    request_sent: Option<Instant>,
    /// A step started while suspended: its request goes out on `Resumed`.
    request_parked: bool,
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
    model_latency: Family<ModelLabel, Histogram>,
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
            // 5 ms to about 80 s, per model.
            model_latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 15))
            }),
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
        r.register(
            "model_latency_seconds",
            "Time from a model request's sending to its reply, by model",
            m.model_latency.clone(),
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
                        request_sent: None,
                        request_parked: false,
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
                    // Counted when sent: a suspended agent's request waits
                    // for a live slot (`Resumed`).
                    if track.suspended {
                        track.request_parked = true;
                    } else {
                        track.request_sent = Some(now);
                        self.requests.get_or_create(&label(track)).inc();
                    }
                }
            }
            EventKind::Suspended | EventKind::Resumed => {
                let suspended = matches!(event.kind, EventKind::Suspended);
                if let Some(track) = runs.get_mut(&event.run_id)
                    && track.suspended != suspended
                {
                    track.suspended = suspended;
                    self.agents_parked.inc_by(if suspended { 1 } else { -1 });
                    if !suspended && std::mem::take(&mut track.request_parked) {
                        track.request_sent = Some(Instant::now());
                        self.requests.get_or_create(&label(track)).inc();
                    }
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
                    if let Some(sent) = track.request_sent.take() {
                        self.model_latency
                            .get_or_create(&ModelLabel {
                                model: model.clone(),
                            })
                            .observe(sent.elapsed().as_secs_f64());
                    }
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
    /// (`/metrics` turns it into `format` with [`Format::convert`].)
    pub fn encode(&self, approvals_pending: usize) -> String {
        self.approvals_pending
            .set(i64::try_from(approvals_pending).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The exposition format a `/metrics` scrape gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4 (`text/plain; version=0.0.4`): the
    /// default, and what `Accept: text/plain` gets.
    Prometheus,
    /// OpenMetrics 1.0 text (`application/openmetrics-text`), for an
    /// `Accept` that prefers it (as Prometheus's own scrapes do).
    OpenMetrics,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when
    /// `application/openmetrics-text` has a higher (or the same) q-value than
    /// `text/plain` and any wildcard; else the Prometheus text format.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Prometheus;
        };
        let (mut openmetrics, mut other) = (0.0_f32, 0.0_f32);
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(q),
                "text/plain" | "text/*" | "*/*" => other = other.max(q),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= other {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    /// Its `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// `openmetrics` (what [`Metrics::encode`] writes) in this format. To
    /// the Prometheus text format: no `# EOF` and no `# UNIT`; a counter's
    /// HELP and TYPE name its sample (`x_total`), as 0.0.4 wants; HELP text
    /// unescapes `\"` (0.0.4 escapes only `\\` and newlines).
    pub fn convert(self, openmetrics: &str) -> String {
        if self == Format::OpenMetrics {
            return openmetrics.to_owned();
        }
        let counters: std::collections::HashSet<&str> = openmetrics
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.strip_suffix(" counter"))
            .collect();
        let mut out = String::with_capacity(openmetrics.len());
        for line in openmetrics.lines() {
            if line == "# EOF" || line.starts_with("# UNIT ") {
                continue;
            }
            let meta = ["# HELP ", "# TYPE "]
                .into_iter()
                .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
            match meta {
                Some((prefix, rest)) => {
                    let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                    out.push_str(prefix);
                    out.push_str(name);
                    if counters.contains(name) {
                        out.push_str("_total");
                    }
                    out.push(' ');
                    if prefix == "# HELP " {
                        out.push_str(&tail.replace("\\\"", "\""));
                    } else {
                        out.push_str(tail);
                    }
                }
                None => out.push_str(line),
            }
            out.push('\n');
        }
        out
    }
}

/// The OpenAPI document's `GET /metrics` (written for OpenMetrics by
/// `api::metrics`'s annotation) with both formats it answers in.
pub fn document(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::RefOr;
    let Some(get) = doc
        .paths
        .paths
        .get_mut("/metrics")
        .and_then(|path| path.get.as_mut())
    else {
        return;
    };
    let Some(RefOr::T(ok)) = get.responses.responses.get_mut("200") else {
        return;
    };
    let Some(content) = ok.content.values().next().cloned() else {
        return;
    };
    ok.description = "Prometheus metrics: the text format 0.0.4 (text/plain) by default, \
        OpenMetrics text for an Accept that prefers application/openmetrics-text"
        .to_owned();
    ok.content.insert("text/plain".to_owned(), content);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> Metrics {
        Metrics::new(HashMap::from([("a".to_owned(), Arc::from("m"))]))
    }

    #[test]
    fn the_document_has_both_formats() {
        use utoipa::OpenApi as _;
        let mut doc = crate::service::ApiDoc::openapi();
        document(&mut doc);
        let json = serde_json::to_value(&doc).unwrap_or_default();
        let content = &json["paths"]["/metrics"]["get"]["responses"]["200"]["content"];
        assert!(content["text/plain"].is_object(), "{content}");
        assert!(
            content["application/openmetrics-text"].is_object(),
            "{content}"
        );
    }

    #[test]
    fn accept_picks_the_format() {
        assert_eq!(Format::negotiate(None), Format::Prometheus);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Prometheus);
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Prometheus);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text; version=1.0.0")),
            Format::OpenMetrics
        );
        // Prometheus's own scrape header.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
            version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0.2, text/plain")),
            Format::Prometheus
        );
    }

    #[test]
    fn every_family_has_help_and_type_in_both_formats() {
        let m = metrics();
        let openmetrics = m.encode(0);
        assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let text = format.convert(&openmetrics);
            let types: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("# TYPE "))
                .map(|l| l.split(' ').next().unwrap_or_default())
                .collect();
            let helps: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("# HELP "))
                .map(|l| l.split(' ').next().unwrap_or_default())
                .collect();
            assert_eq!(types, helps, "{text}");
            // (A labelled family is written once it has a sample.)
            assert!(types.len() >= 7, "{text}");
            if format == Format::Prometheus {
                assert!(!text.contains("# EOF"), "{text}");
                assert!(
                    text.contains("# TYPE arbor_steps_total counter\n"),
                    "{text}"
                );
                assert!(text.contains("# TYPE arbor_live_agents gauge\n"), "{text}");
            }
        }
    }

    #[test]
    fn a_parked_request_is_counted_when_it_is_sent() {
        use arbor_actors::Usage;
        let m = metrics();
        let event = |kind: EventKind| Event {
            seq: 0,
            tree_id: "t".into(),
            run_id: "t/0".into(),
            at_ms: 0,
            kind,
        };
        m.observe(&event(EventKind::AgentStarted {
            agent_id: "a".into(),
            agent_type: "a".into(),
            parent_run_id: None,
            depth: 0,
        }));
        m.observe(&event(EventKind::Suspended));
        m.observe(&event(EventKind::StepStarted { step: 1 }));
        let text = Format::Prometheus.convert(&m.encode(0));
        assert!(
            !text.contains("arbor_model_requests_total{model=\"m\"}"),
            "{text}"
        );
        m.observe(&event(EventKind::Resumed));
        m.observe(&event(EventKind::ModelResponded {
            step: 1,
            usage: Usage::default(),
            tool_calls: 0,
            reply: None,
        }));
        let text = Format::Prometheus.convert(&m.encode(0));
        assert!(
            text.contains("arbor_model_requests_total{model=\"m\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("arbor_model_latency_seconds_count{model=\"m\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP arbor_model_latency_seconds Time from a model request"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE arbor_model_requests_total counter\n"),
            "{text}"
        );
    }
}
