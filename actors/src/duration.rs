//! The one grammar for every duration Arbor reads: config keys, CLI flags
//! (`gc --older-than`, `loadtest --latency`) and HTTP bodies alike.
//!
//! It is jiff's "friendly" format, so it is documented and maintained there:
//! numbers with units, optionally spaced and combined: `250ms`, `1.5s`,
//! `1h30m`, `2 hours 15 minutes`, `30 days`, `1w`, and ISO 8601 (`PT1H`).
//! Arbor adds three rules: a bare `0` means zero; a day is 24 hours and a
//! week 7 days (years and months, which are not a fixed length, are refused);
//! so a fraction is allowed on days and weeks too (`1.5d` is 36 hours,
//! `0.5 days` 12, `1.5w` 252), where jiff itself takes one on hours and
//! smaller units only (`fractional_days_as_hours`). Negative durations
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
    let refused = |e: jiff::Error| {
        let message = e.to_string();
        // jiff's message starts with its own context; keep the reason.
        let reason = message
            .rsplit_once("format: ")
            .map_or(message.as_str(), |(_, r)| r);
        error(format!("{reason} ({EXAMPLES})"))
    };
    let span: Span = match trimmed.parse() {
        Ok(span) => span,
        // jiff refuses a fraction on days and weeks; with 24-hour days it
        // has one meaning, so read it as hours (and jiff reads those).
        Err(e) => match fractional_days_as_hours(trimmed) {
            Some(hours) => hours.parse().map_err(refused)?,
            None => return Err(refused(e)),
        },
    };
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

/// `text` with its fractional number of days or weeks written as hours,
/// exactly (`1.5d` → `36h`, `1w 0.5d` → `1w 12h`, `0.25 weeks ago` → `42h
/// ago`), or `None` if it has no such number. jiff refuses fractional days
/// ("fractional days are not supported") because its days are calendar days
/// of varying length; Arbor's are 24 hours (`days_are_24_hours`), so the
/// fraction has one meaning. jiff allows a fraction only on the last unit
/// and with at most 9 digits, so exactly one number may have one here, and
/// the rest of the text (signs, other units, `ago`) is left for jiff to read.
/// ISO 8601 text (`P1.5D`) is left alone.
fn fractional_days_as_hours(text: &str) -> Option<String> {
    if text.trim_start_matches(['+', '-']).starts_with(['P', 'p']) {
        return None;
    }
    let bytes = text.as_bytes();
    let digits_from = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    // Every `digits [.,] digits` in the text: (start, separator, end).
    let mut fractions = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let separator = digits_from(i);
        let end = digits_from(separator + 1);
        if separator < bytes.len() && matches!(bytes[separator], b'.' | b',') && end > separator + 1
        {
            fractions.push((i, separator, end));
        }
        i = end.max(separator + 1);
    }
    let [(start, separator, end)] = fractions[..] else {
        return None;
    };
    let label_start = end + text[end..].len() - text[end..].trim_start().len();
    let label_len = text[label_start..]
        .bytes()
        .take_while(u8::is_ascii_alphabetic)
        .count();
    let label = &text[label_start..label_start + label_len];
    let one: Span = format!("1{label}").parse().ok()?;
    let hours_per_unit: u128 = if one.fieldwise() == Span::new().days(1).fieldwise() {
        24
    } else if one.fieldwise() == Span::new().weeks(1).fieldwise() {
        24 * 7
    } else {
        return None;
    };
    let fraction = &text[separator + 1..end];
    if fraction.len() > 9 {
        return None;
    }
    let scale = 10u128.pow(u32::try_from(fraction.len()).ok()?);
    let whole: u128 = text[start..separator].parse().ok()?;
    let numerator: u128 = fraction.parse().ok()?;
    let hours = whole
        .checked_mul(scale)?
        .checked_add(numerator)?
        .checked_mul(hours_per_unit)?;
    let (whole_hours, rest) = (hours / scale, hours % scale);
    let written = if rest == 0 {
        format!("{whole_hours}h")
    } else {
        let rest = format!("{rest:0width$}", width = fraction.len());
        format!("{whole_hours}.{}h", rest.trim_end_matches('0'))
    };
    Some(format!(
        "{}{written}{}",
        &text[..start],
        &text[label_start + label_len..]
    ))
}

/// A duration outside its range: the bound it crossed, shown in the
/// grammar's own spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OutOfRange {
    /// Below the least it may be.
    #[error("must be at least {}", Human(*.0))]
    Below(Duration),
    /// Above the most it may be.
    #[error("must be at most {}", Human(*.0))]
    Above(Duration),
}

/// Checks `value` against an inclusive range.
pub fn within(value: Duration, min: Duration, max: Duration) -> Result<Duration, OutOfRange> {
    if value < min {
        Err(OutOfRange::Below(min))
    } else if value > max {
        Err(OutOfRange::Above(max))
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
    fn a_fractional_day_or_week_is_that_many_24_hour_days() {
        let hours = |h: u64| Duration::from_secs(h * 3600);
        assert_eq!(ok("1.5d"), hours(36));
        assert_eq!(ok("0.5 days"), hours(12));
        assert_eq!(ok("1.5w"), hours(252));
        assert_eq!(ok("0.25 weeks"), hours(42));
        assert_eq!(ok("1,5d"), hours(36));
        assert_eq!(ok("1w 0.5d"), hours(180));
        assert_eq!(ok("2.0 days"), hours(48));
        // Exact to the nanosecond, within jiff's nine fraction digits.
        assert_eq!(ok("0.000000001d"), Duration::from_nanos(86_400));
        assert_eq!(ok("0.1d"), Duration::from_secs(8640));
        assert_eq!(ok("1.001d"), Duration::from_millis(86_486_400));
        // The rest of the grammar still applies to them.
        for (text, why) in [
            ("-1.5d", "negative"),
            ("1.5d ago", "negative"),
            ("1.5d 3h", "largest to smallest"),
            ("1.5d 2.5h", "fractional"),
            ("200000000000000.5d", "overflows"),
            ("P1.5D", "designator"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(&format!("{text:?}")), "{e}");
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_bad_duration_says_why_and_names_its_text() {
        for (text, why) in [
            ("12", "unit"),
            ("5 parsecs", "unit"),
            ("", "empty"),
            ("-5s", "negative"),
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
            within(Duration::ZERO, min, max).unwrap_err().to_string(),
            "must be at least 1ms"
        );
        assert_eq!(
            within(Duration::from_secs(5400), min, max),
            Err(OutOfRange::Above(max))
        );
        assert_eq!(
            within(Duration::from_secs(5400), min, max)
                .unwrap_err()
                .to_string(),
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
