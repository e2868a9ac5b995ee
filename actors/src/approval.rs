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
//!
//! A person may also allow a tool for good in one tree ("always allow", the
//! OpenAI Agents SDK's `always_approve`): an `approvalRuleAdded` event of the
//! tree, after which a call of that tool runs without asking, in any agent at
//! any depth and in later turns ([`gate`]). A decision recorded for a call
//! still wins over the rule, so a replay decides every call as it went.

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

/// What a call of a tool that needs approval waits for before it runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Gate {
    /// Nothing: a restart or a replay recorded its decision, which applies.
    Recorded(Decision),
    /// Nothing: a person allowed every call of its tool in the tree.
    Allowed,
    /// A person's decision: it is asked for (`approvalRequested`).
    Ask,
}

/// The gate of one call that needs approval, from the decision recorded for
/// it (a restart's or a replay's) and whether its tool is allowed for good
/// in the tree. A recorded decision wins: a call denied before its tool was
/// allowed is denied again when the tree is replayed.
pub fn gate(recorded: Option<Decision>, always_allowed: bool) -> Gate {
    match (recorded, always_allowed) {
        (Some(decision), _) => Gate::Recorded(decision),
        (None, true) => Gate::Allowed,
        (None, false) => Gate::Ask,
    }
}

/// The tools a person allowed for good in one tree, by the name templates
/// and policies use (each one an `approvalRuleAdded` event).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlwaysAllowed(std::collections::BTreeSet<String>);

impl AlwaysAllowed {
    /// Whether every call of `tool` runs without asking.
    pub fn allows(&self, tool: &str) -> bool {
        self.0.contains(tool)
    }

    /// Allows `tool` for good; `false` if it was already.
    pub fn add(&mut self, tool: &str) -> bool {
        !self.0.contains(tool) && self.0.insert(tool.to_owned())
    }

    /// The tools allowed, in name order.
    pub fn tools(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
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

    use super::{AlwaysAllowed, ApprovalDefault, Decision, Gate, gate};

    #[test]
    fn a_call_of_an_always_allowed_tool_is_not_asked_unless_its_decision_is_recorded() {
        let denied = Decision::Deny {
            reason: "not on prod".into(),
        };
        assert_eq!(gate(None, false), Gate::Ask);
        assert_eq!(gate(None, true), Gate::Allowed);
        // A replay decides a call denied before the rule as it went.
        assert_eq!(gate(Some(denied.clone()), true), Gate::Recorded(denied));
        let mut rules = AlwaysAllowed::default();
        assert!(!rules.allows("shell"));
        assert!(rules.add("shell"));
        assert!(!rules.add("shell"), "a rule is added once");
        assert!(rules.allows("shell"));
        assert!(!rules.allows("shell2"), "by exact name, not prefix");
        assert_eq!(rules.tools().collect::<Vec<_>>(), ["shell"]);
    }

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
