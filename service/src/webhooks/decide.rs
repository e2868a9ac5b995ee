//! What follows one delivery attempt of a completion webhook: delivered,
//! retried after a wait (a connection error, a timeout, a 5xx or a 429),
//! or given up on (any other answer, or no attempt left). Pure: no I/O, no
//! clock; the deliverer carries the decision out and the store records it.

use std::time::Duration;

/// How deliveries are retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retries {
    /// Attempts per delivery, the first included (at least 1).
    pub attempts: u32,
    /// The wait after the first failed attempt; each next one doubles.
    pub backoff: Duration,
    /// The longest wait between two attempts.
    pub backoff_max: Duration,
}

impl Retries {
    /// `[service]`'s webhook retry keys.
    pub fn of(settings: &arbor::config::webhooks::WebhookSettings) -> Retries {
        Retries {
            attempts: settings.attempts,
            backoff: settings.backoff,
            backoff_max: settings.backoff_max,
        }
    }
}

/// What an attempt got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The receiver answered with this status; `retry_after` is its
    /// `Retry-After` (in seconds) when it sent one.
    Status {
        /// The HTTP status.
        code: u16,
        /// The wait the receiver asked for.
        retry_after: Option<Duration>,
    },
    /// No answer: the connection failed, or the attempt timed out.
    Unreachable(String),
    /// The request could not be sent at all (a URL the client refuses): no
    /// attempt would do better.
    Unsendable(String),
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// The receiver accepted it: never sent again.
    Delivered,
    /// Try again after `after`; `error` says why this attempt failed.
    Retry {
        /// The wait before the next attempt.
        after: Duration,
        /// Why this attempt failed.
        error: String,
    },
    /// Give up: `error` says why.
    GiveUp {
        /// Why it is given up on.
        error: String,
    },
}

/// The decision after attempt number `attempt` (from 1) got `answer`.
pub fn after_attempt(answer: &Answer, attempt: u32, retries: &Retries) -> Next {
    let (error, retryable, asked) = match answer {
        Answer::Status { code, .. } if (200..300).contains(code) => return Next::Delivered,
        Answer::Status { code, retry_after } => {
            let retryable = *code == 429 || (500..600).contains(code);
            (
                format!("the receiver answered {code}"),
                retryable,
                *retry_after,
            )
        }
        Answer::Unreachable(why) => (why.clone(), true, None),
        Answer::Unsendable(why) => (why.clone(), false, None),
    };
    if !retryable {
        return Next::GiveUp {
            error: format!("{error} (not retried)"),
        };
    }
    if attempt >= retries.attempts {
        return Next::GiveUp {
            error: format!("{error} (attempt {attempt} of {})", retries.attempts),
        };
    }
    let after = asked
        .map(|asked| asked.min(retries.backoff_max))
        .unwrap_or_else(|| backoff(attempt, retries));
    Next::Retry { after, error }
}

/// The wait after failed attempt number `attempt` (from 1): `backoff`,
/// doubled at each next attempt, at most `backoff_max`.
pub fn backoff(attempt: u32, retries: &Retries) -> Duration {
    let doublings = attempt.saturating_sub(1).min(32);
    retries
        .backoff
        .saturating_mul(1u32 << doublings.min(31))
        .min(retries.backoff_max)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Answer, Next, Retries, after_attempt, backoff};

    const RETRIES: Retries = Retries {
        attempts: 5,
        backoff: Duration::from_secs(1),
        backoff_max: Duration::from_secs(5),
    };

    fn status(code: u16) -> Answer {
        Answer::Status {
            code,
            retry_after: None,
        }
    }

    fn retry_after(next: Next) -> Duration {
        match next {
            Next::Retry { after, .. } => after,
            other => panic!("not a retry: {other:?}"),
        }
    }

    #[test]
    fn a_2xx_is_delivered_whatever_the_attempt() {
        for code in [200, 201, 204, 299] {
            assert_eq!(after_attempt(&status(code), 1, &RETRIES), Next::Delivered);
            assert_eq!(after_attempt(&status(code), 5, &RETRIES), Next::Delivered);
        }
    }

    #[test]
    fn the_waits_double_from_the_backoff_up_to_its_cap() {
        let waits: Vec<u64> = (1..=5).map(|n| backoff(n, &RETRIES).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5]);
        assert_eq!(backoff(u32::MAX, &RETRIES), Duration::from_secs(5));
        for answer in [
            status(500),
            status(503),
            status(429),
            Answer::Unreachable("refused".into()),
        ] {
            assert_eq!(
                retry_after(after_attempt(&answer, 2, &RETRIES)),
                Duration::from_secs(2)
            );
        }
    }

    #[test]
    fn a_4xx_other_than_429_and_an_unsendable_request_are_final() {
        for answer in [
            status(400),
            status(401),
            status(404),
            status(410),
            status(301),
        ] {
            match after_attempt(&answer, 1, &RETRIES) {
                Next::GiveUp { error } => assert!(error.contains("not retried"), "{error}"),
                other => panic!("{answer:?}: {other:?}"),
            }
        }
        let unsendable = Answer::Unsendable("bad URL".into());
        assert!(matches!(
            after_attempt(&unsendable, 1, &RETRIES),
            Next::GiveUp { .. }
        ));
    }

    #[test]
    fn the_last_attempt_gives_up_naming_how_many_were_made() {
        match after_attempt(&status(500), 5, &RETRIES) {
            Next::GiveUp { error } => {
                assert_eq!(error, "the receiver answered 500 (attempt 5 of 5)");
            }
            other => panic!("{other:?}"),
        }
        let once = Retries {
            attempts: 1,
            ..RETRIES
        };
        assert!(matches!(
            after_attempt(&status(503), 1, &once),
            Next::GiveUp { .. }
        ));
    }

    #[test]
    fn a_receivers_retry_after_is_taken_within_the_cap() {
        let asked = |secs| Answer::Status {
            code: 429,
            retry_after: Some(Duration::from_secs(secs)),
        };
        assert_eq!(
            retry_after(after_attempt(&asked(3), 1, &RETRIES)),
            Duration::from_secs(3)
        );
        assert_eq!(
            retry_after(after_attempt(&asked(60), 1, &RETRIES)),
            Duration::from_secs(5)
        );
    }
}
