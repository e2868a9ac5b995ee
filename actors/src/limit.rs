//! Limits that refuse work cleanly (semantics §8), as values a caller can branch on.

use std::fmt;

use serde::Serialize;

/// Which limit was hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Limit {
    /// A spawn would go deeper than the tree allows.
    MaxDepth,
    /// A spawn call asked for more children than one call may start.
    MaxChildrenPerCall,
    /// The tree has started as many agents as it may.
    MaxAgents,
    /// The tree has taken as many steps (all its agents together) as it may.
    MaxSteps,
    /// One agent has taken as many steps as its template allows.
    AgentSteps,
    /// The tree's token budget is spent.
    TokenBudget,
    /// The tree's credit budget is spent.
    CostBudget,
    /// The tree's deadline passed.
    Deadline,
    /// A step ran longer than its template's step timeout.
    StepTimeout,
}

impl Limit {
    /// Whether it is one of the tree's budgets (steps, tokens, credits),
    /// which can pause a tree instead of failing it (semantics §13).
    pub fn is_budget(self) -> bool {
        matches!(
            self,
            Limit::MaxSteps | Limit::TokenBudget | Limit::CostBudget
        )
    }

    /// The config key that sets this limit.
    pub fn key(self) -> &'static str {
        match self {
            Limit::MaxDepth => "max_depth",
            Limit::MaxChildrenPerCall => "max_children_per_call",
            Limit::MaxAgents => "max_agents",
            Limit::MaxSteps => "max_steps",
            Limit::AgentSteps => "max_steps (agent)",
            Limit::TokenBudget => "max_tokens",
            Limit::CostBudget => "max_credits",
            Limit::Deadline => "deadline",
            Limit::StepTimeout => "step_timeout",
        }
    }
}

/// A limit that refused something, with what was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct LimitHit {
    /// Which limit.
    pub limit: Limit,
    /// What it refused, for people (e.g. the count against the maximum).
    pub detail: String,
}

impl LimitHit {
    /// A hit of `limit`, described by `detail`.
    pub fn new(limit: Limit, detail: impl Into<String>) -> Self {
        LimitHit {
            limit,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for LimitHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "limit {} reached: {}", self.limit.key(), self.detail)
    }
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
