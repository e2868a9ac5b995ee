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
}
