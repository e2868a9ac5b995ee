//! The tool calls that wait for a person's decision, across every tree of a
//! supervisor (semantics §12): kept from the events, so a restarted tree's
//! agents, which ask again for the calls still undecided, fill it back in.
//! It also keeps each running tree's "always allow" rules, followed from
//! their `approvalRuleAdded` events.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use arbor_actors::approval::AlwaysAllowed;
use arbor_actors::sync::LockExt;
use arbor_actors::{Event, EventKind, RunId, TreeId};
use serde::Serialize;
use serde_json::Value;

/// One tool call waiting for a decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PendingApproval {
    /// The tree it is in.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub tree_id: TreeId,
    /// The run that made the call.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub run_id: RunId,
    /// The model's call id: what a decision names.
    pub tool_call_id: String,
    /// The step of the call.
    pub step: u32,
    /// The tool, by the name templates and policies use.
    pub tool: String,
    /// The input the model gave it.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input: Value,
    /// When it was asked for (ms since the Unix epoch).
    pub requested_ms: u64,
}

/// One running tree's "always allow" rules: read by its agents (through its
/// hooks) and added to by its `approvalRuleAdded` events.
pub(crate) type Rules = Arc<Mutex<AlwaysAllowed>>;

/// The pending approvals, by tree and call id.
#[derive(Default)]
pub(crate) struct Approvals {
    /// The rules of each running tree, by tree id.
    rules: Mutex<HashMap<TreeId, Rules>>,
    pending: Mutex<BTreeMap<(TreeId, String), PendingApproval>>,
    /// When calls a resumed tree's journal has asked for and not decided
    /// were first asked for (run, ms), by tree and call id: a call asked for
    /// again keeps its age. Dropped when asked again or when its run ends.
    first_asked: Mutex<BTreeMap<(TreeId, String), (String, u64)>>,
}

impl Approvals {
    /// The calls of tree `tree_id` its journal has asked for and not decided,
    /// with their run and first ask: before the resumed tree runs.
    pub(crate) fn asked_before(&self, tree_id: &TreeId, asked: &HashMap<String, (String, u64)>) {
        let mut first = self.first_asked.locked();
        for (call, (run, at)) in asked {
            first.insert((tree_id.clone(), call.clone()), (run.clone(), *at));
        }
    }

    /// The rules of the tree `tree_id` starting now, from those its journal
    /// recorded (`recorded`; none for a new tree). Kept until
    /// [`release_rules`](Self::release_rules).
    pub(crate) fn rules_for(&self, tree_id: &TreeId, recorded: AlwaysAllowed) -> Rules {
        let rules = Arc::new(Mutex::new(recorded));
        self.rules.locked().insert(tree_id.clone(), rules.clone());
        rules
    }

    /// The tree's agents are gone: its rules go, unless a later start of
    /// the same tree (its next turn) holds others already.
    pub(crate) fn release_rules(&self, tree_id: &TreeId, rules: &Rules) {
        let mut all = self.rules.locked();
        if all.get(tree_id).is_some_and(|r| Arc::ptr_eq(r, rules)) {
            all.remove(tree_id);
        }
    }

    /// Whether every call of `tool` in the running tree `tree_id` runs
    /// without asking.
    pub(crate) fn allows(&self, tree_id: &TreeId, tool: &str) -> bool {
        self.rules
            .locked()
            .get(tree_id)
            .is_some_and(|r| r.locked().allows(tool))
    }

    /// Follows one event: a request adds, a decision or the run's end
    /// removes; a rule joins its tree's.
    pub(crate) fn observe(&self, event: &Event) {
        match &event.kind {
            EventKind::ApprovalRuleAdded { tool } => {
                if let Some(rules) = self.rules.locked().get(&event.tree_id) {
                    rules.locked().add(tool);
                }
            }
            EventKind::ApprovalRequested {
                step,
                tool_call_id,
                tool,
                input,
            } => {
                let key = (event.tree_id.clone(), tool_call_id.clone());
                let asked = self.first_asked.locked().remove(&key);
                let requested_ms = asked.map_or(event.at_ms, |(_, at)| at.min(event.at_ms));
                let pending = PendingApproval {
                    tree_id: event.tree_id.clone(),
                    run_id: event.run_id.clone(),
                    tool_call_id: tool_call_id.clone(),
                    step: *step,
                    tool: tool.clone(),
                    input: input.clone(),
                    requested_ms,
                };
                self.pending.locked().insert(key, pending);
            }
            EventKind::ApprovalDecided { tool_call_id, .. } => {
                let key = (event.tree_id.clone(), tool_call_id.clone());
                self.pending.locked().remove(&key);
            }
            EventKind::AgentFinished { .. }
            | EventKind::AgentFailed { .. }
            | EventKind::AgentCancelled { .. } => {
                let tree = &event.tree_id;
                let run = &event.run_id;
                self.pending
                    .locked()
                    .retain(|(t, _), p| !(t == tree && *run == p.run_id));
                self.first_asked
                    .locked()
                    .retain(|(t, _), (r, _)| !(t == tree && *run == *r));
            }
            _ => {}
        }
    }

    /// The pending approvals of one tree, or of every tree, oldest first.
    pub(crate) fn list(&self, tree_id: Option<&TreeId>) -> Vec<PendingApproval> {
        let mut list: Vec<PendingApproval> = self
            .pending
            .locked()
            .values()
            .filter(|p| tree_id.is_none_or(|t| p.tree_id == *t))
            .cloned()
            .collect();
        list.sort_by(|a, b| {
            (a.requested_ms, &a.tree_id, &a.tool_call_id).cmp(&(
                b.requested_ms,
                &b.tree_id,
                &b.tool_call_id,
            ))
        });
        list
    }

    /// The calls one decision over many covers: every call of tree
    /// `tree_id` that waits, or those of the tool `tool` (by the name
    /// templates use), oldest first.
    pub(crate) fn covered(&self, tree_id: &TreeId, tool: Option<&str>) -> Vec<String> {
        self.list(Some(tree_id))
            .into_iter()
            .filter(|p| tool.is_none_or(|t| p.tool == t))
            .map(|p| p.tool_call_id)
            .collect()
    }

    /// The tool (by the name templates use) of the call `call_id` of tree
    /// `tree_id` that waits, if one does.
    pub(crate) fn tool_of(&self, tree_id: &TreeId, call_id: &str) -> Option<String> {
        self.pending
            .locked()
            .get(&(tree_id.clone(), call_id.to_owned()))
            .map(|p| p.tool.clone())
    }

    /// The run whose call `call_id` of tree `tree_id` waits, if one does.
    pub(crate) fn run_of(&self, tree_id: &TreeId, call_id: &str) -> Option<RunId> {
        self.pending
            .locked()
            .get(&(tree_id.clone(), call_id.to_owned()))
            .map(|p| p.run_id.clone())
    }
}

#[cfg(test)]
mod tests {

    use arbor_actors::approval::AlwaysAllowed;
    use arbor_actors::{Event, EventKind, TreeId};

    use super::Approvals;

    fn rule(tree: &str, tool: &str) -> Event {
        Event {
            seq: 1,
            tree_id: tree.parse().unwrap(),
            run_id: format!("{tree}/0").parse().unwrap(),
            at_ms: 0,
            kind: EventKind::ApprovalRuleAdded { tool: tool.into() },
        }
    }

    #[test]
    fn a_rule_event_joins_its_trees_rules_and_an_earlier_start_letting_go_keeps_a_later_ones() {
        let approvals = Approvals::default();
        let (t, u): (TreeId, TreeId) = ("t".parse().unwrap(), "u".parse().unwrap());
        let first = approvals.rules_for(&t, AlwaysAllowed::default());
        approvals.observe(&rule("t", "say"));
        approvals.observe(&rule("u", "say"));
        assert!(approvals.allows(&t, "say"));
        assert!(
            !approvals.allows(&u, "say"),
            "a tree not running here has none"
        );
        assert!(!approvals.allows(&t, "gate"));
        // The next turn of t starts (from its journal) before the last
        // turn's agents are all gone: their going keeps the new rules.
        let mut recorded = AlwaysAllowed::default();
        recorded.add("say");
        let second = approvals.rules_for(&t, recorded);
        approvals.release_rules(&t, &first);
        assert!(approvals.allows(&t, "say"));
        approvals.release_rules(&t, &second);
        assert!(!approvals.allows(&t, "say"), "gone with the tree");
    }
}
