//! The simulated model: a procedural tree for demos and load tests. An agent
//! at depth `d` spawns `shape[d]` children (types taken round-robin from its
//! spawn tool); deeper agents answer with `reply_tokens` words after a
//! configurable latency.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::message::{Message, ToolCall, ToolResultPart};
use crate::model::{DeltaSink, Model, ModelError, ModelRequest, ModelResponse, Usage};
use crate::toolbox::SPAWN_AGENTS;

/// How long a simulated call takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Latency {
    /// Always this long.
    Fixed(Duration),
    /// Log-normal with this median and shape `sigma`.
    LogNormal {
        /// The median latency.
        median: Duration,
        /// The shape: 0 is always the median, larger spreads wider.
        sigma: f64,
    },
}

/// The longest latency a simulated call takes: a parsed one above it is
/// refused, a sampled one is capped to it.
pub(crate) const MAX_LATENCY: Duration = Duration::from_secs(3600);

/// The widest log-normal shape: at 3 the slowest of a million calls is
/// about 10^7 times the median, already past any load test's interest.
pub(crate) const MAX_SIGMA: f64 = 3.0;

/// A latency that cannot be read: the text as given and what is wrong.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("latency {text:?}: {problem}")]
pub struct LatencyError {
    /// The text as given.
    pub text: String,
    /// What is wrong with it.
    pub problem: LatencyProblem,
}

/// What is wrong with a latency's text.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LatencyProblem {
    /// Not a duration.
    #[error("{0}")]
    Duration(crate::duration::DurationError),
    /// A duration past the most a simulated latency may be.
    #[error("{0}")]
    Range(crate::duration::OutOfRange),
    /// `lognormal:` without its two parts.
    #[error("expected lognormal:MEDIAN,SIGMA")]
    Shape,
    /// A sigma that is not a number.
    #[error("sigma must be a number")]
    SigmaNotANumber,
    /// A sigma outside 0 to 3.
    #[error("sigma must be from 0 to {MAX_SIGMA}")]
    SigmaRange,
}

impl Latency {
    /// Whether every call takes no time (a fixed zero, or a zero median).
    pub fn is_zero(&self) -> bool {
        match *self {
            Latency::Fixed(d) | Latency::LogNormal { median: d, .. } => d.is_zero(),
        }
    }

    /// Parses `0`, `50ms`, `2s` or `lognormal:200ms,0.5` (durations in
    /// [`crate::duration`]'s grammar, at most an hour; a sigma from 0 to 3).
    pub fn parse(text: &str) -> Result<Latency, LatencyError> {
        let text = text.trim();
        let error = |problem| LatencyError {
            text: text.to_owned(),
            problem,
        };
        let duration = |d: &str| {
            let value =
                crate::duration::parse(d).map_err(|e| error(LatencyProblem::Duration(e)))?;
            crate::duration::within(value, Duration::ZERO, MAX_LATENCY)
                .map_err(|why| error(LatencyProblem::Range(why)))
        };
        if let Some(rest) = text.strip_prefix("lognormal:") {
            let (median, sigma) = rest
                .split_once(',')
                .ok_or_else(|| error(LatencyProblem::Shape))?;
            let sigma: f64 = sigma
                .trim()
                .parse()
                .map_err(|_| error(LatencyProblem::SigmaNotANumber))?;
            if !(0.0..=MAX_SIGMA).contains(&sigma) {
                return Err(error(LatencyProblem::SigmaRange));
            }
            return Ok(Latency::LogNormal {
                median: duration(median)?,
                sigma,
            });
        }
        duration(text).map(Latency::Fixed)
    }

    /// One call's latency: the fixed one, or a log-normal draw from `seed`
    /// (the same seed, the same draw).
    pub fn sample(&self, seed: u64) -> Duration {
        match *self {
            Latency::Fixed(d) => d,
            Latency::LogNormal { median, sigma } => {
                let mut rng = seed | 1;
                let mut next = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    (rng >> 11) as f64 / (1u64 << 53) as f64
                };
                let (u1, u2) = (next().max(f64::MIN_POSITIVE), next());
                let normal = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                let secs = median.as_secs_f64() * (sigma * normal).exp();
                Duration::try_from_secs_f64(secs.min(MAX_LATENCY.as_secs_f64()))
                    .unwrap_or(MAX_LATENCY)
            }
        }
    }
}

/// What an alive simulated agent holds, besides its answer: its state,
/// history, actor, model call in flight and child table (`--shape
/// 100,100,100` with no live cap peaked at 4.19 GB with 410,104 alive on a
/// release build: ~10 KB each; docs/benchmarks-history.md).
pub const ALIVE_AGENT_BYTES: u64 = 10_240;

/// What a child waiting for a live slot costs at most: its entry in its
/// parent's call as the simulated model writes it (~180 bytes of text), its
/// place in the child table (24 bytes), and its share of the call's reports.
pub const WAITING_CHILD_BYTES: u64 = 300;

/// The shape of a simulated tree and the cost of its calls.
#[derive(Clone, Debug, PartialEq)]
pub struct SimulatedConfig {
    /// Children an agent at depth `d` spawns: `shape[d]`; agents deeper than
    /// the shape answer. `[3, 3]` is fanout 3, depth 2.
    pub shape: Vec<usize>,
    /// How long each call takes.
    pub latency: Latency,
    /// Words in a leaf agent's answer.
    pub reply_tokens: usize,
}

impl SimulatedConfig {
    /// The same fanout on every level down to `depth`.
    pub fn tree(fanout: usize, depth: usize) -> Self {
        SimulatedConfig {
            shape: vec![fanout; depth],
            ..SimulatedConfig::default()
        }
    }

    /// About how many bytes the tree holds at its peak, when at most `live`
    /// agents step at once and at most `max_agents` run (`None`: no limit):
    /// what a check compares with the machine's memory before a tree is
    /// run, so that a tree it lets through does not abort on allocation
    /// (issue 34). Without a live cap every agent is alive at once; with one,
    /// each level has at most `live` agents alive, and the children of the
    /// parents that stepped wait for a slot ([`WAITING_CHILD_BYTES`] each).
    pub fn peak_bytes(&self, live: Option<u64>, max_agents: Option<u64>) -> u64 {
        let cap = max_agents.unwrap_or(u64::MAX);
        let Some(live) = live else {
            return self.agents().min(cap).saturating_mul(self.alive_bytes());
        };
        let mut level = 1u64;
        let mut alive = 1u64;
        let mut waiting = 0u64;
        for &fanout in &self.shape {
            waiting = waiting.max(level.min(live).saturating_mul(fanout as u64));
            level = level.saturating_mul(fanout as u64);
            alive = alive.saturating_add(level.min(live));
        }
        let alive = alive.min(cap).saturating_mul(self.alive_bytes());
        alive.saturating_add(waiting.min(cap).saturating_mul(WAITING_CHILD_BYTES))
    }

    /// What one alive agent holds: its state and actor, and its answer.
    fn alive_bytes(&self) -> u64 {
        ALIVE_AGENT_BYTES.saturating_add((self.reply_tokens as u64).saturating_mul(8))
    }

    /// How many agents the whole tree has, the root included.
    pub fn agents(&self) -> u64 {
        let mut level = 1u64;
        let mut total = 1u64;
        for &fanout in &self.shape {
            level = level.saturating_mul(fanout as u64);
            total = total.saturating_add(level);
        }
        total
    }
}

impl Default for SimulatedConfig {
    fn default() -> Self {
        SimulatedConfig {
            shape: vec![3, 3],
            latency: Latency::Fixed(Duration::ZERO),
            reply_tokens: 40,
        }
    }
}

/// A model that plays a procedural fan-out tree (see [`SimulatedConfig`]).
pub struct SimulatedModel {
    name: String,
    config: SimulatedConfig,
}

impl SimulatedModel {
    /// A simulated model named `name` (its catalog name).
    pub fn new(name: impl Into<String>, config: SimulatedConfig) -> Self {
        SimulatedModel {
            name: name.into(),
            config,
        }
    }

    fn spawn_call(&self, request: &ModelRequest) -> Option<ToolCall> {
        let fanout = self
            .config
            .shape
            .get(request.meta.depth)
            .copied()
            .unwrap_or(0);
        if request.meta.step != 1 || fanout == 0 {
            return None;
        }
        let spawn = request.tools.get(SPAWN_AGENTS)?;
        let types: Vec<&str> = spawn
            .input_schema
            .pointer("/properties/agents/items/properties/agent_type/examples")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if types.is_empty() {
            return None;
        }
        let task = task_of(request);
        let agents: Vec<Value> = (0..fanout)
            .map(|i| {
                json!({
                    "agent_type": types[i % types.len()],
                    "prompt": format!("Part {} of {fanout}: {task}", i + 1),
                })
            })
            .collect();
        Some(ToolCall {
            tool_call_id: format!("{}-spawn", request.meta.run_id),
            tool_name: SPAWN_AGENTS.to_owned(),
            input: json!({ "agents": agents }).into(),
        })
    }

    fn answer(&self, request: &ModelRequest, seed: u64) -> String {
        // The spawn's report entries: (asked for, reported); a child that was
        // refused, failed or never ran reports `{errorMessage}`.
        let (asked, reported) = match request.messages.last().map(|m| &**m) {
            Some(Message::Tool { content, .. }) => content
                .iter()
                .filter_map(|p| match p {
                    ToolResultPart::Json { value } => value.as_array(),
                    ToolResultPart::Media { .. } => None,
                })
                .flatten()
                .fold((0, 0), |(asked, reported), entry| {
                    let failed = entry["value"].get("errorMessage").is_some();
                    (asked + 1, reported + usize::from(!failed))
                }),
            _ => (0, 0),
        };
        let task = task_of(request);
        let mut text = match (asked, reported) {
            (0, _) => format!("Findings on \"{task}\"."),
            (_, 0) => format!("None of the {asked} sub-agents reported on \"{task}\"."),
            (a, r) if a == r => format!("Merged the reports of {r} sub-agents on \"{task}\"."),
            (a, r) => format!("Merged the reports of {r} of {a} sub-agents on \"{task}\"."),
        };
        let mut rng = seed | 1;
        let mut words = text.split_whitespace().count();
        let mut sentence = 0;
        while words < self.config.reply_tokens {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let word = WORDS[(rng % WORDS.len() as u64) as usize];
            text.push(' ');
            if sentence == 0 {
                let mut chars = word.chars();
                text.extend(chars.next().map(|c| c.to_ascii_uppercase()));
                text.push_str(chars.as_str());
            } else {
                text.push_str(word);
            }
            sentence += 1;
            words += 1;
            if sentence >= 6 + (rng % 7) as usize {
                text.push('.');
                sentence = 0;
            }
        }
        if sentence > 0 {
            text.push('.');
        }
        text
    }
}

const WORDS: [&str; 32] = [
    "the",
    "evidence",
    "suggests",
    "approach",
    "scales",
    "with",
    "input",
    "size",
    "while",
    "memory",
    "stays",
    "bounded",
    "each",
    "variant",
    "trades",
    "latency",
    "for",
    "throughput",
    "in",
    "practice",
    "results",
    "depend",
    "on",
    "data",
    "shape",
    "and",
    "cache",
    "behaviour",
    "a",
    "benchmark",
    "confirms",
    "this",
];

/// The task an agent was given: its spawn prompt or its first user message.
fn task_of(request: &ModelRequest) -> String {
    let text = request
        .messages
        .iter()
        .rev()
        .find(|m| matches!(***m, Message::User { .. }))
        .map(|m| m.text())
        .unwrap_or_default();
    let task = text.rsplit(": ").next().unwrap_or(&text);
    task.chars().take(120).collect()
}

#[async_trait]
impl Model for SimulatedModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(
        &self,
        request: ModelRequest,
        _deltas: DeltaSink,
    ) -> Result<ModelResponse, ModelError> {
        let mut hasher = DefaultHasher::new();
        request.meta.run_id.hash(&mut hasher);
        request.meta.step.hash(&mut hasher);
        let delay = self.config.latency.sample(hasher.finish());
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let input_tokens = request.messages.estimated_tokens();
        let message = match self.spawn_call(&request) {
            Some(call) => Message::assistant(None, vec![call]),
            None => Message::assistant_text(self.answer(&request, hasher.finish())),
        };
        let output_tokens = message.estimated_tokens();
        Ok(ModelResponse {
            message,
            usage: Usage {
                input_tokens,
                output_tokens,
                ..Usage::default()
            },
        })
    }
}

#[cfg(test)]
mod tests {

    /// Issue 34: a check refuses what would outgrow the machine by this
    /// estimate, so it must follow the live cap and the tree's limit.
    #[test]
    fn a_trees_peak_follows_its_live_cap_not_its_size() {
        let tree = SimulatedConfig {
            reply_tokens: 0,
            ..SimulatedConfig::tree(9999, 2)
        };
        let uncapped = tree.peak_bytes(None, None);
        assert_eq!(uncapped, 99_990_001 * ALIVE_AGENT_BYTES);
        // 1000 parents step, their 10^7 children wait: ~3 GB, not 400.
        let capped = tree.peak_bytes(Some(1000), None);
        assert_eq!(
            capped,
            2001 * ALIVE_AGENT_BYTES + 1000 * 9999 * WAITING_CHILD_BYTES
        );
        // A tree limited to 200 agents holds no more than 200.
        assert_eq!(tree.peak_bytes(None, Some(200)), 200 * ALIVE_AGENT_BYTES);
        assert!(tree.peak_bytes(Some(1_000_000), None) > 30_000_000_000);
    }

    use super::*;

    #[test]
    fn durations_and_latencies_parse() {
        for bad in [
            "lognormal:1s,1000",
            "lognormal:1s,nan",
            "lognormal:1s,inf",
            "lognormal:1s,-1",
            "99999999999999999999ms",
            "2h",
        ] {
            assert!(Latency::parse(bad).is_err(), "{bad}");
        }
        // The widest shape allowed never samples past the cap (nor panics).
        let wide = Latency::parse("lognormal:1ms,3").unwrap();
        assert!((0..100_000).all(|seed| wide.sample(seed) <= MAX_LATENCY));
        assert_eq!(
            Latency::parse("lognormal:200ms,0.5").unwrap(),
            Latency::LogNormal {
                median: Duration::from_millis(200),
                sigma: 0.5
            }
        );
        assert!(Latency::parse("lognormal:200ms").is_err());
    }

    #[test]
    fn a_shape_counts_its_agents() {
        assert_eq!(SimulatedConfig::tree(10, 4).agents(), 11_111);
        assert_eq!(SimulatedConfig::tree(3, 0).agents(), 1);
        let c = SimulatedConfig {
            shape: vec![10, 10, 5],
            ..SimulatedConfig::default()
        };
        assert_eq!(c.agents(), 1 + 10 + 100 + 500);
    }

    #[test]
    fn lognormal_samples_spread_around_the_median() {
        let l = Latency::LogNormal {
            median: Duration::from_millis(100),
            sigma: 0.5,
        };
        let mut samples: Vec<Duration> = (1..=1001u64)
            .map(|s| l.sample(s.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .collect();
        samples.sort();
        let median = samples[500].as_millis();
        assert!((70..=140).contains(&median), "median {median}ms");
        assert!(samples[0] < samples[1000]);
    }
}
