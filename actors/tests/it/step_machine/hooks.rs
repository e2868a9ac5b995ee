//! `PreToolUse` hooks in the step machine: a step whose calls have hooks
//! holds them until the hooks decided; each call is then refused, rewritten,
//! allowed without asking, or asked for, and the verdict is journaled (and
//! taken from the journal on resume).

use super::*;
use arbor_actors::HookRequest;
use arbor_actors::approval::Decision;
use arbor_actors::lifecycle::{HookEvent, Permission, Verdict};

/// The test catalog, with `PreToolUse` hooks on `echo`.
struct Hooked<'a>(&'a Cat);

impl Catalog for Hooked<'_> {
    fn template(&self, id: &str) -> Option<Arc<AgentTemplate>> {
        self.0.template(id)
    }
    fn knows_agent(&self, requested: &str) -> bool {
        self.0.knows_agent(requested)
    }
    fn hooks_before(&self, tool: &str, _agent_type: &str) -> bool {
        tool == "echo"
    }
}

/// A worker with `echo` and `add_message`; `approval` says whether its
/// template asks a person before `echo` runs.
fn worker(approval: bool) -> Run {
    let mut t = AgentTemplate::new("worker", "m");
    t.tools = vec!["echo".into(), "add_message".into()];
    let mut run = Run::solo(t.clone());
    let template = Arc::new(t);
    let tb = Arc::new(
        toolbox(&template).with_approval(move |names| approval && names.contains(&"echo")),
    );
    let state = run.m.state().clone();
    run.m = StepMachine::new(state, template, tb, 0, "tree-1".parse().unwrap());
    run
}

fn reply(run: &mut Run, message: Message) -> Vec<Action> {
    let step = run.m.step();
    let cat = Hooked(&run.cat);
    run.m.model_replied(
        step,
        ModelResponse {
            message,
            usage: USAGE,
        },
        &cat,
    )
}

fn hook_requests(actions: &[Action]) -> Vec<HookRequest> {
    match actions {
        [Action::RunHooks { calls, .. }] => calls.clone(),
        other => panic!("expected one RunHooks, got {:?}", kinds(other)),
    }
}

fn decided(events: &[EventKind]) -> Vec<(String, Verdict)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::HookDecided {
                tool_call_id,
                hook: HookEvent::PreToolUse,
                verdict,
                ..
            } => Some((tool_call_id.clone(), verdict.clone())),
            _ => None,
        })
        .collect()
}

fn deny(why: &str) -> Verdict {
    Verdict {
        block: Some(why.into()),
        permission: Some(Permission::Deny),
        ..Verdict::default()
    }
}

#[test]
fn a_hooked_call_waits_for_its_hooks_and_a_refused_one_never_runs() {
    let mut run = worker(false);
    request(run.start());
    run.m.take_events();
    let actions = reply(
        &mut run,
        calls(
            "s1",
            &[
                ("echo", json!({"n": 1})),
                ("echo", json!({"n": 2})),
                add_user("hi"),
            ],
        ),
    );
    let asked = hook_requests(&actions);
    assert_eq!(
        asked
            .iter()
            .map(|r| (r.index, r.tool.as_str()))
            .collect::<Vec<_>>(),
        [(0, "echo"), (1, "echo")]
    );
    assert_eq!(asked[1].input, json!({"n": 2}));
    let step = run.m.step();
    let cat = Hooked(&run.cat);
    let actions = run.m.hooks_done(
        step,
        vec![(0, deny("no echo of 1")), (1, Verdict::default())],
        &cat,
    );
    // Only the call the hooks let through runs.
    let runs: Vec<usize> = actions
        .iter()
        .filter_map(|a| match a {
            Action::RunTool { index, .. } => Some(*index),
            _ => None,
        })
        .collect();
    assert_eq!(runs, [1]);
    let journaled = decided(&run.m.take_events());
    assert_eq!(journaled.len(), 2);
    assert_eq!(journaled[0], ("s1-0".to_owned(), deny("no echo of 1")));
    let next = run
        .m
        .tool_done(step, 1, Ok(json!("echoed").into()), &run.cat);
    let req = request(next);
    let refused = req
        .messages
        .iter()
        .map(|m| format!("{m:?}"))
        .find(|m| m.contains("s1-0") && m.contains("refused"))
        .expect("the refused call has a result");
    assert!(
        refused.contains("a hook refused this call: no echo of 1"),
        "{refused}"
    );
}

#[test]
fn a_hook_rewrites_the_input_that_runs_and_its_context_joins_the_result() {
    let mut run = worker(false);
    request(run.start());
    let actions = reply(&mut run, calls("s1", &[("echo", json!({"n": 1}))]));
    hook_requests(&actions);
    let step = run.m.step();
    let verdict = Verdict {
        permission: Some(Permission::Allow),
        updated_input: Some(json!({"n": 100})),
        context: vec!["rewritten by policy".into()],
        ..Verdict::default()
    };
    let cat = Hooked(&run.cat);
    let actions = run.m.hooks_done(step, vec![(0, verdict)], &cat);
    match &actions[..] {
        [Action::RunTool { input, .. }] => assert_eq!(input, &json!({"n": 100})),
        other => panic!("{:?}", kinds(other)),
    }
    let req = request(run.m.tool_done(step, 0, Ok(json!("done").into()), &run.cat));
    let text = format!("{:?}", req.messages.last());
    assert!(text.contains("rewritten by policy"), "{text}");
    // A rewrite that breaks the tool's schema is refused, not run.
    let actions = reply(&mut run, calls("s2", &[("echo", json!({"n": 2}))]));
    hook_requests(&actions);
    let bad = Verdict {
        updated_input: Some(json!({"n": "two"})),
        ..Verdict::default()
    };
    let step = run.m.step();
    let cat = Hooked(&run.cat);
    let actions = run.m.hooks_done(step, vec![(0, bad)], &cat);
    let req = request(actions);
    let text = format!("{:?}", req.messages.last());
    assert!(text.contains("the new input is invalid"), "{text}");
}

#[test]
fn allow_skips_the_templates_approval_and_ask_asks_a_person_for_an_unguarded_tool() {
    // The template asks before echo: a hook's allow runs it unasked.
    let mut run = worker(true);
    request(run.start());
    let actions = reply(&mut run, calls("s1", &[("echo", json!({"n": 1}))]));
    hook_requests(&actions);
    let allow = Verdict {
        permission: Some(Permission::Allow),
        ..Verdict::default()
    };
    let step = run.m.step();
    let cat = Hooked(&run.cat);
    let actions = run.m.hooks_done(step, vec![(0, allow)], &cat);
    assert_eq!(kinds(&actions), ["RunTool"]);
    // The template does not ask: a hook's ask makes it an approval.
    let mut run = worker(false);
    request(run.start());
    run.m.take_events();
    let actions = reply(&mut run, calls("s1", &[("echo", json!({"n": 1}))]));
    hook_requests(&actions);
    let ask = Verdict {
        permission: Some(Permission::Ask),
        reason: Some("touches production".into()),
        ..Verdict::default()
    };
    let step = run.m.step();
    let cat = Hooked(&run.cat);
    let actions = run.m.hooks_done(step, vec![(0, ask)], &cat);
    assert_eq!(kinds(&actions), ["AwaitApproval"]);
    assert!(run.m.take_events().iter().any(
        |e| matches!(e, EventKind::ApprovalRequested { tool_call_id, .. } if tool_call_id == "s1-0")
    ));
    let actions = run
        .m
        .decide("s1-0", Decision::Approve { input: None }, &run.cat)
        .expect("decided");
    assert_eq!(kinds(&actions), ["RunTool"]);
}

#[test]
fn a_resumed_run_takes_the_recorded_verdict_and_runs_no_hook_again() {
    let mut run = worker(false);
    let mut recorded = HashMap::new();
    recorded.insert("s1-0".to_owned(), deny("recorded before the crash"));
    run.m.recover_hook_verdicts(recorded);
    request(run.start());
    run.m.take_events();
    let actions = reply(
        &mut run,
        calls(
            "s1",
            &[("echo", json!({"n": 1})), ("echo", json!({"n": 2}))],
        ),
    );
    // Only the call without a recorded verdict goes to the hooks.
    let asked = hook_requests(&actions);
    assert_eq!(asked.iter().map(|r| r.index).collect::<Vec<_>>(), [1]);
    let step = run.m.step();
    let cat = Hooked(&run.cat);
    let actions = run.m.hooks_done(step, Vec::new(), &cat);
    assert_eq!(kinds(&actions), ["RunTool"]);
    // The recorded one is not journaled again; the new one is.
    let journaled = decided(&run.m.take_events());
    assert_eq!(
        journaled
            .iter()
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>(),
        ["s1-1"]
    );
}

/// The test catalog, with `Stop` and `SubagentStop` hooks on every agent.
struct Stopping<'a>(&'a Cat);

impl Catalog for Stopping<'_> {
    fn template(&self, id: &str) -> Option<Arc<AgentTemplate>> {
        self.0.template(id)
    }
    fn knows_agent(&self, requested: &str) -> bool {
        self.0.knows_agent(requested)
    }
    fn hooks_at(&self, event: HookEvent, _agent_type: &str) -> bool {
        matches!(event, HookEvent::Stop | HookEvent::SubagentStop)
    }
}

#[test]
fn a_stop_hook_that_blocks_keeps_the_agent_going_with_its_reason_and_then_lets_it_end() {
    let mut run = worker(false);
    request(run.start());
    run.m.take_events();
    // A root's end runs Stop hooks, a child's SubagentStop ones.
    let expected = if run.state().parent_id.is_none() {
        HookEvent::Stop
    } else {
        HookEvent::SubagentStop
    };
    let step = run.m.step();
    let cat = Stopping(&run.cat);
    let actions = run.m.model_replied(
        step,
        ModelResponse {
            message: Message::assistant(Some("I edited it.".into()), vec![]),
            usage: USAGE,
        },
        &cat,
    );
    match &actions[..] {
        [
            Action::RunStopHooks {
                active,
                last_message,
                event,
                ..
            },
        ] => {
            assert!(!active);
            assert_eq!(last_message, "I edited it.");
            assert_eq!(*event, expected);
        }
        other => panic!("{:?}", kinds(other)),
    }
    let block = Verdict {
        block: Some("Run the tests first.".into()),
        ..Verdict::default()
    };
    let req = request(run.m.stop_hooks_done(step, block));
    let last = format!("{:?}", req.messages.last());
    assert!(last.contains("Run the tests first."), "{last}");
    assert!(
        run.m
            .take_events()
            .iter()
            .any(|e| matches!(e, EventKind::HookDecided { hook, tool_call_id, .. } if *hook == expected && *tool_call_id == format!("stop@{step}")))
    );
    // The next end asks again, now with stop_hook_active; a verdict that
    // does not block ends the turn.
    let step = run.m.step();
    let actions = run.m.model_replied(
        step,
        ModelResponse {
            message: Message::assistant(Some("Tests pass.".into()), vec![]),
            usage: USAGE,
        },
        &Stopping(&run.cat),
    );
    match &actions[..] {
        [Action::RunStopHooks { active, .. }] => assert!(*active),
        other => panic!("{:?}", kinds(other)),
    }
    finish(run.m.stop_hooks_done(step, Verdict::default()));
    assert_eq!(run.state().status, AgentStatus::Completed);
    // A verdict for another step is ignored.
    assert!(
        run.m
            .stop_hooks_done(step + 7, Verdict::default())
            .is_empty()
    );
}

/// A steer that arrives while the stop hooks run is answered, not lost:
/// the turn goes on for it instead of ending.
#[test]
fn a_steer_that_arrives_while_the_stop_hooks_run_is_answered_before_the_turn_ends() {
    let mut run = worker(false);
    request(run.start());
    let step = run.m.step();
    let cat = Stopping(&run.cat);
    let actions = run.m.model_replied(
        step,
        ModelResponse {
            message: Message::assistant(Some("Done here.".into()), vec![]),
            usage: USAGE,
        },
        &cat,
    );
    assert_eq!(kinds(&actions), ["RunStopHooks"]);
    run.m.steer("Also update the changelog.").expect("taken");
    let req = request(run.m.stop_hooks_done(step, Verdict::default()));
    let last = format!("{:?}", req.messages.last());
    assert!(last.contains("Also update the changelog."), "{last}");
    assert_ne!(run.state().status, AgentStatus::Completed);
}

/// The test catalog: `PreToolUse` hooks on `echo`, which a person allowed
/// for good in the tree.
struct AllowedForGood<'a>(&'a Cat);

impl Catalog for AllowedForGood<'_> {
    fn template(&self, id: &str) -> Option<Arc<AgentTemplate>> {
        self.0.template(id)
    }
    fn knows_agent(&self, requested: &str) -> bool {
        self.0.knows_agent(requested)
    }
    fn always_allowed(&self, tool: &str) -> bool {
        tool == "echo"
    }
    fn hooks_before(&self, tool: &str, _agent_type: &str) -> bool {
        tool == "echo"
    }
}

/// A hook's ask is asked of a person even when the tool is allowed for
/// good: the hook saw something the rule did not (an `rm -rf`).
#[test]
fn a_hooks_ask_is_asked_even_of_a_tool_allowed_for_good() {
    let mut run = worker(true);
    request(run.start());
    run.m.take_events();
    let step = run.m.step();
    let cat = AllowedForGood(&run.cat);
    let actions = run.m.model_replied(
        step,
        ModelResponse {
            message: calls(
                "s1",
                &[("echo", json!({"n": 1})), ("echo", json!({"n": 2}))],
            ),
            usage: USAGE,
        },
        &cat,
    );
    hook_requests(&actions);
    let ask = Verdict {
        permission: Some(Permission::Ask),
        ..Verdict::default()
    };
    // The first call the hook asks about waits; the second, allowed for
    // good and not asked about by the hook, would run unasked.
    let actions = run
        .m
        .hooks_done(step, vec![(0, ask), (1, Verdict::default())], &cat);
    assert_eq!(kinds(&actions), ["AwaitApproval"]);
    let asked: Vec<String> = run
        .m
        .take_events()
        .iter()
        .filter_map(|e| match e {
            EventKind::ApprovalRequested { tool_call_id, .. } => Some(tool_call_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(asked, ["s1-0"]);
}

/// A catalog with start hooks (`UserPromptSubmit`, `SubagentStart`).
struct Starting<'a>(&'a Cat);

impl Catalog for Starting<'_> {
    fn template(&self, id: &str) -> Option<Arc<AgentTemplate>> {
        self.0.template(id)
    }
    fn knows_agent(&self, requested: &str) -> bool {
        self.0.knows_agent(requested)
    }
    fn hooks_at(&self, event: HookEvent, _agent_type: &str) -> bool {
        matches!(
            event,
            HookEvent::UserPromptSubmit | HookEvent::SubagentStart
        )
    }
}

fn start_hooks(run: &mut Run) -> HookEvent {
    let cat = Starting(&run.cat);
    match &run.m.start(&cat)[..] {
        [Action::RunStartHooks { event, prompt }] => {
            assert_eq!(prompt, "task");
            *event
        }
        other => panic!("expected RunStartHooks, got {:?}", kinds(other)),
    }
}

#[test]
fn a_start_hooks_context_joins_the_history_before_the_first_model_call() {
    let mut run = worker(false);
    let event = start_hooks(&mut run);
    let cat = Starting(&run.cat);
    let verdict = Verdict {
        context: vec!["Current branch: main".into()],
        ..Verdict::default()
    };
    let req = request(run.m.start_hooks_done(verdict.clone(), &cat));
    let last = req.messages.last().unwrap();
    assert_eq!(last.text(), "Current branch: main");
    assert!(last.has_tag("HOOK_CONTEXT"));
    // Journaled under start@0, so a restart takes it instead of running
    // the hooks again; a second answer does nothing.
    assert!(run.m.take_events().iter().any(|e| matches!(e,
        EventKind::HookDecided { tool_call_id, hook, verdict: v, .. }
            if tool_call_id == "start@0" && *hook == event && *v == verdict)));
    assert!(run.m.start_hooks_done(Verdict::default(), &cat).is_empty());
}

/// `worker`'s machine as a tree's root (no parent).
fn root_worker() -> Run {
    let mut run = worker(false);
    let mut state = run.m.state().clone();
    state.parent_id = None;
    state.ancestor_run_ids = Default::default();
    let template = run.m.template().clone();
    let tb = toolbox(&template);
    run.m = StepMachine::new(state, template, tb, 0, "tree-1".parse().unwrap());
    run
}

#[test]
fn a_prompt_hook_that_blocks_fails_the_run_before_any_model_call() {
    let block = || Verdict {
        block: Some("Security policy violation".into()),
        ..Verdict::default()
    };
    let mut root = root_worker();
    assert_eq!(start_hooks(&mut root), HookEvent::UserPromptSubmit);
    let cat = Starting(&root.cat);
    let actions = root.m.start_hooks_done(block(), &cat);
    assert!(!kinds(&actions).contains(&"CallModel"));
    assert_eq!(root.state().status, AgentStatus::Failed);
    assert_eq!(
        root.state().error_kind,
        Some(arbor_actors::FailureKind::Blocked)
    );
    // Claude Code's SubagentStart cannot block: the child goes on.
    let mut child = worker(false);
    assert_eq!(start_hooks(&mut child), HookEvent::SubagentStart);
    let cat = Starting(&child.cat);
    request(child.m.start_hooks_done(block(), &cat));
    assert_eq!(child.state().status, AgentStatus::Running);
}

#[test]
fn a_recorded_start_verdict_is_taken_without_running_the_hooks_again() {
    let mut run = worker(false);
    let verdict = Verdict {
        context: vec!["recorded".into()],
        ..Verdict::default()
    };
    run.m
        .recover_hook_verdicts(HashMap::from([("start@0".to_owned(), verdict)]));
    let cat = Starting(&run.cat);
    let req = request(run.m.start(&cat));
    assert_eq!(req.messages.last().unwrap().text(), "recorded");
}

#[test]
fn continue_false_from_a_pre_tool_use_hook_stops_the_agent_and_no_call_runs() {
    let mut run = worker(false);
    request(run.start());
    // Two calls of the step: the hooks stop at the first; the second, which
    // they allowed, does not run either.
    let actions = reply(
        &mut run,
        calls(
            "s1",
            &[("echo", json!({"n": 1})), ("echo", json!({"n": 2}))],
        ),
    );
    let requests = hook_requests(&actions);
    assert_eq!(requests.len(), 2);
    let cat = Hooked(&run.cat);
    let stop = Verdict {
        stop: Some("Build is broken; stop here.".into()),
        ..Verdict::default()
    };
    let step = run.m.step();
    let actions = run.m.hooks_done(
        step,
        vec![
            (requests[0].index, stop),
            (requests[1].index, Verdict::default()),
        ],
        &cat,
    );
    assert!(
        !kinds(&actions).contains(&"RunTool"),
        "{:?}",
        kinds(&actions)
    );
    assert_eq!(run.state().status, AgentStatus::Failed);
    assert_eq!(
        run.state().error_kind,
        Some(arbor_actors::FailureKind::Blocked)
    );
    let output = run.state().output.clone().unwrap_or_default().to_string();
    assert!(output.contains("Build is broken; stop here."), "{output}");
}

#[test]
fn a_run_resumed_after_a_stop_hook_kept_it_going_tells_the_next_stop_hook_it_is_active() {
    let mut run = worker(false);
    // The history a checkpoint holds after a stop hook blocked once.
    let mut state = run.m.state().clone();
    state
        .message_history
        .push(Message::user("You have not said DONE").with_tag(arbor_actors::STOP_HOOK));
    let template = run.m.template().clone();
    run.m = StepMachine::new(
        state,
        template.clone(),
        toolbox(&template),
        0,
        "tree-1".parse().unwrap(),
    );
    request(run.start());
    let step = run.m.step();
    let cat = Stopping(&run.cat);
    let actions = run.m.model_replied(
        step,
        ModelResponse {
            message: Message::assistant(Some("DONE".into()), vec![]),
            usage: USAGE,
        },
        &cat,
    );
    match &actions[..] {
        [Action::RunStopHooks { active, .. }] => assert!(*active),
        other => panic!("expected RunStopHooks, got {:?}", kinds(other)),
    }
}
