//! The live tree's lines, from events, without a terminal.

use std::sync::Arc;

use arbor_actors::message::{Message, ToolCall, ToolInput};
use arbor_actors::model::Usage;
use arbor_actors::{AgentState, Event, EventKind, RunId};
use serde_json::json;

use super::LiveTree;

fn run(id: &str) -> RunId {
    id.parse().unwrap()
}

fn at(run_id: &str, at_ms: u64, kind: EventKind) -> Event {
    Event {
        seq: 1,
        tree_id: "t".parse().unwrap(),
        run_id: run(run_id),
        at_ms,
        kind,
    }
}

fn started(id: &str, ty: &str, depth: usize, ms: u64) -> Event {
    let parent = run(id).parent();
    at(
        id,
        ms,
        EventKind::AgentStarted {
            agent_id: run(id).agent_id(),
            agent_type: ty.into(),
            parent_run_id: parent,
            depth,
        },
    )
}

fn replied(id: &str, ms: u64, tokens: u64, cost: f64, tools: &[&str]) -> Event {
    let calls = tools
        .iter()
        .enumerate()
        .map(|(i, name)| ToolCall {
            tool_call_id: format!("c{i}"),
            tool_name: (*name).into(),
            input: ToolInput::new(&json!({})),
        })
        .collect::<Vec<_>>();
    at(
        id,
        ms,
        EventKind::ModelResponded {
            step: 1,
            usage: Usage {
                input_tokens: tokens,
                cost,
                ..Usage::default()
            },
            tool_calls: tools.len(),
            reply: Some(Arc::new(Message::assistant(None, calls))),
            from_record: false,
            refused: false,
        },
    )
}

fn finished(id: &str, ms: u64) -> Event {
    at(
        id,
        ms,
        EventKind::AgentFinished {
            state: Arc::new(AgentState::of_run(run(id))),
            inherited: 0,
        },
    )
}

/// A planner with a researcher (which has a helper of its own) and a
/// writer, part way: the researcher's subtree has ended, the writer runs
/// a tool, the planner waits for its children.
fn tree() -> LiveTree {
    let mut t = LiveTree::default();
    for e in [
        started("t/0", "planner", 0, 1_000),
        at("t/0", 1_000, EventKind::StepStarted { step: 1 }),
        replied("t/0", 1_500, 100, 0.01, &["spawn_agents"]),
        started("t/0.1", "researcher", 1, 1_600),
        started("t/0.2", "writer", 1, 1_600),
        at("t/0", 1_700, EventKind::Suspended),
        started("t/0.1.1", "helper", 2, 1_800),
        at("t/0.1.1", 1_800, EventKind::StepStarted { step: 1 }),
        replied("t/0.1.1", 2_000, 50, 0.0, &[]),
        finished("t/0.1.1", 2_000),
        replied("t/0.1", 2_100, 70, 0.002, &[]),
        finished("t/0.1", 2_200),
        at("t/0.2", 1_700, EventKind::StepStarted { step: 1 }),
        replied("t/0.2", 2_500, 30, 0.0, &["Bash", "Read"]),
        at(
            "t/0.2",
            2_600,
            EventKind::ToolCalled {
                step: 1,
                tool: "Read".into(),
                tool_call_id: "c1".into(),
                error: None,
                result: None,
            },
        ),
    ] {
        t.apply(&e);
    }
    t
}

#[test]
fn live_agents_say_what_they_do_and_an_ended_subtree_is_one_line() {
    let t = tree();
    let lines = t.render(4_000, 120, 40, false);
    assert_eq!(lines.len(), 4, "{lines:#?}");
    assert!(
        lines[0].contains("planner 0") && lines[0].contains("waiting for 1 child(ren), 2.3s"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("100 tokens, cost 0.0100"), "{}", lines[0]);
    // The researcher and its helper: one line, with the subtree's totals.
    assert!(
        lines[1]
            .contains("✓ researcher 0.1  2 agents (2 completed), 120 tokens, cost 0.0020, 0.6s ▸"),
        "{}",
        lines[1]
    );
    assert!(!lines.iter().any(|l| l.contains("helper")), "{lines:#?}");
    assert!(
        lines[2].contains("▸ writer 0.2  running Bash, Read (1 left), 1.5s"),
        "{}",
        lines[2]
    );
    assert_eq!(
        lines[3],
        "1 running · 3 done · 0 failed · 0 cancelled │ 250 tokens, cost 0.0120 │ 3.0s │ ↑↓ select · enter fold/unfold · c cancel"
            .replace("1 running · 3 done", "2 running · 2 done")
    );
}

#[test]
fn a_selected_ended_subtree_unfolds_and_folds_again() {
    let mut t = tree();
    t.select(1);
    t.select(1);
    assert_eq!(t.selected(), Some(&run("t/0.1")));
    t.toggle();
    let lines = t.render(4_000, 120, 40, false);
    assert_eq!(lines.len(), 5, "{lines:#?}");
    assert!(
        lines[1].starts_with("›  ✓ researcher 0.1  completed in 0.6s"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].contains("✓ helper 0.1.1  completed in 0.2s"),
        "{}",
        lines[2]
    );
    t.toggle();
    assert_eq!(t.render(4_000, 120, 40, false).len(), 4);
    // The selection stays within the lines shown.
    t.select(10);
    assert_eq!(t.selected(), Some(&run("t/0.2")));
    t.select(-10);
    assert_eq!(t.selected(), Some(&run("t/0")));
}

#[test]
fn a_short_terminal_shows_the_lines_around_the_selection_and_the_footer_stays() {
    let mut t = tree();
    t.select(1);
    t.toggle(); // nothing to unfold on a live planner
    t.select(1);
    t.select(1);
    // Three rows: one line of the tree, the "more" line, the footer.
    let lines = t.render(4_000, 120, 3, false);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(lines[0].contains("writer 0.2"), "{lines:#?}");
    assert!(lines[1].contains("2 more line(s)"), "{lines:#?}");
    assert!(lines[2].contains("running ·"), "{lines:#?}");
}

#[test]
fn a_narrow_terminal_drops_the_numbers_and_keys_not_the_doing() {
    let t = tree();
    let lines = t.render(4_000, 80, 40, false);
    assert!(
        lines[2].ends_with("(1 left), 1.5s · 30 tokens"),
        "{}",
        lines[2]
    );
    assert!(!lines[3].contains("select"), "{}", lines[3]);
    let lines = t.render(4_000, 50, 40, false);
    assert!(lines[2].ends_with("(1 left), 1.5s"), "{}", lines[2]);
}

#[test]
fn approvals_budgets_and_failures_show_on_their_line_with_colour_only_when_asked() {
    let mut t = tree();
    t.apply(&at(
        "t/0.2",
        3_000,
        EventKind::ApprovalRequested {
            step: 1,
            tool_call_id: "c0".into(),
            tool: "Bash".into(),
            input: json!({}),
        },
    ));
    let plain = t.render(4_000, 120, 40, false);
    assert!(
        plain[2].contains("? writer 0.2  waits for approval: Bash"),
        "{}",
        plain[2]
    );
    assert!(plain.iter().all(|l| !l.contains('\x1b')), "{plain:#?}");
    let coloured = t.render(4_000, 120, 40, true);
    assert!(coloured[3].starts_with("\x1b[7m"), "{}", coloured[3]);
    t.apply(&at(
        "t/0.2",
        3_500,
        EventKind::AgentFailed {
            error: "boom".into(),
            state: Arc::new(AgentState::of_run(run("t/0.2"))),
            inherited: 0,
        },
    ));
    let lines = t.render(4_000, 120, 40, false);
    assert!(
        lines[2].contains("✗ writer 0.2  failed in 1.9s"),
        "{}",
        lines[2]
    );
    assert!(
        lines[3].starts_with("1 running · 2 done · 1 failed"),
        "{}",
        lines[3]
    );
}

/// A tree followed from its journal (`arbor watch`: the store's entries or
/// a server's stream) draws the same lines as one followed live.
#[test]
fn a_tree_read_from_its_journal_draws_the_same_lines_as_one_followed_live() {
    let live = tree();
    let mut journal = LiveTree::default();
    let mut events = Vec::new();
    for e in [
        started("t/0", "planner", 0, 1_000),
        at("t/0", 1_000, EventKind::StepStarted { step: 1 }),
        replied("t/0", 1_500, 100, 0.01, &["spawn_agents"]),
        started("t/0.1", "researcher", 1, 1_600),
        started("t/0.2", "writer", 1, 1_600),
        at("t/0", 1_700, EventKind::Suspended),
        started("t/0.1.1", "helper", 2, 1_800),
        at("t/0.1.1", 1_800, EventKind::StepStarted { step: 1 }),
        replied("t/0.1.1", 2_000, 50, 0.0, &[]),
        finished("t/0.1.1", 2_000),
        replied("t/0.1", 2_100, 70, 0.002, &[]),
        finished("t/0.1", 2_200),
        at("t/0.2", 1_700, EventKind::StepStarted { step: 1 }),
        replied("t/0.2", 2_500, 30, 0.0, &["Bash", "Read"]),
    ] {
        events.push(e);
    }
    for e in &events {
        let entry = arbor_supervisor::journal_view(e).expect("journaled");
        // As a server's stream sends it, read back.
        let data = serde_json::to_value(&entry).unwrap();
        let serde_json::Value::Object(mut data) = data else {
            panic!("an entry is an object")
        };
        data.insert("treeId".into(), json!("t"));
        let entry = arbor_supervisor::store::JournalEntry::from_stream(data).expect("an entry");
        journal.apply_entry(&entry);
    }
    let mut live_now = LiveTree::default();
    for e in &events {
        live_now.apply(e);
    }
    let followed = live_now.render(4_000, 120, 40, false);
    assert_eq!(
        followed[2],
        "   ▸ writer 0.2  running Bash, Read (2 left), 1.5s · 30 tokens"
    );
    assert_eq!(journal.render(4_000, 120, 40, false), followed);
    // (`tree()` has one more event: a tool done.)
    assert_ne!(
        journal.render(4_000, 120, 40, false),
        live.render(4_000, 120, 40, false)
    );
}

/// An entry read twice (a reconnect, a journal read again) counts once,
/// and the log's end line and summary say what `arbor run`'s do.
#[test]
fn an_end_read_twice_counts_once_and_the_end_line_and_summary_read_as_arbor_runs() {
    let mut t = tree();
    t.apply(&finished("t/0.1", 2_900));
    t.apply(&started("t/0.1", "researcher", 1, 2_900));
    let footer = t.render(4_000, 120, 40, false).pop().unwrap();
    assert!(
        footer.starts_with("2 running · 2 done · 0 failed"),
        "{footer}"
    );
    assert_eq!(
        t.ended_line(&run("t/0.1"), None).unwrap(),
        "  ✓ researcher 0.1 completed in 600ms (1 child, 70 tokens)"
    );
    assert_eq!(t.ended_line(&run("t/0.2"), None), None);
    assert_eq!(
        t.summary(&"t".parse().unwrap(), 3_000),
        "Finished tree t in 2000ms: 2 agents (2 completed), 250 tokens in all"
    );
}

/// Issue 38: a reply streamed in shows as its last words on its agent's
/// line ("writing: …"), its whitespace as single spaces, from live deltas
/// and from a server's stream alike; the next step starts it afresh.
#[test]
fn a_streamed_reply_shows_its_last_words_on_its_line() {
    use arbor_actors::Delta;
    let mut t = LiveTree::default();
    t.apply(&started("t/0", "writer", 0, 1_000));
    t.apply(&at("t/0", 1_000, EventKind::StepStarted { step: 1 }));
    for word in ["Once upon\n", "a time  ", "there was a tree"] {
        t.apply(&at(
            "t/0",
            1_100,
            EventKind::ModelDelta {
                step: 1,
                delta: Delta::Text { text: word.into() },
            },
        ));
    }
    let line = &t.render(2_000, 120, 10, false)[0];
    assert!(
        line.contains("model, step 1, 1.0s, writing: Once upon a time there was a tree ·"),
        "{line}"
    );
    // A long reply: its last 48 characters, after an ellipsis.
    t.apply_streamed(&run("t/0"), &" and the tree grew branches".repeat(4));
    let line = &t.render(2_000, 200, 10, false)[0];
    let (_, shown) = line.split_once("writing: …").expect(line);
    let (shown, _) = shown.split_once(" · ").expect(line);
    assert_eq!(shown.chars().count(), 47, "{line}");
    assert!(shown.ends_with("and the tree grew branches"), "{line}");
    t.apply(&at("t/0", 2_000, EventKind::StepStarted { step: 2 }));
    let line = &t.render(2_000, 120, 10, false)[0];
    assert!(!line.contains("writing"), "{line}");
}

/// A run started again (its tree resumed after a crash) no longer says
/// what it was doing when the process died: it is starting again.
#[test]
fn a_resumed_runs_line_drops_what_it_was_doing_before_the_crash() {
    let mut t = LiveTree::default();
    t.apply(&started("t/0", "writer", 0, 1_000));
    t.apply(&at("t/0", 1_000, EventKind::StepStarted { step: 1 }));
    t.apply(&replied("t/0", 1_200, 10, 0.0, &["Bash"]));
    assert!(t.render(1_500, 120, 10, false)[0].contains("running Bash"));
    t.apply(&started("t/0", "writer", 0, 9_000));
    let line = &t.render(9_500, 120, 10, false)[0];
    assert!(line.contains("starting"), "{line}");
    assert!(!line.contains("Bash"), "{line}");
}
