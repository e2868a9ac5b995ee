//! What the endpoint of a `--model` run did: each request it was sent, how
//! long it took and how it ended. Timed around the endpoint's own call (in
//! [`super::shaped::ShapedModel`]), so the steps the load generator plans
//! itself (its spawns, answered locally in microseconds) are not among them,
//! and a request that failed is counted, by kind, instead of left out.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use arbor_actors::ModelError;
use arbor_actors::sync::LockExt;
use hdrhistogram::Histogram;
use std::sync::Mutex;

use super::collect::{Percentiles, error_kind, histogram};

/// The endpoint's requests so far (shared by the model that sends them and
/// the collector that reports them).
pub struct EndpointStats {
    inner: Mutex<Inner>,
}

struct Inner {
    /// Requests answered with a reply, by latency (µs).
    answered: Histogram<u64>,
    /// Requests that failed, by latency (µs): a timeout takes its whole wait.
    failed: Histogram<u64>,
    /// Failed requests by kind ([`request_failure_kind`]).
    failures: BTreeMap<String, u64>,
}

impl Default for EndpointStats {
    fn default() -> Self {
        EndpointStats {
            inner: Mutex::new(Inner {
                answered: histogram(),
                failed: histogram(),
                failures: BTreeMap::new(),
            }),
        }
    }
}

/// What the endpoint did, for the report and the `--json` file.
#[derive(Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointFigures {
    /// Requests sent to the endpoint (every attempt: a retry is a request).
    pub requests: u64,
    /// Requests it answered with a reply.
    pub answered: u64,
    /// Requests that failed (an HTTP error, a timeout, a reply that could not
    /// be read).
    pub failed: u64,
    /// The failed requests by kind (`http 429`, `http 503`, `timeout`,
    /// `malformed reply`, …).
    pub failures: BTreeMap<String, u64>,
    /// Latency of the answered requests, from the request to the whole
    /// reply, µs.
    pub latency_us: Percentiles,
    /// Latency of the failed requests (to their error), µs.
    pub failed_latency_us: Percentiles,
}

impl EndpointFigures {
    /// Failed requests over all requests (0 when none was sent).
    pub fn error_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.failed as f64 / self.requests as f64
        }
    }
}

impl EndpointStats {
    /// Records one request that started at `start` and ended so.
    pub fn record<T>(&self, start: Instant, outcome: &Result<T, ModelError>) {
        let took = start.elapsed();
        let mut inner = self.inner.locked();
        match outcome {
            Ok(_) => record(&mut inner.answered, took),
            Err(error) => {
                record(&mut inner.failed, took);
                *inner
                    .failures
                    .entry(request_failure_kind(error))
                    .or_default() += 1;
            }
        }
    }

    /// Records one request that started at `start` and failed with a
    /// failure of `kind` that the client then retried (it reported the
    /// retry, not an error).
    pub fn record_retried(&self, start: Instant, kind: String) {
        let took = start.elapsed();
        let mut inner = self.inner.locked();
        record(&mut inner.failed, took);
        *inner.failures.entry(kind).or_default() += 1;
    }

    /// A snapshot of the figures so far.
    pub fn figures(&self) -> EndpointFigures {
        let inner = self.inner.locked();
        let answered = inner.answered.len();
        let failed = inner.failed.len();
        EndpointFigures {
            requests: answered + failed,
            answered,
            failed,
            failures: inner.failures.clone(),
            latency_us: Percentiles::of(&inner.answered),
            failed_latency_us: Percentiles::of(&inner.failed),
        }
    }

    /// The answered requests' latency distribution (see
    /// `collect::distribution`).
    pub fn distribution(&self) -> Vec<(u64, u64)> {
        super::collect::distribution(&self.inner.locked().answered)
    }
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    let _ = h.record((d.as_micros() as u64).max(1));
}

/// The kind a failed request is counted under: its HTTP status where it has
/// one (`http 429`, `http 401`), `timeout`, `malformed reply`, `cut at the
/// output limit`, or the first clause of what went wrong.
pub fn request_failure_kind(error: &ModelError) -> String {
    match error {
        ModelError::Rejected { status, .. } => format!("http {status}"),
        ModelError::RateLimited { .. } => "http 429".to_owned(),
        ModelError::Transient { message, .. } => match error_kind(message) {
            kind if kind.is_empty() => "unavailable".to_owned(),
            kind => kind,
        },
        ModelError::Malformed { .. } => "malformed reply".to_owned(),
        ModelError::Truncated { .. } => "cut at the output limit".to_owned(),
        ModelError::Invalid { message, .. } => format!("invalid: {}", error_kind(message)),
        other => error_kind(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transient(message: &str) -> ModelError {
        ModelError::Transient {
            model: "m".into(),
            message: message.into(),
            retry_after: None,
        }
    }

    #[test]
    fn failed_requests_are_counted_by_kind_and_answered_ones_timed() {
        let stats = EndpointStats::default();
        let start = Instant::now() - Duration::from_millis(1500);
        stats.record(start, &Ok::<(), ModelError>(()));
        stats.record(
            start,
            &Err::<(), _>(transient("503 Service Unavailable: busy")),
        );
        stats.record(
            start,
            &Err::<(), _>(transient("the request timed out after 30s")),
        );
        stats.record(
            start,
            &Err::<(), _>(ModelError::RateLimited {
                model: "m".into(),
                message: "slow down".into(),
                retry_after: None,
            }),
        );
        let f = stats.figures();
        assert_eq!((f.requests, f.answered, f.failed), (4, 1, 3));
        assert_eq!(
            f.failures.into_iter().collect::<Vec<_>>(),
            [
                ("http 429".to_owned(), 1),
                ("http 503".to_owned(), 1),
                ("timeout".to_owned(), 1)
            ]
        );
        // 1.5 s, not the µs of a locally planned step.
        assert!(f.latency_us.p50 >= 1_500_000, "{:?}", f.latency_us);
        assert_eq!(f.latency_us.count, 1);
        assert_eq!(f.failed_latency_us.count, 3);
    }
}
