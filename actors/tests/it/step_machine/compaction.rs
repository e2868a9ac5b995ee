//! Compaction before a step (`compact_at`, issue 37): old tool results cut
//! first, then old turns summarised by a model call whose reply comes back
//! as the step's; a recorded compaction applied with no call.

use arbor_actors::compact::{COMPACT_SUMMARY, Compacted, Compaction};

use super::*;

/// A template calling `echo`, compacting at `at` tokens, keeping one step.
fn compacting(at: u64) -> AgentTemplate {
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["echo".into()];
    t.compact = Some(Compaction {
        keep: 1,
        ..Compaction::at(at)
    });
    t
}

/// Step `step` calls `echo` once; its result is `size` characters.
fn big_step(run: &mut Run, step: u32, size: usize) -> Vec<Action> {
    let reply = calls(&format!("s{step}"), &[("echo", json!({"n": step}))]);
    let actions = run.reply_with(reply, Usage::default());
    assert_eq!(kinds(&actions), ["RunTool"]);
    run.m
        .tool_done(step, 0, Ok(json!("x".repeat(size)).into()), &run.cat)
}

/// `big_step`, its reply also saying a good deal (1,200 characters, about
/// 300 tokens): once its result is cut, it still holds a summary's worth
/// (a quarter of a 1,000-token threshold).
fn said_step(run: &mut Run, step: u32, size: usize) -> Vec<Action> {
    let reply = Message::assistant(
        Some("t".repeat(1200)),
        vec![call(&format!("s{step}-0"), "echo", json!({"n": step}))],
    );
    let actions = run.reply_with(reply, Usage::default());
    assert_eq!(kinds(&actions), ["RunTool"]);
    run.m
        .tool_done(step, 0, Ok(json!("x".repeat(size)).into()), &run.cat)
}

fn compactions(events: &[EventKind]) -> Vec<(u32, usize, usize, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::HistoryCompacted {
                step,
                cut,
                summarized,
                from_record,
                ..
            } => Some((*step, cut.len(), *summarized, *from_record)),
            _ => None,
        })
        .collect()
}

#[test]
fn old_tool_results_are_cut_before_the_step_and_pairing_holds() {
    let mut run = Run::solo(compacting(1500));
    request(run.start());
    // About 770 tokens at step 2: under.
    request(big_step(&mut run, 1, 3000));
    assert!(
        run.m
            .take_events()
            .iter()
            .all(|e| e.name() != "historyCompacted")
    );
    // About 1540 tokens at step 3: the first result is cut, the second kept.
    let req = request(big_step(&mut run, 2, 3000));
    let events = run.m.take_events();
    assert_eq!(compactions(&events), [(3, 1, 0, false)]);
    let sent: Vec<String> = req.messages.iter().map(|m| m.text()).collect();
    assert_eq!(sent[2], "\"[tool result of echo cut: 3,000 chars]\"");
    assert!(sent[4].len() > 3000, "the kept step's result stays");
    assert!(!req.meta.summary);
    assert!(run.state().context_token_count < 1500);
}

#[test]
fn still_over_after_the_cut_the_old_turns_are_summarised_by_a_model_call() {
    let mut run = Run::solo(compacting(1000));
    request(run.start());
    request(said_step(&mut run, 1, 3000));
    // Step 2's reply is long text: kept, it keeps the context over.
    let long = Message::assistant(
        Some("y".repeat(5000)),
        vec![call("s2-0", "echo", json!({"n": 2}))],
    );
    assert_eq!(kinds(&run.reply_with(long, Usage::default())), ["RunTool"]);
    let summary_call = request(run.m.tool_done(2, 0, Ok(json!("ok").into()), &run.cat));
    // The summary call: the old turns, then the ask; no step's request.
    assert!(summary_call.meta.summary);
    assert_eq!(summary_call.meta.step, 3);
    let asked = summary_call.messages.to_vec();
    assert_eq!(asked.len(), 4, "prompt, reply, cut result, the ask");
    assert!(asked[2].text().contains("cut: 3,000 chars"));
    assert!(asked[3].text().starts_with("Your context is nearly full"));
    assert!(
        run.m
            .take_events()
            .iter()
            .all(|e| e.name() != "historyCompacted")
    );
    // Its reply comes back as the step's: the history is replaced, and the
    // step's own request goes out.
    let usage = Usage {
        cost: 0.25,
        ..USAGE
    };
    let step = request(run.reply_with(Message::assistant_text("  did step 1  "), usage));
    assert!(!step.meta.summary);
    assert_eq!(step.meta.step, 3);
    let history = run.history();
    assert_eq!(history.len(), 3, "summary, the kept step");
    assert!(history[0].has_tag(COMPACT_SUMMARY));
    assert!(history[0].text().ends_with("\n\ndid step 1"));
    assert_eq!(history[1].text().len(), 5000);
    assert_eq!(values(&step.messages.to_vec()), history);
    let events = run.m.take_events();
    assert_eq!(compactions(&events), [(3, 1, 3, false)]);
    let Some(EventKind::HistoryCompacted { summary, usage, .. }) =
        events.iter().find(|e| e.name() == "historyCompacted")
    else {
        unreachable!()
    };
    assert_eq!(summary.as_deref(), Some("did step 1"));
    assert_eq!(usage.cost, 0.25);
    assert_eq!(run.state().credits_used, 0.25, "the summary call is billed");
    // The step goes on as usual.
    finish(run.reply(Message::assistant_text("done")));
    assert_eq!(run.state().status, AgentStatus::Completed);
    assert_eq!(run.state().steps_remaining, 17, "the summary took no step");
}

#[test]
fn a_summary_call_that_fails_fails_the_run_saying_so() {
    let mut run = Run::solo(compacting(1000));
    request(run.start());
    let long = Message::assistant(
        Some("y".repeat(5000)),
        vec![call("s1-0", "echo", json!({"n": 1}))],
    );
    run.reply_with(long, Usage::default());
    run.m.tool_done(1, 0, Ok(json!("ok").into()), &run.cat);
    let long = Message::assistant(
        Some("z".repeat(5000)),
        vec![call("s2-0", "echo", json!({"n": 2}))],
    );
    run.reply_with(long, Usage::default());
    let summary_call = request(run.m.tool_done(2, 0, Ok(json!("ok").into()), &run.cat));
    assert!(summary_call.meta.summary);
    let actions = run
        .m
        .model_failed(3, Failure::new(FailureKind::ModelUnavailable, "down"), None);
    finish(actions);
    let output = run.state().output.clone().unwrap();
    assert!(
        output["errorMessage"]
            .as_str()
            .unwrap()
            .contains("summary call to compact the history (compact_at) failed: down"),
        "{output}"
    );
}

#[test]
fn a_recorded_compaction_is_applied_again_without_a_model_call() {
    let live = {
        let mut run = Run::solo(compacting(1000));
        request(run.start());
        request(said_step(&mut run, 1, 3000));
        let long = Message::assistant(
            Some("y".repeat(5000)),
            vec![call("s2-0", "echo", json!({"n": 2}))],
        );
        run.reply_with(long, Usage::default());
        request(run.m.tool_done(2, 0, Ok(json!("ok").into()), &run.cat));
        request(run.reply_with(Message::assistant_text("sum"), USAGE));
        let recorded = run.m.take_events().into_iter().find_map(|e| match e {
            EventKind::HistoryCompacted {
                step,
                cut,
                summarized,
                summary,
                usage,
                ..
            } => Some(Compacted {
                step,
                cut,
                summarized,
                summary,
                usage,
            }),
            _ => None,
        });
        (run.history(), run.state().clone(), recorded.unwrap())
    };
    let (history, state, recorded) = live;
    let mut run = Run::solo(compacting(1000));
    run.m.recover_compactions(vec![recorded]);
    request(run.start());
    request(said_step(&mut run, 1, 3000));
    let long = Message::assistant(
        Some("y".repeat(5000)),
        vec![call("s2-0", "echo", json!({"n": 2}))],
    );
    run.reply_with(long, Usage::default());
    // No summary call: the step's own request, on the recorded summary.
    let step = request(run.m.tool_done(2, 0, Ok(json!("ok").into()), &run.cat));
    assert!(!step.meta.summary);
    assert_eq!(run.history(), history);
    assert_eq!(run.state().credits_used, state.credits_used);
    assert_eq!(run.state().context_token_count, state.context_token_count);
    assert_eq!(compactions(&run.m.take_events()), [(3, 1, 3, true)]);
}
