//! "Always allow this tool in this tree" (semantics §12; the OpenAI Agents
//! SDK's `always_approve`, Claude Code's "don't ask again"): a person's
//! answer to a waiting call that approves it and every later call of its
//! tool in the tree, in any agent at any depth and in later turns.
//!
//! The rule is the supervisor's: an `approvalRuleAdded` event of the tree's
//! root, journaled like any event, so a resumed, adopted or replayed tree has
//! it again (its `Recovery`). A running tree's rules are read by its agents
//! through its hooks ([`RuledHooks`]); the step machine decides, without a
//! runtime, that a call of an allowed tool is not asked for
//! (`arbor_actors::approval::gate`).

use std::collections::BTreeSet;
use std::sync::Arc;

use arbor_actors::approval::{DecideRefused, Decision};
use arbor_actors::hooks::{Slot, SlotLine, SlotPriority};
use arbor_actors::sync::LockExt as _;
use arbor_actors::{
    AgentMsg, AgentTemplate, EventKind, LimitHit, Model, Recovered, RunId, TreeHooks, TreeId, Usage,
};
use futures::future::BoxFuture;

use super::Supervisor;
use crate::approvals::{Approvals, Rules};
use crate::error::Error;
use crate::tree::TreeContext;

/// What one "always allow" answer did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlwaysAllowedNow {
    /// The tools allowed for good in the tree, by the name templates use.
    pub tools: Vec<String>,
    /// The calls approved with it (those of the tools waiting then),
    /// oldest first, each its own `approvalDecided` event.
    pub approved: Vec<String>,
}

impl Supervisor {
    /// Approves the waiting call `call_id` of tree `tree_id` and allows its
    /// tool for good in the tree ("always allow"): the other calls of that
    /// tool waiting now are approved too, and its later calls in the tree
    /// run without asking. Each approval is its own `approvalDecided` event,
    /// the rule an `approvalRuleAdded` event. Refused as
    /// [`decide`](Self::decide) is when the call does not wait (unknown, or
    /// ended once the tree has).
    pub async fn approve_always(
        &self,
        tree_id: &TreeId,
        call_id: &str,
    ) -> Result<AlwaysAllowedNow, Error> {
        let Some(tool) = self.approvals.tool_of(tree_id, call_id) else {
            // Nothing waits: refused as one decision is. (A call that came
            // to wait in between is approved, once.)
            let approve = Decision::Approve { input: None };
            self.decide(tree_id, call_id, approve).await?;
            return Ok(AlwaysAllowedNow {
                tools: Vec::new(),
                approved: vec![call_id.to_owned()],
            });
        };
        self.allow(tree_id, BTreeSet::from([tool])).await
    }

    /// "Always allow" over many calls: every call of tree `tree_id` waiting
    /// now, or every one of the tool `tool`, is approved, and each of their
    /// tools is allowed for good in the tree (see
    /// [`approve_always`](Self::approve_always)). Refused as
    /// [`decide_all`](Self::decide_all) is when none waits.
    pub async fn approve_all_always(
        &self,
        tree_id: &TreeId,
        tool: Option<&str>,
    ) -> Result<AlwaysAllowedNow, Error> {
        let tools: BTreeSet<String> = self
            .approvals
            .list(Some(tree_id))
            .into_iter()
            .filter(|p| tool.is_none_or(|t| p.tool == t))
            .map(|p| p.tool)
            .collect();
        if tools.is_empty() {
            let approve = Decision::Approve { input: None };
            let approved = self.decide_all(tree_id, tool, approve).await?;
            return Ok(AlwaysAllowedNow {
                tools: Vec::new(),
                approved,
            });
        }
        self.allow(tree_id, tools).await
    }

    /// Whether every call of `tool` runs without asking in the tree
    /// `tree_id`, which runs here.
    pub fn always_allowed(&self, tree_id: &TreeId, tool: &str) -> bool {
        self.approvals.allows(tree_id, tool)
    }

    /// Adds the rules of `tools` not in force yet (each an
    /// `approvalRuleAdded` event of the root), then approves every call of
    /// them that waits, oldest first.
    async fn allow(
        &self,
        tree_id: &TreeId,
        tools: BTreeSet<String>,
    ) -> Result<AlwaysAllowedNow, Error> {
        let ctx = self
            .trees
            .locked()
            .get(tree_id.as_str())
            .and_then(|(ctx, _)| ctx.upgrade());
        let Some(ctx) = ctx else {
            return Err(Error::DecisionRefused {
                tree_id: tree_id.clone(),
                call_id: "*".to_owned(),
                reason: DecideRefused::Ended,
            });
        };
        let root = ctx.tree_id.root();
        for tool in &tools {
            if !self.approvals.allows(tree_id, tool) {
                ctx.emit(&root, EventKind::ApprovalRuleAdded { tool: tool.clone() });
            }
        }
        drop(ctx);
        let mut approved = Vec::new();
        for waiting in self.approvals.list(Some(tree_id)) {
            if !tools.contains(&waiting.tool) {
                continue;
            }
            let approve = Decision::Approve { input: None };
            // A call whose run ended meanwhile is no longer decided.
            match self.decide(tree_id, &waiting.tool_call_id, approve).await {
                Ok(()) => approved.push(waiting.tool_call_id),
                Err(Error::UnknownApproval { .. } | Error::DecisionRefused { .. }) => {}
                Err(other) => return Err(other),
            }
        }
        Ok(AlwaysAllowedNow {
            tools: tools.into_iter().collect(),
            approved,
        })
    }

    /// The hooks a tree's agents reach it by: its context, with its "always
    /// allow" rules (those its journal recorded, for a resumed or replayed
    /// tree).
    pub(crate) fn ruled_hooks(
        &self,
        ctx: Arc<TreeContext>,
        recorded: arbor_actors::approval::AlwaysAllowed,
    ) -> Arc<dyn TreeHooks> {
        let rules = self.approvals.rules_for(&ctx.tree_id, recorded);
        Arc::new(RuledHooks {
            ctx,
            rules,
            approvals: self.approvals.clone(),
        })
    }
}

/// A tree's context with its "always allow" rules: what its agents hold.
/// Every hook is the context's but [`always_allowed`](TreeHooks::always_allowed);
/// the rules go when the last agent does.
pub(crate) struct RuledHooks {
    ctx: Arc<TreeContext>,
    rules: Rules,
    approvals: Arc<Approvals>,
}

impl RuledHooks {
    /// The context, seen as the port only (so no method of its own, such as
    /// its builders `durable` and `recovering`, is taken for a hook).
    fn port(&self) -> &impl TreeHooks {
        &*self.ctx
    }
}

impl Drop for RuledHooks {
    fn drop(&mut self) {
        self.approvals.release_rules(&self.ctx.tree_id, &self.rules);
    }
}

// Every hook is forwarded: one the port adds with a default must be
// forwarded too (clippy names it), or the tree would lose it here.
#[warn(clippy::missing_trait_methods)]
impl TreeHooks for RuledHooks {
    fn always_allowed(&self, tool: &str) -> bool {
        self.rules.locked().allows(tool)
    }

    fn emit(&self, run_id: &RunId, kind: EventKind) {
        // A call asked for while its tool was being allowed (its agent read
        // the rules just before): the rule decides it, as it would have.
        // The rule is read after the call is published (and so listed as
        // waiting): an `allow` that added it before lists this call, one
        // that adds it after is seen here; either way someone approves it
        // (twice is harmless: the second finds nothing waiting).
        let asked = match &kind {
            EventKind::ApprovalRequested {
                tool, tool_call_id, ..
            } => Some((tool.clone(), tool_call_id.clone())),
            _ => None,
        };
        self.port().emit(run_id, kind);
        if let Some((tool, call_id)) = asked
            && self.always_allowed(&tool)
            && let Some(actor) = self.ctx.live_actor(run_id)
        {
            let (reply, _) = ractor::concurrency::oneshot();
            let _ = actor.cast(AgentMsg::Decide {
                call_id,
                decision: Box::new(Decision::Approve { input: None }),
                reply: reply.into(),
            });
        }
    }

    fn tree_id(&self) -> &TreeId {
        self.port().tree_id()
    }

    fn template(&self, id: &str) -> Option<Arc<AgentTemplate>> {
        self.port().template(id)
    }

    fn knows_agent(&self, requested: &str) -> bool {
        self.port().knows_agent(requested)
    }

    fn model(&self, name: &str) -> Option<Arc<dyn Model>> {
        self.port().model(name)
    }

    fn toolbox(
        &self,
        template: &AgentTemplate,
    ) -> Result<Arc<arbor_actors::toolbox::Toolbox>, arbor_actors::toolbox::ToolboxError> {
        self.port().toolbox(template)
    }

    fn admit_child(&self, parent_depth: usize, index: usize) -> Result<(), LimitHit> {
        self.port().admit_child(parent_depth, index)
    }

    fn admit_step(&self, estimate: u64) -> Result<(), LimitHit> {
        self.port().admit_step(estimate)
    }

    fn settle(&self, usage: &Usage, reserved: u64) {
        self.port().settle(usage, reserved);
    }

    fn acquire_slot(&self, priority: SlotPriority) -> BoxFuture<'static, Option<Slot>> {
        self.port().acquire_slot(priority)
    }

    fn acquire_slots(&self, priority: SlotPriority, count: usize) -> SlotLine {
        self.port().acquire_slots(priority, count)
    }

    fn store_ready(&self) -> Option<BoxFuture<'static, ()>> {
        self.port().store_ready()
    }

    fn stored(&self) -> Option<BoxFuture<'static, Result<(), arbor_actors::Failure>>> {
        self.port().stored()
    }

    fn actor_started(&self, run_id: &RunId, actor: &ractor::ActorCell) {
        self.port().actor_started(run_id, actor);
    }

    fn actor_stopped(&self, run_id: &RunId) {
        self.port().actor_stopped(run_id);
    }

    fn durable(&self) -> bool {
        self.port().durable()
    }

    fn recovering(&self) -> bool {
        self.port().recovering()
    }

    fn recovered(&self, run_id: &RunId) -> Option<Recovered> {
        self.port().recovered(run_id)
    }

    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.port().deadline()
    }

    fn pauses_on_budget(&self) -> bool {
        self.port().pauses_on_budget()
    }

    fn steers(&self, run_id: &RunId) -> Vec<arbor_actors::steer::Steer> {
        self.port().steers(run_id)
    }

    fn deliveries(&self, run_id: &RunId) -> Vec<arbor_actors::background::Scheduled> {
        self.port().deliveries(run_id)
    }

    fn decisions(&self, run_id: &RunId) -> std::collections::HashMap<String, Decision> {
        self.port().decisions(run_id)
    }

    fn workspace(&self) -> Option<Arc<dyn arbor_actors::tool::Workspace>> {
        self.port().workspace()
    }

    fn program_record(&self, run_id: &RunId) -> Option<arbor_actors::durable::ProgramRecord> {
        self.port().program_record(run_id)
    }

    fn compactions(&self, run_id: &RunId) -> Vec<arbor_actors::compact::Compacted> {
        self.port().compactions(run_id)
    }

    fn worktree_report(&self, run_id: &RunId) -> Option<arbor_actors::worktree::WorktreeReport> {
        self.port().worktree_report(run_id)
    }

    fn lifecycle(&self) -> Option<Arc<dyn arbor_actors::lifecycle::Lifecycle>> {
        self.port().lifecycle()
    }

    fn hook_verdicts(
        &self,
        run_id: &RunId,
    ) -> std::collections::HashMap<String, arbor_actors::lifecycle::Verdict> {
        self.port().hook_verdicts(run_id)
    }
}
