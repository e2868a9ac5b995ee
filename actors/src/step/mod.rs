//! The step machine (semantics §4): every decision of an agent's run as plain code
//! with no I/O. The actor feeds it model replies, tool results and child reports
//! and carries out the `Action`s it returns; tests drive it directly.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::event::EventKind;
use crate::failure::{Failure, FailureKind};
use crate::handler::{Resume, StepProgram};
use crate::history::{Expiry, History};
use crate::id::TreeId;
use crate::message::{INSTRUCTIONS_PROMPT, Message, SPAWN_PROMPT, STEP_PROMPT};
use crate::model::{ModelRequest, ModelResponse, RequestMeta, Usage};
use crate::output::output_value;
use crate::spawn::ChildReport;
use crate::state::{AgentState, AgentStatus};
use crate::steer::{STEERING, Steer, SteerLimits, SteerRefused};
use crate::template::AgentTemplate;
use crate::tool::ToolOutput;
use crate::toolbox::Toolbox;

mod action;
mod approve;
pub mod background;
mod calls;
mod compact;
mod durable;
mod hooked;

pub use action::{Action, Catalog, Planned};
pub use hooked::{HOOK_CONTEXT, HookRequest, STOP_HOOK};
mod ids;
mod sealed;
pub use sealed::EndSeal;
mod spawned;
mod turn;
mod watch;

use ids::{call_ids_ok, fresh_id, with_call_ids};

enum Effect {
    Add(Message),
    Replace(Vec<Message>),
    Output(Value),
    EndTurn,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    Model,
    Program,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Drive {
    /// No program: the model drives until its turn ends.
    Model,
    /// A program waits for the end of one model step.
    OneStep,
    /// A program waits for the end of the model's turn.
    AllSteps,
    /// A program waits for its tool results.
    ProgramTools,
}

struct Pending {
    step: u32,
    calls: calls::Calls,
    results: Vec<Option<Message>>,
    child_runs: Vec<Vec<crate::id::RunId>>,
    effects: Vec<(usize, Effect)>,
    inline: Option<(usize, History)>,
    awaiting: usize,
    origin: Origin,
    /// The calls that wait for a person's decision (semantics §12).
    held: approve::Held,
    /// The calls that wait for their `PreToolUse` hooks, and what waits
    /// with them.
    hooking: Option<Box<hooked::Hooking>>,
    /// What hooks gave the model for a call, added to its result.
    hook_notes: Vec<(usize, String)>,
    /// Calls a hook asked a person about: asked even when their tool is
    /// allowed for good.
    forced_asks: Vec<usize>,
}

/// The pure decisions of one run (semantics §4–§7): fed model replies, tool
/// results and child reports, it answers with [`Action`]s and events.
pub struct StepMachine {
    state: AgentState,
    template: Arc<AgentTemplate>,
    toolbox: Arc<Toolbox>,
    inherited: usize,
    step: u32,
    pending: Option<Box<Pending>>,
    awaiting_model: Option<u32>,
    program: Option<Box<dyn StepProgram>>,
    drive: Drive,
    events: Vec<EventKind>,
    tree_id: TreeId,
    prompt: Option<String>,
    params: Option<Value>,
    /// Children given an ordinal so far (ids derive from it).
    children_spawned: u32,
    /// Whether to emit a `Checkpointed` event at every step boundary (and keep
    /// each raw model reply in `ModelResponded`), for a durable tree.
    checkpointing: bool,
    /// The loop watchdog: the last call and its identical repeats.
    loops: watch::LoopWatch,
    /// Steers, recorded decisions, background children: made when the
    /// first of them comes.
    side: Option<Box<Sideband>>,
    /// Whether the run goes on from a checkpoint (its background children
    /// are started again).
    resumed: bool,
}

/// What reaches a run beside its own steps. Most runs never see any of it,
/// so a machine makes it when the first of it comes (issue 17: ~200 bytes
/// of every agent's machine).
#[derive(Default)]
struct Sideband {
    /// Steering messages accepted and not yet in the history (the next step
    /// boundary applies them).
    steers: Vec<Arc<str>>,
    /// Steers a replay sends again, each when the run is at the step it
    /// first arrived in.
    scheduled_steers: Vec<Steer>,
    /// Decisions on tool calls recorded before a restart, by call id.
    recorded_decisions: std::collections::HashMap<String, crate::approval::Decision>,
    /// `PreToolUse` verdicts recorded before a restart, by call id.
    recorded_hooks: std::collections::HashMap<String, crate::lifecycle::Verdict>,
    /// Whether the run goes on because a stop hook blocked its end (the
    /// hooks' `stop_hook_active`), and the step it waits at for them.
    stop_hook_active: bool,
    stop_hook_step: Option<u32>,
    /// Whether the run waits for its start hooks (`UserPromptSubmit`,
    /// `SubagentStart`).
    starting: bool,
    /// The worktree report a resumed or replayed run recorded, whether the
    /// run waits for its worktree to be sealed, and whether it was.
    recorded_worktree: Option<crate::worktree::WorktreeReport>,
    /// The calls of the program's current step whose call and result stay
    /// out of the history (`includeToolCall: false`), by index.
    hidden_calls: Vec<usize>,
    sealing: bool,
    sealed: bool,
    /// Agent ids of the background children started and not yet reported
    /// in the history (semantics §15).
    background: Vec<crate::id::AgentId>,
    /// Background reports that came and wait for the next step boundary.
    arrived: Vec<ChildReport>,
    /// How the run waits for background reports at the end of its turn.
    waiting: Option<background::Waiting>,
    /// Deliveries a resumed or replayed run makes where its journal made them.
    scheduled: Vec<background::Scheduled>,
    /// Child runs of calls that had reported when the run was cut short.
    abandoned: Vec<(usize, Vec<crate::id::RunId>)>,
    /// A program's yields, and the record a resumed run is held to.
    durable: Option<Box<durable::Durable>>,
    /// A compaction waiting for its summary (issue 37).
    compacting: Option<Box<compact::Compacting>>,
    /// The compactions a resumed or replayed run's journal recorded.
    compactions: Vec<crate::compact::Compacted>,
}

impl StepMachine {
    /// The sideband, made now if nothing came beside the steps before.
    fn side(&mut self) -> &mut Sideband {
        self.side.get_or_insert_default()
    }

    /// Takes one list out of the sideband (empty if there is none), without
    /// making a sideband.
    fn take_side<T: Default>(&mut self, field: impl FnOnce(&mut Sideband) -> &mut T) -> T {
        self.side
            .as_deref_mut()
            .map(|side| std::mem::take(field(side)))
            .unwrap_or_default()
    }

    /// A machine for a run starting from `state`, which inherited `inherited` messages.
    pub fn new(
        state: AgentState,
        template: Arc<AgentTemplate>,
        toolbox: Arc<Toolbox>,
        inherited: usize,
        tree_id: TreeId,
    ) -> Self {
        StepMachine {
            state,
            template,
            toolbox,
            inherited,
            step: 0,
            pending: None,
            awaiting_model: None,
            program: None,
            drive: Drive::Model,
            events: Vec::new(),
            tree_id,
            prompt: None,
            params: None,
            children_spawned: 0,
            checkpointing: false,
            loops: watch::LoopWatch::default(),
            side: None,
            resumed: false,
        }
    }

    /// A machine that goes on from a checkpoint of a model-driven run: `start`
    /// re-issues the step the checkpoint was taken before.
    pub fn from_checkpoint(
        checkpoint: &crate::checkpoint::Checkpoint,
        template: Arc<AgentTemplate>,
        toolbox: Arc<Toolbox>,
        tree_id: TreeId,
    ) -> Self {
        let mut machine = StepMachine::new(
            checkpoint.state.clone(),
            template,
            toolbox,
            checkpoint.inherited,
            tree_id,
        );
        machine.step = checkpoint.step;
        machine.children_spawned = checkpoint.children_spawned;
        machine.resumed = true;
        machine
    }

    /// Accepts a steering message (semantics §9): it joins the history at the
    /// next step boundary, and a `steered` event records it now. At most
    /// [`SteerLimits::default`] wait at once.
    pub fn steer(&mut self, text: impl Into<Arc<str>>) -> Result<(), SteerRefused> {
        self.steer_within(text, &SteerLimits::default())
    }

    /// [`steer`](Self::steer) under `limits`: a message the pending ones
    /// leave no room for is refused ([`SteerRefused::Full`]).
    pub fn steer_within(
        &mut self,
        text: impl Into<Arc<str>>,
        limits: &SteerLimits,
    ) -> Result<(), SteerRefused> {
        if self.state.status.is_final() {
            return Err(SteerRefused::Ended);
        }
        let text: Arc<str> = text.into();
        if text.trim().is_empty() {
            return Err(SteerRefused::Empty);
        }
        let pending = self.side.as_ref().map_or(&[][..], |side| &side.steers[..]);
        limits.admit(pending, text.len())?;
        self.events.push(EventKind::Steered {
            step: self.step,
            text: text.clone(),
        });
        self.side().steers.push(text);
        Ok(())
    }

    /// Gives back the steers a restart or a replay kept of this run (those
    /// no checkpoint it starts from holds): each is taken again when the run
    /// reaches the step it first arrived in, as the live run took it, with no
    /// new event (it was recorded).
    pub fn recover_steers(&mut self, steers: Vec<Steer>) {
        if steers.is_empty() {
            return;
        }
        self.side().scheduled_steers = steers;
        self.take_scheduled_steers();
    }

    fn take_scheduled_steers(&mut self) {
        let step = self.step;
        let Some(side) = self.side.as_deref_mut() else {
            return;
        };
        let due: Vec<Steer> = side
            .scheduled_steers
            .iter()
            .filter(|s| s.step == step)
            .cloned()
            .collect();
        side.scheduled_steers.retain(|s| s.step != step);
        side.steers.extend(due.into_iter().map(|s| s.text));
    }

    /// Whether steering messages wait for the next step boundary.
    pub(crate) fn has_pending_steers(&self) -> bool {
        self.side.as_ref().is_some_and(|s| !s.steers.is_empty())
    }

    /// Emits a `Checkpointed` event at every step boundary from now on.
    pub fn set_checkpointing(&mut self, on: bool) {
        self.checkpointing = on;
    }

    /// Children given an ordinal so far.
    pub(crate) fn children_spawned(&self) -> u32 {
        self.children_spawned
    }

    /// The ordinal of the next child this run spawns (1 for the first).
    pub(crate) fn next_child_ordinal(&mut self) -> u32 {
        self.children_spawned += 1;
        self.children_spawned
    }

    /// A checkpoint before the next step. Not before the first: a run with no
    /// checkpoint starts afresh from what its parent gave it, which is the same
    /// state. A program cannot be saved mid-way, so a program-driven run has
    /// none and starts again from the beginning when its tree is resumed,
    /// held to its journaled yields and fed its recorded results until it
    /// reaches where it was (`durable`).
    fn checkpoint(&mut self) {
        if !self.checkpointing || self.step == 0 || self.template.handler.is_some() {
            return;
        }
        let checkpoint = crate::checkpoint::Checkpoint {
            step: self.step,
            children_spawned: self.children_spawned,
            inherited: self.inherited,
            state: self.state.clone(),
        };
        self.events.push(EventKind::Checkpointed {
            checkpoint: Arc::new(checkpoint),
        });
    }

    /// Records the prompt and params this run was started with, for a
    /// program to read. A model-driven run has them in its history and keeps
    /// no copy (one per agent, issue 17).
    pub fn with_input(mut self, prompt: Option<&str>, params: Option<&Value>) -> Self {
        if self.template.handler.is_some() {
            self.prompt = prompt.map(str::to_owned);
            self.params = params.cloned();
        }
        self
    }

    /// The run's state as it stands.
    pub fn state(&self) -> &AgentState {
        &self.state
    }

    /// Takes the state out of a finished machine (it keeps an empty one).
    pub(crate) fn take_state(&mut self) -> AgentState {
        let empty = AgentState::of_run(self.state.run_id.clone());
        std::mem::replace(&mut self.state, empty)
    }

    /// The template the run follows.
    pub fn template(&self) -> &Arc<AgentTemplate> {
        &self.template
    }

    /// The tools the run may call.
    pub fn toolbox(&self) -> &Arc<Toolbox> {
        &self.toolbox
    }

    /// The current step (0 before the first).
    pub fn step(&self) -> u32 {
        self.step
    }

    /// Messages of the history the run inherited (semantics §7).
    pub(crate) fn inherited(&self) -> usize {
        self.inherited
    }

    /// Events produced since the last call, in order.
    pub fn take_events(&mut self) -> Vec<EventKind> {
        std::mem::take(&mut self.events)
    }

    /// The value this run reports to its parent (semantics §7).
    pub fn output_value(&self) -> Value {
        output_value(&self.state, self.template.output_mode, self.inherited)
    }

    /// Starts the run: its start hooks first when it has any (a run that
    /// starts afresh, not from a checkpoint), then the template's program
    /// if it has one, else the model.
    pub fn start(&mut self, catalog: &dyn Catalog) -> Vec<Action> {
        if let Some(hooks) = self.start_hooks(catalog) {
            return hooks;
        }
        self.start_now(catalog)
    }

    /// [`start`](Self::start), its start hooks done.
    pub(super) fn start_now(&mut self, catalog: &dyn Catalog) -> Vec<Action> {
        let Some(handler) = self.template.handler.clone() else {
            let mut actions: Vec<Action> = Vec::new();
            if self.resumed {
                actions.extend(self.relaunch(catalog));
            }
            actions.extend(self.begin_step());
            return actions;
        };
        let mut program = handler.start();
        self.redraw(&mut *program);
        let next = program.resume(Resume::Start {
            prompt: self.prompt.as_deref(),
            params: self.params.as_ref(),
            state: &self.state,
        });
        let next = self.recorded_yield(&mut *program, next);
        self.program = Some(program);
        self.follow(next, catalog)
    }

    /// The model answered step `step`.
    pub fn model_replied(
        &mut self,
        step: u32,
        response: ModelResponse,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        if self.awaiting_model != Some(step) || self.state.status.is_final() {
            return Vec::new();
        }
        self.awaiting_model = None;
        if self.side.as_ref().is_some_and(|s| s.compacting.is_some()) {
            return self.summary_replied(step, response);
        }
        let ModelResponse { message, usage } = response;
        if !message.is_assistant() {
            // Refused, but billed: counted as a reply not acted on.
            let failure = Failure::new(
                FailureKind::ModelInvalid,
                format!("model replied with a {} message", message.role()),
            );
            let billed = (!usage.is_recorded()).then_some(usage);
            return self.model_failed(step, failure, billed);
        }
        // A durable tree records the reply as the model sent it; it is the very
        // message the history keeps unless its call ids had to be fixed.
        let history = &self.state.message_history;
        let (message, reply) = if !self.checkpointing {
            (Arc::new(with_call_ids(message, step, history)), None)
        } else if call_ids_ok(&message, history) {
            let message = Arc::new(message);
            (message.clone(), Some(message))
        } else {
            let raw = Arc::new(message.clone());
            (Arc::new(with_call_ids(message, step, history)), Some(raw))
        };
        let calls = calls::Calls::of(message.clone());
        self.state.context_token_count = if usage.total_tokens() > 0 {
            usage.total_tokens()
        } else {
            self.state.message_history.estimated_tokens() + message.estimated_tokens()
        };
        self.state.direct_credits_used += usage.cost;
        self.state.credits_used += usage.cost;
        self.state.message_history.push_shared(message);
        // A reply served from the record was counted when it was recorded:
        // the run's state counts it again (it goes on from a checkpoint taken
        // before it), its event does not, so sums over events count it once.
        let from_record = usage.is_recorded();
        self.events.push(EventKind::ModelResponded {
            step,
            usage: if from_record { Usage::default() } else { usage },
            tool_calls: calls.len(),
            reply,
            from_record,
            refused: false,
        });
        if calls.is_empty() {
            return self.step_committed(true, catalog);
        }
        self.run_calls(calls, Origin::Model, catalog)
    }

    /// The model call of step `step` failed. A reply that came and is not
    /// acted on (cut at the output limit) was billed all the same: `billed`
    /// is its usage, counted in the run's credits and in a `modelResponded`
    /// event marked `refused` (what sums over events and the store count),
    /// before the run fails.
    pub fn model_failed(
        &mut self,
        step: u32,
        failure: impl Into<Failure>,
        billed: Option<Usage>,
    ) -> Vec<Action> {
        if step != self.step || self.state.status.is_final() {
            return Vec::new();
        }
        let failure = self.compaction_failed(failure.into());
        if let Some(usage) = billed {
            self.state.direct_credits_used += usage.cost;
            self.state.credits_used += usage.cost;
            self.events.push(EventKind::ModelResponded {
                step,
                usage,
                tool_calls: 0,
                reply: None,
                from_record: false,
                refused: true,
            });
        }
        self.fail(failure)
    }

    /// An external tool finished.
    pub fn tool_done(
        &mut self,
        step: u32,
        index: usize,
        result: Result<ToolOutput, crate::tool::ToolError>,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        let Some(pending) = self.pending_for(step, index) else {
            return Vec::new();
        };
        let note = pending
            .hook_notes
            .iter()
            .position(|(i, _)| *i == index)
            .map(|at| pending.hook_notes.swap_remove(at).1);
        let result = match note {
            Some(note) => crate::lifecycle::with_note(result, note),
            None => result,
        };
        let call = &pending.calls[index];
        pending.results[index] = Some(match result {
            Ok(output) => Message::tool_output(call, output.into_parts()),
            Err(error) => Message::tool_error(call, error.message),
        });
        self.resolved(catalog)
    }

    /// Ends the run as failed: the output is `{errorMessage}` (what a parent's
    /// model reads) and the state keeps the failure's kind beside it.
    pub fn fail(&mut self, failure: impl Into<Failure>) -> Vec<Action> {
        if self.state.status.is_final() {
            return Vec::new();
        }
        let Failure { kind, message } = failure.into();
        self.abandon_pending();
        self.state.status = AgentStatus::Failed;
        self.state.output = Some(json!({ "errorMessage": message }));
        self.state.error_kind = Some(kind);
        vec![Action::Finish]
    }

    /// Ends the run as cancelled; the history it had is kept.
    pub fn cancel(&mut self) -> Vec<Action> {
        if self.state.status.is_final() {
            return Vec::new();
        }
        self.abandon_pending();
        self.state.status = AgentStatus::Cancelled;
        vec![Action::Finish]
    }

    /// At the end of a run cut short: records the children of the unfinished
    /// step, both the calls that had reported and those still out (`late`: call
    /// index, credits, run ids), in call order.
    pub(crate) fn close_children(&mut self, late: Vec<(usize, f64, Vec<crate::id::RunId>)>) {
        let mut calls = self.take_side(|side| &mut side.abandoned);
        let arrived = self.take_side(|side| &mut side.arrived);
        for (index, credits, runs) in late {
            self.state.credits_used += credits;
            calls.push((index, runs));
        }
        calls.sort_by_key(|(index, _)| *index);
        for (_, runs) in calls {
            self.state.child_run_ids.extend(runs);
        }
        // Background reports that came and never reached a step boundary.
        for report in arrived {
            self.state.credits_used += report.credits;
            self.state.child_run_ids.extend(report.run_ids);
        }
    }

    /// Removes expired messages (a no-op, and no copy, when none expire).
    fn expire(&mut self, at: Expiry) {
        if !self.state.message_history.expires_any(at) {
            return;
        }
        let expired = self.state.message_history.expire(at);
        self.set_history(expired);
    }

    /// Replaces the history. `inherited` becomes the number of inherited messages
    /// still at its front, so `all_messages` drops exactly those (expiry or an
    /// inline merge may remove some; `set_messages` makes every message the run's).
    fn set_history(&mut self, history: History) {
        if self.inherited > 0 {
            let prefix: HashSet<*const Message> = self
                .state
                .message_history
                .iter()
                .take(self.inherited)
                .map(Arc::as_ptr)
                .collect();
            self.inherited = history
                .iter()
                .take_while(|m| prefix.contains(&Arc::as_ptr(m)))
                .count();
        }
        self.state.message_history = history;
    }

    fn abandon_pending(&mut self) {
        self.awaiting_model = None;
        if let Some(p) = self.pending.take() {
            // Children that did report stay on record; they are merged in call
            // order with the calls still out when the run ends (`close_children`).
            for (index, runs) in p.child_runs.into_iter().enumerate() {
                if !runs.is_empty() {
                    self.side().abandoned.push((index, runs));
                }
            }
        }
    }

    fn pending_for(&mut self, step: u32, index: usize) -> Option<&mut Pending> {
        if self.state.status.is_final() {
            return None;
        }
        let pending = self.pending.as_mut().filter(|p| p.step == step)?;
        if pending.results.get(index).is_none_or(Option::is_some) {
            return None;
        }
        pending.awaiting -= 1;
        Some(pending)
    }

    fn resolved(&mut self, catalog: &dyn Catalog) -> Vec<Action> {
        match &self.pending {
            Some(p) if p.awaiting == 0 => self.commit(catalog),
            _ => Vec::new(),
        }
    }

    /// Step 1 of the loop: expire, count the step, build the request.
    fn begin_step(&mut self) -> Vec<Action> {
        // Before the checkpoint: a checkpoint holds every report and steer
        // applied before it (so a resumed run neither loses nor repeats one).
        let Some(delivered) = self.take_arrived() else {
            // A report the journal delivered here has not come yet.
            self.side().waiting = Some(background::Waiting::Schedule);
            return vec![Action::AwaitChildren];
        };
        for text in self.take_side(|side| &mut side.steers) {
            self.state
                .message_history
                .push(Message::user(&*text).with_tag(STEERING));
        }
        self.checkpoint();
        self.events.extend(delivered);
        self.expire(Expiry::StepStart);
        if self.state.steps_remaining == 0 {
            return self.step_limit();
        }
        self.state.steps_remaining -= 1;
        self.step += 1;
        self.events.push(EventKind::StepStarted { step: self.step });
        self.take_scheduled_steers();
        if let Some(summary_call) = self.compact() {
            return summary_call;
        }
        self.request_step()
    }

    /// The step's model request, from the history as it stands.
    fn request_step(&mut self) -> Vec<Action> {
        let (mut messages, repair) = self.state.message_history.request_view();
        // Sent as kept (nothing repaired, nor truncated below): the request
        // then starts with the history's own messages.
        let mut as_kept = repair.is_empty();
        if !repair.is_empty() {
            self.events.push(EventKind::HistoryRepaired {
                unanswered_calls: repair.unanswered_calls,
                orphan_results: repair.orphan_results,
            });
        }
        // The history keeps its own token estimate: one that fits is sent as is.
        if let Some(window) = self
            .template
            .context_window
            .filter(|w| messages.estimated_tokens() > *w)
        {
            messages = History::truncated_view(&messages.to_vec(), window)
                .into_iter()
                .collect();
            as_kept = false;
        }
        if let Some(text) = self
            .template
            .step_prompt
            .as_deref()
            .filter(|t| !t.is_empty())
        {
            // Sent with this request only; the history never holds it.
            messages.push(Message::user(text).with_tag(STEP_PROMPT));
        }
        self.awaiting_model = Some(self.step);
        let shared_prefix = self.shared_prefix(&messages, as_kept);
        vec![Action::CallModel(ModelRequest {
            system_prompt: self.state.system_prompt.clone(),
            messages,
            tools: self.state.tool_definitions.clone(),
            meta: RequestMeta {
                tree_id: self.tree_id.as_arc().clone(),
                run_id: self.state.run_id.to_string(),
                agent_type: self.state.agent_type.clone().unwrap_or_default(),
                depth: self.state.depth(),
                step: self.step,
                shared_prefix,
                deadline: None,
                options: self.template.model_options.clone(),
                summary: false,
            },
        })]
    }

    /// How many leading messages of a request are what the run inherited
    /// from its parent, up to (not including) its own prompt: its siblings'
    /// requests start with the same ones (semantics §6).
    ///
    /// `as_kept`: the request starts with the history's own messages, so the
    /// prefix is known without comparing them one by one.
    fn shared_prefix(&self, messages: &History, as_kept: bool) -> usize {
        if self.state.parent_id.is_none() {
            return 0;
        }
        // Walked in place, every step: no copy of the inherited part (a
        // `Vec` of it per step was 3.4% of a deep tree's CPU, issue 17).
        let history = &self.state.message_history;
        let inherited = self.inherited.min(history.len());
        let input = |m: &Arc<Message>| m.has_tag(SPAWN_PROMPT) || m.has_tag(INSTRUCTIONS_PROMPT);
        let own = history
            .iter()
            .take(inherited)
            .rposition(input)
            .map_or(inherited, |at| {
                // The first of the run's own input messages.
                history
                    .iter()
                    .take(at)
                    .rposition(|m| !input(m))
                    .map_or(0, |i| i + 1)
            });
        if as_kept {
            return own.min(messages.len());
        }
        messages
            .iter()
            .zip(history.iter().take(own))
            .take_while(|(sent, kept)| Arc::ptr_eq(sent, kept))
            .count()
    }

    fn step_limit(&mut self) -> Vec<Action> {
        let max = self.template.max_steps;
        self.fail(Failure::new(
            FailureKind::Limit,
            format!(
                "limit max_steps (agent) reached: {} stopped after {max} step(s)",
                self.state.agent_type.as_deref().unwrap_or("agent")
            ),
        ))
    }
}
