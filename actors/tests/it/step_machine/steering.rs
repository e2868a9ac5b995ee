//! Steering: a person's message joins a running agent's history at its next
//! step boundary (semantics §9).

use super::*;
use arbor_actors::steer::{STEERING, Steer, SteerRefused};

fn steered(events: &[EventKind]) -> Vec<(u32, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::Steered { step, text } => Some((*step, text.to_string())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_steer_during_a_step_joins_the_history_at_the_next_step() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    run.m.take_events();
    run.m.steer("use metric units").unwrap();
    assert_eq!(
        steered(&run.m.take_events()),
        [(1, "use metric units".to_owned())],
        "recorded at once, with the step it arrived in"
    );
    // Not in the history before the step ends.
    assert_eq!(run.history(), vec![Message::user("task")]);
    let second = request(run.reply(calls("a", &[add_user("more")])));
    let sent = values(&second.messages.to_vec());
    let last = sent.last().unwrap();
    assert_eq!(last, &Message::user("use metric units").with_tag(STEERING));
    assert_eq!(second.meta.step, 2);
}

#[test]
fn a_steer_that_arrives_while_the_turn_ends_is_answered_before_the_run_completes() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    run.m.steer("and in French, please").unwrap();
    // The model ends its turn without knowing: the run takes one more step.
    let next = request(run.reply(Message::assistant_text("done")));
    assert_eq!(next.meta.step, 2);
    assert_eq!(
        values(&next.messages.to_vec()).last().unwrap(),
        &Message::user("and in French, please").with_tag(STEERING)
    );
    assert_eq!(run.state().status, AgentStatus::Running);
    finish(run.reply(Message::assistant_text("fini")));
    assert_eq!(run.state().status, AgentStatus::Completed);
}

#[test]
fn a_steer_to_an_ended_run_or_an_empty_one_is_refused_and_not_recorded() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    assert_eq!(run.m.steer("  "), Err(SteerRefused::Empty));
    finish(run.reply(Message::assistant_text("hi")));
    run.m.take_events();
    assert_eq!(run.m.steer("too late"), Err(SteerRefused::Ended));
    assert!(steered(&run.m.take_events()).is_empty());
}

#[test]
fn a_checkpoint_holds_the_steers_applied_before_it() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    run.m.set_checkpointing(true);
    request(run.start());
    run.m.steer("focus on tests").unwrap();
    request(run.reply(calls("a", &[add_user("more")])));
    let checkpoint = run
        .m
        .take_events()
        .into_iter()
        .find_map(|e| match e {
            EventKind::Checkpointed { checkpoint } => Some(checkpoint),
            _ => None,
        })
        .unwrap();
    assert!(
        checkpoint
            .state
            .message_history
            .iter()
            .any(|m| m.has_tag(STEERING)),
        "the steer is in the checkpoint a resume starts from"
    );
}

#[test]
fn a_replayed_or_restarted_run_takes_each_steer_again_at_the_step_it_arrived_in() {
    // What a live run did: a steer in step 2, answered in step 3.
    let mut live = Run::solo(AgentTemplate::new("solo", "m"));
    request(live.start());
    request(live.reply(calls("a", &[add_user("more")])));
    live.m.steer("wrap up").unwrap();
    request(live.reply(Message::assistant_text("ok")));
    finish(live.reply(Message::assistant_text("wrapped")));
    let recorded = steered(&live.m.take_events());
    assert_eq!(recorded, [(2, "wrap up".to_owned())]);

    let mut again = Run::solo(AgentTemplate::new("solo", "m"));
    again.m.recover_steers(
        recorded
            .iter()
            .map(|(step, text)| Steer {
                step: *step,
                text: text.as_str().into(),
            })
            .collect(),
    );
    request(again.start());
    request(again.reply(calls("a", &[add_user("more")])));
    request(again.reply(Message::assistant_text("ok")));
    finish(again.reply(Message::assistant_text("wrapped")));
    assert_eq!(again.history(), live.history());
    assert!(
        steered(&again.m.take_events()).is_empty(),
        "taken again without a second event: it was recorded"
    );
}
