//! Limits that refuse work cleanly (semantics §8), as values a caller can branch on.

use std::fmt;

use serde::Serialize;

/// Which limit was hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Limit {
    MaxDepth,
    MaxChildrenPerCall,
    MaxAgents,
    MaxSteps,
    AgentSteps,
    TokenBudget,
    CostBudget,
    Deadline,
    StepTimeout,
}

impl Limit {
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
    pub limit: Limit,
    pub detail: String,
}

impl LimitHit {
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
