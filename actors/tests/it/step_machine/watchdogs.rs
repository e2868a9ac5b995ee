//! The loop watchdog: the same call with the same result, again and again.

use super::*;
use arbor_actors::template::LoopDetection;

fn echoing(detection: LoopDetection) -> Run {
    let mut t = lead();
    t.tools = vec!["echo".into()];
    t.loop_detection = detection;
    Run::solo(t)
}

/// The model calls echo `{n: 1}` and the tool answers the same, step after step.
fn repeat(run: &mut Run, result: Value) -> Vec<Action> {
    let step = run.m.step();
    let actions = run.reply(calls(&format!("c{step}"), &[("echo", json!({"n": 1}))]));
    assert_eq!(kinds(&actions), ["RunTool"]);
    run.m.tool_done(step, 0, Ok(result.into()), &run.cat)
}

fn looping_events(run: &mut Run) -> Vec<(u32, u32, bool)> {
    run.m
        .take_events()
        .into_iter()
        .filter_map(|e| match e {
            EventKind::Looping {
                step,
                repeats,
                fatal,
                tool,
            } => {
                assert_eq!(tool, "echo");
                Some((step, repeats, fatal))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn an_agent_repeating_the_same_call_five_times_is_warned_at_three_and_stopped_at_five() {
    let mut run = echoing(LoopDetection::default());
    request(run.start());
    let mut events = Vec::new();
    for _ in 0..4 {
        request(repeat(&mut run, json!("same")));
        events.extend(looping_events(&mut run));
    }
    assert_eq!(events, [(3, 3, false)], "a warning, and the run goes on");
    assert_eq!(run.state().status, AgentStatus::Running);
    finish(repeat(&mut run, json!("same")));
    assert_eq!(looping_events(&mut run), [(5, 5, true)]);
    let s = run.state();
    assert_eq!(s.status, AgentStatus::Failed);
    assert_eq!(s.error_kind, Some(FailureKind::Looping));
    let error = s.error_message().unwrap();
    assert!(
        error.contains("loop detection") && error.contains("echo was called 5 times"),
        "{error}"
    );
    // The fifth result is in the history: the failure comes after the step.
    assert_eq!(run.history().len(), 1 + 5 * 2);
}

#[test]
fn a_call_whose_result_changes_is_no_loop() {
    let mut run = echoing(LoopDetection::default());
    request(run.start());
    for i in 0..8 {
        request(repeat(&mut run, json!(i)));
        assert!(looping_events(&mut run).is_empty());
    }
    assert_eq!(run.state().status, AgentStatus::Running);
}

#[test]
fn loop_detection_off_lets_an_agent_repeat_itself() {
    let mut run = echoing(LoopDetection::OFF);
    request(run.start());
    for _ in 0..10 {
        request(repeat(&mut run, json!("same")));
    }
    assert!(looping_events(&mut run).is_empty());
    assert_eq!(run.state().status, AgentStatus::Running);
}
