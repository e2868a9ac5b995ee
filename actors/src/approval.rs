//! Approvals: a person decides on a tool call before it runs (semantics §12).
//!
//! A call to a tool that needs approval (the template's `approve` patterns,
//! the tree policy's) does not run when the model asks for it: the machine
//! holds every call of that step, emits an `approvalRequested` event per call
//! that needs a decision, and the actor gives its live slot back. Each
//! decision (approve, approve with an edited input, deny with a reason) is an
//! `approvalDecided` event; once the step's last one is in, its calls go on
//! (a denied one answers the model with the reason). A restarted or replayed
//! run asks again for the same calls (their ids are the same) and takes the
//! decisions already recorded without asking anyone.
//!
//! A template's `approval_timeout` bounds the wait: when a step's calls have
//! waited that long, each one still waiting gets the template's
//! `approval_default`, decided as a person would (an `approvalDecided` event,
//! taken as recorded by a restart or a replay).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::duration::Human;

/// A person's decision on one tool call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case", deny_unknown_fields)]
pub enum Decision {
    /// Run it: with the model's input, or with this one instead (checked
    /// against the tool's schema like the model's).
    Approve {
        /// The input to run it with instead of the model's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<Value>,
    },
    /// Do not run it: the model reads an error result with the reason.
    Deny {
        /// Why, for the model.
        #[serde(default)]
        reason: String,
    },
}

impl Decision {
    /// The error text a denied call answers the model with.
    pub fn denial(reason: &str) -> String {
        if reason.trim().is_empty() {
            "The user denied this tool call".to_owned()
        } else {
            format!("The user denied this tool call: {reason}")
        }
    }
}

/// The decision a call gets when no one decided it within the template's
/// `approval_timeout` (`approval_default`; deny unless it says otherwise).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApprovalDefault {
    /// Deny it: the model reads that no decision came in time.
    #[default]
    Deny,
    /// Run it with the model's input.
    Approve,
}

impl ApprovalDefault {
    /// `"deny"` or `"approve"`, as `approval_default` spells it.
    pub fn parse(text: &str) -> Option<ApprovalDefault> {
        match text {
            "deny" => Some(ApprovalDefault::Deny),
            "approve" => Some(ApprovalDefault::Approve),
            _ => None,
        }
    }

    /// The decision for a call that waited `timeout` without one.
    pub fn decision(self, timeout: Duration) -> Decision {
        match self {
            ApprovalDefault::Approve => Decision::Approve { input: None },
            ApprovalDefault::Deny => Decision::Deny {
                reason: format!("no decision within {} (approval_timeout)", Human(timeout)),
            },
        }
    }
}

/// Why a decision was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecideRefused {
    /// No call of that id waits for a decision in this run (never asked, or
    /// decided already).
    #[error("no tool call {0} waits for a decision")]
    NotPending(String),
    /// The edited input does not fit the tool's schema.
    #[error("the edited input does not fit the tool: {0}")]
    InvalidInput(String),
    /// The run has ended.
    #[error("the run has ended")]
    Ended,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{ApprovalDefault, Decision};

    #[test]
    fn a_default_denial_names_the_timeout_and_the_key() {
        let decision = ApprovalDefault::Deny.decision(Duration::from_secs(600));
        assert_eq!(
            decision,
            Decision::Deny {
                reason: "no decision within 10m (approval_timeout)".into()
            }
        );
        assert_eq!(
            ApprovalDefault::Approve.decision(Duration::from_secs(60)),
            Decision::Approve { input: None }
        );
        assert_eq!(
            ApprovalDefault::parse("approve"),
            Some(ApprovalDefault::Approve)
        );
        assert_eq!(ApprovalDefault::parse("deny"), Some(ApprovalDefault::Deny));
        assert_eq!(ApprovalDefault::parse("Deny"), None);
        assert_eq!(ApprovalDefault::default(), ApprovalDefault::Deny);
    }
}
