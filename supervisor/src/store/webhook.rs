//! Completion webhooks as the store journals them: one row per run that
//! asked for one, a tree's first run or a later turn's (written with the
//! tree's record, in the batch that stores it), then
//! each delivery attempt's outcome, so that a process that stops between the
//! tree's end and a delivery leaves the delivery to the next, and a delivered
//! webhook is never sent again. The row is claimed for one attempt at a time
//! (owner, hold, fencing epoch), as trees are, so of two processes on one
//! store one delivers.

use arbor_actors::{RunId, TreeId};
use serde::Serialize;

/// Where a tree's webhook is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub enum WebhookState {
    /// Not delivered yet: the tree runs, or attempts go on.
    Pending,
    /// A receiver accepted it (a 2xx answer); never sent again.
    Delivered,
    /// Given up on (a final refusal, or every attempt failed).
    Failed,
}

impl WebhookState {
    /// The state as the store writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookState::Pending => "pending",
            WebhookState::Delivered => "delivered",
            WebhookState::Failed => "failed",
        }
    }

    /// The state the store wrote as `text`; `None` for one it does not know.
    pub fn parse(text: &str) -> Option<WebhookState> {
        [
            WebhookState::Pending,
            WebhookState::Delivered,
            WebhookState::Failed,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// A run's webhook, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookRecord {
    /// The root run (of the tree, or of a later turn) it reports the end of.
    pub run_id: RunId,
    /// Its tree.
    pub tree_id: TreeId,
    /// Where it is posted.
    pub url: String,
    /// Where it is.
    pub state: WebhookState,
    /// Attempts made so far.
    pub attempts: u32,
    /// The earliest time of the next attempt, in milliseconds since the
    /// Unix epoch.
    pub next_ms: u64,
    /// Why the last attempt failed (or why it was given up on).
    pub error: Option<String>,
    /// When a receiver accepted it, or it was given up on.
    pub done_ms: Option<u64>,
}

/// A webhook claimed by this process for one attempt: the attempt's
/// outcome is recorded under `epoch` (`Store::webhook_attempted`), and only
/// while no other process has claimed it since.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookClaim {
    /// The root run it reports the end of.
    pub run_id: RunId,
    /// Its tree.
    pub tree_id: TreeId,
    /// Where it is posted.
    pub url: String,
    /// Attempts made before this one.
    pub attempts: u32,
    /// The claim's fencing epoch.
    pub epoch: u64,
}

/// What one attempt came to, as the store records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookResult {
    /// A receiver accepted it.
    Delivered,
    /// It failed (`error`); the next attempt is due at `next_ms`.
    Retry {
        /// Why this attempt failed.
        error: String,
        /// When the next is due, in milliseconds since the Unix epoch.
        next_ms: u64,
    },
    /// It failed for good (`error`): no attempt follows.
    Failed {
        /// Why it is given up on.
        error: String,
    },
}

impl WebhookResult {
    /// The state the webhook is in after it.
    pub fn state(&self) -> WebhookState {
        match self {
            WebhookResult::Delivered => WebhookState::Delivered,
            WebhookResult::Retry { .. } => WebhookState::Pending,
            WebhookResult::Failed { .. } => WebhookState::Failed,
        }
    }

    /// Why the attempt failed; `None` when it was delivered.
    pub fn error(&self) -> Option<&str> {
        match self {
            WebhookResult::Delivered => None,
            WebhookResult::Retry { error, .. } | WebhookResult::Failed { error } => Some(error),
        }
    }
}

/// Whether a pending webhook's row can be claimed for an attempt now: its
/// run has ended (its tree has, or a later turn started), its next attempt
/// is due, and no process holds it (none
/// did, or its holder is gone, or its hold ran out more than `lease_ms`
/// ago, whoever holds it: a holder still alive whose attempt never recorded
/// its outcome, a failed store write or a panic, must not keep the webhook
/// from ever being sent). The same decision on every backend.
pub(crate) fn webhook_claimable(
    (tree_ended, next_ms, holder): (bool, u64, Option<(&str, u64)>),
    now_ms: u64,
    lease_ms: u64,
) -> bool {
    tree_ended
        && next_ms <= now_ms
        && holder.is_none_or(|(owner, until_ms)| {
            super::owners::owner_alive(owner) == Some(false)
                || now_ms.saturating_sub(until_ms) > lease_ms
        })
}

/// A webhook's row as a backend reads it (`state` as written; `attempts`,
/// `next_ms` and `done_ms` as the database's integers), typed; a state this
/// build does not know is the store's corruption, named.
pub(crate) fn webhook_record(
    run: &RunId,
    url: String,
    state: &str,
    (attempts, next_ms, done_ms): (i64, i64, Option<i64>),
    error: Option<String>,
) -> Result<WebhookRecord, crate::error::Error> {
    let state = WebhookState::parse(state).ok_or_else(|| {
        crate::error::Error::Store(format!(
            "run {run}: its webhook's state {state:?} is not one this build knows"
        ))
    })?;
    Ok(WebhookRecord {
        run_id: run.clone(),
        tree_id: run.tree().clone(),
        url,
        state,
        attempts: attempts.max(0) as u32,
        next_ms: next_ms.max(0) as u64,
        error,
        done_ms: done_ms.map(|d| d.max(0) as u64),
    })
}

#[cfg(test)]
mod tests {
    use super::webhook_claimable;

    /// A webhook is claimed once its tree has ended and its attempt is due,
    /// and not while a process holds it; a claim runs out with its hold and
    /// the lease, an unseen holder's and a live one's alike.
    #[test]
    fn a_webhook_is_claimable_once_its_tree_ended_its_attempt_is_due_and_nobody_holds_it() {
        assert!(webhook_claimable((true, 10, None), 10, 5));
        assert!(!webhook_claimable((false, 10, None), 10, 5), "running");
        assert!(!webhook_claimable((true, 11, None), 10, 5), "not due");
        let me = super::super::owner_id();
        assert!(!webhook_claimable((true, 0, Some((&me, 1_000))), 1_000, 5));
        assert!(!webhook_claimable((true, 0, Some((&me, 1_000))), 1_005, 5));
        let unseen = "elsewhere:1";
        assert!(!webhook_claimable((true, 0, Some((unseen, 100))), 105, 5));
        assert!(webhook_claimable((true, 0, Some((unseen, 100))), 106, 5));
    }

    /// A webhook this very process holds, whose attempt never recorded its
    /// outcome (the store write failed, the task panicked), is claimed again
    /// once its hold and the lease have run out, not never.
    #[test]
    fn a_webhook_stuck_under_this_processs_own_claim_is_claimable_after_its_hold() {
        let me = super::super::owner_id();
        assert!(webhook_claimable((true, 0, Some((&me, 1_000))), 1_006, 5));
    }
}
