//! Approvals (semantics §12): a step whose call needs a person's decision
//! holds all its calls until every such call is decided.

use super::*;
use arbor_actors::approval::{DecideRefused, Decision};

/// A worker with `echo` and `add_message`, whose `echo` calls need approval.
fn guarded() -> Run {
    let mut t = AgentTemplate::new("worker", "m");
    t.tools = vec!["echo".into(), "add_message".into()];
    let mut run = Run::solo(t.clone());
    let template = Arc::new(t);
    let tb = Arc::new(toolbox(&template).with_approval(|names| names.contains(&"echo")));
    let state = run.m.state().clone();
    run.m = StepMachine::new(state, template, tb, 0, "tree-1".parse().unwrap());
    run
}

fn requested(events: &[EventKind]) -> Vec<(String, String, Value)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::ApprovalRequested {
                tool_call_id,
                tool,
                input,
                ..
            } => Some((tool_call_id.clone(), tool.clone(), input.clone())),
            _ => None,
        })
        .collect()
}

fn run_tools(actions: &[Action]) -> Vec<(usize, Value)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::RunTool { index, input, .. } => Some((*index, input.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_call_that_needs_approval_holds_its_whole_step_until_it_is_decided() {
    let mut run = guarded();
    request(run.start());
    run.m.take_events();
    let actions = run.reply(calls(
        "s1",
        &[("echo", json!({"n": 1})), ("echo", json!({"n": 2}))],
    ));
    assert_eq!(kinds(&actions), ["AwaitApproval"], "nothing runs yet");
    let asked = requested(&run.m.take_events());
    assert_eq!(
        asked,
        [
            ("s1-0".to_owned(), "echo".to_owned(), json!({"n": 1})),
            ("s1-1".to_owned(), "echo".to_owned(), json!({"n": 2}))
        ]
    );
    assert_eq!(run.m.awaiting_approval().len(), 2);
    // The first decision lets nothing go; the last lets the step's calls run.
    let first = run
        .m
        .decide("s1-0", Decision::Approve { input: None }, &run.cat)
        .unwrap();
    assert!(first.is_empty());
    let edited = json!({"n": 20});
    let last = run
        .m
        .decide(
            "s1-1",
            Decision::Approve {
                input: Some(edited.clone()),
            },
            &run.cat,
        )
        .unwrap();
    assert_eq!(run_tools(&last), [(0, json!({"n": 1})), (1, edited)]);
    let decided = run
        .m
        .take_events()
        .iter()
        .filter(|e| matches!(e, EventKind::ApprovalDecided { .. }))
        .count();
    assert_eq!(decided, 2, "every decision is journaled");
}

#[test]
fn a_denied_call_answers_the_model_with_the_reason_and_the_step_goes_on() {
    let mut run = guarded();
    request(run.start());
    let actions = run.reply(calls("s1", &[("echo", json!({"n": 1})), add_user("note")]));
    assert_eq!(kinds(&actions), ["AwaitApproval"]);
    let next = run
        .m
        .decide(
            "s1-0",
            Decision::Deny {
                reason: "not on prod".into(),
            },
            &run.cat,
        )
        .unwrap();
    // No tool left to run: the step commits and the next one begins.
    let req = request(next);
    let sent = values(&req.messages.to_vec());
    let denied = sent
        .iter()
        .find(|m| is_error(m))
        .expect("the denied call's result");
    assert_eq!(
        result_value(denied)["errorMessage"],
        "The user denied this tool call: not on prod"
    );
}

#[test]
fn a_decision_for_no_waiting_call_or_with_an_input_the_tool_refuses_is_refused() {
    let mut run = guarded();
    request(run.start());
    run.reply(calls("s1", &[("echo", json!({"n": 1}))]));
    assert_eq!(
        run.m
            .decide("nope", Decision::Approve { input: None }, &run.cat)
            .err(),
        Some(DecideRefused::NotPending("nope".into()))
    );
    let bad = run.m.decide(
        "s1-0",
        Decision::Approve {
            input: Some(json!({"n": "one"})),
        },
        &run.cat,
    );
    let bad = bad.err();
    assert!(
        matches!(bad, Some(DecideRefused::InvalidInput(_))),
        "{bad:?}"
    );
    // Still waiting: a valid decision then goes through.
    let ok = run
        .m
        .decide("s1-0", Decision::Approve { input: None }, &run.cat)
        .unwrap();
    assert_eq!(run_tools(&ok), [(0, json!({"n": 1}))]);
    assert_eq!(
        run.m
            .decide("s1-0", Decision::Approve { input: None }, &run.cat)
            .err(),
        Some(DecideRefused::NotPending("s1-0".into())),
        "decided once"
    );
}

#[test]
fn a_recorded_decision_is_taken_without_asking_again_after_a_restart() {
    let mut run = guarded();
    run.m.recover_decisions(
        [(
            "s1-0".to_owned(),
            Decision::Approve {
                input: Some(json!({"n": 5})),
            },
        )]
        .into(),
    );
    request(run.start());
    run.m.take_events();
    let actions = run.reply(calls("s1", &[("echo", json!({"n": 1}))]));
    assert_eq!(run_tools(&actions), [(0, json!({"n": 5}))]);
    let events = run.m.take_events();
    assert!(requested(&events).is_empty(), "not asked again");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, EventKind::ApprovalDecided { .. })),
        "not journaled twice"
    );
}

#[test]
fn a_tool_without_approval_runs_at_once() {
    let mut run = Run::solo({
        let mut t = AgentTemplate::new("worker", "m");
        t.tools = vec!["echo".into()];
        t
    });
    request(run.start());
    let actions = run.reply(calls("s1", &[("echo", json!({"n": 1}))]));
    assert_eq!(kinds(&actions), ["RunTool"]);
}

/// The test catalog, with the tree's "always allow" rules.
struct Allowing<'a>(&'a Cat, &'a [&'a str]);

impl Catalog for Allowing<'_> {
    fn template(&self, id: &str) -> Option<Arc<AgentTemplate>> {
        self.0.template(id)
    }

    fn knows_agent(&self, requested: &str) -> bool {
        self.0.knows_agent(requested)
    }

    fn always_allowed(&self, tool: &str) -> bool {
        self.1.contains(&tool)
    }
}

#[test]
fn a_call_of_a_tool_allowed_for_good_in_the_tree_runs_without_asking() {
    let mut run = guarded();
    request(run.start());
    run.m.take_events();
    let step = run.m.step();
    let allowing = Allowing(&run.cat, &["echo"]);
    let reply = calls(
        "s1",
        &[("echo", json!({"n": 1})), ("echo", json!({"n": 2}))],
    );
    let actions = run.m.model_replied(
        step,
        ModelResponse {
            message: reply,
            usage: USAGE,
        },
        &allowing,
    );
    assert_eq!(
        run_tools(&actions),
        [(0, json!({"n": 1})), (1, json!({"n": 2}))],
        "both run as the model asked"
    );
    assert!(
        requested(&run.m.take_events()).is_empty(),
        "nobody is asked"
    );
    assert!(run.m.awaiting_approval().is_empty());
}

#[test]
fn a_decision_recorded_before_a_tool_was_allowed_for_good_still_applies() {
    let mut run = guarded();
    run.m.recover_decisions(
        [(
            "s1-0".to_owned(),
            Decision::Deny {
                reason: "not on prod".into(),
            },
        )]
        .into(),
    );
    request(run.start());
    run.m.take_events();
    let step = run.m.step();
    let allowing = Allowing(&run.cat, &["echo"]);
    let reply = calls(
        "s1",
        &[("echo", json!({"n": 1})), ("echo", json!({"n": 2}))],
    );
    let actions = run.m.model_replied(
        step,
        ModelResponse {
            message: reply,
            usage: USAGE,
        },
        &allowing,
    );
    assert_eq!(
        run_tools(&actions),
        [(1, json!({"n": 2}))],
        "the denied call stays denied; the other runs by the rule"
    );
    assert!(requested(&run.m.take_events()).is_empty());
}
