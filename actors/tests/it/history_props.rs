//! Properties of `History` over arbitrary sequences of the operations an agent
//! performs on it: pushes (with call ids from a small pool, so ids collide and
//! results may be orphans), expiry, child snapshots, `set_messages`-style
//! replacement with repair, and truncated request views.

use std::collections::HashSet;
use std::sync::Arc;

use arbor_actors::history::{Expiry, History, check_pairing};
use arbor_actors::message::{Message, TimeToLive, ToolCall};
use proptest::prelude::*;
use serde_json::json;

const IDS: [&str; 4] = ["a", "b", "c", "d"];

fn call(i: usize) -> ToolCall {
    ToolCall {
        tool_call_id: IDS[i].to_owned(),
        tool_name: "t".to_owned(),
        input: json!({"i": i}).into(),
    }
}

#[derive(Clone, Debug)]
enum Body {
    User(usize),
    AssistantText(usize),
    /// Optional text and 0–3 calls.
    Assistant(Option<usize>, Vec<usize>),
    Result(usize),
}

#[derive(Clone, Debug)]
struct Msg {
    body: Body,
    ttl: Option<TimeToLive>,
    keep: bool,
}

impl Msg {
    fn build(&self) -> Message {
        let text = |n: usize| "x".repeat(n);
        let mut m = match &self.body {
            Body::User(n) => Message::user(text(*n)),
            Body::AssistantText(n) => Message::assistant_text(text(*n)),
            Body::Assistant(t, calls) => {
                Message::assistant(t.map(text), calls.iter().map(|i| call(*i)).collect())
            }
            Body::Result(i) => Message::tool_result(&call(*i), json!({"r": i})),
        };
        m.meta_mut().time_to_live = self.ttl;
        if self.keep {
            m.meta_mut().keep_during_truncation = Some(true);
        }
        m
    }
}

fn msg() -> impl Strategy<Value = Msg> {
    let body = prop_oneof![
        (0usize..120).prop_map(Body::User),
        (0usize..120).prop_map(Body::AssistantText),
        (
            proptest::option::of(0usize..120),
            proptest::collection::vec(0usize..IDS.len(), 0..=3)
        )
            .prop_map(|(t, calls)| Body::Assistant(t, calls)),
        (0usize..IDS.len()).prop_map(Body::Result),
    ];
    let ttl = prop_oneof![
        6 => Just(None),
        1 => Just(Some(TimeToLive::AgentStep)),
        1 => Just(Some(TimeToLive::UserPrompt)),
    ];
    (body, ttl, proptest::bool::weighted(0.1)).prop_map(|(body, ttl, keep)| Msg { body, ttl, keep })
}

#[derive(Clone, Debug)]
enum Op {
    Push(Msg),
    Expire(Expiry),
    /// What a child's snapshot is made of.
    Filter,
    /// `set_messages`: replace with arbitrary messages, pairing repaired.
    SetMessages(Vec<Msg>),
    /// A request view: must leave the history as it was.
    View(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => msg().prop_map(Op::Push),
        1 => Just(Op::Expire(Expiry::StepStart)),
        1 => Just(Op::Expire(Expiry::TurnEnd)),
        1 => Just(Op::Filter),
        1 => proptest::collection::vec(msg(), 0..10).prop_map(Op::SetMessages),
        1 => (0u64..400).prop_map(Op::View),
    ]
}

fn apply(history: &History, op: &Op) -> History {
    match op {
        Op::Push(m) => {
            let mut h = history.clone();
            h.push(m.build());
            h
        }
        Op::Expire(at) => history.expire(*at),
        Op::Filter => history.filter_unfinished_tool_calls(),
        Op::SetMessages(list) => {
            let raw: History = list.iter().map(Msg::build).collect();
            raw.repaired().0.into_iter().collect()
        }
        Op::View(budget) => {
            let before = history.clone();
            let (repaired, _) = history.repaired();
            let _ = History::truncated_view(&repaired, *budget);
            assert_eq!(history, &before, "a view changed the history");
            history.clone()
        }
    }
}

fn is_placeholder(m: &Message) -> bool {
    matches!(m, Message::User { .. }) && m.text().contains("removed to fit the context window")
}

fn tokens(messages: &[Arc<Message>]) -> u64 {
    messages.iter().map(|m| m.estimated_tokens()).sum()
}

/// What a history knows about itself (kept up to date on push, so the hot path
/// needs no scan) matches what a full scan finds.
fn prop_metadata(history: &History) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        history.is_paired(),
        check_pairing(&history.to_vec()).is_ok(),
        "is_paired disagrees with check_pairing for {:?}",
        history
    );
    prop_assert_eq!(history.estimated_tokens(), tokens(&history.to_vec()));
    let (view, repair) = history.request_view();
    prop_assert_eq!(check_pairing(&view.to_vec()), Ok(()));
    prop_assert_eq!(repair.is_empty(), history.is_paired());
    for m in history.iter() {
        for call in m.tool_calls() {
            prop_assert!(history.id_taken(&call.tool_call_id));
        }
    }
    prop_assert!(!history.id_taken("never-used-id"));
    Ok(())
}

/// (a) A repaired history pairs, and so does every truncated view of it; the
/// view keeps pinned messages and the newest one.
fn prop_repaired_pairs(history: &History) -> Result<(), TestCaseError> {
    let (repaired, _) = history.repaired();
    prop_assert_eq!(check_pairing(&repaired), Ok(()), "repaired: {:?}", repaired);
    let total = tokens(&repaired);
    for budget in [0, 1, 16, 64, 256, total / 2, total.saturating_sub(1), total] {
        let view = History::truncated_view(&repaired, budget);
        prop_assert_eq!(
            check_pairing(&view),
            Ok(()),
            "budget {} of {}: {:?}",
            budget,
            total,
            view
        );
        if let Some(last) = repaired.last() {
            prop_assert!(
                Arc::ptr_eq(view.last().unwrap(), last),
                "newest message dropped"
            );
        }
        for m in repaired.iter().filter(|m| m.keep_during_truncation()) {
            prop_assert!(
                view.iter().any(|v| Arc::ptr_eq(v, m)),
                "pinned message dropped at budget {}",
                budget
            );
        }
        // The view is the repaired list with runs replaced by single placeholders.
        let mut rest = repaired.iter();
        let mut after_placeholder = false;
        for v in &view {
            if is_placeholder(v) {
                prop_assert!(!after_placeholder, "two placeholders in a row");
                after_placeholder = true;
            } else {
                prop_assert!(
                    rest.any(|m| Arc::ptr_eq(m, v)),
                    "view reordered or copied {:?}",
                    v
                );
                after_placeholder = false;
            }
        }
    }
    Ok(())
}

/// (b) filter is idempotent; (c) after it, every call has a result.
fn prop_filter(history: &History) -> Result<(), TestCaseError> {
    let once = history.filter_unfinished_tool_calls();
    let twice = once.filter_unfinished_tool_calls();
    prop_assert_eq!(&twice, &once);
    let answered: HashSet<&str> = once.iter().filter_map(|m| m.answers()).collect();
    for m in once.iter() {
        for c in m.tool_calls() {
            prop_assert!(
                answered.contains(c.tool_call_id.as_str()),
                "call {} has no result after filter",
                c.tool_call_id
            );
        }
    }
    // Non-assistant messages are all kept, shared.
    let others = |h: &History| {
        h.iter()
            .filter(|m| !m.is_assistant())
            .cloned()
            .collect::<Vec<_>>()
    };
    let (before, after) = (others(history), others(&once));
    prop_assert_eq!(before.len(), after.len());
    prop_assert!(before.iter().zip(&after).all(|(x, y)| Arc::ptr_eq(x, y)));
    Ok(())
}

/// (d) repairing a valid list changes nothing and reports nothing.
fn prop_repair_fixpoint(history: &History) -> Result<(), TestCaseError> {
    let (repaired, _) = history.repaired();
    let again: History = repaired.iter().cloned().collect();
    let (twice, repair) = again.repaired();
    prop_assert!(repair.is_empty(), "second repair dropped {:?}", repair);
    prop_assert_eq!(twice.len(), repaired.len());
    prop_assert!(twice.iter().zip(&repaired).all(|(x, y)| Arc::ptr_eq(x, y)));
    if check_pairing(&history.to_vec()).is_ok() {
        let (same, repair) = history.repaired();
        prop_assert!(repair.is_empty());
        prop_assert!(
            same.iter()
                .zip(history.iter())
                .all(|(x, y)| Arc::ptr_eq(x, y))
        );
        prop_assert_eq!(same.len(), history.len());
    }
    Ok(())
}

proptest! {
    // A fixed seed keeps the suite deterministic (PROPTEST_RNG_SEED overrides it
    // for exploration); no regression files are written.
    #![proptest_config(ProptestConfig {
        cases: 256,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x00A2_B0A7),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_reachable_history_keeps_the_invariants(ops in proptest::collection::vec(op(), 0..40)) {
        let mut history = History::new();
        for op in &ops {
            history = apply(&history, op);
            prop_metadata(&history)?;
            prop_metadata(&history.filter_unfinished_tool_calls())?;
            prop_repaired_pairs(&history)?;
            prop_filter(&history)?;
            prop_repair_fixpoint(&history)?;
        }
    }

    #[test]
    fn repair_of_an_arbitrary_list_pairs_and_is_a_fixpoint(list in proptest::collection::vec(msg(), 0..16)) {
        let history: History = list.iter().map(Msg::build).collect();
        prop_metadata(&history)?;
        prop_repaired_pairs(&history)?;
        prop_repair_fixpoint(&history)?;
        // Repair only removes: what it keeps is in order, and a message it kept
        // unchanged is the stored one.
        let (repaired, _) = history.repaired();
        prop_assert!(repaired.len() <= history.len());
        let mut rest = history.iter();
        for m in &repaired {
            prop_assert!(
                rest.any(|h| Arc::ptr_eq(h, m) || (h.is_assistant() && m.is_assistant())),
                "repair reordered or invented {:?}", m
            );
        }
    }

    #[test]
    fn a_valid_history_is_never_changed_by_repair(
        turns in proptest::collection::vec((0usize..40, proptest::collection::vec(0usize..40, 0..=3)), 0..12)
    ) {
        // Built like the step machine builds it: unique ids, results in call order.
        let mut history = History::new();
        let mut next = 0usize;
        for (text, calls) in &turns {
            history.push(Message::user("x".repeat(*text)));
            let calls: Vec<ToolCall> = calls.iter().map(|n| {
                next += 1;
                ToolCall { tool_call_id: format!("id{next}"), tool_name: "t".into(), input: json!({"n": n}).into() }
            }).collect();
            history.push(Message::assistant(Some("y".repeat(*text)), calls.clone()));
            for c in &calls {
                history.push(Message::tool_result(c, json!("ok")));
            }
        }
        prop_assert_eq!(check_pairing(&history.to_vec()), Ok(()));
        let (same, repair) = history.repaired();
        prop_assert!(repair.is_empty());
        prop_assert_eq!(same, history.to_vec());
        prop_assert_eq!(&history.filter_unfinished_tool_calls(), &history);
    }
}
