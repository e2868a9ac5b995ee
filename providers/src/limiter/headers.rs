//! What a reply's rate-limit headers say: the buckets they give (OpenAI's
//! `x-ratelimit-*`, Anthropic's `anthropic-ratelimit-*`), their resets (Go
//! durations and RFC 3339 times, read with jiff), and the quote of them an
//! error carries.

use std::time::Duration;

use reqwest::header::HeaderMap;

use super::{Remaining, Unit};

/// The buckets a reply's rate-limit headers give (each with its remaining
/// count and its reset; see [`Limiter::pace`]).
pub(crate) fn buckets(headers: &HeaderMap) -> Vec<Remaining> {
    let text = |name: &str| headers.get(name)?.to_str().ok().map(str::trim);
    let number = |name: &str| text(name)?.parse::<f64>().ok().filter(|n| n.is_finite());
    let mut found = Vec::new();
    for (row, &(unit, reset_at, [remaining, reset, limit])) in BUCKET_HEADERS.iter().enumerate() {
        let Some(remaining) = number(remaining) else {
            continue;
        };
        let reset = text(reset).and_then(|text| match reset_at {
            ResetAt::After => go_duration(text),
            ResetAt::Time => rfc3339(text).map(|at| {
                at.duration_since(std::time::SystemTime::now())
                    .unwrap_or_default()
            }),
        });
        if let Some(reset) = reset {
            found.push(Remaining {
                unit,
                row,
                limit: number(limit),
                remaining,
                reset,
            });
        }
    }
    found
}

/// The headers of `names` the reply has, as it sent them: `name: value`,
/// comma-separated.
pub(crate) fn quote(headers: &HeaderMap, names: &[&str]) -> String {
    names
        .iter()
        .filter_map(|name| {
            let value = headers.get(*name)?.to_str().ok()?.trim();
            Some(format!("{name}: {value}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A Go duration as OpenAI writes it (`1s`, `6m0s`, `20ms`, `1.5s`,
/// `1h2m3.5s`), read by jiff's friendly format; `None` when it is not one
/// or negative.
pub(crate) fn go_duration(text: &str) -> Option<Duration> {
    let parsed: jiff::SignedDuration = text.trim().parse().ok()?;
    Duration::try_from(parsed).ok()
}

/// An RFC 3339 time (`2025-01-02T03:04:05.678Z`, `...+01:00`), read by jiff.
pub(crate) fn rfc3339(text: &str) -> Option<std::time::SystemTime> {
    let at: jiff::Timestamp = text.trim().parse().ok()?;
    Some(std::time::SystemTime::from(at))
}

/// How a bucket's reset header is written.
#[derive(Clone, Copy)]
enum ResetAt {
    /// A duration from now, as Go writes it (OpenAI: `6m0s`).
    After,
    /// An RFC 3339 time (Anthropic).
    Time,
}

/// Each bucket's headers: remaining, reset, limit. Every reply is read
/// against them, so the names are written out, not formatted per reply.
const BUCKET_HEADERS: &[(Unit, ResetAt, [&str; 3])] = &[
    (
        Unit::Requests,
        ResetAt::After,
        [
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
            "x-ratelimit-limit-requests",
        ],
    ),
    (
        Unit::Tokens,
        ResetAt::After,
        [
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
            "x-ratelimit-limit-tokens",
        ],
    ),
    (
        Unit::Requests,
        ResetAt::Time,
        [
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
            "anthropic-ratelimit-requests-limit",
        ],
    ),
    (
        Unit::Tokens,
        ResetAt::Time,
        [
            "anthropic-ratelimit-tokens-remaining",
            "anthropic-ratelimit-tokens-reset",
            "anthropic-ratelimit-tokens-limit",
        ],
    ),
    (
        Unit::Tokens,
        ResetAt::Time,
        [
            "anthropic-ratelimit-input-tokens-remaining",
            "anthropic-ratelimit-input-tokens-reset",
            "anthropic-ratelimit-input-tokens-limit",
        ],
    ),
    (
        Unit::OutputTokens,
        ResetAt::Time,
        [
            "anthropic-ratelimit-output-tokens-remaining",
            "anthropic-ratelimit-output-tokens-reset",
            "anthropic-ratelimit-output-tokens-limit",
        ],
    ),
];

/// The quote of the headers of `buckets`' row `row` (what an error says the
/// endpoint sent about that bucket).
pub(super) fn quote_row(headers: &HeaderMap, row: usize) -> String {
    quote(headers, &BUCKET_HEADERS[row].2)
}
