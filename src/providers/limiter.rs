//! A limiter shared by every agent using one model: at most `max_concurrent`
//! requests in flight, and requests-per-minute and tokens-per-minute buckets,
//! so a swarm queues instead of drowning the endpoint.

use std::sync::{Arc, Mutex};
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
}
