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
//! endpoint asks to wait (a 429 or 503 with `Retry-After`), the gate closes
//! for that long and no request of any model on that endpoint and key is sent
//! until it opens.
//!
//! [`Limiter::pace`] reads the endpoint's own buckets from the rate-limit
//! headers of each reply. A bucket whose size is given refills at a rate the
//! headers tell (OpenAI and Anthropic refill continuously, the reset being
//! when the bucket is full again): the limiter keeps a copy of it, what is
//! left less what is already on its way and not yet counted by the endpoint,
//! and each new request waits, in turn, until its share has refilled
//! ([`pacing`], the decision): requests go at the bucket's rate, never held
//! for the whole bucket to refill. A bucket without its size says nothing
//! of its rate: when it has nothing left for one more request, the gate
//! closes until its reset. A wait that would end beyond the tree's deadline
//! fails at once, quoting the headers the endpoint sent ([`Closed`]).

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use arbor_actors::sync::LockExt as _;
use reqwest::header::HeaderMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

mod headers;
pub(crate) use headers::{buckets, quote};
#[cfg(test)]
use headers::{go_duration, rfc3339};

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
    /// The endpoint's buckets as its rate-limit headers gave them.
    observed: Mutex<Observed>,
}

/// Held while a request is in flight.
pub struct Admission {
    budgets: Arc<Budgets>,
    permit: Option<OwnedSemaphorePermit>,
    id: u64,
}

impl Admission {
    /// The request is being sent now: from then on, a reply to a request
    /// sent after it no longer counts it as on its way.
    pub fn sending(&self) {
        self.budgets.in_flight.locked().sending(self.id);
    }
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
                observed: Mutex::default(),
            }),
        }
    }

    /// The limiter of `base_url` with `key` (`""` for none), as the
    /// `Gate`s are shared: the same one for every model built on them
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
        match self.admit_before(tokens, None).await {
            Ok(admission) => admission,
            Err(_) => unreachable!("without a deadline, admission waits"),
        }
    }

    /// Waits until one more request of about `tokens` tokens may be sent:
    /// room under the configured bounds, then its turn in the endpoint's own
    /// buckets (see [`Limiter::pace`]). `Err` at once, without waiting, when
    /// its turn there comes beyond `deadline`.
    pub async fn admit_before(
        &self,
        tokens: u64,
        deadline: Option<Instant>,
    ) -> Result<Admission, Closed> {
        let budgets = &self.budgets;
        let permit = budgets.concurrent.acquire().await;
        budgets.requests.take(1.0).await;
        budgets.tokens.take(tokens as f64).await;
        let id = match budgets.turn(tokens, deadline).await {
            Ok(id) => id,
            Err(closed) => {
                if let Some(permit) = permit {
                    budgets.concurrent.release(permit);
                }
                return Err(closed);
            }
        };
        Ok(Admission {
            budgets: budgets.clone(),
            permit,
            id,
        })
    }

    /// Corrects the token bucket once the real usage is known.
    pub fn settle(&self, estimated: u64, actual: u64) {
        self.budgets.tokens.adjust(estimated as f64 - actual as f64);
    }

    /// Reads the rate-limit headers of the reply to a request sent at `sent`:
    /// the requests sent after `sent`, or admitted and not sent yet, are the
    /// ones the endpoint had not counted yet when it answered. Each bucket whose rate they tell
    /// (`pacing`) is kept, so that new requests wait in turn for their
    /// share ([`Limiter::admit_before`]); a bucket whose rate is unknown with
    /// nothing left for one more request gives a wait until its reset, for
    /// the gate (`None`: no such wait; the longest otherwise, with the
    /// headers that said so). OpenAI's
    /// `x-ratelimit-{remaining,reset,limit}-{requests,tokens}` and Anthropic's
    /// `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
    /// {remaining,reset,limit}`; tokens are the requests' estimates (output
    /// tokens, unknown before the reply, only hold requests back when none
    /// are left). The headers of a reply to a request sent before the one
    /// whose headers were read last are older news: not read.
    pub fn pace(&self, headers: &HeaderMap, sent: Instant) -> Option<Pause> {
        let buckets = buckets(headers);
        if buckets.is_empty() {
            // Most replies of most endpoints: nothing to count against, so
            // the requests in flight are not walked (a walk of all of them,
            // under the lock every request takes, on every reply).
            return None;
        }
        // The buckets' lock first, as a request's turn takes them.
        let mut observed = self.budgets.observed.locked();
        if observed.read.is_some_and(|read| read > sent) {
            return None;
        }
        let (requests, tokens) = self.budgets.in_flight.locked().after(sent);
        observed.read = Some(sent);
        let mut pause: Option<Pause> = None;
        for bucket in &buckets {
            let uncounted = match bucket.unit {
                Unit::Requests => requests,
                Unit::Tokens => tokens,
                Unit::OutputTokens => 0.0,
            };
            let capacity = bucket.limit.unwrap_or(f64::INFINITY);
            match (
                pacing(bucket, uncounted),
                observed.buckets.get_mut(&bucket.row),
            ) {
                (Pacing::Refills { per_second, left }, _) => {
                    observed.buckets.insert(
                        bucket.row,
                        Mirror {
                            unit: bucket.unit,
                            level: Level {
                                capacity,
                                per_second,
                                level: left.min(capacity),
                                at: Instant::now(),
                            },
                            said: headers::quote_row(headers, bucket.row),
                        },
                    );
                }
                // Its rate is known from an earlier reply: what is left now.
                (Pacing::Left(left), Some(mirror)) => {
                    mirror.level.level = left.min(mirror.level.capacity);
                    mirror.level.at = Instant::now();
                    mirror.said = headers::quote_row(headers, bucket.row);
                }
                (Pacing::Left(left), None) if left <= 0.0 => {
                    if pause.as_ref().is_none_or(|p| p.wait < bucket.reset) {
                        pause = Some(Pause {
                            wait: bucket.reset,
                            said: Said::Buckets(headers::quote_row(headers, bucket.row)),
                        });
                    }
                }
                (Pacing::Left(_), None) => {}
            }
        }
        pause
    }
}

impl Budgets {
    /// Waits for the turn of one more request of about `tokens` tokens in
    /// the endpoint's buckets as last read, takes its share and counts it in
    /// flight (its id), under the lock [`Limiter::pace`] reads them with, so
    /// no reply is read between the two: `Err` at once when the turn comes
    /// beyond `deadline`.
    async fn turn(&self, tokens: u64, deadline: Option<Instant>) -> Result<u64, Closed> {
        loop {
            let (wait, said) = {
                let mut observed = self.observed.locked();
                match observed.take(tokens as f64) {
                    Ok(()) => return Ok(self.in_flight.locked().admit(tokens)),
                    Err(short) => short,
                }
            };
            let now = Instant::now();
            if let Some(deadline) = deadline
                && now + wait > deadline
            {
                return Err(Closed {
                    wait,
                    left: deadline.saturating_duration_since(now),
                    said: Said::Buckets(said),
                });
            }
            // Another request may take the share first: then this waits again.
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
        }
    }

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

    /// How long until `need` is there, at the bucket's rate (`None`: it
    /// is there now).
    fn wait_for(&self, need: f64) -> Option<Duration> {
        let need = need.min(self.capacity);
        if self.level >= need {
            return None;
        }
        let secs = (need - self.level) / self.per_second;
        Some(Duration::try_from_secs_f64(secs).map_or(LONGEST_CLOSE, |d| d.min(LONGEST_CLOSE)))
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

/// The admitted requests not yet ended, by admission: when each was sent
/// (`None`: not yet) and its estimated tokens.
#[derive(Default)]
struct InFlight {
    next: u64,
    out: BTreeMap<u64, (Option<Instant>, u64)>,
}

impl InFlight {
    fn admit(&mut self, tokens: u64) -> u64 {
        let id = self.next;
        self.next += 1;
        self.out.insert(id, (None, tokens));
        id
    }

    fn sending(&mut self, id: u64) {
        if let Some((sent, _)) = self.out.get_mut(&id) {
            *sent = Some(Instant::now());
        }
    }

    /// The requests (and their tokens) the endpoint had not counted when
    /// it answered one sent at `sent`: those sent after it and those not
    /// sent yet. All are walked: requests admitted together are not sent
    /// in the order they were admitted in.
    fn after(&self, sent: Instant) -> (f64, f64) {
        self.out
            .values()
            .filter(|(at, _)| at.is_none_or(|at| at > sent))
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
    /// Its row in [`BUCKET_HEADERS`].
    pub row: usize,
    /// The bucket's size (`None`: not given).
    pub limit: Option<f64>,
    /// What it has left.
    pub remaining: f64,
    /// How long until it is full again.
    pub reset: Duration,
}

/// What one bucket of a reply tells the requests to come, `uncounted`
/// (requests, or their estimated tokens) being on their way to the endpoint
/// and not yet counted in its `remaining`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Pacing {
    /// It refills at `per_second`, and `left` (below 0: a debt) is what
    /// remains for requests not yet sent: each waits until its share is
    /// there, so requests go at the bucket's rate.
    Refills { per_second: f64, left: f64 },
    /// Its rate is not told (no size, or a full bucket): `left` remains.
    Left(f64),
}

/// The decision of [`Limiter::pace`] for one bucket. OpenAI and Anthropic
/// refill their buckets continuously, the reset being when the bucket is
/// full again, so with its `limit` known and not reached a bucket refills at
/// `(limit - remaining) / reset`. A spent bucket of 30 a minute, full again
/// in 58 s, has room for the next request in 2 s, not 58.
pub(crate) fn pacing(bucket: &Remaining, uncounted: f64) -> Pacing {
    let left = bucket.remaining - uncounted;
    match bucket.limit {
        Some(limit) if limit > bucket.remaining && !bucket.reset.is_zero() => Pacing::Refills {
            per_second: (limit - bucket.remaining) / bucket.reset.as_secs_f64(),
            left,
        },
        _ => Pacing::Left(left),
    }
}

/// The endpoint's buckets as last read ([`Limiter::pace`]).
#[derive(Default)]
struct Observed {
    /// When the request was sent whose reply was read last.
    read: Option<Instant>,
    /// The buckets whose rate is known, by row of [`BUCKET_HEADERS`].
    buckets: BTreeMap<usize, Mirror>,
}

/// A copy of one of the endpoint's buckets.
struct Mirror {
    unit: Unit,
    level: Level,
    /// The headers it was last read from, quoted.
    said: String,
}

impl Observed {
    /// Takes the share of one more request of about `tokens` tokens from
    /// every bucket when each has it; otherwise how long until the one
    /// furthest from it has it, and what its headers said.
    fn take(&mut self, tokens: f64) -> Result<(), (Duration, String)> {
        // (need, share): a request needs one output token left, and its
        // output is only known once its reply is in.
        let of = |unit: Unit| match unit {
            Unit::Requests => (1.0, 1.0),
            Unit::Tokens => (tokens, tokens),
            Unit::OutputTokens => (1.0, 0.0),
        };
        let mut short: Option<(Duration, &str)> = None;
        for mirror in self.buckets.values_mut() {
            mirror.level.refill();
            if let Some(wait) = mirror.level.wait_for(of(mirror.unit).0)
                && short.is_none_or(|(longest, _)| longest < wait)
            {
                short = Some((wait, &mirror.said));
            }
        }
        if let Some((wait, said)) = short {
            return Err((wait, said.to_owned()));
        }
        for mirror in self.buckets.values_mut() {
            mirror.level.level -= of(mirror.unit).1;
        }
        Ok(())
    }
}

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
    /// Until when, and what the endpoint said.
    until: Mutex<Option<(Instant, Said)>>,
}

/// What the endpoint sent that makes requests wait: the headers, quoted as
/// they came (`retry-after: 2`), so an error says what the endpoint said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Said {
    /// `Retry-After` or `retry-after-ms`: it asked to wait.
    RetryAfter(String),
    /// Rate-limit headers: its buckets have no room for another request
    /// until then.
    Buckets(String),
}

impl Said {
    /// The `Retry-After` (and `retry-after-ms`) headers of a reply, quoted.
    pub fn retry_after(headers: &HeaderMap) -> Said {
        Said::RetryAfter(quote(headers, &["retry-after", "retry-after-ms"]))
    }
}

/// A wait the rate-limit headers of a reply give, for the gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pause {
    pub wait: Duration,
    pub said: Said,
}

/// The next request cannot go before the request's deadline: the gate stays
/// closed beyond it, or its turn in the endpoint's buckets comes after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Closed {
    /// How long until the request could go, from now.
    pub wait: Duration,
    /// How long until the deadline.
    pub left: Duration,
    /// What the endpoint sent.
    pub said: Said,
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (wait, left) = (seconds(self.wait), seconds(self.left));
        match &self.said {
            Said::RetryAfter(said) => write!(
                f,
                "the endpoint asked to wait {wait}, beyond the tree's deadline in {left} \
                 (it sent {said})"
            ),
            Said::Buckets(said) => write!(
                f,
                "the endpoint's rate limit has room for the next request in {wait}, beyond \
                 the tree's deadline in {left} (it sent {said})"
            ),
        }
    }
}

/// A wait in seconds, as a message shows it: `30s`, `1.5s`.
pub(crate) fn seconds(wait: Duration) -> String {
    let secs = wait.as_secs_f64();
    if (secs - secs.round()).abs() < 0.05 {
        format!("{}s", secs.round())
    } else {
        format!("{secs:.1}s")
    }
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

    /// Closes the gate for `wait` from now, because the endpoint `said` so
    /// (a gate already closed for longer stays so).
    pub fn close_for(&self, wait: Duration, said: Said) {
        let when = Instant::now() + wait.min(LONGEST_CLOSE);
        let mut until = self.until.locked();
        if until.as_ref().is_none_or(|(u, _)| *u < when) {
            *until = Some((when, said));
        }
    }

    /// How long the gate stays closed, and why (`None`: it is open).
    fn closed(&self) -> Option<(Duration, Said)> {
        let until = self.until.locked();
        let (until, said) = until.as_ref()?;
        let now = Instant::now();
        (*until > now).then(|| (*until - now, said.clone()))
    }

    /// What the endpoint said when the gate was last closed (`None`: never).
    pub fn said(&self) -> Option<Said> {
        Some(self.until.locked().as_ref()?.1.clone())
    }

    /// Waits until the gate is open. `Err` at once, without waiting, when it
    /// stays closed beyond `deadline`.
    pub async fn wait(&self, deadline: Option<Instant>) -> Result<(), Closed> {
        // A loop: the gate may close again, for longer, while this waits.
        while let Some((wait, said)) = self.closed() {
            let now = Instant::now();
            if let Some(deadline) = deadline
                && now + wait > deadline
            {
                return Err(Closed {
                    wait,
                    left: deadline.saturating_duration_since(now),
                    said,
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
        Limiter::new(&LimiterConfig::default())
            .pace(headers, Instant::now())
            .map(|pause| pause.wait)
    }

    fn said() -> Said {
        Said::RetryAfter("retry-after: 1".into())
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
        gate.close_for(Duration::from_secs(2), said());
        // A shorter close does not reopen it earlier.
        gate.close_for(Duration::from_secs(1), said());
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
        assert_eq!(gate.closed(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_closed_again_while_waiting_is_waited_for_again() {
        let gate = Arc::new(Gate::default());
        let start = Instant::now();
        gate.close_for(Duration::from_secs(1), said());
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.wait(None).await.map(|()| Instant::now()) }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        gate.close_for(Duration::from_secs(3), said());
        let opened = waiter.await.unwrap().unwrap();
        assert_eq!(opened - start, Duration::from_millis(3500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_closed_beyond_the_deadline_fails_at_once() {
        let gate = Gate::default();
        let start = Instant::now();
        gate.close_for(Duration::from_secs(10), said());
        let deadline = start + Duration::from_secs(4);
        assert_eq!(
            gate.wait(Some(deadline)).await,
            Err(Closed {
                wait: Duration::from_secs(10),
                left: Duration::from_secs(4),
                said: said(),
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
            row: 0,
            limit,
            remaining,
            reset: Duration::from_millis(reset_ms),
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    /// The headers of an OpenAI-style requests bucket of `limit`, `remaining`
    /// left, full again after `reset`.
    fn requests_bucket(limit: &str, remaining: &str, reset: &str) -> HeaderMap {
        headers(&[
            ("x-ratelimit-limit-requests", limit),
            ("x-ratelimit-remaining-requests", remaining),
            ("x-ratelimit-reset-requests", reset),
        ])
    }

    #[test]
    fn a_bucket_of_known_size_refills_at_its_rate_less_what_is_on_its_way() {
        // 30 a bucket, spent, full again in 60 s: 0.5 a second, nothing left.
        assert_eq!(
            pacing(&bucket(0.0, Some(30.0), 60_000), 0.0),
            Pacing::Refills {
                per_second: 0.5,
                left: 0.0
            }
        );
        // 20 left of 100, full in 8 s (10/s), 24 on their way: 4 owed.
        assert_eq!(
            pacing(&bucket(20.0, Some(100.0), 8000), 24.0),
            Pacing::Refills {
                per_second: 10.0,
                left: -4.0
            }
        );
        // Without the size, or full, the rate is not told.
        assert_eq!(pacing(&bucket(0.0, None, 1000), 0.0), Pacing::Left(0.0));
        assert_eq!(pacing(&bucket(3.0, None, 1000), 2.0), Pacing::Left(1.0));
        assert_eq!(
            pacing(&bucket(5.0, Some(5.0), 700), 9.0),
            Pacing::Left(-4.0)
        );
        assert_eq!(pacing(&bucket(1.0, Some(5.0), 0), 0.0), Pacing::Left(1.0));
    }

    #[test]
    fn the_next_request_waits_for_its_share_not_for_the_full_bucket() {
        let level = |level: f64| Level {
            capacity: 30.0,
            per_second: 0.5,
            level,
            at: Instant::now(),
        };
        // Spent: one request's share comes back in 2 s (the bucket is full
        // in 60).
        assert_eq!(level(0.0).wait_for(1.0), Some(Duration::from_secs(2)));
        // Owing 4: the next one is the fifth, in 10 s.
        assert_eq!(level(-4.0).wait_for(1.0), Some(Duration::from_secs(10)));
        assert_eq!(level(1.0).wait_for(1.0), None);
        // A request larger than the bucket waits for a full bucket only.
        assert_eq!(level(0.0).wait_for(100.0), Some(Duration::from_secs(60)));
    }

    /// Issue 34: an endpoint at 30 requests a minute says its bucket is
    /// spent and full again in 58 s. The next requests go at its rate, one
    /// every 58/30 s, none of them held for the 58 s.
    #[tokio::test(start_paused = true)]
    async fn a_spent_bucket_paces_at_its_rate_instead_of_waiting_for_the_full_reset() {
        let limiter = Limiter::new(&LimiterConfig::default());
        let start = Instant::now();
        let spent = requests_bucket("30", "0", "58s");
        assert_eq!(limiter.pace(&spent, start), None, "the gate stays open");
        let mut went = Vec::new();
        for _ in 0..3 {
            drop(limiter.admit(0).await);
            went.push(start.elapsed());
        }
        let share = Duration::from_secs(58).div_f64(30.0);
        for (n, at) in went.iter().enumerate() {
            let expected = share.mul_f64(n as f64 + 1.0);
            assert!(
                at.abs_diff(expected) < Duration::from_millis(5),
                "request {n} went after {at:?}, not {expected:?}"
            );
        }
    }

    /// Waiting requests go one share apart, in turn, each counting the
    /// share of those before it.
    #[tokio::test(start_paused = true)]
    async fn requests_waiting_together_go_one_share_apart() {
        let limiter = Limiter::new(&LimiterConfig::default());
        let start = Instant::now();
        limiter.pace(&requests_bucket("60", "1", "59s"), start);
        let waiting: Vec<_> = (0..4)
            .map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    drop(limiter.admit(0).await);
                    start.elapsed()
                })
            })
            .collect();
        let mut went = Vec::new();
        for waiter in waiting {
            went.push(waiter.await.unwrap());
        }
        went.sort();
        let secs: Vec<u64> = went.iter().map(|at| at.as_millis() as u64 / 100).collect();
        // One left: the first at once, then one a second.
        assert_eq!(secs, [0, 10, 20, 30], "{went:?}");
    }

    /// A request admitted after the answered one was sent (and not sent
    /// yet) is not counted by the endpoint: it owes its share.
    #[tokio::test(start_paused = true)]
    async fn a_request_on_its_way_owes_its_share() {
        let limiter = Limiter::new(&LimiterConfig::default());
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        let on_its_way = limiter.admit(0).await;
        let start = Instant::now();
        limiter.pace(&requests_bucket("60", "1", "59s"), sent);
        drop(limiter.admit(0).await);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        drop(on_its_way);
    }

    /// Issue 34: requests admitted together are not sent in the order they
    /// were admitted in. One admitted before the answered one but sent
    /// after it was not counted by the endpoint: it owes its share, as does
    /// one admitted and not sent yet; one sent before is counted.
    #[tokio::test(start_paused = true)]
    async fn a_request_admitted_before_the_answered_one_but_sent_after_it_owes_its_share() {
        let limiter = Limiter::new(&LimiterConfig::default());
        let counted = limiter.admit(0).await;
        let admitted_first = limiter.admit(0).await;
        let answered = limiter.admit(0).await;
        let not_sent = limiter.admit(0).await;
        counted.sending();
        tokio::time::advance(Duration::from_millis(1)).await;
        answered.sending();
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        admitted_first.sending();
        // 3 left, 2 on their way: room for one more at once, the next in 1 s.
        let start = Instant::now();
        limiter.pace(&requests_bucket("60", "3", "57s"), sent);
        drop(limiter.admit(0).await);
        assert_eq!(start.elapsed(), Duration::ZERO);
        drop(limiter.admit(0).await);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        drop((counted, admitted_first, answered, not_sent));
    }

    /// A reply to a request sent before the one read last is older news.
    #[tokio::test(start_paused = true)]
    async fn the_headers_of_an_older_request_are_not_read() {
        let limiter = Limiter::new(&LimiterConfig::default());
        let older = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        let newer = Instant::now();
        limiter.pace(&requests_bucket("60", "30", "30s"), newer);
        limiter.pace(&requests_bucket("60", "0", "60s"), older);
        let start = Instant::now();
        drop(limiter.admit(0).await);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    /// Tokens: each request takes its estimate from the endpoint's token
    /// bucket, and waits for it to refill.
    #[tokio::test(start_paused = true)]
    async fn a_token_bucket_is_taken_by_estimate() {
        let limiter = Limiter::new(&LimiterConfig::default());
        let tokens = headers(&[
            ("x-ratelimit-limit-tokens", "1000"),
            ("x-ratelimit-remaining-tokens", "150"),
            ("x-ratelimit-reset-tokens", "8.5s"),
        ]);
        let start = Instant::now();
        limiter.pace(&tokens, start);
        drop(limiter.admit(100).await);
        assert_eq!(start.elapsed(), Duration::ZERO);
        // 50 left, 100 a second: the next 100 in half a second.
        drop(limiter.admit(100).await);
        assert_eq!(start.elapsed(), Duration::from_millis(500));
    }

    /// A turn beyond the deadline fails at once, saying what the endpoint
    /// sent, not that it asked to wait.
    #[tokio::test(start_paused = true)]
    async fn a_turn_beyond_the_deadline_fails_at_once_quoting_the_headers() {
        let limiter = Limiter::new(&LimiterConfig::default());
        let start = Instant::now();
        limiter.pace(&requests_bucket("2", "0", "58s"), start);
        let closed = match limiter
            .admit_before(0, Some(start + Duration::from_secs(10)))
            .await
        {
            Err(closed) => closed,
            Ok(_) => panic!("admitted"),
        };
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(
            closed,
            Closed {
                wait: Duration::from_secs(29),
                left: Duration::from_secs(10),
                said: Said::Buckets(
                    "x-ratelimit-remaining-requests: 0, x-ratelimit-reset-requests: 58s, \
                     x-ratelimit-limit-requests: 2"
                        .into()
                ),
            }
        );
        assert_eq!(
            closed.to_string(),
            "the endpoint's rate limit has room for the next request in 29s, beyond the \
             tree's deadline in 10s (it sent x-ratelimit-remaining-requests: 0, \
             x-ratelimit-reset-requests: 58s, x-ratelimit-limit-requests: 2)"
        );
        // A Retry-After is quoted as sent.
        let asked = Closed {
            wait: Duration::from_secs(2),
            left: Duration::from_secs(1),
            said: Said::retry_after(&headers(&[("retry-after", "2")])),
        };
        assert_eq!(
            asked.to_string(),
            "the endpoint asked to wait 2s, beyond the tree's deadline in 1s \
             (it sent retry-after: 2)"
        );
    }

    #[test]
    fn waits_show_in_seconds() {
        assert_eq!(seconds(Duration::from_secs(30)), "30s");
        assert_eq!(seconds(Duration::from_millis(4999)), "5s");
        assert_eq!(seconds(Duration::from_millis(1500)), "1.5s");
    }

    #[test]
    fn go_durations_as_openai_writes_them() {
        let ms = Duration::from_millis;
        assert_eq!(go_duration("1s"), Some(ms(1000)));
        assert_eq!(go_duration("6m0s"), Some(ms(360_000)));
        assert_eq!(go_duration("20ms"), Some(ms(20)));
        assert_eq!(go_duration("1.5s"), Some(ms(1500)));
        assert_eq!(go_duration("1h2m3.5s"), Some(ms(3_723_500)));
        assert_eq!(go_duration("0.25s"), Some(ms(250)));
        assert_eq!(
            go_duration("1500us"),
            Some(ms(1) + Duration::from_micros(500))
        );
        assert_eq!(go_duration("2\u{b5}s"), Some(Duration::from_micros(2)));
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
        ] {
            assert_eq!(rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn rate_limit_headers_give_each_bucket_with_its_reset() {
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
                    row: 0,
                    limit: Some(500.0),
                    remaining: 499.0,
                    reset: Duration::from_millis(120),
                },
                Remaining {
                    unit: Unit::Tokens,
                    row: 1,
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
                row: 4,
                limit: None,
                remaining: 7.0,
                reset: Duration::ZERO,
            },
            "a reset in the past is now"
        );
        assert!(buckets(&headers(&[("x-ratelimit-remaining-requests", "x")])).is_empty());
    }

    /// A reply says 2 requests are left, of a bucket of unknown size: with 2
    /// requests admitted after it was sent (not yet counted), new ones wait
    /// for the reset; once one of those has ended, they do not.
    #[tokio::test(start_paused = true)]
    async fn pace_counts_the_requests_admitted_after_the_answered_one_was_sent() {
        let limiter = Limiter::new(&LimiterConfig::default());
        let answered = limiter.admit(100).await;
        answered.sending();
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        let later = limiter.admit(100).await;
        let last = limiter.admit(300).await;
        later.sending();
        let wait = |headers: &HeaderMap| limiter.pace(headers, sent).map(|pause| pause.wait);
        let mut headers = HeaderMap::new();
        headers.insert("x-ratelimit-remaining-requests", "2".parse().unwrap());
        headers.insert("x-ratelimit-reset-requests", "1s".parse().unwrap());
        assert_eq!(wait(&headers), Some(Duration::from_secs(1)));
        drop(last);
        assert_eq!(wait(&headers), None);
        // Tokens: 150 left, 100 on the way after it: enough for one more.
        headers.insert("x-ratelimit-remaining-tokens", "150".parse().unwrap());
        headers.insert("x-ratelimit-reset-tokens", "6s".parse().unwrap());
        assert_eq!(wait(&headers), None);
        headers.insert("x-ratelimit-remaining-tokens", "100".parse().unwrap());
        assert_eq!(wait(&headers), Some(Duration::from_secs(6)));
        drop((answered, later));
        assert_eq!(wait(&headers), None);
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
