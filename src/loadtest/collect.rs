//! What a load test measures, taken from the event stream as it happens: an
//! observer on the bus, so nothing is buffered and nothing reaches into actors.

use std::collections::HashMap;

use arbor_actors::idmap::IdMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arbor_actors::sync::LockExt as _;
use arbor_actors::{Delta, Event, EventKind, FailureKind, RunId, UsageSource};
use hdrhistogram::Histogram;

/// Counters and histograms of one run, updated from events.
///
/// The counters are public so that a progress display (`run_once`'s `tick`)
/// can read them while the tree runs; they are only written by
/// [`observe`](Collector::observe).
pub struct Collector {
    start: Instant,
    /// Agents started so far (root included).
    pub started: AtomicU64,
    /// Agents that ended with an answer.
    pub finished: AtomicU64,
    /// Agents that ended with an error.
    pub failed: AtomicU64,
    /// Agents that were cancelled.
    pub cancelled: AtomicU64,
    /// Agents holding a live slot (stepping) now.
    pub live: AtomicI64,
    /// The most agents that held a live slot at once.
    pub live_max: AtomicI64,
    /// Agents started and not yet ended (stepping, suspended or finishing).
    pub alive: AtomicI64,
    /// The most agents alive at once.
    pub alive_max: AtomicI64,
    /// Model steps started, over all agents.
    pub steps: AtomicU64,
    /// Model calls retried (each retry counts once).
    pub retries: AtomicU64,
    /// The endpoint's requests (a `--model` run's model records them).
    pub endpoint: Arc<super::endpoint::EndpointStats>,
    inner: Mutex<Inner>,
}

struct Inner {
    /// When each child waiting or running was spawned, by a hash of its run
    /// id: a wide tree at its live cap has `cap × fanout` children spawned and
    /// waiting (10^7 in the 10^8-agent tree at 1,000 live), so an entry is
    /// 24 bytes, not a copy of the id.
    spawned_at: IdMap<u64, Instant>,
    /// The hasher of `spawned_at`'s keys.
    ids: arbor_actors::idmap::IdHasher,
    /// Per run (one step in flight at a time): the step and when it started,
    /// and when its first delta arrived.
    step_started: IdMap<RunId, (u32, Instant)>,
    first_delta: IdMap<RunId, Instant>,
    /// Spawn to reply, microseconds.
    spawn_to_reply: Histogram<u64>,
    /// Model step latency (request to reply), microseconds.
    step_latency: Histogram<u64>,
    /// Time to first token, microseconds.
    ttft: Histogram<u64>,
    /// Answers (replies without tool calls: on an endpoint, the replies it
    /// sent) and their counts by where they come from.
    answers: Answers,
    /// Time the answers took to generate: from the first token when streamed,
    /// from the request otherwise.
    generation: Duration,
    errors: HashMap<String, u64>,
    retry_reasons: HashMap<String, u64>,
    /// Live agents and agents ended over time, a point per event.
    timeline: Timeline,
}

/// One point of the timeline: at `t_ms` (since the collector was made), the
/// most agents live (stepping) in the point's span of time and the agents
/// ended by its end.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Point {
    /// Milliseconds since the collector was made.
    pub t_ms: f64,
    /// The most agents holding a live slot within the point's span.
    pub live: i64,
    /// Agents ended (completed, failed or cancelled) by then.
    pub ended: u64,
}

/// The live-agent curve, sampled by event: every change of the live count or
/// of the agents ended makes or updates a point, so a peak between two ticks
/// is not missed (a 50 ms tick once showed 1 live agent where 90 ran). Its
/// size is bounded: events less than `span_ms` after the last point update
/// it (keeping its largest live count), and when there are
/// [`Timeline::MOST`] points, neighbours are merged in pairs and the span
/// doubles.
#[derive(Clone, Debug)]
pub struct Timeline {
    points: Vec<Point>,
    span_ms: f64,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline {
            points: Vec::new(),
            span_ms: 1.0,
        }
    }
}

impl Timeline {
    /// The most points kept.
    pub const MOST: usize = 4096;

    /// Records the live count and agents ended at `t_ms`.
    pub fn record(&mut self, t_ms: f64, live: i64, ended: u64) {
        if let Some(last) = self.points.last_mut()
            && t_ms - last.t_ms < self.span_ms
        {
            last.live = last.live.max(live);
            last.ended = last.ended.max(ended);
            return;
        }
        if self.points.len() >= Self::MOST {
            self.points = self
                .points
                .chunks(2)
                .map(|pair| Point {
                    t_ms: pair[0].t_ms,
                    live: pair.iter().map(|p| p.live).max().unwrap_or(0),
                    ended: pair.iter().map(|p| p.ended).max().unwrap_or(0),
                })
                .collect();
            self.span_ms *= 2.0;
        }
        self.points.push(Point { t_ms, live, ended });
    }

    /// The points, in time order.
    pub fn points(&self) -> &[Point] {
        &self.points
    }
}

/// 1 µs .. 1 h at 3 significant digits: constant bounds that hdrhistogram accepts.
#[allow(clippy::expect_used)]
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant histogram bounds")
}

impl Default for Collector {
    fn default() -> Self {
        Collector {
            start: Instant::now(),
            started: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            live: AtomicI64::new(0),
            live_max: AtomicI64::new(0),
            alive: AtomicI64::new(0),
            alive_max: AtomicI64::new(0),
            steps: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            endpoint: Arc::default(),
            inner: Mutex::new(Inner {
                spawned_at: IdMap::default(),
                ids: arbor_actors::idmap::IdHasher::default(),
                first_delta: IdMap::default(),
                step_started: IdMap::default(),
                spawn_to_reply: histogram(),
                step_latency: histogram(),
                ttft: histogram(),
                answers: Answers::default(),
                generation: Duration::ZERO,
                errors: HashMap::new(),
                retry_reasons: HashMap::new(),
                timeline: Timeline::default(),
            }),
        }
    }
}

/// Latency percentiles in microseconds (of a histogram that records at
/// least 1 µs, to 3 significant digits).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Percentiles {
    /// How many latencies were recorded (the others are 0 when none was).
    pub count: u64,
    /// The median, µs.
    pub p50: u64,
    /// The 90th percentile, µs.
    pub p90: u64,
    /// The 95th percentile, µs.
    pub p95: u64,
    /// The 99th percentile, µs.
    pub p99: u64,
    /// The largest recorded, µs.
    pub max: u64,
}

impl Percentiles {
    pub(crate) fn of(h: &Histogram<u64>) -> Self {
        Percentiles {
            count: h.len(),
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p95: h.value_at_quantile(0.95),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        }
    }
}

/// The answers of a run and their tokens. Planned spawning steps (tool
/// calls) are left out: in an endpoint run the simulated model makes them
/// locally, and their counts are not the endpoint's.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Answers {
    /// Answers received (model replies without tool calls).
    pub replies: u64,
    /// Input (prompt) tokens of those answers, summed.
    pub input_tokens: u64,
    /// Output tokens of those answers, summed.
    pub output_tokens: u64,
    /// Replies that reported no usage and whose counts were estimated from
    /// their text (`arbor_actors::model::ESTIMATED_BYTES_PER_TOKEN`).
    pub replies_estimated: u64,
    /// Replies that reported no usage and were counted as 0 (nothing estimated them).
    pub replies_unreported: u64,
}

impl Answers {
    /// Whether any figure includes an estimate.
    pub fn estimated(&self) -> bool {
        self.replies_estimated > 0
    }
}

/// The token figures of an endpoint run.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenFigures {
    /// Output tokens over the time the answers took to generate.
    pub output_tokens_per_sec: f64,
    /// Some (or all) counts are estimates: `repliesEstimated` of `replies`
    /// reported no usage.
    pub tokens_estimated: bool,
    /// The counts the rate is computed from.
    #[serde(flatten)]
    pub answers: Answers,
}

/// A snapshot of what was measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Measured {
    /// From a child's spawn to its parent receiving its result.
    pub spawn_to_reply_us: Percentiles,
    /// One model step, from its start to the model's reply (retries included).
    pub step_latency_us: Percentiles,
    /// Time to the first streamed token (text, tool-call arguments or
    /// reasoning) of a step; steps that streamed nothing are not counted.
    pub ttft_us: Percentiles,
    /// Only for a run on an endpoint (`--model`).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenFigures>,
    /// Agents that ended failed or cancelled, by a short label of the error
    /// (`http 429`, `limit max_depth`, `timeout`, `cancelled`, or the error's
    /// first clause).
    pub errors: HashMap<String, u64>,
    /// Retries by kind (the total is `LoadReport::retries`).
    pub retry_kinds: HashMap<String, u64>,
    /// Only for a run on an endpoint (`--model`): its requests, their
    /// latency and their failures by kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<super::endpoint::EndpointFigures>,
    /// The latency the report leads with (the endpoint's requests with
    /// `--model`, else spawn→reply) as `(up to µs, count)` buckets: the
    /// plot's distribution.
    pub latency_distribution: Vec<(u64, u64)>,
    /// Live agents and agents ended over time, a point per event (merged
    /// when close in time, at most [`Timeline::MOST`]): the plot's curves.
    pub timeline: Vec<Point>,
}

impl Collector {
    fn live_add(&self, delta: i64) {
        let now = self.live.fetch_add(delta, Ordering::AcqRel) + delta;
        self.live_max.fetch_max(now, Ordering::AcqRel);
        self.point();
    }

    /// A timeline point for now.
    fn point(&self) {
        let t = self.start.elapsed().as_secs_f64() * 1000.0;
        let mut inner = self.inner.locked();
        let live = self.live.load(Ordering::Acquire);
        let ended = self.finished.load(Ordering::Acquire)
            + self.failed.load(Ordering::Acquire)
            + self.cancelled.load(Ordering::Acquire);
        inner.timeline.record(t, live, ended);
    }

    fn record(h: &mut Histogram<u64>, d: Duration) {
        let _ = h.record((d.as_micros() as u64).max(1));
    }

    /// Takes one event.
    pub fn observe(&self, event: &Event) {
        let now = Instant::now();
        match &event.kind {
            EventKind::AgentStarted { .. } => {
                self.started.fetch_add(1, Ordering::Relaxed);
                self.live_add(1);
                let alive = self.alive.fetch_add(1, Ordering::AcqRel) + 1;
                self.alive_max.fetch_max(alive, Ordering::AcqRel);
            }
            EventKind::Suspended => self.live_add(-1),
            EventKind::Resumed => self.live_add(1),
            EventKind::ChildSpawned { child_run_id, .. } => {
                let mut inner = self.inner.locked();
                let id = std::hash::BuildHasher::hash_one(&inner.ids, child_run_id);
                inner.spawned_at.insert(id, now);
            }
            EventKind::ChildFinished { child_run_id, .. } => {
                let mut inner = self.inner.locked();
                let id = std::hash::BuildHasher::hash_one(&inner.ids, child_run_id);
                if let Some(at) = inner.spawned_at.remove(&id) {
                    Self::record(&mut inner.spawn_to_reply, now - at);
                }
            }
            EventKind::StepStarted { step } => {
                self.steps.fetch_add(1, Ordering::Relaxed);
                self.inner
                    .locked()
                    .step_started
                    .insert(event.run_id.clone(), (*step, now));
            }
            EventKind::ModelDelta { delta, .. } => {
                if matches!(
                    delta,
                    Delta::Text { .. } | Delta::ToolCallArgs { .. } | Delta::Reasoning { .. }
                ) {
                    self.inner
                        .locked()
                        .first_delta
                        .entry(event.run_id.clone())
                        .or_insert(now);
                }
            }
            EventKind::ModelRetrying { reason, .. } => {
                self.retries.fetch_add(1, Ordering::Relaxed);
                let mut inner = self.inner.locked();
                *inner.retry_reasons.entry(error_kind(reason)).or_default() += 1;
                // The next attempt's first token counts, not this one's.
                inner.first_delta.remove(&event.run_id);
            }
            EventKind::ModelResponded {
                step,
                usage,
                tool_calls,
                from_record,
                refused,
                ..
            } => {
                {
                    let mut inner = self.inner.locked();
                    let started = inner.step_started.remove(&event.run_id);
                    let first = inner.first_delta.remove(&event.run_id);
                    // Neither a reply served from a store's record nor one
                    // billed and refused (cut) is an answer of the endpoint.
                    let answer = *tool_calls == 0 && !*from_record && !*refused;
                    if let Some((_, at)) = started.filter(|(s, _)| s == step) {
                        Self::record(&mut inner.step_latency, now - at);
                        if let Some(first) = first {
                            Self::record(&mut inner.ttft, first - at);
                        }
                        if answer {
                            // A reply that was not streamed took its whole
                            // request to generate.
                            inner.generation += now - first.unwrap_or(at);
                        }
                    }
                    if answer {
                        let a = &mut inner.answers;
                        a.replies += 1;
                        a.input_tokens += usage.input_tokens;
                        a.output_tokens += usage.output_tokens;
                        match usage.source {
                            UsageSource::Reported | UsageSource::Recorded => {}
                            UsageSource::Estimated => a.replies_estimated += 1,
                            UsageSource::Absent => a.replies_unreported += 1,
                        }
                    }
                }
            }
            EventKind::AgentFinished { .. } => self.ended(event, &self.finished, None),
            EventKind::AgentFailed { error, state, .. } => {
                let label = failure_label(state.error_kind, error);
                self.ended(event, &self.failed, Some(&label))
            }
            EventKind::AgentCancelled { .. } => {
                self.ended(event, &self.cancelled, Some("cancelled"))
            }
            _ => {}
        }
    }

    fn ended(&self, event: &Event, counter: &AtomicU64, error: Option<&str>) {
        counter.fetch_add(1, Ordering::AcqRel);
        self.live_add(-1);
        self.alive.fetch_sub(1, Ordering::AcqRel);
        let mut inner = self.inner.locked();
        if let Some(error) = error {
            *inner.errors.entry(error.to_owned()).or_default() += 1;
        }
        inner.step_started.remove(&event.run_id);
        inner.first_delta.remove(&event.run_id);
    }

    /// Records a timeline point for now (events record their own; a tick
    /// marks the time between them).
    pub fn sample(&self) {
        self.point();
    }

    /// A snapshot of the histograms, counts and samples so far.
    pub(crate) fn measured(&self, endpoint: bool) -> Measured {
        let endpoint = endpoint.then(|| (self.endpoint.figures(), self.endpoint.distribution()));
        let inner = self.inner.locked();
        let secs = inner.generation.as_secs_f64();
        Measured {
            spawn_to_reply_us: Percentiles::of(&inner.spawn_to_reply),
            step_latency_us: Percentiles::of(&inner.step_latency),
            ttft_us: Percentiles::of(&inner.ttft),
            tokens: Some(TokenFigures {
                output_tokens_per_sec: if secs > 0.0 {
                    inner.answers.output_tokens as f64 / secs
                } else {
                    0.0
                },
                tokens_estimated: inner.answers.estimated(),
                answers: inner.answers,
            }),
            errors: inner.errors.clone(),
            retry_kinds: inner.retry_reasons.clone(),
            latency_distribution: match &endpoint {
                Some((_, distribution)) => distribution.clone(),
                None => distribution(&inner.spawn_to_reply),
            },
            endpoint: endpoint.map(|(figures, _)| figures),
            timeline: inner.timeline.points().to_vec(),
        }
    }
}

/// A latency distribution as `(up to µs, count)` buckets: at most 40,
/// spaced evenly on a log scale from the smallest to the largest latency
/// recorded (none when nothing was).
pub(crate) fn distribution(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    const BUCKETS: usize = 40;
    if h.is_empty() {
        return Vec::new();
    }
    let (low, high) = (h.min().max(1) as f64, h.max().max(1) as f64);
    let ratio = (high / low).powf(1.0 / BUCKETS as f64).max(1.0 + 1e-6);
    let mut counts = [0u64; BUCKETS];
    for v in h.iter_recorded() {
        let value = (v.value_iterated_to().max(1) as f64).clamp(low, high);
        let i = ((value / low).ln() / ratio.ln()).floor() as usize;
        counts[i.min(BUCKETS - 1)] += v.count_at_value();
    }
    counts
        .iter()
        .enumerate()
        .map(|(i, &n)| ((low * ratio.powi(i as i32 + 1)).round() as u64, n))
        .collect()
}

/// How a failed agent is counted: its failure's kind with the short reason
/// beside it (`model_unavailable: http 503`, `limit max_depth`), or the short
/// reason alone for a state that has no kind.
pub fn failure_label(kind: Option<FailureKind>, error: &str) -> String {
    let detail = error_kind(error);
    match kind {
        Some(FailureKind::Limit) | None => detail,
        Some(kind) if detail.is_empty() => kind.name().to_owned(),
        Some(kind) => format!("{kind}: {detail}"),
    }
}

/// A short kind for an error or retry reason: the HTTP status or limit it
/// names, else its first clause (up to the first `:`, without a leading
/// `model NAME (…) …:`), at most six words: `stream chunk is not JSON`, not
/// a cut `stream chunk is not`.
pub fn error_kind(reason: &str) -> String {
    if let Some(status) = reason
        .split(|c: char| !c.is_ascii_digit())
        .find(|w| w.len() == 3 && matches!(w.as_bytes()[0], b'4' | b'5'))
    {
        return format!("http {status}");
    }
    if let Some(rest) = reason.find("limit ").map(|i| &reason[i + 6..]) {
        return format!("limit {}", rest.split_whitespace().next().unwrap_or(""));
    }
    if reason.contains("timed out") || reason.contains("idle for") || reason.contains("within") {
        return "timeout".into();
    }
    let reason = match reason.strip_prefix("model ") {
        Some(_) => reason.split_once(": ").map_or(reason, |(_, rest)| rest),
        None => reason,
    };
    let clause = reason.split(':').next().unwrap_or(reason);
    clause
        .split_whitespace()
        .take(6)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_agent_is_counted_by_its_failure_kind() {
        assert_eq!(
            failure_label(
                Some(FailureKind::ModelRateLimited),
                "model m (openai x) is rate-limited: 429: slow down"
            ),
            "model_rate_limited: http 429"
        );
        assert_eq!(
            failure_label(
                Some(FailureKind::ModelRejected),
                "model m (openai x) refused the request (401): bad key"
            ),
            "model_rejected: http 401"
        );
        assert_eq!(
            failure_label(Some(FailureKind::Limit), "limit max_steps reached: 3 of 3"),
            "limit max_steps"
        );
        assert_eq!(failure_label(None, "it broke: badly"), "it broke");
    }

    #[test]
    fn error_kinds_are_short() {
        assert_eq!(
            error_kind("model m (openai x) failed transiently: 429: slow down"),
            "http 429"
        );
        assert_eq!(
            error_kind("limit max_depth reached: a child at depth 5"),
            "limit max_depth"
        );
        assert_eq!(error_kind("the stream was idle for 2s"), "timeout");
        assert_eq!(error_kind("cancelled"), "cancelled");
        // A label is a whole clause, not cut after four words.
        assert_eq!(
            error_kind("stream chunk is not JSON: expected value at line 1 column 4"),
            "stream chunk is not JSON"
        );
        assert_eq!(
            error_kind("model m (openai x) is unavailable: request failed: connection refused"),
            "request failed"
        );
    }
}
