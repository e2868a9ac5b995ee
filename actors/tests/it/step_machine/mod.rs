//! The step machine driven by hand, with no runtime: model replies, tool results
//! and child reports are fed in, and the actions and state it produces are
//! checked against semantics §4–§7. Every model request it builds must pair.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arbor_actors::handler::{FnHandler, FnProgram, ProgramCall, Resume, Yield};
use arbor_actors::history::{History, check_pairing};
use arbor_actors::hooks::RunIds;
use arbor_actors::message::{
    Content, Message, Part, SPAWN_PROMPT, SUBAGENT_SPAWN, TOOL_CALL_ERROR, TimeToLive, ToolCall,
};
use arbor_actors::model::{ModelRequest, ModelResponse, Usage, UsageSource};
use arbor_actors::schema::Schema;
use arbor_actors::spawn::{ChildPlan, ChildReport, ChildStart, ParentInfo};
use arbor_actors::state::{AgentState, AgentStatus};
use arbor_actors::template::{AgentTemplate, AgentTypeId, OutputMode};
use arbor_actors::tool::{Tool, ToolError};
use arbor_actors::toolbox::Toolbox;
use arbor_actors::{Action, Catalog, EventKind, StepMachine};
use arbor_actors::{Failure, FailureKind, RunId};
use arbor_test_support::Echo;
use serde_json::{Value, json};

mod approvals;
mod checkpoints;
mod compaction;
mod durable;
mod hooks;
mod plain;
mod programs;
mod spawning;
mod steering;
mod structured;
mod watchdogs;
mod worktrees;

// ------------------------------------------------------------ test doubles

struct Cat(HashMap<String, Arc<AgentTemplate>>);

impl Catalog for Cat {
    fn template(&self, id: &str) -> Option<Arc<AgentTemplate>> {
        self.0.get(id).cloned()
    }

    fn knows_agent(&self, requested: &str) -> bool {
        let want = AgentTypeId::parse(requested);
        self.0.keys().any(|k| want.matches(&AgentTypeId::parse(k)))
    }
}

/// A run id of a test's text.
fn rid(text: &str) -> RunId {
    text.parse().unwrap()
}

fn catalog(templates: Vec<AgentTemplate>) -> Cat {
    Cat(templates
        .into_iter()
        .map(|t| (t.id.clone(), Arc::new(t)))
        .collect())
}

/// An external tool; the machine never runs it (the actor does).
fn echo() -> Echo {
    Echo::with_schema(
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    )
}

fn toolbox(template: &AgentTemplate) -> Arc<Toolbox> {
    Arc::new(
        Toolbox::build(template, |name| {
            (name == "echo").then(|| Arc::new(echo()) as Arc<dyn Tool>)
        })
        .unwrap(),
    )
}

const USAGE: Usage = Usage {
    input_tokens: 100,
    output_tokens: 20,
    cache_read_tokens: 0,
    cache_write_tokens: 0,
    cost: 0.5,
    source: UsageSource::Reported,
};

/// A machine and the catalog it plans spawns with.
struct Run {
    m: StepMachine,
    cat: Cat,
}

impl Run {
    /// A root run of `template` (which must be in `templates` or not spawn).
    fn new(template: AgentTemplate, others: Vec<AgentTemplate>, history: Vec<Message>) -> Self {
        let template = Arc::new(template);
        let tb = toolbox(&template);
        let state = AgentState {
            agent_type: Some(template.id.clone()),
            parent_id: Some(rid("tree-1/0").agent_id()),
            ancestor_run_ids: [rid("tree-1/0")].into(),
            message_history: history.into_iter().collect(),
            system_prompt: template.system_prompt.clone(),
            tool_definitions: tb.definitions().clone(),
            steps_remaining: template.max_steps,
            ..AgentState::of_run(rid("tree-1/0.1~1"))
        };
        let m = StepMachine::new(state, template, tb, 0, "tree-1".parse().unwrap());
        Run {
            m,
            cat: catalog(others),
        }
    }

    fn with_input(self, prompt: Option<&str>, params: Option<Value>) -> Self {
        Run {
            m: self.m.with_input(prompt, params.as_ref()),
            cat: self.cat,
        }
    }

    fn solo(template: AgentTemplate) -> Self {
        Run::new(template, Vec::new(), vec![Message::user("task")])
    }

    fn start(&mut self) -> Vec<Action> {
        self.m.start(&self.cat)
    }

    fn reply_with(&mut self, message: Message, usage: Usage) -> Vec<Action> {
        let step = self.m.step();
        self.m
            .model_replied(step, ModelResponse { message, usage }, &self.cat)
    }

    fn reply(&mut self, message: Message) -> Vec<Action> {
        self.reply_with(message, USAGE)
    }

    fn state(&self) -> &AgentState {
        self.m.state()
    }

    fn history(&self) -> Vec<Message> {
        hvalues(&self.state().message_history)
    }
}

// ----------------------------------------------------------------- helpers

fn call(id: &str, name: &str, input: Value) -> ToolCall {
    ToolCall {
        tool_call_id: id.to_owned(),
        tool_name: name.to_owned(),
        input: input.into(),
    }
}

/// An assistant reply making these calls, with ids `{prefix}-{i}`.
fn calls(prefix: &str, list: &[(&str, Value)]) -> Message {
    Message::assistant(
        None,
        list.iter()
            .enumerate()
            .map(|(i, (name, input))| call(&format!("{prefix}-{i}"), name, input.clone()))
            .collect(),
    )
}

fn add_user(text: &str) -> (&'static str, Value) {
    ("add_message", json!({"role": "user", "content": text}))
}

fn hvalues(history: &History) -> Vec<Message> {
    history.iter().map(|m| (**m).clone()).collect()
}

fn values(messages: &[Arc<Message>]) -> Vec<Message> {
    messages.iter().map(|m| (**m).clone()).collect()
}

fn kind(action: &Action) -> &'static str {
    match action {
        Action::CallModel(_) => "CallModel",
        Action::RunTool { .. } => "RunTool",
        Action::RunHooks { .. } => "RunHooks",
        Action::RunStopHooks { .. } => "RunStopHooks",
        Action::SpawnAgents { .. } => "SpawnAgents",
        Action::SpawnInline { .. } => "SpawnInline",
        Action::SpawnBackground { .. } => "SpawnBackground",
        Action::Relaunch { .. } => "Relaunch",
        Action::AwaitChildren => "AwaitChildren",
        Action::AwaitApproval => "AwaitApproval",
        Action::Finish => "Finish",
        Action::SealWorktree => "SealWorktree",
        Action::RunStartHooks { .. } => "RunStartHooks",
    }
}

fn kinds(actions: &[Action]) -> Vec<&'static str> {
    actions.iter().map(kind).collect()
}

/// The one model request among `actions`; it must pass the pairing check.
fn request(actions: Vec<Action>) -> ModelRequest {
    assert_eq!(kinds(&actions), ["CallModel"]);
    let Some(Action::CallModel(req)) = actions.into_iter().next() else {
        unreachable!()
    };
    assert_eq!(
        check_pairing(&req.messages),
        Ok(()),
        "request: {:?}",
        req.messages
    );
    req
}

fn finish(actions: Vec<Action>) {
    assert_eq!(kinds(&actions), ["Finish"]);
}

/// A `spawn_agents` action: step, call index, and each child's plan or
/// `(agent_type, error)`.
type Spawn = (u32, usize, Vec<Result<ChildPlan, (String, String)>>);
/// A planned child as (agent type, prompt), or a refusal as (agent type, error).
type Outcome = Result<(String, Option<String>), (String, String)>;

fn spawn_children(actions: Vec<Action>) -> Spawn {
    assert_eq!(kinds(&actions), ["SpawnAgents"]);
    let Some(Action::SpawnAgents {
        step,
        index,
        children,
    }) = actions.into_iter().next()
    else {
        unreachable!()
    };
    (step, index, children.plans())
}

fn inline_child(actions: Vec<Action>) -> (u32, usize, ChildPlan) {
    assert_eq!(kinds(&actions), ["SpawnInline"]);
    let Some(Action::SpawnInline { step, index, child }) = actions.into_iter().next() else {
        unreachable!()
    };
    (step, index, child)
}

fn is_error(m: &Message) -> bool {
    m.has_tag(TOOL_CALL_ERROR)
}

fn result_value(m: &Message) -> Value {
    let Message::Tool { content, .. } = m else {
        panic!("not a tool result: {m:?}")
    };
    match content.as_slice() {
        [arbor_actors::ToolResultPart::Json { value }] => value.clone(),
        other => panic!("unexpected result content {other:?}"),
    }
}

fn error_text(m: &Message) -> String {
    assert!(is_error(m), "not an error result: {m:?}");
    result_value(m)["errorMessage"].as_str().unwrap().to_owned()
}

fn lead() -> AgentTemplate {
    AgentTemplate::new("lead", "m").system_prompt("lead sys")
}
