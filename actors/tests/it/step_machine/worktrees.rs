//! Sealing an isolated run's worktree in the step machine (issue 36): the
//! run completes only once its worktree is sealed, the report is journaled
//! and kept in its state, and a resumed run takes the recorded report
//! instead of sealing again.

use super::*;
use arbor_actors::EndSeal;
use arbor_actors::worktree::{Isolation, WorktreeCommit, WorktreeReport};

fn isolated() -> Run {
    let mut t = AgentTemplate::new("editor", "m");
    t.isolation = Isolation::Worktree;
    Run::solo(t)
}

fn report() -> WorktreeReport {
    WorktreeReport {
        branch: "arbor/editor-x".into(),
        base: "b".into(),
        path: Some("/w".into()),
        commits: vec![WorktreeCommit {
            sha: "c".into(),
            subject: "s".into(),
        }],
        files: Vec::new(),
        summary: "1 file changed".into(),
        error: None,
    }
}

#[test]
fn an_isolated_run_completes_only_after_its_worktree_is_sealed() {
    let mut run = isolated();
    request(run.start());
    let actions = run.reply(Message::assistant_text("done"));
    assert_eq!(kinds(&actions), ["SealWorktree"]);
    assert_eq!(run.state().status, AgentStatus::Running);
    // A second report of the same seal does nothing.
    let actions = run.m.worktree_sealed(Some(report()));
    assert_eq!(kinds(&actions), ["Finish"]);
    assert!(run.m.worktree_sealed(Some(report())).is_empty());
    let s = run.state();
    assert_eq!(s.status, AgentStatus::Completed);
    assert_eq!(s.worktree.as_deref(), Some(&report()));
    let events = run.m.take_events();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, EventKind::WorktreeSealed { report: r } if *r == report())),
        "the seal is journaled"
    );
    // The parent reads the branch in the child's value.
    assert_eq!(run.m.output_value()["worktree"]["branch"], "arbor/editor-x");
}

#[test]
fn a_worktree_never_made_completes_without_a_report() {
    let mut run = isolated();
    request(run.start());
    run.reply(Message::assistant_text("done"));
    assert_eq!(kinds(&run.m.worktree_sealed(None)), ["Finish"]);
    assert_eq!(run.state().worktree, None);
    assert!(run.m.output_value().get("worktree").is_none());
}

#[test]
fn a_resumed_run_takes_the_recorded_report_without_sealing_again() {
    let mut run = isolated();
    run.m.recover_worktree(report());
    request(run.start());
    let actions = run.reply(Message::assistant_text("done"));
    assert_eq!(kinds(&actions), ["Finish"]);
    assert_eq!(run.state().worktree.as_deref(), Some(&report()));
}

#[test]
fn a_shared_run_never_seals() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    assert_eq!(kinds(&run.reply(Message::assistant_text("hi"))), ["Finish"]);
}

#[test]
fn a_failed_isolated_run_left_its_edits_unsealed_and_unnamed() {
    // Regression: a run that failed (or was cancelled) kept its worktree
    // and uncommitted edits, and its parent never learned the branch. It is
    // sealed once its work has stopped, and its error value names it.
    let mut run = isolated();
    request(run.start());
    assert_eq!(
        kinds(
            &run.m
                .fail(Failure::new(FailureKind::ModelRejected, "model refused"))
        ),
        ["Finish"]
    );
    assert_eq!(run.m.end_seal(), EndSeal::Start);
    assert_eq!(run.m.end_seal(), EndSeal::Wait, "one seal at a time");
    assert!(
        run.m.worktree_sealed(Some(report())).is_empty(),
        "already finished"
    );
    assert_eq!(run.m.end_seal(), EndSeal::Done);
    let s = run.state();
    assert_eq!(s.status, AgentStatus::Failed);
    assert_eq!(s.worktree.as_deref(), Some(&report()));
    assert!(
        run.m
            .take_events()
            .iter()
            .any(|e| matches!(e, EventKind::WorktreeSealed { .. }))
    );
    let value = run.m.output_value();
    assert_eq!(value["message"], "model refused");
    assert_eq!(value["worktree"]["branch"], "arbor/editor-x");
}

#[test]
fn a_cancelled_isolated_run_takes_its_recorded_report_on_replay() {
    let mut run = isolated();
    run.m.recover_worktree(report());
    request(run.start());
    run.m.cancel();
    assert_eq!(run.m.end_seal(), EndSeal::Done);
    assert_eq!(run.state().worktree.as_deref(), Some(&report()));
}

#[test]
fn an_ended_shared_run_has_nothing_to_seal() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    run.m.cancel();
    assert_eq!(run.m.end_seal(), EndSeal::Done);
}
