//! Durable programs (issue 37): a program's yields and its tools' results
//! journaled, and a run started again from them served its recorded
//! results, given back what its program drew, and held to its yields.

use super::*;
use arbor_actors::durable::{ProgramRecord, RecordedYield};
use arbor_actors::handler::StepProgram;

/// Two `echo` calls (`n` = 1, then `n` = `second`), then the end; it draws
/// a seed on its way to its first yield, and logs what it is given back.
struct Twice {
    second: i64,
    stage: u32,
    redrawn: Arc<Mutex<Vec<Value>>>,
}

impl StepProgram for Twice {
    fn resume(&mut self, _: Resume<'_>) -> Yield {
        self.stage += 1;
        match self.stage {
            1 => Yield::Calls(vec![ProgramCall::new("echo", json!({"n": 1}))]),
            2 => Yield::Calls(vec![ProgramCall::new("echo", json!({"n": self.second}))]),
            _ => Yield::Done,
        }
    }

    fn drawn(&mut self) -> Option<Value> {
        (self.stage == 1).then(|| json!({"seed": 7}))
    }

    fn redraw(&mut self, drawn: Value) {
        self.redrawn.lock().unwrap().push(drawn);
    }
}

fn twice(second: i64, redrawn: Arc<Mutex<Vec<Value>>>) -> Run {
    let handler = FnHandler(move || Twice {
        second,
        stage: 0,
        redrawn: redrawn.clone(),
    });
    let mut t = AgentTemplate::new("prog", "m")
        .max_steps(5)
        .handler(Arc::new(handler));
    t.tools = vec!["echo".into()];
    Run::solo(t)
}

/// The inputs of the `RunTool` actions among `actions`.
fn tool_inputs(actions: &[Action]) -> Vec<Value> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::RunTool { input, .. } => Some(input.clone()),
            _ => None,
        })
        .collect()
}

/// What a store reads back of a run's events.
fn record_of(events: &[EventKind]) -> ProgramRecord {
    let mut record = ProgramRecord::default();
    for e in events {
        match e {
            EventKind::ProgramYielded {
                index,
                yielded,
                drawn,
            } => record.push_yield(RecordedYield {
                index: *index,
                yielded: yielded.clone(),
                drawn: drawn.clone(),
            }),
            EventKind::ToolCalled {
                tool_call_id,
                result: Some(result),
                ..
            } => {
                record.results.insert(tool_call_id.clone(), result.clone());
            }
            _ => {}
        }
    }
    record
}

#[test]
fn a_durable_program_journals_each_yield_what_it_drew_and_its_tools_results() {
    let mut run = twice(2, Arc::default());
    run.m.set_checkpointing(true);
    assert_eq!(tool_inputs(&run.start()), [json!({"n": 1})]);
    let second = run.m.tool_done(1, 0, Ok(json!("one").into()), &run.cat);
    assert_eq!(tool_inputs(&second), [json!({"n": 2})]);
    let events = run.m.take_events();
    let record = record_of(&events);
    assert_eq!(
        record.yields,
        vec![
            RecordedYield {
                index: 1,
                yielded: json!({"toolName": "echo", "input": {"n": 1}}),
                drawn: Some(json!({"seed": 7})),
            },
            RecordedYield {
                index: 2,
                yielded: json!({"toolName": "echo", "input": {"n": 2}}),
                drawn: None,
            },
        ]
    );
    let ids: Vec<&String> = record.results.keys().collect();
    assert_eq!(ids, ["prog-1-0"]);
    assert!(record.results["prog-1-0"].text().contains("one"));
    // Not journaled where nothing can resume it.
    let mut plain = twice(2, Arc::default());
    plain.start();
    plain.m.tool_done(1, 0, Ok(json!("one").into()), &plain.cat);
    let events = plain.m.take_events();
    assert!(
        !events.iter().any(|e| matches!(
            e,
            EventKind::ProgramYielded { .. }
                | EventKind::ToolCalled {
                    result: Some(_),
                    ..
                }
        )),
        "{events:?}"
    );
}

#[test]
fn a_resumed_program_is_served_its_recorded_results_and_draws_again_what_it_drew() {
    // The first life: yield 1's tool ran, yield 2's was cut short.
    let mut first = twice(2, Arc::default());
    first.m.set_checkpointing(true);
    first.start();
    first.m.tool_done(1, 0, Ok(json!("one").into()), &first.cat);
    let record = record_of(&first.m.take_events());
    // The second: the program starts again; yield 1's tool is not run.
    let redrawn: Arc<Mutex<Vec<Value>>> = Arc::default();
    let mut again = twice(2, redrawn.clone());
    again.m.set_checkpointing(true);
    again.m.recover_program(record);
    let actions = again.start();
    assert_eq!(
        tool_inputs(&actions),
        [json!({"n": 2})],
        "only yield 2's tool runs"
    );
    assert_eq!(*redrawn.lock().unwrap(), [json!({"seed": 7})]);
    // Nothing journaled twice: the yields were, yield 1's result was.
    let events = again.m.take_events();
    assert!(
        !events.iter().any(|e| matches!(
            e,
            EventKind::ProgramYielded { .. }
                | EventKind::ToolCalled {
                    result: Some(_),
                    ..
                }
        )),
        "{events:?}"
    );
    finish(again.m.tool_done(2, 0, Ok(json!("two").into()), &again.cat));
    assert_eq!(again.state().status, AgentStatus::Completed);
    // Its history is the one a run that was never cut short has.
    let mut whole = twice(2, Arc::default());
    whole.start();
    whole.m.tool_done(1, 0, Ok(json!("one").into()), &whole.cat);
    finish(whole.m.tool_done(2, 0, Ok(json!("two").into()), &whole.cat));
    assert_eq!(again.history(), whole.history());
}

#[test]
fn a_resumed_program_whose_yield_differs_fails_naming_it() {
    let mut first = twice(2, Arc::default());
    first.m.set_checkpointing(true);
    first.start();
    first.m.tool_done(1, 0, Ok(json!("one").into()), &first.cat);
    let record = record_of(&first.m.take_events());
    // Edited: its second call is another.
    let mut edited = twice(20, Arc::default());
    edited.m.recover_program(record);
    let actions = edited.start();
    finish(actions);
    let state = edited.state();
    assert_eq!(state.status, AgentStatus::Failed);
    assert_eq!(state.error_kind, Some(FailureKind::Program));
    let error = state.output.as_ref().unwrap()["errorMessage"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(error.contains("at yield 2"), "{error}");
    assert!(
        error.contains(r#""n":2"#) && error.contains(r#""n":20"#),
        "{error}"
    );
}
