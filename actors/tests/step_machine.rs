//! The step machine driven by hand, with no runtime: model replies, tool results
//! and child reports are fed in, and the actions and state it produces are
//! checked against semantics §4–§7. Every model request it builds must pair.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arbor_actors::event::EventKind;
use arbor_actors::handler::{FnHandler, FnProgram, Resume, Yield};
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
use arbor_actors::tool::{Tool, ToolContext, ToolError, ToolOutput};
use arbor_actors::toolbox::Toolbox;
use arbor_actors::{Action, Catalog, StepMachine};
use serde_json::{Value, json};

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

fn catalog(templates: Vec<AgentTemplate>) -> Cat {
    Cat(templates
        .into_iter()
        .map(|t| (t.id.clone(), Arc::new(t)))
        .collect())
}

/// An external tool; the machine never runs it (the actor does).
struct Echo;

#[async_trait::async_trait]
impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Echoes its input."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    }
    async fn call(&self, input: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(input.into())
    }
}

fn toolbox(template: &AgentTemplate) -> Arc<Toolbox> {
    Arc::new(
        Toolbox::build(template, |name| {
            (name == "echo").then(|| Arc::new(Echo) as Arc<dyn Tool>)
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
            agent_id: "agent-p".into(),
            agent_type: Some(template.id.clone()),
            run_id: "run-p".into(),
            ancestor_run_ids: vec!["run-root".into()],
            message_history: history.into_iter().collect(),
            system_prompt: template.system_prompt.clone(),
            tool_definitions: tb.definitions().clone(),
            steps_remaining: template.max_steps,
            ..AgentState::default()
        };
        let m = StepMachine::new(state, template, tb, 0, Arc::from("tree-1"));
        Run {
            m,
            cat: catalog(others),
        }
    }

    fn with_input(self, prompt: Option<&str>, params: Option<Value>) -> Self {
        Run {
            m: self.m.with_input(prompt.map(str::to_owned), params),
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
        input,
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
        Action::SpawnAgents { .. } => "SpawnAgents",
        Action::SpawnInline { .. } => "SpawnInline",
        Action::Finish => "Finish",
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
    (step, index, children)
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

// --------------------------------------------------------- the plain loop

#[test]
fn a_reply_without_tool_calls_completes_the_run() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m").system_prompt("be brief"));
    let req = request(run.start());
    assert_eq!(&*req.system_prompt, "be brief");
    assert_eq!(values(&req.messages.to_vec()), vec![Message::user("task")]);
    assert!(req.tools.contains_key("set_output") && req.tools.contains_key("end_turn"));
    assert_eq!(
        (
            req.meta.step,
            req.meta.run_id.as_str(),
            req.meta.agent_type.as_str(),
            req.meta.depth
        ),
        (1, "run-p", "solo", 1)
    );
    assert_eq!(&*req.meta.tree_id, "tree-1");
    finish(run.reply(Message::assistant_text("hi")));
    let s = run.state();
    assert_eq!(s.status, AgentStatus::Completed);
    assert_eq!(
        run.history(),
        vec![Message::user("task"), Message::assistant_text("hi")]
    );
    assert_eq!(s.steps_remaining, 19);
    assert_eq!(s.context_token_count, 120);
    assert_eq!((s.direct_credits_used, s.credits_used), (0.5, 0.5));
    assert_eq!(
        run.m.output_value(),
        json!({"type": "lastMessage", "value": [{"role": "assistant", "content": "hi"}]})
    );
    let events: Vec<&str> = run.m.take_events().iter().map(EventKind::name).collect();
    assert_eq!(events, ["stepStarted", "modelResponded"]);
}

#[test]
fn without_provider_usage_the_context_size_is_estimated() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    let reply = Message::assistant_text("hello there");
    let expected = Message::user("task").estimated_tokens() + reply.estimated_tokens();
    finish(run.reply_with(reply, Usage::default()));
    assert_eq!(run.state().context_token_count, expected);
}

#[test]
fn each_step_costs_one_and_the_step_limit_fails_the_run() {
    let mut t = AgentTemplate::new("solo", "m").max_steps(2);
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    assert_eq!(run.state().steps_remaining, 1);
    let req = request(run.reply(calls("s1", &[add_user("more")])));
    assert_eq!(req.meta.step, 2);
    assert_eq!(run.state().steps_remaining, 0);
    finish(run.reply(calls("s2", &[add_user("again")])));
    let s = run.state();
    assert_eq!(s.status, AgentStatus::Failed);
    let error = s.error_message().unwrap();
    assert!(error.contains("max_steps"), "{error}");
    assert!(error.contains("2 step(s)"), "{error}");
    let value = run.m.output_value();
    assert_eq!(value["type"], "error");
    assert!(value["message"].as_str().unwrap().contains("max_steps"));
    // Everything the run did is kept.
    assert_eq!(run.history().len(), 7);
    assert_eq!(run.m.step(), 2);
}

#[test]
fn a_run_with_no_steps_left_fails_without_calling_the_model() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m").max_steps(0));
    finish(run.start());
    assert_eq!(run.state().status, AgentStatus::Failed);
    assert!(run.state().error_message().unwrap().contains("max_steps"));
    assert_eq!(run.m.step(), 0);
}

#[test]
fn tool_results_follow_the_call_order_whatever_order_they_finish_in() {
    let mut t = AgentTemplate::new("worker", "m");
    t.tools = vec!["echo".into(), "add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    let actions = run.reply(calls(
        "s1",
        &[
            ("echo", json!({"n": 1})),
            ("echo", json!({"n": 2})),
            add_user("note"),
        ],
    ));
    let tools: Vec<(u32, usize, Value)> = actions
        .iter()
        .map(|a| match a {
            Action::RunTool {
                step,
                index,
                tool,
                input,
                ..
            } => {
                assert_eq!(tool.name(), "echo");
                (*step, *index, input.clone())
            }
            other => panic!("unexpected {}", kind(other)),
        })
        .collect();
    assert_eq!(
        tools,
        vec![(1, 0, json!({"n": 1})), (1, 1, json!({"n": 2}))]
    );
    // The second finishes first; nothing moves until both have.
    assert!(
        run.m
            .tool_done(1, 1, Ok(json!("two").into()), &run.cat)
            .is_empty()
    );
    assert!(
        run.m
            .tool_done(1, 1, Ok(json!("late duplicate").into()), &run.cat)
            .is_empty()
    );
    assert!(
        run.m
            .tool_done(7, 0, Ok(json!("wrong step").into()), &run.cat)
            .is_empty()
    );
    let req = request(run.m.tool_done(1, 0, Err("disk full".into()), &run.cat));
    let h = run.history();
    assert_eq!(h.len(), 6, "{h:?}");
    assert_eq!(h[2].answers(), Some("s1-0"));
    assert_eq!(error_text(&h[2]), "disk full");
    assert_eq!(h[3].answers(), Some("s1-1"));
    assert_eq!(result_value(&h[3]), json!("two"));
    assert_eq!(h[4].answers(), Some("s1-2"));
    // add_message's message comes after all of the step's results.
    assert_eq!(h[5], Message::user("note"));
    assert_eq!(values(&req.messages.to_vec()), h);
}

#[test]
fn an_unknown_tool_is_an_error_result_the_model_sees() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    run.m.take_events();
    let req = request(run.reply(calls("s1", &[("grep", json!({"q": "x"}))])));
    let last = req.messages.last().unwrap();
    assert_eq!(last.answers(), Some("s1-0"));
    let error = error_text(last);
    assert!(error.contains("Tool grep not found"), "{error}");
    assert!(
        error.contains("end_turn"),
        "lists the available tools: {error}"
    );
    let called = run
        .m
        .take_events()
        .into_iter()
        .find_map(|e| match e {
            EventKind::ToolCalled { tool, error, .. } => Some((tool, error)),
            _ => None,
        })
        .unwrap();
    assert_eq!(called.0, "grep");
    assert!(called.1.unwrap().contains("grep"));
    assert_eq!(run.state().status, AgentStatus::Running);
}

#[test]
fn arguments_that_are_not_json_are_an_error_result() {
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    let req = request(run.reply(Message::assistant(
        None,
        vec![
            call(
                "bad",
                "add_message",
                Value::String("{\"role\": \"user\", ".into()),
            ),
            call(
                "good",
                "add_message",
                Value::String(r#"{"role":"user","content":"raw"}"#.into()),
            ),
        ],
    )));
    let h = run.history();
    let error = error_text(&h[2]);
    assert!(
        error.contains("add_message") && error.contains("not valid JSON"),
        "{error}"
    );
    // Arguments sent as a JSON string are parsed.
    assert!(!is_error(&h[3]));
    assert_eq!(h[4], Message::user("raw"));
    assert_eq!(values(&req.messages.to_vec()), h);
}

#[test]
fn arguments_that_fail_the_schema_are_an_error_result_naming_the_path() {
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["add_message".into(), "echo".into()];
    let mut run = Run::solo(t);
    request(run.start());
    let req = request(run.reply(calls(
        "s1",
        &[
            ("add_message", json!({"role": "robot", "content": "x"})),
            ("echo", json!({"n": "three"})),
        ],
    )));
    let h = run.history();
    let e0 = error_text(&h[2]);
    assert!(
        e0.contains("Invalid input for add_message") && e0.contains("/role"),
        "{e0}"
    );
    let e1 = error_text(&h[3]);
    assert!(
        e1.contains("Invalid input for echo") && e1.contains("/n"),
        "{e1}"
    );
    // Nothing was added and no tool was run.
    assert_eq!(h.len(), 4);
    assert_eq!(req.messages.len(), 4);
}

#[test]
fn set_messages_with_a_bad_message_changes_nothing_but_reports_the_error() {
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["set_messages".into()];
    let mut run = Run::solo(t);
    request(run.start());
    let req = request(run.reply(calls(
        "s1",
        &[(
            "set_messages",
            json!({"messages": [{"role": "user", "content": "fine"}, {"role": "robot", "content": "x"}]}),
        )],
    )));
    let h = run.history();
    assert_eq!(h.len(), 3);
    assert_eq!(h[0], Message::user("task"));
    let error = error_text(&h[2]);
    assert!(error.contains("messages[1]"), "{error}");
    assert_eq!(values(&req.messages.to_vec()), h);
}

#[test]
fn set_messages_replaces_the_history_with_pairing_repaired() {
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["set_messages".into()];
    let mut run = Run::solo(t);
    request(run.start());
    let new = json!([
        {"role": "user", "content": "fresh start"},
        {"role": "assistant", "content": [
            {"type": "tool-call", "toolCallId": "X", "toolName": "echo", "input": {}}
        ]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "looking"},
            {"type": "tool-call", "toolCallId": "Y", "toolName": "echo", "input": {}}
        ]},
        {"role": "tool", "toolCallId": "Y", "toolName": "echo",
         "content": [{"type": "json", "value": 1}]},
        {"role": "tool", "toolCallId": "Z", "toolName": "echo",
         "content": [{"type": "json", "value": 2}]}
    ]);
    let req = request(run.reply(calls("s1", &[("set_messages", json!({"messages": new}))])));
    let expected: Vec<Message> = serde_json::from_value(json!([
        {"role": "user", "content": "fresh start"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "looking"},
            {"type": "tool-call", "toolCallId": "Y", "toolName": "echo", "input": {}}
        ]},
        {"role": "tool", "toolCallId": "Y", "toolName": "echo",
         "content": [{"type": "json", "value": 1}]}
    ]))
    .unwrap();
    assert_eq!(run.history(), expected);
    assert_eq!(values(&req.messages.to_vec()), expected);
}

fn scored() -> AgentTemplate {
    let mut t = AgentTemplate::new("scorer", "m").output_mode(OutputMode::StructuredOutput);
    t.tools = vec!["add_message".into()];
    t.output_schema = Some(
        Schema::compile(json!({
            "type": "object",
            "properties": {"score": {"type": "number"}},
            "required": ["score"]
        }))
        .unwrap(),
    );
    t
}

#[test]
fn set_output_checks_the_output_schema() {
    let mut run = Run::solo(scored());
    request(run.start());
    // A good object is taken (and add_message keeps the turn going).
    request(run.reply(calls(
        "s1",
        &[("set_output", json!({"score": 1})), add_user("check")],
    )));
    assert_eq!(run.state().output, Some(json!({"score": 1})));
    assert!(!is_error(&run.history()[2]));
    // A bad one is an error naming the path; the output stays as it was, and the
    // turn goes on so the model reads the error (it was the step's only call).
    let next = request(run.reply(calls("s2", &[("set_output", json!({"score": "high"}))])));
    assert!(is_error(next.messages.last().unwrap()));
    let last = run.history().last().cloned().unwrap();
    let error = error_text(&last);
    assert!(error.contains("/score"), "{error}");
    assert_eq!(run.state().output, Some(json!({"score": 1})));
    finish(run.reply(Message::assistant_text("done")));
    assert_eq!(
        run.m.output_value(),
        json!({"type": "structuredOutput", "value": {"score": 1}})
    );
}

#[test]
fn a_bad_first_output_leaves_no_output() {
    let mut run = Run::solo(scored());
    request(run.start());
    request(run.reply(calls("s1", &[("set_output", json!({"total": 3}))])));
    assert_eq!(run.state().output, None);
    assert!(error_text(run.history().last().unwrap()).contains("score"));
    finish(run.reply(Message::assistant_text("giving up")));
    assert_eq!(
        run.m.output_value(),
        json!({"type": "structuredOutput", "value": null})
    );
}

#[test]
fn end_turn_ends_the_turn_after_the_step() {
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    finish(run.reply(calls(
        "s1",
        &[add_user("last words"), ("end_turn", json!({}))],
    )));
    assert_eq!(run.state().status, AgentStatus::Completed);
    let h = run.history();
    assert_eq!(h.len(), 5);
    assert_eq!(h[4], Message::user("last words"));
}

#[test]
fn a_reply_of_only_set_output_or_end_turn_ends_the_turn() {
    for list in [
        vec![("set_output", json!({"done": true}))],
        vec![
            ("set_output", json!({"done": true})),
            ("end_turn", json!({})),
        ],
        vec![("end_turn", Value::Null)],
    ] {
        let mut run = Run::solo(AgentTemplate::new("solo", "m"));
        request(run.start());
        finish(run.reply(calls("s1", &list)));
        assert_eq!(run.state().status, AgentStatus::Completed, "{list:?}");
        assert_eq!(run.m.step(), 1);
    }
    // Any other call keeps the turn going.
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    request(run.reply(calls("s1", &[("set_output", json!({})), add_user("x")])));
    assert_eq!(run.state().status, AgentStatus::Running);
}

#[test]
fn stale_replies_and_events_after_the_end_are_ignored() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    let stale = ModelResponse {
        message: Message::assistant_text("from step 9"),
        usage: USAGE,
    };
    assert!(run.m.model_replied(9, stale, &run.cat).is_empty());
    assert_eq!(run.history().len(), 1);
    finish(run.reply(Message::assistant_text("done")));
    assert!(run.reply(Message::assistant_text("again")).is_empty());
    assert!(run.m.fail("too late").is_empty());
    assert!(run.m.cancel().is_empty());
    assert_eq!(run.state().status, AgentStatus::Completed);
    assert_eq!(run.history().len(), 2);
}

#[test]
fn cancel_keeps_the_history_it_had() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    finish(run.m.cancel());
    assert_eq!(run.state().status, AgentStatus::Cancelled);
    assert_eq!(run.history(), vec![Message::user("task")]);
    assert_eq!(
        run.m.output_value(),
        json!({"type": "error", "message": "Agent was cancelled"})
    );
}

#[test]
fn a_broken_stored_history_is_repaired_in_the_request_and_reported() {
    let mut run = Run::new(
        AgentTemplate::new("solo", "m"),
        Vec::new(),
        vec![
            Message::user("task"),
            Message::assistant(Some("hm".into()), vec![call("lost", "echo", json!({}))]),
            Message::tool_result(&call("ghost", "echo", json!({})), json!(1)),
        ],
    );
    let req = request(run.start());
    assert_eq!(
        values(&req.messages.to_vec()),
        vec![
            Message::user("task"),
            Message::assistant(Some("hm".into()), vec![])
        ]
    );
    // The stored history is not changed by building the request.
    assert_eq!(run.history().len(), 3);
    let repaired = run
        .m
        .take_events()
        .into_iter()
        .find_map(|e| match e {
            EventKind::HistoryRepaired {
                unanswered_calls,
                orphan_results,
            } => Some((unanswered_calls, orphan_results)),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        repaired,
        (vec!["lost".to_owned()], vec!["ghost".to_owned()])
    );
}

#[test]
fn call_ids_reused_by_the_model_across_steps_still_pair() {
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    let same = |text: &str| {
        Message::assistant(
            None,
            vec![call(
                "dup",
                "add_message",
                json!({"role": "user", "content": text}),
            )],
        )
    };
    request(run.reply(same("one")));
    let req = request(run.reply(same("two")));
    // Both exchanges reach the model: two calls, two results, two notes.
    let results = req
        .messages
        .iter()
        .filter(|m| m.answers().is_some())
        .count();
    let calls_seen = req
        .messages
        .iter()
        .map(|m| m.tool_calls().count())
        .sum::<usize>();
    assert_eq!((calls_seen, results, req.messages.len()), (2, 2, 7));
    // Within one reply, repeated and empty ids are made unique too.
    let req = request(run.reply(Message::assistant(
        None,
        vec![
            call("x", "add_message", json!({"role": "user", "content": "a"})),
            call("x", "add_message", json!({"role": "user", "content": "b"})),
            call("", "add_message", json!({"role": "user", "content": "c"})),
        ],
    )));
    assert_eq!(
        req.messages
            .iter()
            .filter(|m| m.answers().is_some())
            .count(),
        5
    );
}

// ------------------------------------------------------------------ spawning

fn spawning_catalog() -> Vec<AgentTemplate> {
    let mut strict = AgentTemplate::new("strict", "m");
    strict.input_schema.params = Some(
        Schema::compile(
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
        )
        .unwrap(),
    );
    let mut historian = AgentTemplate::new("historian", "m")
        .system_prompt("historian sys")
        .max_steps(7)
        .output_mode(OutputMode::AllMessages);
    historian.include_message_history = true;
    let mut clone = AgentTemplate::new("clone", "m").system_prompt("clone sys");
    clone.inherit_parent_system_prompt = true;
    vec![
        AgentTemplate::new("acme/researcher@1.0.0", "m").system_prompt("researcher sys"),
        AgentTemplate::new("writer", "m").system_prompt("writer sys"),
        AgentTemplate::new("planner", "m"),
        AgentTemplate::new("helper", "m").output_mode(OutputMode::LastMessage),
        strict,
        historian,
        clone,
    ]
}

fn spawner() -> AgentTemplate {
    let mut t = lead().spawns(&[
        "acme/researcher@1.0.0",
        "writer",
        "strict",
        "historian",
        "clone",
        "helper",
    ]);
    t.tools = vec!["add_message".into()];
    t
}

fn spawn_run(history: Vec<Message>) -> Run {
    Run::new(spawner(), spawning_catalog(), history)
}

fn spawn_reply(id: &str, agents: Value) -> Message {
    Message::assistant(
        Some("delegating".into()),
        vec![call(id, "spawn_agents", json!({"agents": agents}))],
    )
}

#[test]
fn spawn_agents_plans_children_in_request_order_with_permission_checks() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let (step, index, children) = run.spawn_reply_action(json!([
        {"agent_type": "researcher", "prompt": "r"},
        {"agent_type": "planner"},
        {"agent_type": "ghost"},
        {"agent_type": "writer", "prompt": "w", "params": {"k": 1}},
        {"agent_type": "acme/researcher@1.0.0"},
        {"agent_type": "acme/researcher@2.0.0"},
        {"agent_type": "strict", "params": {"n": "x"}},
        {"agent_type": "acme/researcher"}
    ]));
    assert_eq!((step, index), (1, 0));
    let outcome: Vec<Outcome> = children
        .iter()
        .map(|c| match c {
            Ok(plan) => {
                assert!(!plan.inline);
                Ok((plan.agent_type.clone(), plan.prompt.clone()))
            }
            Err(e) => Err(e.clone()),
        })
        .collect();
    let ok = |t: &str, p: Option<&str>| Ok((t.to_owned(), p.map(str::to_owned)));
    let err = |t: &str, e: &str| Err((t.to_owned(), e.to_owned()));
    assert_eq!(
        outcome[..6].to_vec(),
        vec![
            ok("acme/researcher@1.0.0", Some("r")),
            err(
                "planner",
                "Agent type lead is not allowed to spawn child agent type planner"
            ),
            err("ghost", "Agent type ghost not found"),
            ok("writer", Some("w")),
            ok("acme/researcher@1.0.0", None),
            err(
                "acme/researcher@2.0.0",
                "Agent type acme/researcher@2.0.0 not found"
            ),
        ]
    );
    let Err((t, e)) = &outcome[6] else {
        panic!("strict child should be refused: {:?}", outcome[6])
    };
    assert_eq!(t, "strict");
    assert!(
        e.starts_with("Invalid params for agent strict: at /n"),
        "{e}"
    );
    assert_eq!(outcome[7], ok("acme/researcher@1.0.0", None));
    let writer = children[3].as_ref().unwrap();
    assert_eq!(writer.params, Some(json!({"k": 1})));
    assert_eq!(&*writer.template.system_prompt, "writer sys");
}

impl Run {
    fn spawn_reply_action(&mut self, agents: Value) -> Spawn {
        let step = self.m.step();
        spawn_children(self.reply(spawn_reply(&format!("spawn-{step}"), agents)))
    }
}

#[test]
fn siblings_share_one_filtered_snapshot_without_the_spawn_call() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let (_, _, children) = run.spawn_reply_action(json!([
        {"agent_type": "writer"}, {"agent_type": "historian"}
    ]));
    let plans: Vec<&ChildPlan> = children.iter().map(|c| c.as_ref().unwrap()).collect();
    // The parent's history is [task, A(text, spawn call)]: the call is unanswered.
    let parent = &run.state().message_history;
    assert_eq!(parent.len(), 2);
    for plan in &plans {
        assert_eq!(
            hvalues(&plan.snapshot),
            vec![
                Message::user("task"),
                Message::assistant(Some("delegating".into()), vec![])
            ]
        );
        assert!(Arc::ptr_eq(
            plan.snapshot.get(0).unwrap(),
            parent.get(0).unwrap()
        ));
    }
    assert!(
        plans[0]
            .snapshot
            .iter()
            .zip(plans[1].snapshot.iter())
            .all(|(a, b)| Arc::ptr_eq(a, b))
    );
}

#[test]
fn spawn_results_come_back_as_one_array_in_request_order() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let credits_before = run.state().credits_used;
    let (step, index, _) = run.spawn_reply_action(json!([
        {"agent_type": "writer", "prompt": "a"},
        {"agent_type": "ghost"},
        {"agent_type": "researcher", "prompt": "b"},
        {"agent_type": "writer", "prompt": "c"}
    ]));
    let report =
        |agent_type: &str, id: &str, runs: &[&str], status, value: Value, credits| ChildReport {
            agent_type: agent_type.into(),
            agent_name: AgentTypeId::parse(agent_type).name.into(),
            agent_id: id.into(),
            run_ids: runs.iter().map(|r| (*r).to_owned()).collect(),
            status,
            value,
            credits,
            history: None,
        };
    let reports = vec![
        report(
            "writer",
            "ag-1",
            &["run-1"],
            AgentStatus::Completed,
            json!({"type": "lastMessage", "value": []}),
            1.0,
        ),
        ChildReport::refused("ghost", "Agent type ghost not found"),
        // A failed child that was retried: both attempts are on record, both paid.
        report(
            "acme/researcher@1.0.0",
            "ag-3",
            &["run-3a", "run-3b"],
            AgentStatus::Failed,
            json!({"errorMessage": "model exploded"}),
            0.25,
        ),
        report(
            "writer",
            "ag-4",
            &["run-4"],
            AgentStatus::Completed,
            json!({"type": "structuredOutput", "value": {"x": 1}}),
            2.0,
        ),
    ];
    let req = request(run.m.spawn_done(step, index, reports, &run.cat));
    let h = run.history();
    assert_eq!(h.len(), 3, "only the one result is added: {h:?}");
    assert_eq!(h[2].answers(), Some("spawn-1"));
    assert!(!is_error(&h[2]));
    assert_eq!(
        result_value(&h[2]),
        json!([
            {"agentName": "writer", "agentType": "writer", "agentId": "ag-1", "runId": "run-1",
             "value": {"type": "lastMessage", "value": []}},
            {"agentName": "ghost", "agentType": "ghost", "agentId": "", "runId": null,
             "value": {"errorMessage": "Agent type ghost not found"}},
            {"agentName": "researcher", "agentType": "acme/researcher@1.0.0", "agentId": "ag-3",
             "runId": "run-3b", "value": {"errorMessage": "model exploded"}},
            {"agentName": "writer", "agentType": "writer", "agentId": "ag-4", "runId": "run-4",
             "value": {"type": "structuredOutput", "value": {"x": 1}}}
        ])
    );
    let s = run.state();
    assert_eq!(s.child_run_ids, ["run-1", "run-3a", "run-3b", "run-4"]);
    assert_eq!(s.credits_used, credits_before + 0.5 + 3.25);
    assert_eq!(s.direct_credits_used, 0.5);
    // A failed child never fails the parent.
    assert_eq!(s.status, AgentStatus::Running);
    assert_eq!(values(&req.messages.to_vec()), h);
    // A second delivery for the same call is ignored.
    assert!(
        run.m
            .spawn_done(step, index, Vec::new(), &run.cat)
            .is_empty()
    );
    assert_eq!(run.state().child_run_ids.len(), 4);
}

fn start_child(run: &Run, plan: &ChildPlan, n: u32) -> ChildStart {
    let own = toolbox(&plan.template);
    plan.start_from(
        &ParentInfo::of(run.state(), run.m.toolbox()),
        RunIds {
            agent_id: format!("agent-c{n}"),
            run_id: format!("run-c{n}"),
        },
        own,
    )
}

/// A parent with a finished exchange, a dangling call and a turn-scoped note.
fn rich_parent() -> Run {
    let old = call(
        "old",
        "add_message",
        json!({"role": "user", "content": "x"}),
    );
    spawn_run(vec![
        Message::user("task").with_tag(SPAWN_PROMPT),
        Message::assistant(None, vec![old.clone()]),
        Message::tool_result(&old, json!({"ok": true})),
        Message::assistant(
            Some("thinking".into()),
            vec![call("dangling", "echo", json!({}))],
        ),
        Message::user("remember this turn").with_ttl(TimeToLive::UserPrompt),
    ])
}

#[test]
fn a_child_starts_from_its_parent_as_the_spec_says() {
    let mut run = rich_parent();
    request(run.start());
    let (_, _, children) = run.spawn_reply_action(json!([
        {"agent_type": "historian", "prompt": "dig", "params": {"depth": 2}},
        {"agent_type": "writer", "prompt": "write"},
        {"agent_type": "clone"}
    ]));
    let plans: Vec<&ChildPlan> = children.iter().map(|c| c.as_ref().unwrap()).collect();
    let parent = run.state().clone();
    assert!(parent.context_token_count > 0);

    // With includeMessageHistory: the filtered history, the spawn notice, the prompt.
    let c = start_child(&run, plans[0], 1);
    let s = &c.state;
    assert_eq!(
        (s.agent_id.as_str(), s.run_id.as_str()),
        ("agent-c1", "run-c1")
    );
    assert_eq!(s.parent_id.as_deref(), Some("agent-p"));
    assert_eq!(s.agent_type.as_deref(), Some("historian"));
    assert_eq!(s.ancestor_run_ids, ["run-root", "run-p"]);
    assert!(s.child_run_ids.is_empty());
    assert_eq!(s.steps_remaining, 7);
    assert_eq!((s.credits_used, s.direct_credits_used), (0.0, 0.0));
    assert_eq!(s.context_token_count, parent.context_token_count);
    assert_eq!(s.status, AgentStatus::Running);
    assert_eq!(s.output, None);
    assert_eq!(&*s.system_prompt, "historian sys");
    let h = hvalues(&s.message_history);
    let filtered = hvalues(&parent.message_history.filter_unfinished_tool_calls());
    assert_eq!(
        filtered.len(),
        6,
        "the spawn call and the dangling call are gone"
    );
    assert_eq!(
        filtered
            .iter()
            .map(|m| m.tool_calls().count())
            .sum::<usize>(),
        1
    );
    assert_eq!(h[..6], filtered[..]);
    assert!(h[6].has_tag(SUBAGENT_SPAWN));
    assert!(matches!(h[6], Message::User { .. }));
    assert!(h[6].text().contains("historian"), "{}", h[6].text());
    assert!(h[7].has_tag(SPAWN_PROMPT));
    assert_eq!(
        h[7],
        Message::User {
            content: Content::Parts(vec![
                Part::Text { text: "dig".into() },
                Part::Text {
                    text: "Params: {\"depth\":2}".into()
                }
            ]),
            meta: h[7].meta().clone(),
        }
    );
    assert_eq!(h.len(), 8);
    assert_eq!(c.inherited, 8);
    // Inherited bodies are shared with the parent, not copied.
    assert!(Arc::ptr_eq(
        s.message_history.get(0).unwrap(),
        parent.message_history.get(0).unwrap()
    ));

    // Without it: only the prompt.
    let c = start_child(&run, plans[1], 2);
    assert_eq!(
        hvalues(&c.state.message_history),
        vec![Message::user("write").with_tag(SPAWN_PROMPT)]
    );
    assert_eq!(c.inherited, 1);
    assert_eq!(&*c.state.system_prompt, "writer sys");
    assert_eq!(c.state.steps_remaining, 20);
    assert!(!c.state.tool_definitions.contains_key("spawn_agents"));

    // inheritParentSystemPrompt: the parent's system prompt and tools.
    let c = start_child(&run, plans[2], 3);
    assert_eq!(&*c.state.system_prompt, "lead sys");
    assert!(Arc::ptr_eq(
        &c.state.tool_definitions,
        &parent.tool_definitions
    ));
    assert!(Arc::ptr_eq(&c.toolbox, run.m.toolbox()));
    assert!(c.state.message_history.is_empty(), "no prompt, no history");
}

/// Runs a child machine from its start state until it finishes.
fn child_machine(plan: &ChildPlan, start: ChildStart) -> Run {
    let m = StepMachine::new(
        start.state,
        plan.template.clone(),
        start.toolbox,
        start.inherited,
        Arc::from("tree-1"),
    )
    .with_input(plan.prompt.clone(), plan.params.clone());
    Run {
        m,
        cat: catalog(Vec::new()),
    }
}

#[test]
fn all_messages_output_drops_exactly_the_inherited_prefix() {
    let mut run = rich_parent();
    request(run.start());
    let (_, _, children) =
        run.spawn_reply_action(json!([{"agent_type": "historian", "prompt": "dig"}]));
    let plan = children[0].as_ref().unwrap();
    let start = start_child(&run, plan, 1);
    let inherited = start.inherited;
    let mut child = child_machine(plan, start);
    let req = request(child.start());
    assert_eq!(req.messages.len(), inherited);
    request(child.reply(Message::assistant(
        Some("noting".into()),
        vec![call("n1", "end_turn_not", json!({}))],
    )));
    finish(child.reply(Message::assistant_text("found it")));
    let value = child.m.output_value();
    assert_eq!(value["type"], "allMessages");
    let added: Vec<Message> = serde_json::from_value(value["value"].clone()).unwrap();
    assert_eq!(added.len(), 3, "{added:?}");
    assert_eq!(added[0].tool_calls().next().unwrap().tool_call_id, "n1");
    assert_eq!(added[1].answers(), Some("n1"));
    assert_eq!(added[2], Message::assistant_text("found it"));
}

#[test]
fn inline_spawn_hands_the_history_over_and_takes_it_back() {
    let mut run = spawn_run(vec![Message::user("task").with_tag(SPAWN_PROMPT)]);
    request(run.start());
    let actions = run.reply(Message::assistant(
        None,
        vec![call(
            "in-1",
            "spawn_agent_inline",
            json!({"agent_type": "helper", "prompt": "do it"}),
        )],
    ));
    let (step, index, plan) = inline_child(actions);
    assert!(plan.inline);
    assert_eq!(plan.agent_type, "helper");
    let start = start_child(&run, &plan, 1);
    // An inline child starts from the filtered history, then its prompt.
    let initial = hvalues(&start.state.message_history);
    assert_eq!(
        initial,
        vec![
            Message::user("task").with_tag(SPAWN_PROMPT),
            Message::user("do it").with_tag(SPAWN_PROMPT),
        ]
    );
    let mut final_history = start.state.message_history.clone();
    final_history.push(Message::assistant_text("working"));
    final_history.push(Message::user("scratch").with_ttl(TimeToLive::UserPrompt));
    final_history.push(Message::assistant_text("done"));
    let report = ChildReport {
        agent_type: "helper".into(),
        agent_name: "helper".into(),
        agent_id: "agent-c1".into(),
        run_ids: vec!["run-c1".into()],
        status: AgentStatus::Completed,
        value: json!({"type": "lastMessage", "value": []}),
        credits: 2.0,
        history: Some(final_history),
    };
    let before = run.state().credits_used;
    let req = request(run.m.inline_done(step, index, report, &run.cat));
    // The parent's history is the child's, minus the child's prompt and expired messages.
    let expected = vec![
        Message::user("task").with_tag(SPAWN_PROMPT),
        Message::assistant_text("working"),
        Message::assistant_text("done"),
    ];
    assert_eq!(run.history(), expected);
    assert_eq!(values(&req.messages.to_vec()), expected);
    assert_eq!(run.state().child_run_ids, ["run-c1"]);
    assert_eq!(run.state().credits_used, before + 2.0);
}

#[test]
fn inline_spawn_alongside_other_calls_keeps_their_results() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let actions = run.reply(Message::assistant(
        None,
        vec![
            call(
                "in-1",
                "spawn_agent_inline",
                json!({"agent_type": "helper"}),
            ),
            call("g-1", "grep", json!({})),
            call(
                "in-2",
                "spawn_agent_inline",
                json!({"agent_type": "helper"}),
            ),
        ],
    ));
    let (step, index, plan) = inline_child(actions);
    assert_eq!(index, 0);
    let mut final_history = plan.snapshot.clone();
    final_history.push(Message::assistant_text("merged"));
    let report = ChildReport {
        agent_type: "helper".into(),
        agent_name: "helper".into(),
        agent_id: "agent-c1".into(),
        run_ids: vec!["run-c1".into()],
        status: AgentStatus::Completed,
        value: json!({}),
        credits: 0.0,
        history: Some(final_history),
    };
    let req = request(run.m.inline_done(step, index, report, &run.cat));
    let h = run.history();
    assert_eq!(h[0], Message::user("task"));
    assert_eq!(h[1], Message::assistant_text("merged"));
    let ids: Vec<&str> = h[2].tool_calls().map(|c| c.tool_call_id.as_str()).collect();
    assert_eq!(ids, ["g-1", "in-2"]);
    assert!(error_text(&h[3]).contains("grep"));
    assert!(error_text(&h[4]).contains("Only one spawn_agent_inline"));
    assert_eq!(h.len(), 5);
    assert_eq!(values(&req.messages.to_vec()), h);
}

#[test]
fn a_failed_inline_child_is_an_error_result_and_the_history_stays() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let (step, index, plan) = inline_child(run.reply(Message::assistant(
        None,
        vec![call(
            "in-1",
            "spawn_agent_inline",
            json!({"agent_type": "helper"}),
        )],
    )));
    let mut child_history = plan.snapshot.clone();
    child_history.push(Message::assistant_text("half done"));
    let report = ChildReport {
        agent_type: "helper".into(),
        agent_name: "helper".into(),
        agent_id: "agent-c1".into(),
        run_ids: vec!["run-c1".into()],
        status: AgentStatus::Failed,
        value: json!({"errorMessage": "it broke"}),
        credits: 0.75,
        history: Some(child_history),
    };
    let before = run.state().credits_used;
    request(run.m.inline_done(step, index, report, &run.cat));
    let h = run.history();
    assert_eq!(h.len(), 3);
    assert_eq!(h[0], Message::user("task"));
    assert_eq!(h[1].tool_calls().next().unwrap().tool_call_id, "in-1");
    assert_eq!(error_text(&h[2]), "it broke");
    assert_eq!(run.state().child_run_ids, ["run-c1"]);
    assert_eq!(run.state().credits_used, before + 0.75);
    assert_eq!(run.state().status, AgentStatus::Running);
}

#[test]
fn spawn_errors_before_any_child_starts_are_error_results() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let req = request(run.reply(Message::assistant(
        None,
        vec![
            call("a", "spawn_agents", json!({"agents": []})),
            call("b", "spawn_agent_inline", json!({"agent_type": "planner"})),
        ],
    )));
    let h = run.history();
    assert!(error_text(&h[2]).contains("Invalid input for spawn_agents"));
    assert_eq!(
        error_text(&h[3]),
        "Agent type lead is not allowed to spawn child agent type planner"
    );
    assert_eq!(values(&req.messages.to_vec()), h);
}

// ------------------------------------------------------ programmatic agents

#[test]
fn a_program_yields_tool_calls_then_lets_the_model_finish_the_turn() {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let handler = FnHandler(move || {
        let log = log.clone();
        let mut stage = 0;
        FnProgram(move |resume: Resume<'_>| {
            stage += 1;
            let mut log = log.lock().unwrap();
            match resume {
                Resume::Start {
                    prompt,
                    params,
                    state,
                } => {
                    log.push(format!(
                        "start {prompt:?} {} {}",
                        params.unwrap(),
                        state.steps_remaining
                    ));
                    Yield::ToolCalls(vec![
                        (
                            "add_message".into(),
                            json!({"role": "user", "content": "from program"}),
                        ),
                        ("grep".into(), json!({})),
                        ("set_output".into(), json!({"phase": 1})),
                    ])
                }
                Resume::ToolResults { results, state } => {
                    for r in &results {
                        log.push(format!(
                            "result {} error={}",
                            r.answers().unwrap(),
                            r.has_tag(TOOL_CALL_ERROR)
                        ));
                    }
                    log.push(format!("output {}", state.output.clone().unwrap()));
                    Yield::StepAll
                }
                Resume::StepsDone { turn_ended, .. } => {
                    log.push(format!("steps done {turn_ended} at stage {stage}"));
                    Yield::Done
                }
            }
        })
    });
    let mut t = AgentTemplate::new("prog", "m")
        .max_steps(5)
        .handler(Arc::new(handler));
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t).with_input(Some("go"), Some(json!({"k": 1})));
    let req = request(run.start());
    // The tool batch cost one step, the model step another.
    assert_eq!(req.meta.step, 2);
    assert_eq!(run.state().steps_remaining, 3);
    let h = run.history();
    assert_eq!(h.len(), 6, "{h:?}");
    let ids: Vec<&str> = h[1].tool_calls().map(|c| c.tool_call_id.as_str()).collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(h[5], Message::user("from program"));
    assert_eq!(values(&req.messages.to_vec()), h);
    finish(run.reply(Message::assistant_text("model done")));
    assert_eq!(run.state().status, AgentStatus::Completed);
    assert_eq!(run.state().output, Some(json!({"phase": 1})));
    let log = seen.lock().unwrap().clone();
    assert_eq!(
        log,
        vec![
            "start Some(\"go\") {\"k\":1} 5".to_owned(),
            format!("result {} error=false", ids[0]),
            format!("result {} error=true", ids[1]),
            format!("result {} error=false", ids[2]),
            "output {\"phase\":1}".to_owned(),
            "steps done true at stage 3".to_owned(),
        ]
    );
}

#[test]
fn a_program_is_held_to_the_step_limit() {
    // (A tool that does not end the turn: an `end_turn` now ends it.)
    let handler = FnHandler(|| {
        FnProgram(|_: Resume<'_>| Yield::ToolCalls(vec![("no_such_tool".into(), json!({}))]))
    });
    let mut run = Run::solo(
        AgentTemplate::new("prog", "m")
            .max_steps(3)
            .handler(Arc::new(handler)),
    );
    finish(run.start());
    assert_eq!(run.state().status, AgentStatus::Failed);
    assert!(run.state().error_message().unwrap().contains("max_steps"));
    assert_eq!(run.m.step(), 3);
    // Three batches, each an assistant message and its result.
    assert_eq!(run.history().len(), 7);
}

#[test]
fn a_program_that_takes_single_steps_sees_each_one() {
    let turns: Arc<Mutex<Vec<bool>>> = Arc::default();
    let log = turns.clone();
    let handler = FnHandler(move || {
        let log = log.clone();
        FnProgram(move |resume: Resume<'_>| match resume {
            Resume::Start { .. } => Yield::Step,
            Resume::StepsDone { turn_ended, .. } => {
                log.lock().unwrap().push(turn_ended);
                if turn_ended { Yield::Done } else { Yield::Step }
            }
            Resume::ToolResults { .. } => Yield::Done,
        })
    });
    let mut t = AgentTemplate::new("prog", "m").handler(Arc::new(handler));
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    // A step with a non-ending call hands control back to the program.
    request(run.reply(calls("s1", &[add_user("n")])));
    finish(run.reply(Message::assistant_text("ok")));
    assert_eq!(*turns.lock().unwrap(), vec![false, true]);
    assert_eq!(run.state().status, AgentStatus::Completed);
}

#[test]
fn program_call_ids_never_collide_with_inherited_ones() {
    // A programmatic child that inherited a program's history: its own first
    // batch must not reuse an id already in the history.
    let inherited = call(
        "prog-1-0",
        "add_message",
        json!({"role": "user", "content": "old"}),
    );
    let handler = FnHandler(|| {
        FnProgram(|resume: Resume<'_>| match resume {
            Resume::Start { .. } => Yield::ToolCalls(vec![(
                "add_message".into(),
                json!({"role": "user", "content": "new"}),
            )]),
            Resume::ToolResults { .. } => Yield::StepAll,
            Resume::StepsDone { .. } => Yield::Done,
        })
    });
    let mut t = AgentTemplate::new("prog", "m").handler(Arc::new(handler));
    t.tools = vec!["add_message".into()];
    let mut run = Run::new(
        t,
        Vec::new(),
        vec![
            Message::assistant(None, vec![inherited.clone()]),
            Message::tool_result(&inherited, json!({"ok": true})),
            Message::user("old"),
        ],
    );
    let req = request(run.start());
    assert_eq!(
        req.messages
            .iter()
            .filter(|m| m.answers().is_some())
            .count(),
        2
    );
    assert_eq!(req.messages.len(), 6);
}

// ------------------------------------------------------------ checkpoints (durable runs)

fn checkpoints(events: &[EventKind]) -> Vec<Arc<arbor_actors::Checkpoint>> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::Checkpointed { checkpoint } => Some(checkpoint.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_durable_run_checkpoints_every_step_boundary_but_the_first() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    run.m.set_checkpointing(true);
    request(run.start());
    assert!(
        checkpoints(&run.m.take_events()).is_empty(),
        "none before step 1"
    );
    let second = request(run.reply(calls("a", &[add_user("more")])));
    let events = run.m.take_events();
    let cps = checkpoints(&events);
    assert_eq!(cps.len(), 1);
    assert_eq!(cps[0].step, 1);
    // Taken before the step began: the state the next request is built from.
    assert_eq!(
        cps[0].state.steps_remaining,
        run.state().steps_remaining + 1
    );
    assert_eq!(
        hvalues(&cps[0].state.message_history),
        run.history(),
        "the history the second request was built from"
    );
    // The raw reply is recorded, and it is the very message the history holds.
    let reply = events.iter().find_map(|e| match e {
        EventKind::ModelResponded { reply, .. } => reply.clone(),
        _ => None,
    });
    let reply = reply.expect("a durable run records its replies");
    assert!(Arc::ptr_eq(
        &reply,
        run.state().message_history.get(1).unwrap()
    ));

    // Going on from the checkpoint asks the model the same thing again.
    let template = run.m.template().clone();
    let toolbox = run.m.toolbox().clone();
    let mut resumed = StepMachine::from_checkpoint(&cps[0], template, toolbox, Arc::from("tree-1"));
    let again = request(resumed.start(&run.cat));
    assert_eq!(again.meta.step, 2);
    assert_eq!(
        values(&again.messages.to_vec()),
        values(&second.messages.to_vec())
    );
    assert_eq!(resumed.state().steps_remaining, run.state().steps_remaining);
}

#[test]
fn a_run_that_is_not_durable_emits_no_checkpoint_and_keeps_no_reply() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    request(run.reply(calls("a", &[add_user("more")])));
    let events = run.m.take_events();
    assert!(checkpoints(&events).is_empty());
    assert!(
        events
            .iter()
            .all(|e| !matches!(e, EventKind::ModelResponded { reply: Some(_), .. }))
    );
}

#[test]
fn one_invalid_spawn_agents_entry_is_refused_alone_and_the_valid_ones_run() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let (_, _, children) = run.spawn_reply_action(json!([
        {"agent_type": ""},
        {"agent_type": "writer", "prompt": "go"},
        {"prompt": "no type"},
        {"agent_type": "historian", "prompt": 7}
    ]));
    assert_eq!(children.len(), 4);
    let Err((t, e)) = &children[0] else {
        panic!(
            "an empty agent_type should be refused: {:?}",
            children[0].is_ok()
        )
    };
    assert_eq!(t, "");
    assert!(
        e.starts_with("Invalid input for spawn_agents: agents[0]"),
        "{e}"
    );
    assert_eq!(children[1].as_ref().unwrap().agent_type, "writer");
    assert!(matches!(&children[2], Err((t, e)) if t.is_empty() && e.contains("agents[2]")));
    assert!(matches!(&children[3], Err((t, e)) if t == "historian" && e.contains("agents[3]")));
}

#[test]
fn a_program_that_yields_end_turn_is_not_resumed_for_later_yields() {
    let resumed = Arc::new(std::sync::Mutex::new(0));
    let seen = resumed.clone();
    let handler = FnHandler(move || {
        let seen = seen.clone();
        FnProgram(move |resume: Resume<'_>| match resume {
            Resume::Start { .. } => Yield::ToolCalls(vec![("end_turn".into(), json!({}))]),
            _ => {
                *seen.lock().unwrap() += 1;
                Yield::ToolCalls(vec![(
                    "add_message".into(),
                    json!({"role": "user", "content": "after the end"}),
                )])
            }
        })
    });
    let mut t = AgentTemplate::new("prog", "m").handler(Arc::new(handler));
    t.tools = vec!["add_message".into()];
    let mut run = Run::new(t, Vec::new(), Vec::new());
    finish(run.start());
    assert_eq!(run.state().status, AgentStatus::Completed);
    assert_eq!(
        *resumed.lock().unwrap(),
        0,
        "the program ran after its end_turn"
    );
    let shown = serde_json::to_string(&run.state().message_history).unwrap();
    assert!(!shown.contains("after the end"), "{shown}");
}
