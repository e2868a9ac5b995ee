//! The one grammar for every duration Arbor reads: config keys, CLI flags
//! (`gc --older-than`, `loadtest --latency`) and HTTP bodies alike.
//!
//! It is jiff's "friendly" format, so it is documented and maintained there:
//! numbers with units, optionally spaced and combined: `250ms`, `1.5s`,
//! `1h30m`, `2 hours 15 minutes`, `30 days`, `1w`, and ISO 8601 (`PT1H`).
//! A fraction is allowed on hours and smaller units (`1.5h`, not `1.5d`).
//! Arbor adds two rules: a bare `0` means zero, and a day is 24 hours (years
//! and months, which are not a fixed length, are refused). Negative durations
//! are refused. Where a key has a range (a timeout of at least 1 ms, a
//! latency of at most an hour), the caller checks it with [`within`].

use std::fmt;
use std::time::Duration;

use jiff::{Span, SpanRelativeTo};

/// Why a duration was refused; its `Display` names the text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("duration {text:?}: {why}")]
pub struct DurationError {
    /// The text as given.
    pub text: String,
    /// What is wrong with it.
    pub why: String,
}

/// What a well-formed duration looks like, for messages.
pub const EXAMPLES: &str = "e.g. 0, 250ms, 1.5s, 1h30m, 30 days";

/// Parses a duration (see the module documentation for the grammar).
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let trimmed = text.trim();
    let error = |why: String| DurationError {
        text: text.to_owned(),
        why,
    };
    if trimmed == "0" {
        return Ok(Duration::ZERO);
    }
    if trimmed.is_empty() {
        return Err(error(format!("is empty ({EXAMPLES})")));
    }
    let span: Span = trimmed.parse().map_err(|e: jiff::Error| {
        let message = e.to_string();
        // jiff's message starts with its own context; keep the reason.
        let reason = message
            .rsplit_once("format: ")
            .map_or(message.as_str(), |(_, r)| r);
        error(format!("{reason} ({EXAMPLES})"))
    })?;
    if span.get_years() != 0 || span.get_months() != 0 {
        return Err(error(
            "years and months are not a fixed length; use days or weeks".into(),
        ));
    }
    if span.is_negative() {
        return Err(error("must not be negative".into()));
    }
    let signed = span
        .to_duration(SpanRelativeTo::days_are_24_hours())
        .map_err(|e| error(e.to_string()))?;
    Duration::try_from(signed).map_err(|e| error(e.to_string()))
}

/// Checks `value` against an inclusive range, naming the bounds in the
/// grammar's own spelling.
pub fn within(value: Duration, min: Duration, max: Duration) -> Result<Duration, String> {
    if value < min {
        Err(format!("must be at least {}", Human(min)))
    } else if value > max {
        Err(format!("must be at most {}", Human(max)))
    } else {
        Ok(value)
    }
}

/// A duration written the way [`parse`] reads it (`1h30m`, `250ms`).
#[derive(Clone, Copy, Debug)]
pub struct Human(pub Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.is_zero() {
            return f.write_str("0");
        }
        if d.subsec_nanos() != 0 && d < Duration::from_secs(1) {
            let ms = d.as_secs_f64() * 1000.0;
            return write!(f, "{}ms", trim(ms));
        }
        let mut secs = d.as_secs();
        let mut out = String::new();
        for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
            if secs >= size {
                out.push_str(&format!("{}{unit}", secs / size));
                secs %= size;
            }
        }
        let frac = d.subsec_nanos();
        if secs != 0 || frac != 0 {
            let s = secs as f64 + f64::from(frac) / 1e9;
            out.push_str(&format!("{}s", trim(s)));
        }
        f.write_str(&out)
    }
}

fn trim(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ok(text: &str) -> Duration {
        parse(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn one_grammar_reads_units_combinations_fractions_and_days() {
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("250ms"), Duration::from_millis(250));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("1.5m"), Duration::from_secs(90));
        assert_eq!(ok("1h30m"), Duration::from_secs(5400));
        assert_eq!(ok("2 hours 15 minutes"), Duration::from_secs(8100));
        assert_eq!(ok("30 days"), Duration::from_secs(30 * 86_400));
        assert_eq!(ok("1d12h"), Duration::from_secs(36 * 3600));
        assert_eq!(ok("1w"), Duration::from_secs(7 * 86_400));
        assert_eq!(ok(" 5s "), Duration::from_secs(5));
        assert_eq!(ok("PT1H"), Duration::from_secs(3600));
    }

    #[test]
    fn a_bad_duration_says_why_and_names_its_text() {
        for (text, why) in [
            ("12", "unit"),
            ("5 parsecs", "unit"),
            ("", "empty"),
            ("-5s", "negative"),
            ("1.5d", "fractional days"),
            ("1y", "fixed length"),
            ("2mo", "fixed length"),
            ("99999999999999999999ms", "too big"),
            ("200000000000000d", "range"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(&format!("{text:?}")), "{e}");
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn ranges_name_their_bounds_in_the_grammar() {
        let (min, max) = (Duration::from_millis(1), Duration::from_secs(3600));
        assert_eq!(
            within(Duration::ZERO, min, max).unwrap_err(),
            "must be at least 1ms"
        );
        assert_eq!(
            within(Duration::from_secs(5400), min, max).unwrap_err(),
            "must be at most 1h"
        );
        assert!(within(Duration::from_secs(60), min, max).is_ok());
    }

    #[test]
    fn human_durations_parse_back_to_themselves() {
        for d in [
            Duration::from_millis(250),
            Duration::from_millis(1500),
            Duration::from_secs(5400),
            Duration::from_secs(90_061),
            Duration::from_secs(30 * 86_400),
        ] {
            assert_eq!(ok(&Human(d).to_string()), d, "{}", Human(d));
        }
    }
}
