//! When and how long to wait before trying a model request again.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;

/// Exponential backoff with full jitter, honouring the server's `Retry-After`.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// The wait before the first retry, doubled for each next one.
    pub base_delay: Duration,
    /// The longest wait before a retry.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1 for the first retry). A server's
    /// `Retry-After` wins when given, as it is: `max_delay` does not shorten
    /// it (the client fails at once instead when it falls beyond the tree's
    /// deadline); otherwise `base · 2^(retry-1)` with jitter in [50 %, 100 %],
    /// capped at `max_delay`.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>, jitter: f64) -> Duration {
        if let Some(after) = retry_after {
            return after;
        }
        let exp = self
            .base_delay
            .saturating_mul(1u32 << retry.saturating_sub(1).min(20));
        let capped = exp.min(self.max_delay);
        capped.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
    }
}

/// Whether an HTTP status is worth retrying: rate limits, timeouts, server errors
/// and Anthropic's 529 (overloaded).
pub fn retryable_status(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::CONFLICT
        || status.is_server_error()
        || status.as_u16() == 529
}

/// `retry-after-ms` (milliseconds) or `Retry-After` (seconds or an HTTP date).
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = |name: &str| headers.get(name)?.to_str().ok().map(str::trim);
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return Duration::try_from_secs_f64(ms / 1000.0).ok();
    }
    let value = text("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    )
}

/// A number in [0, 1) that differs between calls, for jitter.
pub fn jitter() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let h = RandomState::new().hash_one(std::time::Instant::now());
    (h >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let p = RetryPolicy {
            max_retries: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1000),
        };
        assert_eq!(p.delay(1, None, 1.0), Duration::from_millis(100));
        assert_eq!(p.delay(2, None, 1.0), Duration::from_millis(200));
        assert_eq!(p.delay(3, None, 0.0), Duration::from_millis(200));
        assert_eq!(p.delay(9, None, 1.0), Duration::from_millis(1000));
        // Retry-After is honoured as it is, beyond max_delay.
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(7)), 0.3),
            Duration::from_secs(7)
        );
        assert_eq!(
            p.delay(1, Some(Duration::from_millis(20)), 0.3),
            Duration::from_millis(20)
        );
    }

    #[test]
    fn retry_after_reads_seconds_milliseconds_and_dates() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)));
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
        h.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn which_statuses_are_retried() {
        for s in [429, 500, 502, 503, 504, 529, 408] {
            assert!(retryable_status(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [400, 401, 403, 404, 422] {
            assert!(!retryable_status(StatusCode::from_u16(s).unwrap()), "{s}");
        }
    }
}
