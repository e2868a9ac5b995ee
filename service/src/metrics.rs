//! `/metrics`: counters fed by a bus observer (an event in, numbers out; no
//! reaching into agents), the HTTP client's request signals (a request
//! counted when it is sent, time to first token) and the HTTP server's own
//! middleware (`http_metrics`), and the pending approvals the supervisor
//! lists, read when scraped; encoded by `prometheus-client` in the
//! OpenMetrics text format, and in the Prometheus text format 0.0.4 (the
//! default) for a scraper that does not ask for OpenMetrics
//! ([`Format::negotiate`]). Every family has its HELP and TYPE.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arbor_actors::sync::LockExt as _;
use arbor_actors::{Event, EventKind, RunId, TreeId};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use arbor::providers::{RequestEvent, RequestObserver, RequestSignal, observe_requests};

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabel {
    method: String,
    /// The route's template (`/v1/runs/{run_id}`), never the raw path.
    route: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    method: String,
    route: String,
}

/// What the observer remembers of a live run.
struct Track {
    model: Arc<str>,
    /// When its step in progress started.
    step_started: Option<Instant>,
    /// The time that step spent suspended, up to its last `Resumed`: not
    /// the agent's own time (it waited for children, a person or a budget).
    step_waited: Duration,
    /// Since when it is suspended (gave its live slot back), if it is.
    suspended_since: Option<Instant>,
    /// Its step's model request is due since then and not yet known sent:
    /// an HTTP model tells when it sends; a built-in one's request counts
    /// when it replies.
    request_due: Option<Instant>,
    /// When its model request went out (for the latency histogram).
    request_sent: Option<Instant>,
    /// A step started while suspended: its request is due on `Resumed`.
    request_parked: bool,
    /// Its model tells when it sends (an HTTP model).
    signals: bool,
    in_model_call: bool,
}

impl Track {
    fn new(model: Arc<str>) -> Track {
        Track {
            model,
            step_started: None,
            step_waited: Duration::ZERO,
            suspended_since: None,
            request_due: None,
            request_sent: None,
            request_parked: false,
            signals: false,
            in_model_call: false,
        }
    }

    fn label(&self) -> ModelLabel {
        ModelLabel {
            model: self.model.to_string(),
        }
    }

    /// The agent's own time in the step in progress, up to `now`: from its
    /// start, less the time it was suspended.
    fn own_step_time(&self, now: Instant) -> Option<Duration> {
        let started = self.step_started?;
        let suspended = self
            .suspended_since
            .map(|since| now.saturating_duration_since(since.max(started)))
            .unwrap_or_default();
        Some(
            now.saturating_duration_since(started)
                .saturating_sub(self.step_waited + suspended),
        )
    }
}

/// What the bus observer and the client's request signals share.
struct Live {
    runs: Mutex<HashMap<RunId, Track>>,
    requests: Family<ModelLabel, Counter>,
    ttft: Family<ModelLabel, Histogram>,
}

impl Live {
    /// A signal from the HTTP client about a request of one of our runs
    /// (another service's runs are not in `runs`).
    fn signal(&self, signal: &RequestSignal<'_>, now: Instant) {
        let Ok(run) = signal.run_id.parse::<RunId>() else {
            return;
        };
        let mut runs = self.runs.locked();
        let Some(track) = runs.get_mut(&run) else {
            return;
        };
        match signal.event {
            RequestEvent::Sent => {
                track.signals = true;
                self.requests.get_or_create(&track.label()).inc();
                // A retry keeps its first attempt's sending time.
                if track.request_due.take().is_some() || track.request_sent.is_none() {
                    track.request_sent = Some(now);
                }
            }
            RequestEvent::FirstToken(after) => {
                self.ttft
                    .get_or_create(&track.label())
                    .observe(after.as_secs_f64());
            }
            // An event this service does not count.
            _ => {}
        }
    }
}

/// The HTTP server's families, for its middleware (`http_metrics`): cheap
/// to clone (the families are shared).
#[derive(Clone)]
pub struct HttpMetrics {
    requests: Family<HttpLabel, Counter>,
    seconds: Family<RouteLabel, Histogram>,
}

impl HttpMetrics {
    /// One request answered: its method, route template, status and the
    /// time until its response's head was ready.
    pub fn record(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&HttpLabel {
                method: method.to_owned(),
                route: route.to_owned(),
                status: status.to_string(),
            })
            .inc();
        self.seconds
            .get_or_create(&RouteLabel {
                method: method.to_owned(),
                route: route.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }
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
    /// 1 while the store takes this process's writes, 0 while it is down
    /// or failed.
    store_writable: Gauge,
    /// How long the store has taken no writes, while it is down.
    store_down_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    agents_spawned: Counter,
    runs_finished: Family<StatusLabel, Counter>,
    steps: Counter,
    errors: Family<ModelLabel, Counter>,
    retries: Family<ModelLabel, Counter>,
    tokens: Family<TokenLabel, Counter>,
    cost: Family<ModelLabel, Counter<f64, std::sync::atomic::AtomicU64>>,
    step_seconds: Histogram,
    model_latency: Family<ModelLabel, Histogram>,
    http: HttpMetrics,
    /// Trees admitted and not ended (the service's count of running trees).
    pub trees_running: Gauge,
    /// The model each agent type runs on, and each tree's override.
    models: HashMap<String, Arc<str>>,
    tree_models: Mutex<HashMap<Arc<str>, Arc<str>>>,
    live: Arc<Live>,
    /// Kept for as long as the metrics live (the providers hold it weakly).
    _requests: Arc<RequestObserver>,
}

/// 5 ms to about 80 s.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

impl Metrics {
    /// `models`: agent type → model name, from the catalog's templates.
    pub fn new(models: HashMap<String, Arc<str>>) -> Metrics {
        let live = Arc::new(Live {
            runs: Mutex::new(HashMap::new()),
            requests: Family::default(),
            ttft: Family::new_with_constructor(seconds_histogram),
        });
        let signals = live.clone();
        let observer: Arc<RequestObserver> =
            Arc::new(move |signal: &RequestSignal<'_>| signals.signal(signal, Instant::now()));
        observe_requests(&observer);
        let mut m = Metrics {
            registry: Registry::with_prefix("arbor"),
            live_agents: Gauge::default(),
            agents_parked: Gauge::default(),
            approvals_pending: Gauge::default(),
            store_writable: Gauge::default(),
            store_down_seconds: Gauge::default(),
            agents_spawned: Counter::default(),
            runs_finished: Family::default(),
            steps: Counter::default(),
            errors: Family::default(),
            retries: Family::default(),
            tokens: Family::default(),
            cost: Family::default(),
            step_seconds: seconds_histogram(),
            model_latency: Family::new_with_constructor(seconds_histogram),
            http: HttpMetrics {
                requests: Family::default(),
                // 1 ms to about 16 s.
                seconds: Family::new_with_constructor(|| {
                    Histogram::new(exponential_buckets(0.001, 2.0, 15))
                }),
            },
            trees_running: Gauge::default(),
            models,
            tree_models: Mutex::new(HashMap::new()),
            live,
            _requests: observer,
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
            "store_writable",
            "1 while the store takes this process's writes; 0 while it is down (the writes \
             wait and are tried again) or failed",
            m.store_writable.clone(),
        );
        r.register(
            "store_down_seconds",
            "How long the store has taken no writes (0 while it takes them)",
            m.store_down_seconds.clone(),
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
            "Model requests sent, retries included (an HTTP model's when it sends, a built-in model's when it replies)",
            m.live.requests.clone(),
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
            "An agent's own time in a step: from its start to the next step or the run's end, less the time it waited suspended (for children, an approval, a budget or a live slot)",
            m.step_seconds.clone(),
        );
        r.register(
            "model_latency_seconds",
            "Time from a model request's sending to its reply, by model",
            m.model_latency.clone(),
        );
        r.register(
            "model_ttft_seconds",
            "Time from a streamed model request's sending to the first piece of its reply (text, reasoning or a tool call), by model",
            m.live.ttft.clone(),
        );
        r.register(
            "http_requests",
            "HTTP requests answered, by method, route template and status",
            m.http.requests.clone(),
        );
        r.register(
            "http_request_duration_seconds",
            "Time from an HTTP request's arrival to its response's head, by method and route template",
            m.http.seconds.clone(),
        );
        m
    }

    /// The HTTP server's families, for its middleware.
    pub fn http(&self) -> HttpMetrics {
        self.http.clone()
    }

    /// The tree runs every agent on `model` (a start request's override).
    pub fn tree_model(&self, tree_id: &TreeId, model: &str) {
        self.tree_models
            .locked()
            .insert(tree_id.as_str().into(), model.into());
    }

    /// A tree that did not start after all.
    pub fn forget_tree(&self, tree_id: &TreeId) {
        self.tree_models.locked().remove(tree_id.as_str());
    }

    pub fn observe(&self, event: &Event) {
        self.observe_at(event, Instant::now());
    }

    /// `event`, as if observed at `now`.
    fn observe_at(&self, event: &Event, now: Instant) {
        let mut runs = self.live.runs.locked();
        match &event.kind {
            EventKind::AgentStarted { agent_type, .. } => {
                self.live_agents.inc();
                self.agents_spawned.inc();
                let model = self
                    .tree_models
                    .locked()
                    .get(&*event.tree_id)
                    .cloned()
                    .or_else(|| self.models.get(agent_type).cloned())
                    .unwrap_or_else(|| Arc::from("unknown"));
                runs.insert(event.run_id.clone(), Track::new(model));
            }
            EventKind::StepStarted { .. } => {
                self.steps.inc();
                if let Some(track) = runs.get_mut(&event.run_id) {
                    if let Some(own) = track.own_step_time(now) {
                        self.step_seconds.observe(own.as_secs_f64());
                    }
                    track.step_started = Some(now);
                    track.step_waited = Duration::ZERO;
                    track.in_model_call = true;
                    // A suspended agent's request waits for a live slot
                    // (`Resumed`); the wait is not the new step's own time.
                    if track.suspended_since.is_some() {
                        track.suspended_since = Some(now);
                        track.request_parked = true;
                    } else {
                        track.request_due = Some(now);
                    }
                }
            }
            EventKind::Suspended | EventKind::Resumed => {
                let suspended = matches!(event.kind, EventKind::Suspended);
                if let Some(track) = runs.get_mut(&event.run_id)
                    && track.suspended_since.is_some() != suspended
                {
                    self.agents_parked.inc_by(if suspended { 1 } else { -1 });
                    if suspended {
                        track.suspended_since = Some(now);
                    } else {
                        if let (Some(since), Some(started)) =
                            (track.suspended_since.take(), track.step_started)
                        {
                            track.step_waited += now.saturating_duration_since(since.max(started));
                        }
                        if std::mem::take(&mut track.request_parked) {
                            track.request_due = Some(now);
                        }
                    }
                }
            }
            EventKind::ModelRetrying { .. } => {
                if let Some(track) = runs.get(&event.run_id) {
                    let l = track.label();
                    self.errors.get_or_create(&l).inc();
                    self.retries.get_or_create(&l).inc();
                    // An HTTP model tells when its retry goes out.
                    if !track.signals {
                        self.live.requests.get_or_create(&l).inc();
                    }
                }
            }
            EventKind::ModelResponded {
                usage,
                from_record,
                refused,
                ..
            } => {
                if let Some(track) = runs.get_mut(&event.run_id) {
                    // A reply not acted on: the run fails next, of the call.
                    track.in_model_call = *refused;
                    // Served from the store's record of an earlier call (a
                    // resumed tree): no request went out, nothing was billed
                    // again; the process that made the call counted it.
                    if *from_record {
                        track.request_due = None;
                        track.request_sent = None;
                        return;
                    }
                    let label = track.label();
                    // Still due: a built-in model, which does not tell when
                    // it sends; its request counts now.
                    let sent = match track.request_due.take() {
                        Some(due) => {
                            self.live.requests.get_or_create(&label).inc();
                            Some(due)
                        }
                        None => track.request_sent.take(),
                    };
                    track.request_sent = None;
                    if let Some(sent) = sent {
                        self.model_latency
                            .get_or_create(&label)
                            .observe(now.saturating_duration_since(sent).as_secs_f64());
                    }
                    for (kind, n) in [
                        ("input", usage.input_tokens),
                        ("output", usage.output_tokens),
                    ] {
                        self.tokens
                            .get_or_create(&TokenLabel {
                                model: label.model.clone(),
                                kind: kind.into(),
                            })
                            .inc_by(n);
                    }
                    self.cost.get_or_create(&label).inc_by(usage.cost);
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
                    if track.suspended_since.is_some() {
                        self.agents_parked.dec();
                    }
                    if let Some(own) = track.own_step_time(now) {
                        self.step_seconds.observe(own.as_secs_f64());
                    }
                    if track.in_model_call && matches!(kind, EventKind::AgentFailed { .. }) {
                        self.errors.get_or_create(&track.label()).inc();
                    }
                }
                if state.parent_id.is_none() {
                    self.tree_models.locked().remove(&*event.tree_id);
                }
            }
        }
    }

    /// Sets the store's gauges before a scrape: whether it takes writes,
    /// and for how long (ms) it has not, while it is down.
    pub fn store_state(&self, writable: bool, down_ms: Option<u64>) {
        self.store_writable.set(i64::from(writable));
        self.store_down_seconds
            .set(down_ms.unwrap_or(0) as f64 / 1000.0);
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
        let mut doc = crate::ApiDoc::openapi();
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
            tree_id: "t".parse().unwrap(),
            run_id: "t/0".parse().unwrap(),
            at_ms: 0,
            kind,
        };
        m.observe(&event(EventKind::AgentStarted {
            agent_id: "t/0".parse().unwrap(),
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
            from_record: false,
            refused: false,
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

    fn event(run: &str, kind: EventKind) -> Event {
        Event {
            seq: 0,
            tree_id: "t".parse().unwrap(),
            run_id: run.parse().unwrap(),
            at_ms: 0,
            kind,
        }
    }

    fn started(run: &str) -> EventKind {
        let run: RunId = run.parse().unwrap();
        EventKind::AgentStarted {
            agent_id: run.agent_id(),
            agent_type: "a".into(),
            parent_run_id: run.parent(),
            depth: run.path().len() - 1,
        }
    }

    fn responded(step: u32) -> EventKind {
        EventKind::ModelResponded {
            step,
            usage: arbor_actors::Usage::default(),
            tool_calls: 0,
            reply: None,
            from_record: false,
            refused: false,
        }
    }

    fn finished(run: &str) -> EventKind {
        let state = arbor_actors::AgentState {
            run_id: run.parse().unwrap(),
            parent_id: Some("t/0".parse().unwrap()),
            status: arbor_actors::AgentStatus::Completed,
            ..arbor_actors::AgentState::of_run(run.parse().unwrap())
        };
        EventKind::AgentFinished {
            state: Arc::new(state),
            inherited: 0,
        }
    }

    fn sample(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    fn signal(m: &Metrics, run: &str, event: RequestEvent, at: Instant) {
        m.live.signal(
            &RequestSignal {
                tree_id: "t",
                run_id: run,
                model: "m",
                event,
            },
            at,
        );
    }

    /// Regression: the step that spawned children was timed until the
    /// children's results came back (a parent's step as long as its
    /// slowest child's whole run).
    #[test]
    fn a_parent_whose_child_takes_long_shows_a_short_step() {
        let m = metrics();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let (parent, child) = ("t/0", "t/0.1");
        m.observe_at(&event(parent, started(parent)), at(0));
        m.observe_at(&event(parent, EventKind::StepStarted { step: 1 }), at(0));
        // The model answers in 100 ms with a spawn; the parent gives its
        // slot back while its child runs for a minute.
        m.observe_at(&event(parent, responded(1)), at(100));
        m.observe_at(&event(parent, EventKind::Suspended), at(110));
        m.observe_at(&event(child, started(child)), at(120));
        m.observe_at(&event(child, EventKind::StepStarted { step: 1 }), at(120));
        m.observe_at(&event(child, responded(1)), at(60_000));
        m.observe_at(&event(child, finished(child)), at(60_000));
        m.observe_at(&event(parent, EventKind::Resumed), at(60_010));
        m.observe_at(
            &event(parent, EventKind::StepStarted { step: 2 }),
            at(60_020),
        );
        m.observe_at(&event(parent, responded(2)), at(60_120));
        let text = Format::Prometheus.convert(&m.encode(0));
        // The child's step (about 60 s) and the parent's two (0.12 s and
        // 0.1 s): not 60 s for the parent's first.
        assert_eq!(
            sample(&text, "arbor_step_duration_seconds_count"),
            Some(2.0),
            "{text}"
        );
        let sum = sample(&text, "arbor_step_duration_seconds_sum").unwrap_or_default();
        assert!((sum - (59.88 + 0.12)).abs() < 1e-6, "{text}");
        assert_eq!(
            sample(&text, "arbor_step_duration_seconds_bucket{le=\"0.16\"}"),
            Some(1.0),
            "{text}"
        );
    }

    /// Regression: a request the rate limiter refused (a wait beyond the
    /// tree's deadline) or a closed cooldown gate failed at once was counted
    /// as sent.
    #[test]
    fn a_request_refused_before_sending_is_not_counted() {
        let m = metrics();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // An HTTP model: sent (counted), retried once (counted when the
        // retry goes out), answered.
        m.observe_at(&event("t/0", started("t/0")), at(0));
        m.observe_at(&event("t/0", EventKind::StepStarted { step: 1 }), at(0));
        signal(&m, "t/0", RequestEvent::Sent, at(50));
        let retrying = EventKind::ModelRetrying {
            step: 1,
            attempt: 1,
            delay_ms: 10,
            reason: "503: busy".into(),
        };
        m.observe_at(&event("t/0", retrying), at(60));
        signal(&m, "t/0", RequestEvent::Sent, at(70));
        signal(
            &m,
            "t/0",
            RequestEvent::FirstToken(Duration::from_millis(40)),
            at(110),
        );
        m.observe_at(&event("t/0", responded(1)), at(150));
        // Its next step's request is refused before it goes out: the run
        // fails without a signal.
        m.observe_at(&event("t/0", EventKind::StepStarted { step: 2 }), at(200));
        let state = arbor_actors::AgentState {
            status: arbor_actors::AgentStatus::Failed,
            ..arbor_actors::AgentState::of_run("t/0".parse().unwrap())
        };
        let failed = EventKind::AgentFailed {
            error: "the endpoint asked to wait 60s, beyond the tree's deadline in 5s".into(),
            state: Arc::new(state),
            inherited: 0,
        };
        m.observe_at(&event("t/0", failed), at(201));
        // Another service's run: not ours.
        signal(&m, "u/0", RequestEvent::Sent, at(300));
        let text = Format::Prometheus.convert(&m.encode(0));
        assert_eq!(
            sample(&text, "arbor_model_requests_total{model=\"m\"}"),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, "arbor_model_retries_total{model=\"m\"}"),
            Some(1.0),
            "{text}"
        );
        // Latency from the first sending (50 ms) to the reply (150 ms).
        let latency = sample(&text, "arbor_model_latency_seconds_sum{model=\"m\"}");
        assert!(latency.is_some_and(|s| (s - 0.1).abs() < 1e-9), "{text}");
        assert_eq!(
            sample(&text, "arbor_model_ttft_seconds_count{model=\"m\"}"),
            Some(1.0),
            "{text}"
        );
        let ttft = sample(&text, "arbor_model_ttft_seconds_sum{model=\"m\"}");
        assert!(ttft.is_some_and(|s| (s - 0.04).abs() < 1e-9), "{text}");
    }
}
