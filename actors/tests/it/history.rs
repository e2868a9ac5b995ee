//! Semantics §3 as data: each operation on `History` is checked against the
//! examples of the spec (verbatim) and the invariants it names.

use std::sync::Arc;

use arbor_actors::history::{Expiry, History, PairingError, Repair, check_pairing};
use arbor_actors::message::{Content, Message, Meta, Part, TOOL_CALL_ERROR, TimeToLive, ToolCall};
use serde_json::json;

// ---------------------------------------------------------------- helpers

fn call(id: &str) -> ToolCall {
    ToolCall {
        tool_call_id: id.to_owned(),
        tool_name: format!("tool_{id}"),
        input: json!({}).into(),
    }
}

fn sys(text: &str) -> Message {
    Message::system(text)
}

fn u(text: &str) -> Message {
    Message::user(text)
}

fn a(text: &str) -> Message {
    Message::assistant_text(text)
}

/// An assistant message with text parts and calls: `A(text t, call X)`.
fn a_text_call(text: &str, ids: &[&str]) -> Message {
    Message::assistant(
        Some(text.to_owned()),
        ids.iter().map(|id| call(id)).collect(),
    )
}

/// An assistant message made only of calls: `A(call X, call Y)`.
fn a_call(ids: &[&str]) -> Message {
    Message::assistant(None, ids.iter().map(|id| call(id)).collect())
}

/// An assistant message with text only, in parts form: `A(text t)`.
fn a_parts(text: &str) -> Message {
    Message::assistant(Some(text.to_owned()), Vec::new())
}

/// The result of call `id`: `T(X)`.
fn t(id: &str) -> Message {
    Message::tool_result(&call(id), json!({"answer": id}))
}

fn t_err(id: &str) -> Message {
    Message::tool_error(&call(id), "boom")
}

fn ttl(m: Message, ttl: TimeToLive) -> Message {
    m.with_ttl(ttl)
}

fn keep(mut m: Message) -> Message {
    m.meta_mut().keep_during_truncation = Some(true);
    m
}

fn h(messages: Vec<Message>) -> History {
    messages.into_iter().collect()
}

fn values(messages: &[Arc<Message>]) -> Vec<Message> {
    messages.iter().map(|m| (**m).clone()).collect()
}

fn hvalues(history: &History) -> Vec<Message> {
    history.iter().map(|m| (**m).clone()).collect()
}

fn arcs(messages: Vec<Message>) -> Vec<Arc<Message>> {
    messages.into_iter().map(Arc::new).collect()
}

// ------------------------------------------------- one check per operation

fn check_filter(input: Vec<Message>, expected: Vec<Message>) {
    let out = h(input.clone()).filter_unfinished_tool_calls();
    assert_eq!(
        hvalues(&out),
        expected,
        "filterUnfinishedToolCalls({input:?})"
    );
}

fn check_last_turn(input: Vec<Message>, expected: Vec<Message>) {
    let out = h(input.clone()).last_assistant_turn();
    assert_eq!(values(&out), expected, "lastAssistantTurn({input:?})");
}

fn check_expire(at: Expiry, input: Vec<Message>, expected: Vec<Message>) {
    let out = h(input.clone()).expire(at);
    assert_eq!(hvalues(&out), expected, "expire({at:?}, {input:?})");
}

fn check_repaired(
    input: Vec<Message>,
    expected: Vec<Message>,
    unanswered: &[&str],
    orphans: &[&str],
) {
    let (out, repair) = h(input.clone()).repaired();
    assert_eq!(values(&out), expected, "repaired({input:?})");
    assert_eq!(
        repair,
        Repair {
            unanswered_calls: unanswered.iter().map(|s| (*s).to_owned()).collect(),
            orphan_results: orphans.iter().map(|s| (*s).to_owned()).collect(),
        },
        "repair report of {input:?}"
    );
    assert_eq!(check_pairing(&out), Ok(()), "repaired output must pair");
}

fn check_pairs(input: Vec<Message>, expected: Result<(), PairingError>) {
    assert_eq!(
        check_pairing(&arcs(input.clone())),
        expected,
        "check_pairing({input:?})"
    );
}

// ------------------------------------------------ filterUnfinishedToolCalls

#[test]
fn filter_spec_example_drops_the_unanswered_call_and_keeps_the_text() {
    // [sys, U, A(text t, call X), A(call Y), T(Y)] → [sys, U, A(text t), A(call Y), T(Y)]
    check_filter(
        vec![
            sys("s"),
            u("u"),
            a_text_call("t", &["X"]),
            a_call(&["Y"]),
            t("Y"),
        ],
        vec![sys("s"), u("u"), a_parts("t"), a_call(&["Y"]), t("Y")],
    );
}

#[test]
fn filter_spec_example_drops_an_assistant_message_left_empty() {
    // [A(call X)] → []
    check_filter(vec![a_call(&["X"])], vec![]);
}

#[test]
fn filter_cases() {
    // Nothing to do: the same history comes back.
    check_filter(
        vec![u("q"), a_call(&["X"]), t("X"), a("done")],
        vec![u("q"), a_call(&["X"]), t("X"), a("done")],
    );
    // Only the unanswered call of a message goes.
    check_filter(
        vec![u("q"), a_call(&["X", "Y", "Z"]), t("Y")],
        vec![u("q"), a_call(&["Y"]), t("Y")],
    );
    // Non-assistant messages are kept as they are, orphan results included.
    check_filter(
        vec![sys("s"), t("orphan"), u("q"), a_call(&["X"])],
        vec![sys("s"), t("orphan"), u("q")],
    );
    // "Answered" looks at the whole history, not at position.
    check_filter(
        vec![a_call(&["X"]), u("between"), t("X")],
        vec![a_call(&["X"]), u("between"), t("X")],
    );
    check_filter(vec![], vec![]);
}

// ------------------------------------------------------- lastAssistantTurn

#[test]
fn last_turn_spec_examples() {
    // [U, A1, A2, T1, T2] → [A1, A2, T1, T2]
    let (a1, a2) = (a_call(&["1"]), a_call(&["2"]));
    check_last_turn(
        vec![u("q"), a1.clone(), a2.clone(), t("1"), t("2")],
        vec![a1, a2, t("1"), t("2")],
    );
    // [A0, U, A1, T1] → [A1, T1]
    let a1 = a_call(&["1"]);
    check_last_turn(vec![a("a0"), u("q"), a1.clone(), t("1")], vec![a1, t("1")]);
}

#[test]
fn last_turn_cases() {
    // Empty history, or no assistant message at all → empty.
    check_last_turn(vec![], vec![]);
    check_last_turn(vec![sys("s"), u("q")], vec![]);
    // Messages tagged TOOL_CALL_ERROR are skipped.
    check_last_turn(
        vec![u("q"), a_call(&["1", "2"]), t("1"), t_err("2")],
        vec![a_call(&["1", "2"]), t("1")],
    );
    // The turn starts at the last assistant run: earlier tool traffic is not in it.
    check_last_turn(
        vec![u("q"), a_call(&["1"]), t("1"), a("answer")],
        vec![a("answer")],
    );
    // Collection stops at a user message after the turn.
    check_last_turn(
        vec![u("q"), a_call(&["1"]), t("1"), u("follow-up")],
        vec![a_call(&["1"]), t("1")],
    );
    let tagged_assistant = a("oops").with_tag(TOOL_CALL_ERROR);
    check_last_turn(vec![u("q"), a("x"), tagged_assistant], vec![a("x")]);
    // Collection stops at the first user or system message after the start.
    check_last_turn(vec![u("q"), a("a1"), sys("note"), a("a2")], vec![a("a2")]);
    // Directly preceding assistant messages are part of the turn.
    check_last_turn(
        vec![u("q"), a("a1"), a("a2"), a("a3")],
        vec![a("a1"), a("a2"), a("a3")],
    );
}

// ------------------------------------------------------------------ expiry

#[test]
fn expiry_at_step_start_removes_agent_step_messages_only() {
    check_expire(
        Expiry::StepStart,
        vec![
            u("q"),
            ttl(u("step note"), TimeToLive::AgentStep),
            ttl(u("prompt note"), TimeToLive::UserPrompt),
            a("r"),
        ],
        vec![
            u("q"),
            ttl(u("prompt note"), TimeToLive::UserPrompt),
            a("r"),
        ],
    );
}

#[test]
fn expiry_at_turn_end_removes_user_prompt_messages_too() {
    check_expire(
        Expiry::TurnEnd,
        vec![
            u("q"),
            ttl(u("step note"), TimeToLive::AgentStep),
            ttl(u("prompt note"), TimeToLive::UserPrompt),
            a("r"),
        ],
        vec![u("q"), a("r")],
    );
}

#[test]
fn expiry_without_expiring_messages_changes_nothing() {
    let history = h(vec![u("q"), a("r")]);
    let out = history.expire(Expiry::TurnEnd);
    assert_eq!(out, history);
    assert!(
        out.iter()
            .zip(history.iter())
            .all(|(x, y)| Arc::ptr_eq(x, y))
    );
}

// ------------------------------------------------------ repair and pairing

#[test]
fn repaired_keeps_a_valid_history_as_it_is() {
    let input = vec![
        sys("s"),
        u("q"),
        a_call(&["X", "Y"]),
        t("X"),
        t("Y"),
        a("done"),
    ];
    check_repaired(input.clone(), input, &[], &[]);
}

#[test]
fn repaired_drops_unanswered_calls_and_reports_them() {
    check_repaired(
        vec![
            u("q"),
            a_text_call("t", &["X", "Y"]),
            t("Y"),
            a_call(&["Z"]),
        ],
        vec![u("q"), a_text_call("t", &["Y"]), t("Y")],
        &["X", "Z"],
        &[],
    );
}

#[test]
fn repaired_drops_orphan_and_duplicate_results_and_reports_them() {
    check_repaired(
        vec![
            t("early"),
            u("q"),
            a_call(&["X"]),
            t("X"),
            t("X"),
            t("nobody"),
        ],
        vec![u("q"), a_call(&["X"]), t("X")],
        &[],
        &["early", "X", "nobody"],
    );
    // A result that comes before its call does not answer it.
    check_repaired(
        vec![u("q"), t("X"), a_call(&["X"])],
        vec![u("q")],
        &["X"],
        &["X"],
    );
}

#[test]
fn repaired_keeps_one_pair_per_reused_call_id() {
    // A model that reuses an id across steps: the second call has no result of
    // its own, so the request may not contain it.
    check_repaired(
        vec![u("q"), a_call(&["X"]), t("X"), a_call(&["X"]), t("X")],
        vec![u("q"), a_call(&["X"]), t("X")],
        &["X"],
        &["X"],
    );
    check_repaired(
        vec![u("q"), a_call(&["X", "X"]), t("X")],
        vec![u("q"), a_call(&["X"]), t("X")],
        &["X"],
        &[],
    );
}

#[test]
fn check_pairing_cases() {
    check_pairs(vec![], Ok(()));
    check_pairs(vec![u("q"), a_call(&["X"]), t("X")], Ok(()));
    // By id, not by position.
    check_pairs(vec![a_call(&["X", "Y"]), t("Y"), t("X")], Ok(()));
    check_pairs(
        vec![u("q"), a_call(&["X"])],
        Err(PairingError::Unanswered("X".into())),
    );
    check_pairs(
        vec![u("q"), a_call(&["X", "Y"]), t("X")],
        Err(PairingError::Unanswered("Y".into())),
    );
    check_pairs(vec![u("q"), t("X")], Err(PairingError::Orphan("X".into())));
    check_pairs(
        vec![t("X"), a_call(&["X"]), t("X")],
        Err(PairingError::Orphan("X".into())),
    );
    check_pairs(
        vec![a_call(&["X"]), t("X"), t("X")],
        Err(PairingError::Duplicate("X".into())),
    );
    check_pairs(
        vec![a_call(&["X"]), t("X"), a_call(&["X"])],
        Err(PairingError::DuplicateCall("X".into())),
    );
    check_pairs(
        vec![a_call(&["X"]), t("X"), a_call(&["X"]), t("X")],
        Err(PairingError::DuplicateCall("X".into())),
    );
    check_pairs(
        vec![a_call(&["X", "X"]), t("X")],
        Err(PairingError::DuplicateCall("X".into())),
    );
}

// --------------------------------------------------------------- truncation

/// A user message of about `tokens` estimated tokens.
fn big_user(tag: &str, tokens: usize) -> Message {
    u(&format!(
        "{tag}:{}",
        "x".repeat(tokens.saturating_sub(5) * 4)
    ))
}

fn big_assistant(tag: &str, tokens: usize, ids: &[&str]) -> Message {
    a_text_call(
        &format!("{tag}:{}", "x".repeat(tokens.saturating_sub(5) * 4)),
        ids,
    )
}

fn is_placeholder(m: &Message) -> bool {
    matches!(m, Message::User { content: Content::Text(text), .. }
        if text.contains("removed to fit the context window"))
}

fn placeholder_count(m: &Message) -> usize {
    let text = m.text();
    let digits: String = text
        .trim_start_matches('[')
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

fn tokens(messages: &[Arc<Message>]) -> u64 {
    messages.iter().map(|m| m.estimated_tokens()).sum()
}

#[test]
fn truncation_is_a_no_op_when_the_history_fits() {
    let messages = arcs(vec![u("q"), a("r")]);
    let view = History::truncated_view(&messages, tokens(&messages));
    assert_eq!(view.len(), 2);
    assert!(view.iter().zip(&messages).all(|(x, y)| Arc::ptr_eq(x, y)));
}

#[test]
fn truncation_keeps_pinned_and_newest_messages_and_marks_each_gap() {
    let history = h(vec![
        keep(sys("pinned system")),
        big_user("old1", 100),
        big_assistant("old2", 100, &[]),
        keep(u("pinned middle")),
        big_user("old3", 100),
        big_user("old4", 100),
        big_user("newest", 300),
    ]);
    let before = history.clone();
    let messages = history.to_vec();
    let view = History::truncated_view(&messages, 350);
    let texts: Vec<String> = view.iter().map(|m| m.text()).collect();
    assert_eq!(view.len(), 5, "{texts:?}");
    assert_eq!(view[0].text(), "pinned system");
    assert!(
        is_placeholder(&view[1]) && placeholder_count(&view[1]) == 2,
        "{texts:?}"
    );
    assert_eq!(view[2].text(), "pinned middle");
    assert!(
        is_placeholder(&view[3]) && placeholder_count(&view[3]) == 2,
        "{texts:?}"
    );
    assert!(view[4].text().starts_with("newest:"));
    // Kept messages are the stored ones, not copies.
    assert!(Arc::ptr_eq(&view[0], &messages[0]));
    assert!(Arc::ptr_eq(&view[4], &messages[6]));
    // The history itself is untouched.
    assert_eq!(history, before);
    assert_eq!(history.len(), 7);
}

#[test]
fn truncation_removes_only_what_it_must() {
    let messages = arcs(vec![
        big_user("old1", 100),
        big_user("old2", 100),
        big_user("old3", 100),
        big_user("newest", 10),
    ]);
    // 310 tokens; a budget of 250 needs one unit gone.
    let view = History::truncated_view(&messages, 250);
    assert_eq!(view.len(), 4);
    assert!(is_placeholder(&view[0]));
    assert_eq!(placeholder_count(&view[0]), 1);
    assert!(view[1].text().starts_with("old2:"));
}

#[test]
fn truncation_keeps_the_newest_message_even_over_budget() {
    let messages = arcs(vec![big_user("old", 50), big_user("huge", 1000)]);
    let view = History::truncated_view(&messages, 10);
    assert_eq!(view.len(), 2);
    assert!(is_placeholder(&view[0]));
    assert!(view[1].text().starts_with("huge:"));
}

#[test]
fn truncation_never_splits_a_call_from_its_results() {
    let messages = arcs(vec![
        u("q"),
        big_assistant("calls", 50, &["X", "Y"]),
        t("X"),
        t("Y"),
        big_user("big", 200),
        a_call(&["Z"]),
        t("Z"),
    ]);
    for budget in [0, 20, 60, 100, 200, 250, 400] {
        let view = History::truncated_view(&messages, budget);
        assert_eq!(check_pairing(&view), Ok(()), "budget {budget}: {view:?}");
        let calls = view.iter().filter(|m| m.tool_calls().count() > 0).count();
        let results = view.iter().filter(|m| m.answers().is_some()).count();
        assert!(
            (calls, results) == (2, 3) || (calls, results) == (1, 1),
            "budget {budget}: {calls} calls, {results} results"
        );
    }
}

#[test]
fn truncation_never_splits_a_call_from_a_result_that_is_not_adjacent() {
    // Pairing is by id, so a valid history may have other messages between a
    // call and its result (e.g. after `set_messages`).
    let messages = arcs(vec![
        big_assistant("calls", 100, &["X"]),
        big_user("between", 100),
        t("X"),
        big_user("newest", 10),
    ]);
    assert_eq!(check_pairing(&messages), Ok(()));
    for budget in [0, 50, 150, 250] {
        let view = History::truncated_view(&messages, budget);
        assert_eq!(check_pairing(&view), Ok(()), "budget {budget}: {view:?}");
        assert!(view.last().unwrap().text().starts_with("newest:"));
    }
}

// ------------------------------------------------------------------ sharing

#[test]
fn a_cloned_history_shares_every_message_body() {
    let history = h(vec![sys("s"), u("q"), a_call(&["X"]), t("X"), a("r")]);
    let copy = history.clone();
    assert_eq!(copy.len(), history.len());
    assert!(
        copy.iter()
            .zip(history.iter())
            .all(|(x, y)| Arc::ptr_eq(x, y))
    );
    // A copy that grows does not change the original.
    let mut grown = copy.clone();
    grown.push(u("more"));
    assert_eq!(history.len(), 5);
    assert_eq!(grown.len(), 6);
    assert!(
        grown
            .iter()
            .zip(history.iter())
            .all(|(x, y)| Arc::ptr_eq(x, y))
    );
}

#[test]
fn a_filtered_snapshot_shares_the_messages_it_keeps_unchanged() {
    let history = h(vec![
        sys("s"),
        u("q"),
        a_text_call("t", &["X"]),
        a_call(&["Y"]),
        t("Y"),
    ]);
    let snapshot = history.filter_unfinished_tool_calls();
    assert_eq!(snapshot.len(), 5);
    for i in [0, 1, 3, 4] {
        assert!(
            Arc::ptr_eq(snapshot.get(i).unwrap(), history.get(i).unwrap()),
            "message {i} was copied"
        );
    }
    // The one message that changed is new, and the original keeps its call.
    assert!(!Arc::ptr_eq(
        snapshot.get(2).unwrap(),
        history.get(2).unwrap()
    ));
    assert_eq!(history.get(2).unwrap().tool_calls().count(), 1);
    // With nothing to filter, the whole snapshot is shared.
    let done = h(vec![u("q"), a_call(&["X"]), t("X")]);
    let snap = done.filter_unfinished_tool_calls();
    assert!(snap.iter().zip(done.iter()).all(|(x, y)| Arc::ptr_eq(x, y)));
}

#[test]
fn skip_and_retain_share_message_bodies() {
    let history = h(vec![u("q"), a("r1"), a("r2")]);
    let tail = history.skip(1);
    assert_eq!(tail.len(), 2);
    assert!(Arc::ptr_eq(tail.get(0).unwrap(), history.get(1).unwrap()));
    assert!(history.skip(3).is_empty());
    let kept = history.retain(|m| m.is_assistant());
    assert!(Arc::ptr_eq(kept.get(1).unwrap(), history.get(2).unwrap()));
}

// --------------------------------------------------------------- wire form

#[test]
fn a_history_serialises_as_a_plain_message_array() {
    let history = h(vec![u("q"), a_call(&["X"]), t("X")]);
    let wire = serde_json::to_value(&history).unwrap();
    assert_eq!(
        wire,
        json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [
                {"type": "tool-call", "toolCallId": "X", "toolName": "tool_X", "input": {}}
            ]},
            {"role": "tool", "toolCallId": "X", "toolName": "tool_X",
             "content": [{"type": "json", "value": {"answer": "X"}}]}
        ])
    );
    let back: History = serde_json::from_value(wire).unwrap();
    assert_eq!(back, history);
    // Parts and metadata survive too.
    let m = Message::User {
        content: Content::Parts(vec![Part::Text { text: "x".into() }]),
        meta: Meta {
            tags: vec!["T".into()],
            ..Meta::default()
        },
    };
    let back: History =
        serde_json::from_value(serde_json::to_value(h(vec![m.clone()])).unwrap()).unwrap();
    assert_eq!(hvalues(&back), vec![m]);
}

#[test]
fn an_agents_prompt_survives_truncation_of_a_long_history() {
    use arbor_actors::message::{INSTRUCTIONS_PROMPT, SPAWN_PROMPT};
    let history = h(vec![
        u("the task").with_tag(SPAWN_PROMPT),
        u("the instructions").with_tag(INSTRUCTIONS_PROMPT),
        big_assistant("work1", 200, &[]),
        big_user("more", 200),
        big_assistant("work2", 200, &[]),
        big_user("newest", 100),
    ]);
    let messages = history.to_vec();
    let view = History::truncated_view(&messages, 150);
    let texts: Vec<String> = view.iter().map(|m| m.text()).collect();
    assert_eq!(view[0].text(), "the task", "{texts:?}");
    assert_eq!(view[1].text(), "the instructions", "{texts:?}");
    assert!(is_placeholder(&view[2]), "{texts:?}");
    assert!(
        view.last().unwrap().text().starts_with("newest"),
        "{texts:?}"
    );
}
