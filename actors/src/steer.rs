//! Steering: a message a person sends to a running agent (semantics §9).
//!
//! The agent takes it at its next step boundary: it is appended to the
//! history as a user message tagged [`STEERING`], before the step's
//! checkpoint, so a checkpoint holds every steer applied before it. A steer
//! that arrives while the turn is ending keeps the turn going for one more
//! step, so it is always answered. Every accepted steer is a `steered`
//! event, journaled with the step the agent was on. A restarted run (from its
//! last checkpoint, or afresh) and a replayed one get back the steers no
//! checkpoint of theirs holds and take each when they reach the step it
//! arrived in, as the live run did: the same history, and no second event.

use std::sync::Arc;

/// The tag of a steering message in the history.
pub const STEERING: &str = "STEERING";

/// One accepted steering message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Steer {
    /// The step the agent was on when it arrived (the message is applied at
    /// the start of the next one).
    pub step: u32,
    /// What the person said.
    pub text: Arc<str>,
}

/// Why a steer was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SteerRefused {
    /// The run has ended: start a follow-up turn instead.
    #[error("the run has ended")]
    Ended,
    /// The message is empty.
    #[error("the message is empty")]
    Empty,
    /// The run is spawned but has not started (it waits for a live slot or
    /// a retry): send it once it runs.
    #[error("the run has not started yet")]
    NotStarted,
    /// The run holds as many messages not yet taken into its history as it
    /// may ([`SteerLimits`]): send it once the run has reached its next step.
    #[error(
        "{pending} messages ({pending_bytes} bytes) wait for its next step; one more of \
         {bytes} bytes would pass its cap of {} messages and {} bytes: send it once the \
         run has taken them",
        limits.max_pending,
        limits.max_pending_bytes
    )]
    Full {
        /// Messages accepted and not yet in the history.
        pending: usize,
        /// Their bytes.
        pending_bytes: usize,
        /// The bytes of the message refused.
        bytes: usize,
        /// The caps it would pass.
        limits: SteerLimits,
    },
}

/// How much steering one run may hold that it has not taken into its
/// history yet (it takes every pending message at its next step boundary).
/// Without a cap, a client could post messages faster than a slow step ends
/// and grow the history, the memory and the next request without bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SteerLimits {
    /// Messages pending at once.
    pub max_pending: usize,
    /// Their bytes (UTF-8) at once, the new message's included.
    pub max_pending_bytes: usize,
}

impl Default for SteerLimits {
    /// 64 messages and 1 MiB.
    fn default() -> Self {
        SteerLimits {
            max_pending: 64,
            max_pending_bytes: 1 << 20,
        }
    }
}

impl SteerLimits {
    /// Whether a message of `bytes` may join the `pending` ones (their texts),
    /// or the [`SteerRefused::Full`] that says which cap it would pass.
    pub fn admit(&self, pending: &[Arc<str>], bytes: usize) -> Result<(), SteerRefused> {
        let pending_bytes: usize = pending.iter().map(|text| text.len()).sum();
        if pending.len() >= self.max_pending
            || pending_bytes.saturating_add(bytes) > self.max_pending_bytes
        {
            return Err(SteerRefused::Full {
                pending: pending.len(),
                pending_bytes,
                bytes,
                limits: *self,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(sizes: &[usize]) -> Vec<Arc<str>> {
        sizes.iter().map(|&n| "x".repeat(n).into()).collect()
    }

    #[test]
    fn a_steer_beyond_the_pending_count_or_bytes_is_refused_naming_both_caps() {
        let limits = SteerLimits {
            max_pending: 3,
            max_pending_bytes: 100,
        };
        assert_eq!(limits.admit(&texts(&[]), 100), Ok(()));
        assert_eq!(limits.admit(&texts(&[10, 10]), 80), Ok(()));
        // The count: a fourth message, however small.
        let full = limits.admit(&texts(&[1, 1, 1]), 1).unwrap_err();
        assert_eq!(
            full,
            SteerRefused::Full {
                pending: 3,
                pending_bytes: 3,
                bytes: 1,
                limits
            }
        );
        // The bytes: one byte over, or one message larger than the cap.
        assert!(matches!(
            limits.admit(&texts(&[10, 10]), 81),
            Err(SteerRefused::Full {
                pending_bytes: 20,
                bytes: 81,
                ..
            })
        ));
        assert!(limits.admit(&texts(&[]), 101).is_err());
        assert!(limits.admit(&texts(&[]), usize::MAX).is_err());
        let text = full.to_string();
        assert!(text.contains("3 messages (3 bytes)"), "{text}");
        assert!(text.contains("cap of 3 messages and 100 bytes"), "{text}");
    }
}
