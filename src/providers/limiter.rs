//! A limiter shared by every agent using one model: at most `max_concurrent`
//! requests in flight, and requests-per-minute and tokens-per-minute buckets,
//! so a swarm queues instead of drowning the endpoint.
//!
//! Over the limiters, one cooldown [`Gate`] per endpoint and key: when the
//! endpoint asks to wait (a 429 or 503 with `Retry-After`, or rate-limit
//! headers saying nothing is left until a reset), the gate closes and no
//! request of any model on that endpoint and key is sent until it opens.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use arbor_actors::sync::LockExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

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

/// The limiter of one model (see the module's text).
pub struct Limiter {
    concurrent: Option<Arc<Semaphore>>,
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

/// Held while a request is in flight.
pub struct Admission {
    _permit: Option<OwnedSemaphorePermit>,
}

impl Limiter {
    /// A limiter with `config`'s bounds.
    pub fn new(config: &LimiterConfig) -> Self {
        let per_minute = |n: u32| Bucket::new(f64::from(n.max(1)), f64::from(n.max(1)) / 60.0);
        Limiter {
            concurrent: config
                .max_concurrent
                .map(|n| Arc::new(Semaphore::new(n.max(1)))),
            requests: config.requests_per_minute.map(per_minute),
            tokens: config.tokens_per_minute.map(per_minute),
        }
    }

    /// Waits until one more request of about `tokens` tokens may be sent.
    pub async fn admit(&self, tokens: u64) -> Admission {
        let permit = match &self.concurrent {
            Some(s) => s.clone().acquire_owned().await.ok(),
            None => None,
        };
        if let Some(bucket) = &self.requests {
            bucket.take(1.0).await;
        }
        if let Some(bucket) = &self.tokens {
            bucket.take(tokens as f64).await;
        }
        Admission { _permit: permit }
    }

    /// Corrects the token bucket once the real usage is known.
    pub fn settle(&self, estimated: u64, actual: u64) {
        if let Some(bucket) = &self.tokens {
            bucket.adjust(estimated as f64 - actual as f64);
        }
    }
}

/// A token bucket refilled continuously; it may go into debt after `adjust`.
struct Bucket {
    capacity: f64,
    per_second: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    fn new(capacity: f64, per_second: f64) -> Self {
        Bucket {
            capacity,
            per_second,
            state: Mutex::new((capacity, Instant::now())),
        }
    }

    fn refill(&self, state: &mut (f64, Instant)) {
        let now = Instant::now();
        let elapsed = now.duration_since(state.1).as_secs_f64();
        state.0 = (state.0 + elapsed * self.per_second).min(self.capacity);
        state.1 = now;
    }

    async fn take(&self, amount: f64) {
        let amount = amount.min(self.capacity);
        loop {
            let wait = {
                let mut state = self.state.locked();
                self.refill(&mut state);
                if state.0 >= amount {
                    state.0 -= amount;
                    return;
                }
                (amount - state.0) / self.per_second
            };
            tokio::time::sleep(Duration::from_secs_f64(wait.max(0.001))).await;
        }
    }

    fn adjust(&self, delta: f64) {
        let mut state = self.state.locked();
        self.refill(&mut state);
        state.0 = (state.0 + delta).min(self.capacity);
    }
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
static GATES: LazyLock<Mutex<Gates>> = LazyLock::new(Mutex::default);

/// A gate by the endpoint's base URL and its key's hash.
type Gates = HashMap<(String, u64), Weak<Gate>>;

impl Gate {
    /// The gate of `base_url` with `key` (`""` for none): the same gate for
    /// every model built on them while one of those models lives. The key
    /// is kept only as a hash.
    pub fn shared(base_url: &str, key: &str) -> Arc<Gate> {
        // A fixed hasher: the same key always hashes the same in a process.
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        let id = (base_url.trim_end_matches('/').to_owned(), hasher.finish());
        let mut gates = GATES.locked();
        if let Some(gate) = gates.get(&id).and_then(Weak::upgrade) {
            return gate;
        }
        gates.retain(|_, gate| gate.strong_count() > 0);
        let gate = Arc::new(Gate::default());
        gates.insert(id, Arc::downgrade(&gate));
        gate
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
