//! Which requested children a spawn call admits, and the ids they get: a
//! decision of the child table, made against what the tree answers through
//! [`Tree`] (its limits and toolboxes), so it is tested with a tree of
//! canned answers and no runtime.
//!
//! In request order, a requested child is refused when the step machine
//! refused it (its type, permission or input), when its template's toolbox cannot be made, or
//! when the tree's limits refuse it; only a child that passes the checks
//! before the limits is counted against them. An admitted child gets the
//! next ordinal of its parent (`P.n`).

use std::sync::Arc;

use super::{Admission, Planner};
use crate::id::RunId;
use crate::limit::LimitHit;
use crate::spawn::{ChildPlan, SpawnChildren};
use crate::template::AgentTemplate;
use crate::toolbox::{Toolbox, ToolboxError};

/// Why a requested child the step machine planned is not admitted; its
/// words are what the child's entry in the call's result says.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// Its template's toolbox cannot be made (the hooks' words).
    #[error(transparent)]
    Toolbox(#[from] ToolboxError),
    /// The call's plan has no kind of this number (a plan and its
    /// children that do not match).
    #[error("no kind {0} in the call's plan")]
    NotInPlan(usize),
    /// A limit of the tree refuses it.
    #[error(transparent)]
    Limit(#[from] LimitHit),
}

/// What the table asks of the tree to admit a child.
pub trait Tree {
    /// The toolbox `template`'s agents run with, or why it cannot be made.
    fn toolbox(&mut self, template: &AgentTemplate) -> Result<Arc<Toolbox>, ToolboxError>;

    /// Counts child `id` (the `index`-th of its call) against the tree's
    /// limits, or says which one refuses it. A resumed tree does not count
    /// again a child it ran before.
    fn count(&mut self, id: &RunId, index: usize) -> Result<(), LimitHit>;
}

/// The children of a `spawn_agents` call, planned compactly: each admitted
/// one waits as its kind and ordinal ([`Admission::Waiting`]). `next` is the
/// ordinal the first admitted child gets; returns the admissions, the
/// planner their plans are made from, and how many were admitted.
pub fn admit_planned(
    children: SpawnChildren,
    parent: &RunId,
    next: u32,
    tree: &mut impl Tree,
) -> (Vec<Admission>, Planner, u32) {
    let SpawnChildren { plan, children } = children;
    let toolboxes: Vec<Result<Arc<Toolbox>, Refusal>> = plan
        .kinds()
        .iter()
        .map(|kind| tree.toolbox(&kind.template).map_err(Refusal::Toolbox))
        .collect();
    let mut admitted = 0;
    let admissions = children
        .into_iter()
        .enumerate()
        .map(|(index, child)| {
            let kind = match child {
                Ok(kind) => kind,
                Err(refused) => {
                    let (agent_type, error) = *refused;
                    return Admission::Refused { agent_type, error };
                }
            };
            let agent_type = plan
                .kinds()
                .get(usize::from(kind))
                .map(|k| &*k.agent_type)
                .unwrap_or_default();
            let toolbox = toolboxes
                .get(usize::from(kind))
                .cloned()
                .unwrap_or_else(|| Err(Refusal::NotInPlan(usize::from(kind))));
            let ordinal = next + admitted;
            match checked(parent, ordinal, index, toolbox, tree) {
                Ok((_, _)) => {
                    admitted += 1;
                    Admission::Waiting { kind, ordinal }
                }
                Err(refusal) => Admission::Refused {
                    agent_type: agent_type.to_owned(),
                    error: refusal.to_string(),
                },
            }
        })
        .collect();
    let planner = Planner {
        plan,
        toolboxes: toolboxes.into_iter().map(Result::ok).collect(),
    };
    (admissions, planner, admitted)
}

/// Children planned in full (an inline call's, a background call's), as
/// [`admit_planned`] admits a planned call's; each requested child is its
/// plan or its requested type and why it was refused.
pub fn admit_each(
    children: Vec<Result<ChildPlan, (String, String)>>,
    parent: &RunId,
    next: u32,
    tree: &mut impl Tree,
) -> (Vec<Admission>, u32) {
    let mut admitted = 0;
    let admissions = children
        .into_iter()
        .enumerate()
        .map(|(index, child)| {
            let plan = match child {
                Ok(plan) => plan,
                Err((agent_type, error)) => return Admission::Refused { agent_type, error },
            };
            let toolbox = tree.toolbox(&plan.template).map_err(Refusal::Toolbox);
            match checked(parent, next + admitted, index, toolbox, tree) {
                Ok((id, toolbox)) => {
                    admitted += 1;
                    Admission::Admitted { plan, toolbox, id }
                }
                Err(refusal) => Admission::Refused {
                    agent_type: plan.agent_type.to_string(),
                    error: refusal.to_string(),
                },
            }
        })
        .collect();
    (admissions, admitted)
}

/// The checks after the step machine's, in order: the toolbox, then the
/// limits (the only one that counts the child).
fn checked(
    parent: &RunId,
    ordinal: u32,
    index: usize,
    toolbox: Result<Arc<Toolbox>, Refusal>,
    tree: &mut impl Tree,
) -> Result<(RunId, Arc<Toolbox>), Refusal> {
    // From the parent's run id, not its agent id: the children of a retried
    // attempt (`T/0.1~1`) get ids of their own (`T/0.1~1.1`).
    let id = parent.child(ordinal);
    let toolbox = toolbox?;
    tree.count(&id, index)?;
    Ok((id, toolbox))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::History;

    /// A tree of canned answers: toolboxes for every template but `broken`,
    /// and room for `room` more children.
    struct Canned {
        room: usize,
        counted: Vec<String>,
    }

    impl Tree for Canned {
        fn toolbox(&mut self, template: &AgentTemplate) -> Result<Arc<Toolbox>, ToolboxError> {
            if template.id == "broken" {
                return Err(ToolboxError::Unresolved {
                    entry: "x".into(),
                    reason: "tool x is not configured".into(),
                });
            }
            Toolbox::build(template, |_| None).map(Arc::new)
        }

        fn count(&mut self, id: &RunId, _index: usize) -> Result<(), LimitHit> {
            if self.room == 0 {
                return Err(LimitHit::new(
                    crate::limit::Limit::MaxAgents,
                    "the tree has 2 agents",
                ));
            }
            self.room -= 1;
            self.counted.push(id.to_string());
            Ok(())
        }
    }

    fn plan(agent_type: &str) -> Result<ChildPlan, (String, String)> {
        Ok(ChildPlan {
            agent_type: agent_type.into(),
            template: Arc::new(AgentTemplate::new(agent_type, "m")),
            prompt: None,
            params: None,
            snapshot: Arc::new(History::new()),
            notice: None,
            inline: false,
        })
    }

    fn shown(admissions: &[Admission]) -> Vec<String> {
        admissions
            .iter()
            .map(|a| match a {
                Admission::Refused { agent_type, error } => format!("{agent_type}: {error}"),
                Admission::Admitted { id, .. } => id.to_string(),
                Admission::Waiting { kind, ordinal } => format!("kind {kind} as {ordinal}"),
            })
            .collect()
    }

    #[test]
    fn children_are_checked_in_order_and_only_those_that_pass_are_counted_and_numbered() {
        let parent: RunId = "t/0.2".parse().unwrap();
        let mut tree = Canned {
            room: 2,
            counted: Vec::new(),
        };
        let children = vec![
            plan("a"),
            Err(("ghost".into(), "Agent type ghost not found".into())),
            plan("broken"),
            plan("b"),
            plan("c"),
        ];
        let (admissions, admitted) = admit_each(children, &parent, 4, &mut tree);
        assert_eq!(
            shown(&admissions),
            [
                "t/0.2.4",
                "ghost: Agent type ghost not found",
                "broken: tool x is not configured",
                "t/0.2.5",
                "c: limit max_agents reached: the tree has 2 agents",
            ]
        );
        assert_eq!(admitted, 2);
        // The refused ones were never counted against the limits.
        assert_eq!(tree.counted, ["t/0.2.4", "t/0.2.5"]);
    }
}
