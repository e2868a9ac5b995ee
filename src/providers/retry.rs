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

/// A Go duration as OpenAI writes it: `1s`, `6m0s`, `20ms`, `1h2m3.5s`.
pub fn go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit..];
        total += number * scale;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// An RFC 3339 time (`2025-01-02T03:04:05.678Z`, `...+01:00`).
pub fn rfc3339(text: &str) -> Option<std::time::SystemTime> {
    let text = text.trim();
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let bytes = text.as_bytes();
    let separators = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if bytes.len() < 20
        || separators.iter().any(|&(i, c)| bytes[i] != c)
        || !matches!(bytes[10], b'T' | b't' | b' ')
    {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    // Seconds may be 60 (a leap second): counted as the next second's start.
    if second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut nanos = 0u32;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(fraction.len());
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<9}", &fraction[..digits.min(9)]);
        nanos = padded.parse().ok()?;
        rest = &fraction[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (h, m) = rest.get(1..)?.split_once(':')?;
            if h.len() != 2 || m.len() != 2 {
                return None;
            }
            sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60)
        }
    };
    // Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
    // days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset;
    let secs = u64::try_from(secs).ok()?;
    std::time::UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
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
    fn go_durations_as_openai_writes_them() {
        let ms = Duration::from_millis;
        assert_eq!(go_duration("1s"), Some(ms(1000)));
        assert_eq!(go_duration("6m0s"), Some(ms(360_000)));
        assert_eq!(go_duration("20ms"), Some(ms(20)));
        assert_eq!(go_duration("1h2m3.5s"), Some(ms(3_723_500)));
        assert_eq!(go_duration("0.25s"), Some(ms(250)));
        assert_eq!(
            go_duration("1500us"),
            Some(ms(1) + Duration::from_micros(500))
        );
        for bad in ["", "5", "s", "1x", "1.2.3s", "-1s"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn rfc3339_times() {
        let at = |secs: u64, nanos: u32| Some(std::time::UNIX_EPOCH + Duration::new(secs, nanos));
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), at(0, 0));
        assert_eq!(rfc3339("2015-10-21T07:28:00Z"), at(1_445_412_480, 0));
        assert_eq!(
            rfc3339("2015-10-21T09:28:00.25+02:00"),
            at(1_445_412_480, 250_000_000)
        );
        assert_eq!(
            rfc3339("2024-02-29T23:59:59-00:30"),
            at(1_709_251_199 + 1800, 0)
        );
        for bad in [
            "",
            "2015-10-21",
            "2015-10-21T07:28:00",
            "2015-13-21T07:28:00Z",
            "2015-10-21T07:28:00.Z",
            "2015-10-21T07:28:00+0200",
            "1969-12-31T23:59:59Z",
        ] {
            assert_eq!(rfc3339(bad), None, "{bad}");
        }
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
