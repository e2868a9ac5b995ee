//! Compaction before a step (`compact_at`, issue 37), as the machine
//! carries it out: the plan ([`crate::compact`]) applied, the summary call
//! started as work whose reply comes back through `model_replied`, and
//! every compaction journaled (`historyCompacted`); a resumed or replayed
//! run applies the recorded one instead of asking the model again.

use std::sync::Arc;

use crate::compact::{self, Compacted, Plan};
use crate::event::EventKind;
use crate::failure::{Failure, FailureKind};
use crate::model::{ModelOptions, ModelRequest, ModelResponse, RequestMeta, ToolChoice, Usage};

use super::{Action, StepMachine};

/// A compaction waiting for its summary.
pub(super) struct Compacting {
    /// The plan: the history with its results cut, what to summarise.
    plan: Plan,
}

impl StepMachine {
    /// Gives a resumed or replayed run the compactions its journal
    /// recorded: each is applied again before its step, with no model call.
    pub fn recover_compactions(&mut self, recorded: Vec<Compacted>) {
        if recorded.is_empty() {
            return;
        }
        self.side().compactions = recorded;
    }

    /// Before the step's request: compacts the history when the template
    /// asks and the context is over its threshold. `Some`: the summary
    /// call to start (the step's request follows its reply).
    pub(super) fn compact(&mut self) -> Option<Vec<Action>> {
        let template = self.template.clone();
        let compaction = template.compact.as_ref()?;
        let step = self.step;
        let recorded = self
            .side
            .as_deref()
            .and_then(|side| side.compactions.iter().find(|c| c.step == step))
            .cloned();
        if let Some(recorded) = recorded {
            self.apply_recorded(recorded);
            return None;
        }
        let history = &self.state.message_history;
        let plan = compact::plan(
            history,
            self.state.context_token_count,
            compaction,
            super::background::pinned(history),
        )?;
        if plan.summarize == 0 {
            self.events.push(EventKind::HistoryCompacted {
                step,
                tokens: plan.tokens,
                cut: plan.cut,
                summarized: 0,
                summary: None,
                usage: Usage::default(),
                from_record: false,
            });
            self.state.context_token_count = plan.tokens_after_cut;
            self.set_history(plan.history);
            return None;
        }
        let messages =
            compact::summary_messages(&plan.history, plan.summarize, compaction.prompt());
        // The run's own model and options, but no tool call and no
        // structured output: the reply is the summary's text.
        let options = ModelOptions {
            tool_choice: Some(ToolChoice::None),
            output: None,
            ..(*template.model_options).clone()
        };
        self.side().compacting = Some(Box::new(Compacting { plan }));
        self.awaiting_model = Some(step);
        Some(vec![Action::CallModel(ModelRequest {
            system_prompt: self.state.system_prompt.clone(),
            messages,
            tools: self.state.tool_definitions.clone(),
            meta: RequestMeta {
                tree_id: self.tree_id.as_arc().clone(),
                run_id: self.state.run_id.to_string(),
                agent_type: self.state.agent_type.clone().unwrap_or_default(),
                depth: self.state.depth(),
                step,
                shared_prefix: 0,
                deadline: None,
                options: Arc::new(options),
                summary: true,
            },
        })])
    }

    /// The summary call answered: the summarised turns are replaced, the
    /// compaction journaled, and the step's own request goes out.
    pub(super) fn summary_replied(&mut self, step: u32, response: ModelResponse) -> Vec<Action> {
        let Some(compacting) = self.side.as_deref_mut().and_then(|s| s.compacting.take()) else {
            return Vec::new();
        };
        let ModelResponse { message, usage } = response;
        let text = message.text();
        let summary = text.trim();
        if !message.is_assistant() || summary.is_empty() {
            let failure = Failure::new(
                FailureKind::ModelInvalid,
                "the summary call to compact the history (compact_at) replied with no text",
            );
            return self.model_failed(step, failure, Some(usage));
        }
        let Plan {
            tokens,
            history,
            cut,
            summarize,
            ..
        } = compacting.plan;
        self.state.direct_credits_used += usage.cost;
        self.state.credits_used += usage.cost;
        let history = compact::summarized(&history, summarize, summary);
        self.state.context_token_count = history.estimated_tokens();
        self.events.push(EventKind::HistoryCompacted {
            step,
            tokens,
            cut,
            summarized: summarize,
            summary: Some(Arc::from(summary)),
            usage,
            from_record: false,
        });
        self.set_history(history);
        self.request_step()
    }

    /// A failed model call of this step: when it was the summary call, the
    /// failure says so.
    pub(super) fn compaction_failed(&mut self, mut failure: Failure) -> Failure {
        if self
            .side
            .as_deref_mut()
            .and_then(|s| s.compacting.take())
            .is_some()
        {
            failure.message = format!(
                "the summary call to compact the history (compact_at) failed: {}",
                failure.message
            );
        }
        failure
    }

    /// A compaction the journal recorded, applied as it was made: the same
    /// results cut, the same summary, its credits counted in the run's
    /// state (its event counts nothing again).
    fn apply_recorded(&mut self, recorded: Compacted) {
        let applied = compact::apply(
            &self.state.message_history,
            self.state.context_token_count,
            &recorded,
        );
        self.state.direct_credits_used += recorded.usage.cost;
        self.state.credits_used += recorded.usage.cost;
        self.state.context_token_count = applied.context_tokens;
        self.events.push(EventKind::HistoryCompacted {
            step: recorded.step,
            tokens: applied.tokens,
            cut: recorded.cut,
            summarized: recorded.summarized,
            summary: recorded.summary,
            usage: Usage::default(),
            from_record: true,
        });
        self.set_history(applied.history);
    }
}
