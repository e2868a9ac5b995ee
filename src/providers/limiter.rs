//! The rate limits of one endpoint and key, shared by every model on them.
//!
//! A [`Limiter`] holds the configured budgets: at most `max_concurrent`
//! requests in flight, and requests-per-minute and tokens-per-minute
//! buckets, so a swarm queues instead of drowning the endpoint. There is one
//! per endpoint (base URL) and key in the process ([`Limiter::shared`]),
//! whatever the number of `[models.*]` entries on them: two entries on one
//! key share one budget, as the provider counts it. When the entries
//! configure different budgets, the tighter one wins, bound by bound (the
//! lower `max_concurrent`, the lower `requests_per_minute`, the lower
//! `tokens_per_minute`; an unset bound is the loosest). The budgets only
//! tighten while a model holds the limiter: a looser entry built later does
//! not widen them.
//!
//! Over the limiters, one cooldown [`Gate`] per endpoint and key: when the
//! endpoint asks to wait (a 429 or 503 with `Retry-After`, or rate-limit
//! headers saying nothing is left until a reset), the gate closes and no
//! request of any model on that endpoint and key is sent until it opens.
//!
//! [`Limiter::pace`] reads the rate-limit headers beyond "nothing left": when
//! what a bucket has left is no more than what is already on its way to the
//! endpoint and not yet counted by it, the next request would find the bucket
//! spent, so new requests wait ([`hold`], the decision) for the bucket to
//! refill enough.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use arbor_actors::sync::LockExt as _;
use reqwest::header::HeaderMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::retry::{go_duration, rfc3339};

/// A limiter's bounds; `None` leaves that one out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LimiterConfig {
    /// Requests in flight at once.
    pub max_concurrent: Option<usize>,
    /// Requests started per minute.
    pub requests_per_minute: Option<u32>,
    /// Tokens (estimated, then settled) per minute.
    pub tokens_per_minute: Option<u32>,
}

impl LimiterConfig {
    /// Bound by bound, the tighter of the two (an unset bound is the
    /// loosest): the budgets of two entries on one endpoint and key.
    pub fn tightest(&self, other: &LimiterConfig) -> LimiterConfig {
        fn lower<T: Ord + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        LimiterConfig {
            max_concurrent: lower(self.max_concurrent, other.max_concurrent),
            requests_per_minute: lower(self.requests_per_minute, other.requests_per_minute),
            tokens_per_minute: lower(self.tokens_per_minute, other.tokens_per_minute),
        }
    }
}

/// The budgets of one endpoint and key (see the module's text). A handle:
/// its clones, and every limiter [`Limiter::shared`] gives for the same
/// endpoint and key, are one limiter.
#[derive(Clone)]
pub struct Limiter {
    budgets: Arc<Budgets>,
}

/// What the handles of one limiter share.
struct Budgets {
    /// The bounds in force: the tightest of every config joined.
    config: Mutex<LimiterConfig>,
    concurrent: Concurrency,
    requests: Bucket,
    tokens: Bucket,
    in_flight: Mutex<InFlight>,
}

/// Held while a request is in flight.
pub struct Admission {
    budgets: Arc<Budgets>,
    permit: Option<OwnedSemaphorePermit>,
    id: u64,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.budgets.in_flight.locked().out.remove(&self.id);
        if let Some(permit) = self.permit.take() {
            self.budgets.concurrent.release(permit);
        }
    }
}

/// The limiters by endpoint and key hash; a limiter lives while a model
/// holds it.
static LIMITERS: LazyLock<Mutex<Registry<Budgets>>> = LazyLock::new(Mutex::default);

impl Limiter {
    /// A limiter of its own with `config`'s bounds (shared with no model
    /// that does not hold this one; models get theirs from
    /// [`Limiter::shared`]).
    pub fn new(config: &LimiterConfig) -> Self {
        Limiter {
            budgets: Arc::new(Budgets {
                config: Mutex::new(config.clone()),
                concurrent: Concurrency::new(config.max_concurrent),
                requests: Bucket::per_minute(config.requests_per_minute),
                tokens: Bucket::per_minute(config.tokens_per_minute),
                in_flight: Mutex::default(),
            }),
        }
    }

    /// The limiter of `base_url` with `key` (`""` for none), as the
    /// [`Gate`]s are shared: the same one for every model built on them
    /// while one of those models lives, its bounds tightened to `config`'s
    /// where those are tighter. The key is kept only as a hash.
    pub fn shared(base_url: &str, key: &str, config: &LimiterConfig) -> Self {
        let budgets = shared(
            &LIMITERS,
            endpoint(base_url, key),
            || Limiter::new(config).budgets,
            |budgets| budgets.tighten(config),
        );
        Limiter { budgets }
    }

    /// The bounds in force.
    pub fn config(&self) -> LimiterConfig {
        self.budgets.config.locked().clone()
    }

    /// Waits until one more request of about `tokens` tokens may be sent.
    pub async fn admit(&self, tokens: u64) -> Admission {
        let budgets = &self.budgets;
        let permit = budgets.concurrent.acquire().await;
        budgets.requests.take(1.0).await;
        budgets.tokens.take(tokens as f64).await;
        let id = budgets.in_flight.locked().admit(tokens);
        Admission {
            budgets: budgets.clone(),
            permit,
            id,
        }
    }

    /// Corrects the token bucket once the real usage is known.
    pub fn settle(&self, estimated: u64, actual: u64) {
        self.budgets.tokens.adjust(estimated as f64 - actual as f64);
    }

    /// How long new requests should wait, by the rate-limit headers of the
    /// reply to a request sent at `sent` (`None`: no wait): the longest of
    /// the buckets they give, a spent one (nothing left) until its reset,
    /// another by [`hold`], the requests admitted after `sent` being the ones
    /// the endpoint had not counted yet when it answered. OpenAI's
    /// `x-ratelimit-{remaining,reset,limit}-{requests,tokens}` and Anthropic's
    /// `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
    /// {remaining,reset,limit}`; tokens are the requests' estimates (output
    /// tokens, unknown before the reply, wait only when spent).
    pub fn pace(&self, headers: &HeaderMap, sent: Instant) -> Option<Duration> {
        let buckets = buckets(headers);
        if buckets.is_empty() {
            // Most replies of most endpoints: nothing to count against, so
            // the requests in flight are not walked (a walk of all of them,
            // under the lock every request takes, on every reply).
            return None;
        }
        let (requests, tokens) = self.budgets.in_flight.locked().after(sent);
        buckets
            .iter()
            .filter_map(|bucket| {
                // A spent bucket is full again at its reset.
                if bucket.remaining <= 0.0 {
                    return Some(bucket.reset);
                }
                hold(
                    bucket,
                    match bucket.unit {
                        Unit::Requests => requests,
                        Unit::Tokens => tokens,
                        Unit::OutputTokens => 0.0,
                    },
                )
            })
            .max()
    }
}

impl Budgets {
    /// Tightens every bound `config` sets tighter.
    fn tighten(&self, config: &LimiterConfig) {
        let mut current = self.config.locked();
        let tighter = current.tightest(config);
        if tighter == *current {
            return;
        }
        self.concurrent.tighten(tighter.max_concurrent);
        self.requests.tighten(tighter.requests_per_minute);
        self.tokens.tighten(tighter.tokens_per_minute);
        *current = tighter;
    }
}

/// Requests in flight at once: a fair semaphore whose bound may be lowered.
/// Without a bound it has `Semaphore::MAX_PERMITS`, so one set later counts
/// the requests already in flight.
struct Concurrency {
    permits: Arc<Semaphore>,
    state: Mutex<Permits>,
}

struct Permits {
    /// The bound.
    limit: usize,
    /// Permits to forget as they come back: a lower bound found them taken.
    owed: usize,
}

impl Concurrency {
    fn new(limit: Option<usize>) -> Self {
        let limit = limit.map_or(Semaphore::MAX_PERMITS, |n| {
            n.clamp(1, Semaphore::MAX_PERMITS)
        });
        Concurrency {
            permits: Arc::new(Semaphore::new(limit)),
            state: Mutex::new(Permits { limit, owed: 0 }),
        }
    }

    async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().acquire_owned().await.ok()
    }

    /// Lowers the bound to `limit` (a higher or no bound changes nothing).
    fn tighten(&self, limit: Option<usize>) {
        let Some(limit) = limit.map(|n| n.max(1)) else {
            return;
        };
        let mut state = self.state.locked();
        if limit >= state.limit {
            return;
        }
        let cut = state.limit - limit;
        state.limit = limit;
        let forgotten = self.permits.forget_permits(cut);
        state.owed += cut - forgotten;
    }

    fn release(&self, permit: OwnedSemaphorePermit) {
        let mut state = self.state.locked();
        if state.owed > 0 {
            state.owed -= 1;
            permit.forget();
        }
    }
}

/// A token bucket refilled continuously; it may go into debt after
/// `adjust`. `None`: no bound.
struct Bucket {
    state: Mutex<Option<Level>>,
}

struct Level {
    capacity: f64,
    per_second: f64,
    level: f64,
    at: Instant,
}

impl Level {
    /// A full bucket of `n` a minute.
    fn per_minute(n: u32) -> Self {
        let capacity = f64::from(n.max(1));
        Level {
            capacity,
            per_second: capacity / 60.0,
            level: capacity,
            at: Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let elapsed = now.duration_since(self.at).as_secs_f64();
        self.level = (self.level + elapsed * self.per_second).min(self.capacity);
        self.at = now;
    }
}

impl Bucket {
    fn per_minute(n: Option<u32>) -> Self {
        Bucket {
            state: Mutex::new(n.map(Level::per_minute)),
        }
    }

    async fn take(&self, amount: f64) {
        loop {
            let wait = {
                let mut state = self.state.locked();
                let Some(level) = state.as_mut() else {
                    return;
                };
                level.refill();
                let amount = amount.min(level.capacity);
                if level.level >= amount {
                    level.level -= amount;
                    return;
                }
                (amount - level.level) / level.per_second
            };
            tokio::time::sleep(Duration::from_secs_f64(wait.max(0.001))).await;
        }
    }

    fn adjust(&self, delta: f64) {
        if let Some(level) = self.state.locked().as_mut() {
            level.refill();
            level.level = (level.level + delta).min(level.capacity);
        }
    }

    /// Lowers the bound to `n` a minute (a higher or no bound changes
    /// nothing); what is left stays, up to the new capacity.
    fn tighten(&self, n: Option<u32>) {
        let Some(n) = n else {
            return;
        };
        let tighter = Level::per_minute(n);
        let mut state = self.state.locked();
        match state.as_mut() {
            None => *state = Some(tighter),
            Some(level) if tighter.capacity < level.capacity => {
                level.refill();
                level.capacity = tighter.capacity;
                level.per_second = tighter.per_second;
                level.level = level.level.min(level.capacity);
            }
            Some(_) => {}
        }
    }
}

/// The admitted requests not yet ended, by admission: when each was
/// admitted and its estimated tokens.
#[derive(Default)]
struct InFlight {
    next: u64,
    out: BTreeMap<u64, (Instant, u64)>,
}

impl InFlight {
    fn admit(&mut self, tokens: u64) -> u64 {
        let id = self.next;
        self.next += 1;
        self.out.insert(id, (Instant::now(), tokens));
        id
    }

    /// The requests (and their tokens) admitted after `sent`: the newest
    /// entries (ids are given in admission order, under the lock that takes
    /// the time), so the walk stops at the first admitted before.
    fn after(&self, sent: Instant) -> (f64, f64) {
        self.out
            .values()
            .rev()
            .take_while(|(at, _)| *at > sent)
            .fold((0.0, 0.0), |(n, tokens), (_, t)| {
                (n + 1.0, tokens + *t as f64)
            })
    }
}

/// What a rate-limit bucket counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    Requests,
    /// Input tokens (or all tokens), which the requests on their way estimate.
    Tokens,
    /// Anthropic's output tokens: known only once a reply is in, so nothing
    /// on its way counts against them.
    OutputTokens,
}

/// One bucket as a reply's rate-limit headers give it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Remaining {
    pub unit: Unit,
    /// The bucket's size (`None`: not given).
    pub limit: Option<f64>,
    /// What it has left.
    pub remaining: f64,
    /// How long until it is full again.
    pub reset: Duration,
}

/// Whether, and how long, new requests wait for a bucket, `uncounted`
/// (requests, or their estimated tokens) being on their way to the endpoint
/// and not yet counted in its `remaining`. When that leaves nothing for one
/// more (`remaining <= uncounted`), they wait for the shortfall
/// (`uncounted - remaining + 1`) to refill. OpenAI and Anthropic refill
/// their buckets continuously, the reset being when the bucket is full
/// again, so with its `limit` known a bucket refills at
/// `(limit - remaining) / reset` and the wait is the shortfall at that rate
/// (at most the reset); without it, the wait is the reset.
pub(crate) fn hold(bucket: &Remaining, uncounted: f64) -> Option<Duration> {
    if bucket.remaining > uncounted {
        return None;
    }
    let shortfall = uncounted - bucket.remaining + 1.0;
    let wait = match bucket.limit {
        Some(limit) if limit > bucket.remaining => bucket
            .reset
            .mul_f64((shortfall / (limit - bucket.remaining)).min(1.0)),
        _ => bucket.reset,
    };
    Some(wait.min(LONGEST_CLOSE))
}

/// The buckets a reply's rate-limit headers give (each with its remaining
/// count and its reset; see [`Limiter::pace`]).
pub(crate) fn buckets(headers: &HeaderMap) -> Vec<Remaining> {
    let text = |name: &str| headers.get(name)?.to_str().ok().map(str::trim);
    let number = |name: &str| text(name)?.parse::<f64>().ok().filter(|n| n.is_finite());
    let mut found = Vec::new();
    for &(unit, reset_at, [remaining, reset, limit]) in BUCKET_HEADERS {
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
                limit: number(limit),
                remaining,
                reset,
            });
        }
    }
    found
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

/// An endpoint's base URL (without a trailing `/`) and its key's hash.
type Endpoint = (String, u64);

/// Shared values by endpoint, held weakly: one lives while a model holds it.
type Registry<T> = HashMap<Endpoint, Weak<T>>;

fn endpoint(base_url: &str, key: &str) -> Endpoint {
    // A fixed hasher: the same key always hashes the same in a process.
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    (base_url.trim_end_matches('/').to_owned(), hasher.finish())
}

/// The value of `id` in `registry`, joined (`join`) when it lives, else a
/// new one (`make`).
fn shared<T>(
    registry: &Mutex<Registry<T>>,
    id: Endpoint,
    make: impl FnOnce() -> Arc<T>,
    join: impl FnOnce(&T),
) -> Arc<T> {
    let mut values = registry.locked();
    if let Some(value) = values.get(&id).and_then(Weak::upgrade) {
        join(&value);
        return value;
    }
    values.retain(|_, value| value.strong_count() > 0);
    let value = make();
    values.insert(id, Arc::downgrade(&value));
    value
}

/// The cooldown gate of one endpoint and key, shared by every model on them
/// ([`Gate::shared`]): closed until an instant, it holds back every request
/// to the endpoint, the ones waiting to start and the retries alike.
#[derive(Debug, Default)]
pub struct Gate {
    until: Mutex<Option<Instant>>,
}

/// The gate stays closed beyond the request's deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Closed {
    /// How long the gate stays closed from now.
    pub wait: Duration,
    /// How long until the deadline.
    pub left: Duration,
}

/// The longest a gate closes for at once (a guard against a garbled header).
const LONGEST_CLOSE: Duration = Duration::from_secs(86_400);

/// The gates by endpoint and key hash; a gate lives while a model holds it.
static GATES: LazyLock<Mutex<Registry<Gate>>> = LazyLock::new(Mutex::default);

impl Gate {
    /// The gate of `base_url` with `key` (`""` for none): the same gate for
    /// every model built on them while one of those models lives. The key
    /// is kept only as a hash.
    pub fn shared(base_url: &str, key: &str) -> Arc<Gate> {
        shared(&GATES, endpoint(base_url, key), Arc::default, |_| {})
    }

    /// Closes the gate for `wait` from now (a gate already closed for longer
    /// stays so).
    pub fn close_for(&self, wait: Duration) {
        let when = Instant::now() + wait.min(LONGEST_CLOSE);
        let mut until = self.until.locked();
        if until.is_none_or(|u| u < when) {
            *until = Some(when);
        }
    }

    /// How long the gate stays closed (`None`: it is open).
    pub fn closed_for(&self) -> Option<Duration> {
        let until = (*self.until.locked())?;
        let now = Instant::now();
        (until > now).then(|| until - now)
    }

    /// Waits until the gate is open. `Err` at once, without waiting, when it
    /// stays closed beyond `deadline`.
    pub async fn wait(&self, deadline: Option<Instant>) -> Result<(), Closed> {
        // A loop: the gate may close again, for longer, while this waits.
        while let Some(wait) = self.closed_for() {
            let now = Instant::now();
            if let Some(deadline) = deadline
                && now + wait > deadline
            {
                return Err(Closed {
                    wait,
                    left: deadline.saturating_duration_since(now),
                });
            }
            tokio::time::sleep(wait).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    /// `pace` with nothing on its way: what the spent buckets alone say.
    fn spent(headers: &HeaderMap) -> Option<Duration> {
        Limiter::new(&LimiterConfig::default()).pace(headers, Instant::now())
    }

    #[test]
    fn spent_rate_limit_buckets_close_until_their_reset() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-ratelimit-remaining-requests",
            HeaderValue::from_static("3"),
        );
        h.insert("x-ratelimit-reset-requests", HeaderValue::from_static("1s"));
        h.insert(
            "x-ratelimit-remaining-tokens",
            HeaderValue::from_static("0"),
        );
        h.insert("x-ratelimit-reset-tokens", HeaderValue::from_static("6m0s"));
        assert_eq!(spent(&h), Some(Duration::from_secs(360)));
        h.insert(
            "x-ratelimit-remaining-tokens",
            HeaderValue::from_static("10"),
        );
        assert_eq!(spent(&h), None, "nothing is spent");
        h.insert(
            "x-ratelimit-remaining-requests",
            HeaderValue::from_static("0"),
        );
        assert_eq!(spent(&h), Some(Duration::from_secs(1)));

        let mut h = HeaderMap::new();
        h.insert(
            "anthropic-ratelimit-requests-remaining",
            HeaderValue::from_static("0"),
        );
        // A reset in the past: nothing to wait for.
        h.insert(
            "anthropic-ratelimit-requests-reset",
            HeaderValue::from_static("2015-10-21T07:28:00Z"),
        );
        assert_eq!(spent(&h), Some(Duration::ZERO));
        h.insert(
            "anthropic-ratelimit-tokens-remaining",
            HeaderValue::from_static("0"),
        );
        h.insert(
            "anthropic-ratelimit-tokens-reset",
            HeaderValue::from_static("2999-01-01T00:00:00Z"),
        );
        assert!(spent(&h) > Some(Duration::from_secs(86_400 * 365)));
        // Remaining 0 without a reset says nothing about how long.
        let mut h = HeaderMap::new();
        h.insert(
            "x-ratelimit-remaining-requests",
            HeaderValue::from_static("0"),
        );
        assert_eq!(spent(&h), None);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_per_minute_spreads_requests_out() {
        let limiter = Limiter::new(&LimiterConfig {
            requests_per_minute: Some(60),
            ..LimiterConfig::default()
        });
        let start = Instant::now();
        for _ in 0..60 {
            let _ = limiter.admit(0).await;
        }
        assert!(
            start.elapsed() < Duration::from_millis(10),
            "the first minute's burst is free"
        );
        let _ = limiter.admit(0).await;
        let _ = limiter.admit(0).await;
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(2) && waited < Duration::from_millis(2100),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_per_minute_counts_the_real_usage() {
        let limiter = Limiter::new(&LimiterConfig {
            tokens_per_minute: Some(600),
            ..LimiterConfig::default()
        });
        let start = Instant::now();
        let _ = limiter.admit(100).await;
        // The call used 700 tokens, not the 100 estimated: of the 600 in the bucket
        // (600/min = 10/s) 500 were left, so the bucket owes 100.
        limiter.settle(100, 700);
        let _ = limiter.admit(100).await;
        // The next call waits for the debt and its own 100 tokens: 20 s at 10/s.
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(20) && waited < Duration::from_millis(20_100),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn max_concurrent_holds_requests_back() {
        let limiter = Arc::new(Limiter::new(&LimiterConfig {
            max_concurrent: Some(2),
            ..LimiterConfig::default()
        }));
        let a = limiter.admit(0).await;
        let _b = limiter.admit(0).await;
        let third = tokio::spawn({
            let limiter = limiter.clone();
            async move {
                let _c = limiter.admit(0).await;
            }
        });
        tokio::task::yield_now().await;
        assert!(!third.is_finished());
        drop(a);
        third.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_gate_holds_every_waiter_until_it_opens() {
        let gate = Arc::new(Gate::default());
        let start = Instant::now();
        gate.wait(None).await.unwrap();
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "an open gate does not wait"
        );
        gate.close_for(Duration::from_secs(2));
        // A shorter close does not reopen it earlier.
        gate.close_for(Duration::from_secs(1));
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let gate = gate.clone();
                tokio::spawn(async move {
                    gate.wait(None).await.unwrap();
                    Instant::now()
                })
            })
            .collect();
        for waiter in waiters {
            assert_eq!(waiter.await.unwrap() - start, Duration::from_secs(2));
        }
        assert_eq!(gate.closed_for(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_closed_again_while_waiting_is_waited_for_again() {
        let gate = Arc::new(Gate::default());
        let start = Instant::now();
        gate.close_for(Duration::from_secs(1));
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.wait(None).await.map(|()| Instant::now()) }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        gate.close_for(Duration::from_secs(3));
        let opened = waiter.await.unwrap().unwrap();
        assert_eq!(opened - start, Duration::from_millis(3500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_closed_beyond_the_deadline_fails_at_once() {
        let gate = Gate::default();
        let start = Instant::now();
        gate.close_for(Duration::from_secs(10));
        let deadline = start + Duration::from_secs(4);
        assert_eq!(
            gate.wait(Some(deadline)).await,
            Err(Closed {
                wait: Duration::from_secs(10),
                left: Duration::from_secs(4)
            })
        );
        assert_eq!(start.elapsed(), Duration::ZERO);
        let later = start + Duration::from_secs(11);
        gate.wait(Some(later)).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[test]
    fn the_tighter_budget_of_two_entries_wins_bound_by_bound() {
        let url = "http://limiter-tightest.invalid/v1";
        let a = Limiter::shared(
            url,
            "k1",
            &LimiterConfig {
                max_concurrent: Some(4),
                requests_per_minute: Some(600),
                tokens_per_minute: None,
            },
        );
        let b = Limiter::shared(
            &format!("{url}/"),
            "k1",
            &LimiterConfig {
                max_concurrent: Some(2),
                requests_per_minute: None,
                tokens_per_minute: Some(1000),
            },
        );
        let tightest = LimiterConfig {
            max_concurrent: Some(2),
            requests_per_minute: Some(600),
            tokens_per_minute: Some(1000),
        };
        assert_eq!(a.config(), tightest);
        assert!(Arc::ptr_eq(&a.budgets, &b.budgets));
        // A looser entry built later does not widen them.
        let c = Limiter::shared(
            url,
            "k1",
            &LimiterConfig {
                max_concurrent: Some(8),
                ..LimiterConfig::default()
            },
        );
        assert_eq!(c.config(), tightest);
        // Another key, or another endpoint, has a limiter of its own.
        let other_key = Limiter::shared(url, "k2", &LimiterConfig::default());
        let other_url = Limiter::shared("http://limiter-tightest-2.invalid/v1", "k1", &tightest);
        assert!(!Arc::ptr_eq(&a.budgets, &other_key.budgets));
        assert!(!Arc::ptr_eq(&a.budgets, &other_url.budgets));
        assert_eq!(other_key.config(), LimiterConfig::default());
    }

    #[test]
    fn a_limiter_lives_while_a_model_holds_it() {
        let url = "http://limiter-lives.invalid/v1";
        let tight = LimiterConfig {
            max_concurrent: Some(1),
            ..LimiterConfig::default()
        };
        drop(Limiter::shared(url, "k", &tight));
        let fresh = Limiter::shared(url, "k", &LimiterConfig::default());
        assert_eq!(fresh.config(), LimiterConfig::default());
    }

    /// Two `[models.*]` entries on one endpoint and key, each configured with
    /// `max_concurrent = 2`: two requests in flight in all, not two each.
    #[tokio::test(start_paused = true)]
    async fn entries_on_one_endpoint_and_key_share_one_max_concurrent() {
        let url = "http://limiter-shared.invalid/v1";
        let two = LimiterConfig {
            max_concurrent: Some(2),
            ..LimiterConfig::default()
        };
        let first = Limiter::shared(url, "k", &two);
        let second = Limiter::shared(url, "k", &two);
        let other_key = Limiter::shared(url, "other", &two);
        let a = first.admit(0).await;
        let _b = first.admit(0).await;
        let third = tokio::spawn({
            let second = second.clone();
            async move {
                let _c = second.admit(0).await;
            }
        });
        // Another key's budget is its own.
        let _d = other_key.admit(0).await;
        let _e = other_key.admit(0).await;
        tokio::task::yield_now().await;
        assert!(
            !third.is_finished(),
            "the second entry has no budget of its own"
        );
        drop(a);
        third.await.unwrap();
    }

    /// Requests per minute, shared: the second entry's requests come out of
    /// the first's bucket.
    #[tokio::test(start_paused = true)]
    async fn entries_on_one_endpoint_and_key_share_one_requests_per_minute() {
        let url = "http://limiter-rpm.invalid/v1";
        let sixty = LimiterConfig {
            requests_per_minute: Some(60),
            ..LimiterConfig::default()
        };
        let first = Limiter::shared(url, "k", &sixty);
        let second = Limiter::shared(url, "k", &sixty);
        let start = Instant::now();
        for _ in 0..30 {
            let _ = first.admit(0).await;
            let _ = second.admit(0).await;
        }
        assert!(start.elapsed() < Duration::from_millis(10));
        let _ = second.admit(0).await;
        assert_eq!(start.elapsed(), Duration::from_secs(1), "the 61st waits");
    }

    /// A tighter `max_concurrent` joined while requests are in flight holds
    /// new ones until those in flight are under the new bound.
    #[tokio::test(start_paused = true)]
    async fn a_bound_tightened_while_requests_are_in_flight_holds_new_ones() {
        let url = "http://limiter-tighten.invalid/v1";
        let loose = Limiter::shared(
            url,
            "k",
            &LimiterConfig {
                max_concurrent: Some(3),
                ..LimiterConfig::default()
            },
        );
        let mut held: Vec<_> = Vec::new();
        for _ in 0..3 {
            held.push(loose.admit(0).await);
        }
        let tight = Limiter::shared(
            url,
            "k",
            &LimiterConfig {
                max_concurrent: Some(1),
                ..LimiterConfig::default()
            },
        );
        let next = tokio::spawn({
            let tight = tight.clone();
            async move { tight.admit(0).await }
        });
        held.pop();
        held.pop();
        tokio::task::yield_now().await;
        assert!(
            !next.is_finished(),
            "one is still in flight: the bound is 1"
        );
        held.pop();
        let admitted = next.await.unwrap();
        let after = tokio::spawn({
            let loose = loose.clone();
            async move {
                let _ = loose.admit(0).await;
            }
        });
        tokio::task::yield_now().await;
        assert!(!after.is_finished(), "the bound stays 1");
        drop(admitted);
        after.await.unwrap();
    }

    /// An unbounded limiter given `max_concurrent = 1` later counts the
    /// request already in flight.
    #[tokio::test(start_paused = true)]
    async fn a_bound_set_later_counts_the_requests_in_flight() {
        let url = "http://limiter-later.invalid/v1";
        let unbounded = Limiter::shared(url, "k", &LimiterConfig::default());
        let first = unbounded.admit(0).await;
        let bounded = Limiter::shared(
            url,
            "k",
            &LimiterConfig {
                max_concurrent: Some(1),
                requests_per_minute: Some(6),
                ..LimiterConfig::default()
            },
        );
        let next = tokio::spawn(async move {
            let _ = bounded.admit(0).await;
        });
        tokio::task::yield_now().await;
        assert!(!next.is_finished());
        drop(first);
        next.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_tighter_requests_per_minute_keeps_no_more_than_its_capacity() {
        let url = "http://limiter-tighter-rpm.invalid/v1";
        let loose = Limiter::shared(
            url,
            "k",
            &LimiterConfig {
                requests_per_minute: Some(600),
                ..LimiterConfig::default()
            },
        );
        let _tight = Limiter::shared(
            url,
            "k",
            &LimiterConfig {
                requests_per_minute: Some(6),
                ..LimiterConfig::default()
            },
        );
        let start = Instant::now();
        for _ in 0..6 {
            let _ = loose.admit(0).await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        let _ = loose.admit(0).await;
        assert_eq!(start.elapsed(), Duration::from_secs(10), "6 a minute");
    }

    fn bucket(remaining: f64, limit: Option<f64>, reset_ms: u64) -> Remaining {
        Remaining {
            unit: Unit::Requests,
            limit,
            remaining,
            reset: Duration::from_millis(reset_ms),
        }
    }

    #[test]
    fn new_requests_wait_when_what_is_left_is_already_on_its_way() {
        // More left than on the way: no wait.
        assert_eq!(hold(&bucket(3.0, None, 1000), 2.0), None);
        assert_eq!(hold(&bucket(1.0, None, 1000), 0.0), None);
        // Just enough for those on the way, none for the next: until the reset.
        assert_eq!(
            hold(&bucket(2.0, None, 1000), 2.0),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            hold(&bucket(2.0, None, 1000), 5.0),
            Some(Duration::from_secs(1))
        );
        // Nothing left, nothing on the way: the spent bucket.
        assert_eq!(
            hold(&bucket(0.0, None, 1000), 0.0),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn with_the_limit_known_the_wait_is_the_shortfalls_refill() {
        // 100 a bucket, 0 left, full again in 10 s: it refills at 10/s, and the
        // one more request needs 0.1 s.
        assert_eq!(
            hold(&bucket(0.0, Some(100.0), 10_000), 0.0),
            Some(Duration::from_millis(100))
        );
        // 20 left of 100 (full in 8 s: 10/s), 24 on the way: 5 short, 0.5 s.
        assert_eq!(
            hold(&bucket(20.0, Some(100.0), 8000), 24.0),
            Some(Duration::from_millis(500))
        );
        // Never beyond the reset, whatever the shortfall.
        assert_eq!(
            hold(&bucket(1.0, Some(10.0), 900), 1000.0),
            Some(Duration::from_millis(900))
        );
        // A limit no larger than what is left says nothing of the rate.
        assert_eq!(
            hold(&bucket(5.0, Some(5.0), 700), 9.0),
            Some(Duration::from_millis(700))
        );
    }

    #[test]
    fn rate_limit_headers_give_each_bucket_with_its_reset() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, value.parse().unwrap());
            }
            map
        };
        let openai = headers(&[
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "499"),
            ("x-ratelimit-reset-requests", "120ms"),
            ("x-ratelimit-remaining-tokens", "1000"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]);
        assert_eq!(
            buckets(&openai),
            [
                Remaining {
                    unit: Unit::Requests,
                    limit: Some(500.0),
                    remaining: 499.0,
                    reset: Duration::from_millis(120),
                },
                Remaining {
                    unit: Unit::Tokens,
                    limit: None,
                    remaining: 1000.0,
                    reset: Duration::from_secs(360),
                },
            ]
        );
        let anthropic = headers(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "3"),
            ("anthropic-ratelimit-requests-reset", "2999-01-01T00:00:00Z"),
            ("anthropic-ratelimit-input-tokens-remaining", "7"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2000-01-01T00:00:00Z",
            ),
            // No reset: not a bucket this can pace.
            ("anthropic-ratelimit-tokens-remaining", "9"),
        ]);
        let found = buckets(&anthropic);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(
            (found[0].unit, found[0].limit, found[0].remaining),
            (Unit::Requests, Some(50.0), 3.0)
        );
        assert!(found[0].reset > Duration::from_secs(86_400 * 365));
        assert_eq!(
            found[1],
            Remaining {
                unit: Unit::Tokens,
                limit: None,
                remaining: 7.0,
                reset: Duration::ZERO,
            },
            "a reset in the past is now"
        );
        assert!(buckets(&headers(&[("x-ratelimit-remaining-requests", "x")])).is_empty());
    }

    /// A reply says 2 requests are left: with 2 requests admitted after it was
    /// sent (not yet counted), new ones wait for the reset; once one of
    /// those has ended, they do not.
    #[tokio::test(start_paused = true)]
    async fn pace_counts_the_requests_admitted_after_the_answered_one_was_sent() {
        let limiter = Limiter::new(&LimiterConfig::default());
        let answered = limiter.admit(100).await;
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        let later = limiter.admit(100).await;
        let last = limiter.admit(300).await;
        let mut headers = HeaderMap::new();
        headers.insert("x-ratelimit-remaining-requests", "2".parse().unwrap());
        headers.insert("x-ratelimit-reset-requests", "1s".parse().unwrap());
        assert_eq!(limiter.pace(&headers, sent), Some(Duration::from_secs(1)));
        drop(last);
        assert_eq!(limiter.pace(&headers, sent), None);
        // Tokens: 150 left, 100 on the way after it: enough for one more.
        headers.insert("x-ratelimit-remaining-tokens", "150".parse().unwrap());
        headers.insert("x-ratelimit-reset-tokens", "6s".parse().unwrap());
        assert_eq!(limiter.pace(&headers, sent), None);
        headers.insert("x-ratelimit-remaining-tokens", "100".parse().unwrap());
        assert_eq!(limiter.pace(&headers, sent), Some(Duration::from_secs(6)));
        drop((answered, later));
        assert_eq!(limiter.pace(&headers, sent), None);
    }

    #[test]
    fn models_on_one_endpoint_and_key_share_one_gate() {
        let a = Gate::shared("http://gate-test.invalid/v1", "k1");
        let b = Gate::shared("http://gate-test.invalid/v1/", "k1");
        let other_key = Gate::shared("http://gate-test.invalid/v1", "k2");
        let other_url = Gate::shared("http://gate-test-2.invalid/v1", "k1");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &other_key));
        assert!(!Arc::ptr_eq(&a, &other_url));
    }
}
