//! Why a run failed, as a value a caller can branch on.
//!
//! A failed run's output is `{errorMessage}`, the text its parent's model
//! reads (semantics §7). The kind travels beside that text, never inside it:
//! in the final state (`errorKind`), in a child's report to its parent, and so
//! in the journal, the API and the load test's error counts. "Rate-limited"
//! and "rejected" stay two different things all the way up the tree (a
//! model error's kind is `ModelError::kind`).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::limit::LimitHit;

/// What kind of failure ended a run (or kept a child from starting).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailureKind {
    /// The endpoint refused the request (bad request, auth, not found):
    /// trying again will not help.
    ModelRejected,
    /// The endpoint rate-limited every attempt (HTTP 429).
    ModelRateLimited,
    /// The endpoint was overloaded, failing or unreachable on every attempt.
    ModelUnavailable,
    /// The model's replies could not be understood.
    ModelMalformed,
    /// The model's reply was cut at its output limit (`finish_reason:
    /// length`, `stop_reason: max_tokens`): a cut reply is never acted on.
    ModelTruncated,
    /// The request was invalid for the model (a scripted model ran out of
    /// replies, a reply with the wrong role).
    ModelInvalid,
    /// The template names a model the catalog does not have.
    ModelNotConfigured,
    /// A limit of the tree (steps, tokens, credits, depth, time) was reached.
    Limit,
    /// A child failed and its template escalates the failure to the parent.
    ChildFailed,
    /// A child was refused before it started (unknown or unpermitted type,
    /// a limit on spawning).
    NotStarted,
    /// The run was cancelled (only in a child's report: a cancelled run's
    /// own status says so).
    Cancelled,
    /// The child's actor stopped without a final state.
    Lost,
    /// The agent or one of its tools panicked: a bug, reported as a failure.
    Panicked,
    /// The store could not record the tree.
    Store,
    /// Another process claimed the tree after this one (a later fencing
    /// epoch): the store refused this process's writes, and it stopped
    /// running the tree, which goes on where it was adopted.
    Fenced,
    /// An invariant of the runtime broke (a bug, reported as a failure).
    Internal,
    /// The run repeated the same tool call with the same result until its
    /// template's `loop_detection.fail_after`.
    Looping,
    /// The run's own work in flight (its model call or tools) made no
    /// progress for its template's `idle_timeout`.
    Stalled,
    /// A `UserPromptSubmit` hook refused the prompt (Claude Code's hooks):
    /// the run never called its model.
    Blocked,
    /// The agent's program (a JavaScript `handleSteps`) threw, broke its
    /// engine's memory or time limit, or yielded what a program cannot.
    Program,
}

impl FailureKind {
    /// The name on the wire (`model_rate_limited`, `limit`, …).
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::ModelRejected => "model_rejected",
            FailureKind::ModelRateLimited => "model_rate_limited",
            FailureKind::ModelUnavailable => "model_unavailable",
            FailureKind::ModelMalformed => "model_malformed",
            FailureKind::ModelTruncated => "model_truncated",
            FailureKind::ModelInvalid => "model_invalid",
            FailureKind::ModelNotConfigured => "model_not_configured",
            FailureKind::Limit => "limit",
            FailureKind::ChildFailed => "child_failed",
            FailureKind::NotStarted => "not_started",
            FailureKind::Cancelled => "cancelled",
            FailureKind::Lost => "lost",
            FailureKind::Panicked => "panicked",
            FailureKind::Store => "store",
            FailureKind::Fenced => "fenced",
            FailureKind::Internal => "internal",
            FailureKind::Looping => "looping",
            FailureKind::Stalled => "stalled",
            FailureKind::Blocked => "blocked",
            FailureKind::Program => "program",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failure: its kind, and the text the parent's model reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// What went wrong, for the model and for people.
    pub message: String,
}

impl Failure {
    /// A failure of `kind`, described by `message`.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<LimitHit> for Failure {
    fn from(hit: LimitHit) -> Self {
        Failure::new(FailureKind::Limit, hit.to_string())
    }
}

impl From<&LimitHit> for Failure {
    fn from(hit: &LimitHit) -> Self {
        Failure::new(FailureKind::Limit, hit.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Limit;

    #[test]
    fn kinds_serialise_as_their_names() {
        for kind in [
            FailureKind::ModelRejected,
            FailureKind::ModelRateLimited,
            FailureKind::ModelUnavailable,
            FailureKind::ModelMalformed,
            FailureKind::ModelTruncated,
            FailureKind::ModelInvalid,
            FailureKind::ModelNotConfigured,
            FailureKind::Limit,
            FailureKind::ChildFailed,
            FailureKind::NotStarted,
            FailureKind::Cancelled,
            FailureKind::Lost,
            FailureKind::Panicked,
            FailureKind::Store,
            FailureKind::Internal,
            FailureKind::Looping,
            FailureKind::Stalled,
            FailureKind::Program,
        ] {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, serde_json::json!(kind.name()));
            assert_eq!(serde_json::from_value::<FailureKind>(json).unwrap(), kind);
        }
    }

    #[test]
    fn a_limit_hit_is_a_limit_failure_naming_the_limit() {
        let failure = Failure::from(LimitHit::new(Limit::MaxSteps, "20 of 20"));
        assert_eq!(failure.kind, FailureKind::Limit);
        assert!(failure.message.contains("max_steps"), "{}", failure.message);
    }
}
