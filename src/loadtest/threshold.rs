//! `arbor loadtest --threshold`: pass/fail criteria on a run's figures, as
//! k6's thresholds are (`http_req_duration: p(99)<2000`,
//! `http_req_failed: rate<0.01`). Parsing and evaluation are pure.
//!
//! A threshold is `METRIC OP VALUE`:
//!
//! - `p50`, `p90`, `p95`, `p99`, `max`: latency, a duration (`2s`, `800ms`):
//!   of the endpoint's answered requests with `--model`, else of a child's
//!   spawn to its parent receiving its result;
//! - `error_rate` (or `failed_rate`): failed requests over requests with
//!   `--model`, else failed agents over agents ended; a fraction (`0.01`) or
//!   a percentage (`1%`);
//! - `failures`: failed requests (`--model`), else failed agents, a count;
//! - `throughput` (or `agents_per_sec`): agents ended per second of the run.
//!
//! `OP` is one of `<`, `<=`, `>`, `>=`.

use std::fmt;
use std::str::FromStr;

/// A latency quantile a threshold reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantile {
    /// The median.
    P50,
    /// The 90th percentile.
    P90,
    /// The 95th percentile.
    P95,
    /// The 99th percentile.
    P99,
    /// The largest.
    Max,
}

/// What a threshold is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// A latency quantile, µs.
    Latency(Quantile),
    /// Failed over all, a fraction.
    ErrorRate,
    /// Failed, a count.
    Failures,
    /// Agents ended per second.
    Throughput,
}

/// A comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl Op {
    fn holds(self, actual: f64, bound: f64) -> bool {
        match self {
            Op::Lt => actual < bound,
            Op::Le => actual <= bound,
            Op::Gt => actual > bound,
            Op::Ge => actual >= bound,
        }
    }
}

/// One `--threshold`: `metric op value`, the value in the metric's unit
/// (µs, a fraction, a count, per second).
#[derive(Clone, Debug, PartialEq)]
pub struct Threshold {
    /// The text as given (trimmed), for the report.
    pub text: String,
    /// What it is on.
    pub metric: Metric,
    /// How the figure compares.
    pub op: Op,
    /// The bound, in the metric's unit.
    pub value: f64,
}

/// The figures a threshold reads from one run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Observed {
    /// p50, p90, p95, p99, max, µs.
    pub latency_us: [u64; 5],
    /// Failed over all (0 to 1).
    pub error_rate: f64,
    /// Failed, a count.
    pub failures: u64,
    /// Agents ended per second.
    pub throughput: f64,
}

impl Observed {
    /// The figure `metric` reads.
    pub fn of(&self, metric: Metric) -> f64 {
        match metric {
            Metric::Latency(q) => {
                let i = match q {
                    Quantile::P50 => 0,
                    Quantile::P90 => 1,
                    Quantile::P95 => 2,
                    Quantile::P99 => 3,
                    Quantile::Max => 4,
                };
                self.latency_us[i] as f64
            }
            Metric::ErrorRate => self.error_rate,
            Metric::Failures => self.failures as f64,
            Metric::Throughput => self.throughput,
        }
    }
}

/// A threshold and how the run met it.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// The threshold.
    pub threshold: Threshold,
    /// The run's figure, in the metric's unit.
    pub actual: f64,
    /// Whether the figure met it.
    pub passed: bool,
}

impl fmt::Display for Verdict {
    /// `✓ p99<2s (p99 1.20 s)` or `✗ error_rate<1% (error_rate 12.5%)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = if self.passed { '✓' } else { '✗' };
        let name = self.threshold.text.split(['<', '>']).next().unwrap_or("");
        let actual = match self.threshold.metric {
            Metric::Latency(_) => super::report::human_us_f64(self.actual),
            Metric::ErrorRate => format!("{:.2}%", self.actual * 100.0),
            Metric::Failures => format!("{:.0}", self.actual),
            Metric::Throughput => format!("{:.1}/s", self.actual),
        };
        write!(
            f,
            "{mark} {} ({} {actual})",
            self.threshold.text,
            name.trim()
        )
    }
}

/// Each threshold against `observed`, in order.
pub fn evaluate(thresholds: &[Threshold], observed: &Observed) -> Vec<Verdict> {
    thresholds
        .iter()
        .map(|t| {
            let actual = observed.of(t.metric);
            Verdict {
                threshold: t.clone(),
                actual,
                passed: t.op.holds(actual, t.value),
            }
        })
        .collect()
}

/// What the metrics are, for messages.
pub const METRICS: &str = "p50, p90, p95, p99, max (a duration), error_rate (a fraction or \
                           a percentage), failures (a count), throughput (agents/s)";

/// What is wrong with a threshold's text (each names the text, trimmed).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ThresholdError {
    /// No `<`, `>`, `<=` or `>=`.
    #[error("{0:?} has no comparison: expected METRIC<VALUE, e.g. p99<2s or error_rate<1%")]
    NoComparison(String),
    /// Nothing before the comparison.
    #[error("{0:?} names no metric: one of {METRICS}")]
    NoMetric(String),
    /// A metric of no such name.
    #[error("{text:?}: unknown metric {metric:?}: one of {METRICS}")]
    UnknownMetric {
        /// The threshold.
        text: String,
        /// The name it gives.
        metric: String,
    },
    /// Nothing after the comparison.
    #[error("{0:?} has no value after its comparison")]
    NoValue(String),
    /// A count, rate or throughput that is not a number of at least 0.
    #[error("{text:?}: {value:?} is not a number of at least 0")]
    NotANumber {
        /// The threshold.
        text: String,
        /// The value it gives.
        value: String,
    },
    /// A latency that is no duration.
    #[error(
        "{text:?}: a latency is a duration ({}): {why}",
        arbor_actors::duration::EXAMPLES
    )]
    NotADuration {
        /// The threshold.
        text: String,
        /// Why the value is no duration.
        why: String,
    },
    /// An error rate over 1.
    #[error("{text:?}: an error rate is at most 1 (100%), here {rate}")]
    RateOverOne {
        /// The threshold.
        text: String,
        /// The rate it gives.
        rate: f64,
    },
}

impl FromStr for Threshold {
    type Err = ThresholdError;

    fn from_str(text: &str) -> Result<Self, ThresholdError> {
        let text = text.trim();
        let at = text
            .find(['<', '>'])
            .ok_or_else(|| ThresholdError::NoComparison(text.to_owned()))?;
        let (name, rest) = text.split_at(at);
        let (op, value) = if let Some(v) = rest.strip_prefix("<=") {
            (Op::Le, v)
        } else if let Some(v) = rest.strip_prefix(">=") {
            (Op::Ge, v)
        } else if let Some(v) = rest.strip_prefix('<') {
            (Op::Lt, v)
        } else {
            (Op::Gt, &rest[1..])
        };
        let (name, value) = (name.trim(), value.trim());
        let metric = match name {
            "p50" | "p(50)" | "median" => Metric::Latency(Quantile::P50),
            "p90" | "p(90)" => Metric::Latency(Quantile::P90),
            "p95" | "p(95)" => Metric::Latency(Quantile::P95),
            "p99" | "p(99)" => Metric::Latency(Quantile::P99),
            "max" => Metric::Latency(Quantile::Max),
            "error_rate" | "failed_rate" => Metric::ErrorRate,
            "failures" => Metric::Failures,
            "throughput" | "agents_per_sec" => Metric::Throughput,
            "" => return Err(ThresholdError::NoMetric(text.to_owned())),
            other => {
                return Err(ThresholdError::UnknownMetric {
                    text: text.to_owned(),
                    metric: other.to_owned(),
                });
            }
        };
        if value.is_empty() {
            return Err(ThresholdError::NoValue(text.to_owned()));
        }
        let number = |v: &str| -> Result<f64, ThresholdError> {
            v.parse::<f64>()
                .ok()
                .filter(|n| n.is_finite() && *n >= 0.0)
                .ok_or_else(|| ThresholdError::NotANumber {
                    text: text.to_owned(),
                    value: v.to_owned(),
                })
        };
        let value = match metric {
            Metric::Latency(_) => {
                let d = arbor_actors::duration::parse(value).map_err(|e| {
                    ThresholdError::NotADuration {
                        text: text.to_owned(),
                        why: e.why,
                    }
                })?;
                d.as_secs_f64() * 1e6
            }
            Metric::ErrorRate => match value.strip_suffix('%') {
                Some(percent) => number(percent.trim())? / 100.0,
                None => number(value)?,
            },
            Metric::Failures => number(value)?,
            Metric::Throughput => number(value.strip_suffix("/s").unwrap_or(value).trim())?,
        };
        if metric == Metric::ErrorRate && value > 1.0 {
            return Err(ThresholdError::RateOverOne {
                text: text.to_owned(),
                rate: value,
            });
        }
        Ok(Threshold {
            text: text.to_owned(),
            metric,
            op,
            value,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(text: &str) -> Threshold {
        text.parse().unwrap()
    }

    #[test]
    fn thresholds_parse_k6_style_with_units() {
        let p99 = t("p99<2s");
        assert_eq!(p99.metric, Metric::Latency(Quantile::P99));
        assert_eq!(p99.op, Op::Lt);
        assert_eq!(p99.value, 2_000_000.0);
        assert_eq!(t(" p(95) <= 800ms ").value, 800_000.0);
        assert_eq!(t("p95<=800ms").text, "p95<=800ms");
        assert_eq!(t("error_rate<0.01").value, 0.01);
        assert_eq!(t("error_rate < 1%").value, 0.01);
        assert_eq!(t("failures<=0").metric, Metric::Failures);
        let rate = t("throughput>=50/s");
        assert_eq!(
            (rate.metric, rate.op, rate.value),
            (Metric::Throughput, Op::Ge, 50.0)
        );
        assert_eq!(t("agents_per_sec>5").op, Op::Gt);
    }

    #[test]
    fn a_bad_threshold_says_what_is_wrong() {
        let err = |text: &str| text.parse::<Threshold>().unwrap_err().to_string();
        assert!(err("p99").contains("no comparison"), "{}", err("p99"));
        assert!(
            err("p98<2s").contains("unknown metric \"p98\""),
            "{}",
            err("p98<2s")
        );
        assert!(err("p99<").contains("no value"));
        assert!(
            err("p99<fast").contains("a latency is a duration"),
            "{}",
            err("p99<fast")
        );
        assert!(err("error_rate<150%").contains("at most 1"));
        assert!(err("failures<-1").contains("not a number of at least 0"));
        assert!(err("<2s").contains("names no metric"));
    }

    #[test]
    fn thresholds_are_met_or_crossed_by_the_figures() {
        let observed = Observed {
            latency_us: [1_000, 2_000, 2_500, 3_000_000, 4_000_000],
            error_rate: 0.2,
            failures: 3,
            throughput: 12.0,
        };
        let verdicts = evaluate(
            &[
                t("p99<2s"),
                t("p50<2s"),
                t("error_rate<0.01"),
                t("error_rate<=20%"),
                t("failures<1"),
                t("throughput>10"),
                t("max<=4s"),
            ],
            &observed,
        );
        let passed: Vec<bool> = verdicts.iter().map(|v| v.passed).collect();
        assert_eq!(passed, [false, true, false, true, false, true, true]);
        assert_eq!(verdicts[0].to_string(), "✗ p99<2s (p99 3.00 s)");
        assert_eq!(
            verdicts[2].to_string(),
            "✗ error_rate<0.01 (error_rate 20.00%)"
        );
        assert_eq!(
            verdicts[5].to_string(),
            "✓ throughput>10 (throughput 12.0/s)"
        );
    }
}
