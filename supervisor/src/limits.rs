//! Tree-wide limits (semantics §8) and the counters that enforce them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use arbor_actors::{Limit, LimitHit, Usage};

use crate::policy::ToolPolicy;
use crate::slots::Slots;

/// Limits of one tree. `None` means unlimited.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct TreeLimits {
    /// Deepest level a child may be at (the root is at 0).
    pub max_depth: Option<usize>,
    pub max_children_per_call: Option<usize>,
    /// Agents stepping at once; a spawn waits for a slot, a parent waiting for its
    /// children gives its slot back.
    pub max_live_agents: Option<usize>,
    /// Agents in the whole tree, the root included.
    pub max_agents: Option<usize>,
    /// Model steps in the whole tree.
    pub max_steps: Option<u64>,
    pub max_tokens: Option<u64>,
    pub max_credits: Option<f64>,
    #[serde(rename = "deadlineMs", with = "millis")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub deadline: Option<Duration>,
    /// Which tools the tree's agents may use, whatever their templates list.
    #[serde(skip_serializing_if = "ToolPolicy::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<crate::ToolRule>))]
    pub tools: ToolPolicy,
}

/// The documented range of each limit (inclusive); config files and start
/// requests are both checked against these, by [`TreeLimits::problems`].
pub mod ranges {
    use std::time::Duration;

    pub const MAX_DEPTH: (usize, usize) = (0, 1_000);
    pub const MAX_CHILDREN_PER_CALL: (usize, usize) = (1, 10_000);
    pub const MAX_LIVE_AGENTS: (usize, usize) = (1, 1_000_000);
    pub const MAX_AGENTS: (usize, usize) = (1, 100_000_000);
    pub const MAX_STEPS: (u64, u64) = (1, 1_000_000_000);
    pub const MAX_TOKENS: (u64, u64) = (1, 1_000_000_000_000);
    pub const MAX_CREDITS: (f64, f64) = (0.0, 1e12);
    pub const DEADLINE: (Duration, Duration) =
        (Duration::from_millis(1), Duration::from_secs(365 * 86_400));
}

/// Why `value` is outside `min..=max` (inclusive; NaN is outside every
/// range), in the words every range check of a setting uses.
pub fn out_of_range<T: PartialOrd + std::fmt::Display + Copy>(
    value: T,
    (min, max): (T, T),
) -> Option<String> {
    (!(value >= min && value <= max))
        .then(|| format!("{value} is out of range: must be from {min} to {max}"))
}

impl TreeLimits {
    /// Each limit outside its range, as `(key, problem)` with the config's
    /// snake_case key (`max_agents`); NaN is outside every range.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        fn check<T: PartialOrd + std::fmt::Display + Copy>(
            out: &mut Vec<(&'static str, String)>,
            key: &'static str,
            value: Option<T>,
            (min, max): (T, T),
        ) {
            if let Some(why) = value.and_then(|v| out_of_range(v, (min, max))) {
                out.push((key, why));
            }
        }
        let mut out = Vec::new();
        check(&mut out, "max_depth", self.max_depth, ranges::MAX_DEPTH);
        check(
            &mut out,
            "max_children_per_call",
            self.max_children_per_call,
            ranges::MAX_CHILDREN_PER_CALL,
        );
        check(
            &mut out,
            "max_live_agents",
            self.max_live_agents,
            ranges::MAX_LIVE_AGENTS,
        );
        check(&mut out, "max_agents", self.max_agents, ranges::MAX_AGENTS);
        check(&mut out, "max_steps", self.max_steps, ranges::MAX_STEPS);
        check(&mut out, "max_tokens", self.max_tokens, ranges::MAX_TOKENS);
        check(
            &mut out,
            "max_credits",
            self.max_credits,
            ranges::MAX_CREDITS,
        );
        if let Some(d) = self.deadline
            && !(ranges::DEADLINE.0..=ranges::DEADLINE.1).contains(&d)
        {
            out.push((
                "deadline",
                format!(
                    "must be from {} to {}",
                    arbor_actors::duration::Human(ranges::DEADLINE.0),
                    arbor_actors::duration::Human(ranges::DEADLINE.1)
                ),
            ));
        }
        out
    }
}

/// A duration as whole milliseconds in JSON.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&(d.as_millis() as u64)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

/// The running counts of one tree, shared by its agents through the hooks.
pub(crate) struct Budget {
    limits: TreeLimits,
    agents: AtomicUsize,
    steps: AtomicU64,
    tokens: AtomicU64,
    /// Tokens reserved by model calls in flight.
    reserved: AtomicU64,
    /// Credits in millionths, so they add atomically.
    micro_credits: AtomicU64,
    pub(crate) slots: Option<Arc<Slots>>,
}

impl Budget {
    pub(crate) fn new(limits: TreeLimits) -> Self {
        Budget {
            slots: limits.max_live_agents.map(Slots::new),
            limits,
            agents: AtomicUsize::new(1),
            steps: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            micro_credits: AtomicU64::new(0),
        }
    }

    /// Goes on from what a previous run of the tree had spent.
    pub(crate) fn restore(&self, spent: &crate::recovery::Spent) {
        self.agents.store(spent.agents.max(1), Ordering::Relaxed);
        self.steps.store(spent.steps, Ordering::Relaxed);
        self.tokens.store(spent.tokens, Ordering::Relaxed);
        self.micro_credits
            .store((spent.credits * 1e6).round() as u64, Ordering::Relaxed);
    }

    pub(crate) fn limits(&self) -> &TreeLimits {
        &self.limits
    }

    pub(crate) fn admit_child(&self, parent_depth: usize, index: usize) -> Result<(), LimitHit> {
        if let Some(max) = self.limits.max_depth
            && parent_depth + 1 > max
        {
            return Err(LimitHit::new(
                Limit::MaxDepth,
                format!("a child at depth {} is deeper than {max}", parent_depth + 1),
            ));
        }
        if let Some(max) = self.limits.max_children_per_call
            && index >= max
        {
            return Err(LimitHit::new(
                Limit::MaxChildrenPerCall,
                format!("child {} of one call is more than {max}", index + 1),
            ));
        }
        let Some(max) = self.limits.max_agents else {
            self.agents.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        self.agents
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|_| {
                LimitHit::new(
                    Limit::MaxAgents,
                    format!("the tree already has {max} agents"),
                )
            })
    }

    /// Admits one model step of about `estimate` tokens: reserves them against the
    /// token budget (so concurrent calls cannot all overshoot it), checks the cost
    /// budget, and counts the step.
    pub(crate) fn admit_step(&self, estimate: u64) -> Result<(), LimitHit> {
        if let Some(max) = self.limits.max_credits {
            let used = self.credits();
            if used >= max {
                return Err(LimitHit::new(
                    Limit::CostBudget,
                    format!("{used:.4} of {max} credits used"),
                ));
            }
        }
        if let Some(max) = self.limits.max_tokens {
            let used = self.tokens.load(Ordering::Acquire);
            self.reserved
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |reserved| {
                    (used + reserved + estimate <= max).then_some(reserved + estimate)
                })
                .map_err(|reserved| {
                    LimitHit::new(
                        Limit::TokenBudget,
                        format!(
                            "{used} of {max} tokens used, {reserved} reserved by calls in flight, \
                             this call needs about {estimate}"
                        ),
                    )
                })?;
        }
        let Some(max) = self.limits.max_steps else {
            self.steps.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        self.steps
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|_| {
                self.release(estimate);
                LimitHit::new(
                    Limit::MaxSteps,
                    format!("the tree already took {max} steps"),
                )
            })
    }

    /// Settles a call that reserved `reserved` tokens and used `usage`.
    pub(crate) fn settle(&self, usage: &Usage, reserved: u64) {
        self.release(reserved);
        self.tokens
            .fetch_add(usage.total_tokens(), Ordering::AcqRel);
        let micro = (usage.cost.max(0.0) * 1e6).round() as u64;
        self.micro_credits.fetch_add(micro, Ordering::AcqRel);
    }

    fn release(&self, reserved: u64) {
        if self.limits.max_tokens.is_some() && reserved > 0 {
            let _ = self
                .reserved
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                    Some(r.saturating_sub(reserved))
                });
        }
    }

    pub(crate) fn agents(&self) -> usize {
        self.agents.load(Ordering::Acquire)
    }

    pub(crate) fn steps(&self) -> u64 {
        self.steps.load(Ordering::Acquire)
    }

    pub(crate) fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Acquire)
    }

    pub(crate) fn credits(&self) -> f64 {
        self.micro_credits.load(Ordering::Acquire) as f64 / 1e6
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn depth_children_and_total_refuse_cleanly() {
        let b = Budget::new(TreeLimits {
            max_depth: Some(2),
            max_children_per_call: Some(3),
            max_agents: Some(3),
            ..TreeLimits::default()
        });
        assert_eq!(b.admit_child(2, 0).unwrap_err().limit, Limit::MaxDepth);
        assert_eq!(
            b.admit_child(0, 3).unwrap_err().limit,
            Limit::MaxChildrenPerCall
        );
        assert!(b.admit_child(0, 0).is_ok());
        assert!(b.admit_child(0, 1).is_ok());
        let hit = b.admit_child(0, 2).unwrap_err();
        assert_eq!(hit.limit, Limit::MaxAgents);
        assert_eq!(
            hit.to_string(),
            "limit max_agents reached: the tree already has 3 agents"
        );
        assert_eq!(b.agents(), 3);
    }

    #[test]
    fn steps_tokens_and_credits_are_budgets() {
        let b = Budget::new(TreeLimits {
            max_steps: Some(2),
            max_tokens: Some(100),
            ..TreeLimits::default()
        });
        assert!(b.admit_step(10).is_ok());
        // Reserved tokens count against the budget while the call is in flight.
        let hit = b.admit_step(95).unwrap_err();
        assert_eq!(hit.limit, Limit::TokenBudget);
        assert!(hit.detail.contains("10 reserved"), "{}", hit.detail);
        b.settle(
            &Usage {
                input_tokens: 60,
                output_tokens: 50,
                cost: 0.25,
                ..Usage::default()
            },
            10,
        );
        assert_eq!(b.admit_step(1).unwrap_err().limit, Limit::TokenBudget);
        assert_eq!(b.credits(), 0.25);

        let b = Budget::new(TreeLimits {
            max_steps: Some(1),
            ..TreeLimits::default()
        });
        assert!(b.admit_step(0).is_ok());
        assert_eq!(b.admit_step(0).unwrap_err().limit, Limit::MaxSteps);
        assert_eq!(b.steps(), 1);
    }
}
