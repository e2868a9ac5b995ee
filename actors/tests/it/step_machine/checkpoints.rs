//! Checkpoints of durable runs.

use super::*;

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
    let mut resumed =
        StepMachine::from_checkpoint(&cps[0], template, toolbox, "tree-1".parse().unwrap());
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
