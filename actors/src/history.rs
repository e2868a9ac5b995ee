//! The conversation as an immutable, structurally shared value (semantics §3).
//!
//! A `History` is a persistent vector of `Arc<Message>` plus a short list of
//! the newest messages: cloning it for a child or a snapshot copies at most
//! [`TAIL_MAX`] pointers and never a message body. The agent actor is the
//! single owner of its current history; everyone else holds snapshots.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use imbl::Vector;
use imbl::shared_ptr::DefaultSharedPtr;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::message::{INSTRUCTIONS_PROMPT, Message, SPAWN_PROMPT, TOOL_CALL_ERROR, TimeToLive};

/// The messages, plus what is known about them so the hot paths need no scan:
/// the calls still open, results that answered nothing, every call id used,
/// messages with a time to live, and an estimate of the tokens. Kept up to date
/// on `push`; rebuilt by the bulk operations that already walk every message.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// The older messages, shared with the histories this one was copied
    /// from and to.
    shared: Vector<Arc<Message>>,
    /// The newest messages (at most [`TAIL_MAX`]), after `shared`'s.
    tail: Vec<Arc<Message>>,
    /// Ids of calls with no result yet, in call order (usually the last step's).
    open: Vec<Arc<str>>,
    /// Results that answered no open call, and calls that reused an id.
    broken: u32,
    /// Every tool call id in the history (shared structure, O(1) to clone).
    ids: imbl::HashSet<Arc<str>>,
    /// Messages with a `timeToLive`.
    ttl: u32,
    tokens: u64,
}

/// How many of the newest messages a history keeps outside its persistent
/// vector. A child appends its own messages to a short list of its own
/// instead of to the vector it shares with its parent: a push there copies
/// the vector's last chunk (64 pointers, ~530 bytes) for every child
/// (issue 17). Every clone copies the list, so it stays short.
pub const TAIL_MAX: usize = 16;

impl PartialEq for History {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

/// The messages of a [`History`], oldest first.
#[derive(Clone)]
pub struct Iter<'a> {
    shared: imbl::vector::Iter<'a, Arc<Message>, DefaultSharedPtr>,
    tail: std::slice::Iter<'a, Arc<Message>>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Arc<Message>;

    fn next(&mut self) -> Option<Self::Item> {
        self.shared.next().or_else(|| self.tail.next())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let len = self.shared.len() + self.tail.len();
        (len, Some(len))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.tail.next_back().or_else(|| self.shared.next_back())
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl std::iter::FusedIterator for Iter<'_> {}

/// When expiry runs: at the start of a step, or at the end of a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// A step starts: `agentStep` messages expire.
    StepStart,
    /// A turn ends: `agentStep` and `userPrompt` messages expire.
    TurnEnd,
}

/// What `repaired` had to drop to make a history valid for a model request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Repair {
    /// Ids of tool calls dropped because no result answers them.
    pub unanswered_calls: Vec<String>,
    /// Ids of tool results dropped because they answer no call.
    pub orphan_results: Vec<String>,
}

impl Repair {
    /// Whether nothing was dropped.
    pub fn is_empty(&self) -> bool {
        self.unanswered_calls.is_empty() && self.orphan_results.is_empty()
    }
}

/// Why a message list breaks the pairing invariant.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PairingError {
    /// A tool call (by id) has no result before the next model request.
    #[error("tool call {0} has no result before the next model request")]
    Unanswered(String),
    /// A tool result (by call id) answers no earlier tool call.
    #[error("tool result {0} answers no earlier tool call")]
    Orphan(String),
    /// A tool call (by id) is answered more than once.
    #[error("tool call {0} is answered more than once")]
    Duplicate(String),
    /// Two tool calls use the same id.
    #[error("tool call id {0} is used by more than one call")]
    DuplicateCall(String),
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of messages.
    pub fn len(&self) -> usize {
        self.shared.len() + self.tail.len()
    }

    /// Estimated tokens of every message (maintained, not recomputed).
    pub fn estimated_tokens(&self) -> u64 {
        self.tokens
    }

    /// Whether a new tool call may not use this id: a call already has it, or a
    /// result does (only possible in a history with orphan results).
    pub fn id_taken(&self, id: &str) -> bool {
        self.ids.contains(id) || (self.broken > 0 && self.iter().any(|m| m.answers() == Some(id)))
    }

    /// Every call answered by one later result and every result answering an
    /// earlier call: what a model may receive as is.
    pub fn is_paired(&self) -> bool {
        self.open.is_empty() && self.broken == 0
    }

    fn note(&mut self, message: &Message) {
        if message.meta().time_to_live.is_some() {
            self.ttl += 1;
        }
        self.tokens += message.estimated_tokens();
        for call in message.tool_calls() {
            let id: Arc<str> = Arc::from(call.tool_call_id.as_str());
            if self.ids.insert(id.clone()).is_some() {
                self.broken += 1;
            } else {
                self.open.push(id);
            }
        }
        if let Some(id) = message.answers() {
            match self.open.iter().position(|o| &**o == id) {
                Some(pos) => {
                    self.open.remove(pos);
                }
                None => self.broken += 1,
            }
        }
    }

    /// Whether it has no message.
    pub fn is_empty(&self) -> bool {
        self.shared.is_empty() && self.tail.is_empty()
    }

    /// Appends a message.
    pub fn push(&mut self, message: Message) {
        self.push_shared(Arc::new(message));
    }

    /// Appends a message already shared (its body is not copied).
    pub fn push_shared(&mut self, message: Arc<Message>) {
        self.note(&message);
        if self.tail.len() >= TAIL_MAX {
            self.shared.extend(self.tail.drain(..));
        }
        self.tail.push(message);
    }

    /// Takes the newest message off (the caller keeps the summaries right).
    fn pop(&mut self) -> Option<Arc<Message>> {
        self.tail.pop().or_else(|| self.shared.pop_back())
    }

    /// This history with its leading messages that equal `other`'s replaced by
    /// `other`'s own `Arc`s. A history read back from a store holds copies;
    /// this makes it share (and compare by address) with the live one again.
    pub(crate) fn sharing_prefix_with(&self, other: &History) -> History {
        let shared = self
            .iter()
            .zip(other.iter())
            .take_while(|(a, b)| Arc::ptr_eq(a, b) || a == b)
            .count();
        other
            .iter()
            .take(shared)
            .chain(self.iter().skip(shared))
            .cloned()
            .collect()
    }

    /// The messages, oldest first.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            shared: self.shared.iter(),
            tail: self.tail.iter(),
        }
    }

    /// The messages from `start` on. The shared part is split (O(log n)), not
    /// walked.
    fn from(&self, start: usize) -> impl Iterator<Item = &Arc<Message>> {
        let shared_len = self.shared.len();
        let (shared, tail) = if start < shared_len {
            (Some(self.shared.focus().narrow(start..)), &self.tail[..])
        } else {
            (
                None,
                &self.tail[(start - shared_len).min(self.tail.len())..],
            )
        };
        shared.into_iter().flat_map(|f| f.into_iter()).chain(tail)
    }

    /// The message at `index` (0 is the oldest), if there is one.
    pub fn get(&self, index: usize) -> Option<&Arc<Message>> {
        match index.checked_sub(self.shared.len()) {
            Some(i) => self.tail.get(i),
            None => self.shared.get(index),
        }
    }

    /// The newest message, if any.
    pub fn last(&self) -> Option<&Arc<Message>> {
        self.tail.last().or_else(|| self.shared.last())
    }

    /// This history with the message `old` (by address) replaced by `new`;
    /// the same history when `old` is not in it. The other messages are
    /// shared, not copied; the summaries are rebuilt.
    pub fn replace(&self, old: &Arc<Message>, new: Arc<Message>) -> History {
        if !self.iter().rev().any(|m| Arc::ptr_eq(m, old)) {
            return self.clone();
        }
        self.iter()
            .map(|m| {
                if Arc::ptr_eq(m, old) {
                    new.clone()
                } else {
                    m.clone()
                }
            })
            .collect()
    }

    /// The messages from `start` on, sharing their bodies.
    pub fn skip(&self, start: usize) -> History {
        self.from(start).cloned().collect()
    }

    /// The messages as a vector, sharing their bodies.
    pub fn to_vec(&self) -> Vec<Arc<Message>> {
        self.iter().cloned().collect()
    }

    /// Keeps the messages for which `keep` is true.
    pub fn retain(&self, keep: impl Fn(&Message) -> bool) -> History {
        self.iter().filter(|m| keep(m)).cloned().collect()
    }

    /// `filterUnfinishedToolCalls`: drops tool calls that have no result anywhere in
    /// the history, and assistant messages left empty by that. Idempotent.
    pub fn filter_unfinished_tool_calls(&self) -> History {
        if self.is_paired() {
            return self.clone();
        }
        // The common case, a spawn mid-step: every open call is in the last
        // message and nothing else is broken. Only that message changes.
        if self.broken == 0
            && let Some(last) = self.last()
        {
            let in_last = |id: &Arc<str>| last.tool_calls().any(|c| c.tool_call_id == **id);
            if self.open.iter().all(in_last) {
                let open = &self.open;
                let mut out = self.clone();
                out.pop();
                if last.meta().time_to_live.is_some() {
                    out.ttl -= 1;
                }
                out.tokens -= last.estimated_tokens();
                for call in last.tool_calls() {
                    out.ids.remove(call.tool_call_id.as_str());
                }
                out.open.clear();
                if let Some(kept) =
                    last.retain_calls(|c| !open.iter().any(|o| **o == *c.tool_call_id))
                {
                    out.push(kept);
                }
                return out;
            }
        }
        let answered: HashSet<&str> = self.iter().filter_map(|m| m.answers()).collect();
        let needs_change = |m: &Message| {
            m.tool_calls()
                .any(|c| !answered.contains(c.tool_call_id.as_str()))
        };
        if !self.iter().any(|m| needs_change(m)) {
            return self.clone();
        }
        self.iter()
            .filter_map(|m| {
                if !needs_change(m) {
                    return Some(m.clone());
                }
                m.retain_calls(|c| answered.contains(c.tool_call_id.as_str()))
                    .map(Arc::new)
            })
            .collect()
    }

    /// `lastAssistantTurn`: the final run of assistant and tool messages that ends
    /// the conversation, without messages tagged `TOOL_CALL_ERROR`.
    pub fn last_assistant_turn(&self) -> Vec<Arc<Message>> {
        let Some(mut start) = self.iter().rposition(|m| m.is_assistant()) else {
            return Vec::new();
        };
        while start > 0 && self.get(start - 1).is_some_and(|m| m.is_assistant()) {
            start -= 1;
        }
        self.from(start)
            .take_while(|m| m.is_assistant() || m.answers().is_some())
            .filter(|m| !m.has_tag(TOOL_CALL_ERROR))
            .cloned()
            .collect()
    }

    /// Removes the messages whose time to live has run out.
    pub fn expire(&self, at: Expiry) -> History {
        if !self.expires_any(at) {
            return self.clone();
        }
        self.retain(|m| !expired(m, at))
    }

    /// Whether `expire` at `at` would remove a message (O(1) when no message
    /// has a time to live, the usual case), so a caller can skip the copy.
    pub fn expires_any(&self, at: Expiry) -> bool {
        self.ttl > 0 && self.iter().any(|m| expired(m, at))
    }

    /// The history a model request carries: the history itself (O(1)) when it is
    /// paired, else the repaired copy and what was dropped.
    pub fn request_view(&self) -> (History, Repair) {
        if self.is_paired() {
            return (self.clone(), Repair::default());
        }
        let (messages, repair) = self.repaired();
        (messages.into_iter().collect(), repair)
    }

    /// The history as a model may receive it: every tool call answered by exactly
    /// one later result, every result answering an earlier call. What had to be
    /// dropped is reported so the caller can emit a warning.
    pub fn repaired(&self) -> (Vec<Arc<Message>>, Repair) {
        let mut repair = Repair::default();
        // Results that answer a call made earlier; the first one per id wins.
        let mut called: HashSet<&str> = HashSet::new();
        let mut answered: HashSet<&str> = HashSet::new();
        let mut keep_result = vec![true; self.len()];
        for (i, m) in self.iter().enumerate() {
            for call in m.tool_calls() {
                called.insert(&call.tool_call_id);
            }
            if let Some(id) = m.answers()
                && (!called.contains(id) || !answered.insert(id))
            {
                keep_result[i] = false;
                repair.orphan_results.push(id.to_owned());
            }
        }
        let mut out = Vec::with_capacity(self.len());
        let mut kept_calls: HashSet<&str> = HashSet::new();
        for (i, m) in self.iter().enumerate() {
            if !keep_result[i] {
                continue;
            }
            // A call is kept when answered and the first call with its id (a reused
            // id has no result of its own).
            let keep: Vec<bool> = m
                .tool_calls()
                .map(|c| {
                    let id = c.tool_call_id.as_str();
                    answered.contains(id) && kept_calls.insert(id)
                })
                .collect();
            if keep.iter().all(|k| *k) {
                out.push(m.clone());
                continue;
            }
            for (call, kept) in m.tool_calls().zip(&keep) {
                if !kept {
                    repair.unanswered_calls.push(call.tool_call_id.clone());
                }
            }
            let next = std::cell::Cell::new(0);
            if let Some(kept) = m.retain_calls(|_| {
                let i = next.get();
                next.set(i + 1);
                keep[i]
            }) {
                out.push(Arc::new(kept));
            }
        }
        (out, repair)
    }

    /// A view that fits `max_tokens` (estimated), for one model request. Keeps
    /// messages marked `keepDuringTruncation` and the newest message, never splits
    /// a tool call from its results, and puts one placeholder where each run of
    /// messages was removed. Of an agent's inputs (its prompts and
    /// instructions, kept by their tags), only the current turn's are kept: the
    /// last run of them; an ended turn's prompt may be cut like any message,
    /// as Codebuff lets older prompts be truncated. The history itself is not
    /// changed.
    pub fn truncated_view(messages: &[Arc<Message>], max_tokens: u64) -> Vec<Arc<Message>> {
        let total: u64 = messages.iter().map(|m| m.estimated_tokens()).sum();
        if total <= max_tokens {
            return messages.to_vec();
        }
        let current = current_input(messages);
        let kept = |i: usize, m: &Message| {
            if m.has_tag(SPAWN_PROMPT) || m.has_tag(INSTRUCTIONS_PROMPT) {
                i >= current
            } else {
                m.keep_during_truncation()
            }
        };
        let units = units(messages);
        let mut removed = vec![false; units.len()];
        let mut excess = total.saturating_sub(max_tokens);
        for (u, range) in units.iter().enumerate() {
            if excess == 0 || u + 1 == units.len() {
                break;
            }
            if range.clone().any(|i| kept(i, &messages[i])) {
                continue;
            }
            let unit = &messages[range.clone()];
            removed[u] = true;
            let tokens: u64 = unit.iter().map(|m| m.estimated_tokens()).sum();
            excess = excess.saturating_sub(tokens);
        }
        let mut out = Vec::new();
        let mut gap = 0usize;
        for (u, range) in units.into_iter().enumerate() {
            if removed[u] {
                gap += range.len();
                continue;
            }
            if gap > 0 {
                out.push(Arc::new(placeholder(gap)));
                gap = 0;
            }
            out.extend(messages[range].iter().cloned());
        }
        out
    }
}

/// Checks the pairing invariant (by id) on a message list a model is about to
/// receive: each call answered by exactly one later result, no result without an
/// earlier call, no call id used twice.
pub fn check_pairing<'a>(
    messages: impl IntoIterator<Item = &'a Arc<Message>>,
) -> Result<(), PairingError> {
    // Calls in order (the first unanswered one is the one reported) plus a
    // set to look them up: linear in the history, not quadratic.
    let mut calls: Vec<&str> = Vec::new();
    let mut known: HashSet<&str> = HashSet::new();
    let mut answered: HashSet<&str> = HashSet::new();
    for m in messages {
        if let Some(id) = m.answers() {
            if !known.contains(id) {
                return Err(PairingError::Orphan(id.to_owned()));
            }
            if !answered.insert(id) {
                return Err(PairingError::Duplicate(id.to_owned()));
            }
        }
        for call in m.tool_calls() {
            let id = call.tool_call_id.as_str();
            if !known.insert(id) {
                return Err(PairingError::DuplicateCall(id.to_owned()));
            }
            calls.push(id);
        }
    }
    match calls.into_iter().find(|id| !answered.contains(id)) {
        Some(id) => Err(PairingError::Unanswered(id.to_owned())),
        None => Ok(()),
    }
}

/// Splits messages into units that truncation keeps or removes whole: an
/// assistant message up to the last result of its calls (pairing is by id, so
/// other messages may lie between; they join the unit), or one message.
fn units(messages: &[Arc<Message>]) -> Vec<std::ops::Range<usize>> {
    let mut result_at: HashMap<&str, usize> = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        if let Some(id) = m.answers() {
            result_at.entry(id).or_insert(i);
        }
    }
    let mut units = Vec::new();
    let mut i = 0;
    while i < messages.len() {
        let mut end = i + 1;
        let mut j = i;
        while j < end {
            for call in messages[j].tool_calls() {
                if let Some(&r) = result_at.get(call.tool_call_id.as_str()) {
                    end = end.max(r + 1);
                }
            }
            j += 1;
        }
        units.push(i..end);
        i = end;
    }
    units
}

/// Where the current turn's input starts: the first of the last run of
/// messages tagged `SPAWN_PROMPT` or `INSTRUCTIONS_PROMPT` (the length when
/// there is none). Each turn appends its prompt and instructions together.
fn current_input(messages: &[Arc<Message>]) -> usize {
    let input = |m: &Arc<Message>| m.has_tag(SPAWN_PROMPT) || m.has_tag(INSTRUCTIONS_PROMPT);
    let Some(last) = messages.iter().rposition(input) else {
        return messages.len();
    };
    messages[..last]
        .iter()
        .rposition(|m| !input(m))
        .map_or(0, |i| i + 1)
}

/// Whether `m`'s time to live has run out at `at`.
pub fn expired(m: &Message, at: Expiry) -> bool {
    matches!(
        (m.meta().time_to_live, at),
        (Some(TimeToLive::AgentStep), _) | (Some(TimeToLive::UserPrompt), Expiry::TurnEnd)
    )
}

fn placeholder(count: usize) -> Message {
    Message::user(format!(
        "[{count} earlier message(s) removed to fit the context window]"
    ))
}

impl FromIterator<Arc<Message>> for History {
    fn from_iter<I: IntoIterator<Item = Arc<Message>>>(iter: I) -> Self {
        let mut history = History::new();
        for message in iter {
            history.push_shared(message);
        }
        history
    }
}

impl FromIterator<Message> for History {
    fn from_iter<I: IntoIterator<Item = Message>>(iter: I) -> Self {
        iter.into_iter().map(Arc::new).collect()
    }
}

impl<'a> IntoIterator for &'a History {
    type Item = &'a Arc<Message>;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl Serialize for History {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter().map(|m| m.as_ref()))
    }
}

impl<'de> Deserialize<'de> for History {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Message>::deserialize(deserializer).map(|v| v.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::message::ToolCall;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            tool_call_id: id.to_owned(),
            tool_name: "t".to_owned(),
            input: Value::Null.into(),
        }
    }

    /// `n` messages: user, assistant, user, ... with a call and its result
    /// every fifth pair, so the newest messages straddle the shared vector
    /// and the tail at every length.
    fn messages(n: usize) -> Vec<Arc<Message>> {
        (0..n)
            .map(|i| {
                let m = match i % 10 {
                    8 => Message::assistant(Some(format!("a{i}")), vec![call(&format!("c{i}"))]),
                    9 => Message::tool_result(&call(&format!("c{}", i - 1)), Value::Null),
                    k if k % 2 == 1 => Message::assistant_text(format!("a{i}")),
                    _ => Message::user(format!("u{i}")),
                };
                Arc::new(m)
            })
            .collect()
    }

    #[test]
    fn a_history_reads_the_same_on_both_sides_of_its_tail() {
        for n in 0..(3 * TAIL_MAX + 5) {
            let model = messages(n);
            let history: History = model.iter().cloned().collect();
            assert_eq!(history.len(), n);
            assert_eq!(history.is_empty(), n == 0);
            assert!(history.iter().zip(&model).all(|(a, b)| Arc::ptr_eq(a, b)));
            assert_eq!(history.iter().len(), n);
            let back: Vec<_> = history.iter().rev().collect();
            assert!(
                back.iter()
                    .zip(model.iter().rev())
                    .all(|(a, b)| Arc::ptr_eq(a, b))
            );
            assert_eq!(back.len(), n);
            for (i, m) in model.iter().enumerate() {
                assert!(Arc::ptr_eq(history.get(i).unwrap(), m), "get({i}) of {n}");
            }
            assert!(history.get(n).is_none());
            assert_eq!(
                history.last().map(Arc::as_ptr),
                model.last().map(Arc::as_ptr)
            );
            for start in [
                0,
                1,
                n / 2,
                n.saturating_sub(TAIL_MAX),
                n.saturating_sub(1),
                n,
                n + 3,
            ] {
                let skipped = history.skip(start);
                assert_eq!(
                    skipped.len(),
                    n.saturating_sub(start),
                    "skip({start}) of {n}"
                );
                assert!(
                    skipped
                        .iter()
                        .zip(model.iter().skip(start))
                        .all(|(a, b)| Arc::ptr_eq(a, b))
                );
            }
            // The last turn: from the last run of assistant messages on.
            let turn = history.last_assistant_turn();
            let start = model.iter().rposition(|m| m.is_assistant());
            match start {
                None => assert!(turn.is_empty()),
                Some(end) => {
                    let first = model[..=end]
                        .iter()
                        .rposition(|m| !m.is_assistant())
                        .map_or(0, |i| i + 1);
                    let expected: Vec<_> = model[first..]
                        .iter()
                        .take_while(|m| m.is_assistant() || m.answers().is_some())
                        .collect();
                    assert_eq!(turn.len(), expected.len(), "last turn of {n}");
                    assert!(turn.iter().zip(expected).all(|(a, b)| Arc::ptr_eq(a, b)));
                }
            }
            let copy: History = model.iter().cloned().collect();
            assert_eq!(history, copy);
            assert!(history.is_paired() == (n % 10 != 9));
        }
    }

    /// Issue 34: after many follow-up turns, only the current turn's prompt
    /// and instructions are kept under truncation; an earlier turn's prompt
    /// is cut like any message, and the newest answers stay.
    #[test]
    fn only_the_current_turns_prompt_is_kept_when_a_long_conversation_is_truncated() {
        let prompt =
            |n: usize| Arc::new(Message::user(format!("prompt {n}")).with_tag(SPAWN_PROMPT));
        let rules = || {
            let mut m = Message::user("the rules").with_tag(INSTRUCTIONS_PROMPT);
            m.meta_mut().keep_during_truncation = Some(true);
            Arc::new(m)
        };
        let mut messages = Vec::new();
        for turn in 1..=10 {
            messages.push(prompt(turn));
            if turn == 10 {
                messages.push(rules());
            }
            messages.push(Arc::new(Message::assistant_text(format!(
                "answer {turn} {}",
                "x".repeat(400)
            ))));
        }
        messages.pop();
        let view = History::truncated_view(&messages, 400);
        let texts: Vec<String> = view.iter().map(|m| m.text()).collect();
        assert!(
            texts.iter().any(|t| t.starts_with("answer 9")),
            "the latest answer stays: {texts:?}"
        );
        assert!(!texts.iter().any(|t| t == "prompt 1"), "{texts:?}");
        assert_eq!(texts[texts.len() - 2..], ["prompt 10", "the rules"]);
    }

    /// A child's copy of a long history appends its own messages without
    /// copying the chunk of the shared vector its parent's newest messages
    /// sit in: a copied chunk holds one more reference to each message in it.
    #[test]
    fn a_childs_copy_appends_without_copying_its_parents_chunk() {
        let model = messages(100);
        let parent: History = model.iter().cloned().collect();
        let in_shared = &model[parent.len() - parent.tail.len() - 1];
        let before = Arc::strong_count(in_shared);
        let mut child = parent.filter_unfinished_tool_calls();
        child.push(Message::user("the child's prompt"));
        child.push(Message::assistant_text("the child's answer"));
        assert_eq!(Arc::strong_count(in_shared), before);
        assert_eq!(child.len(), 102);
        assert_eq!(parent.len(), 100);
        assert!(Arc::ptr_eq(child.get(99).unwrap(), &model[99]));
    }

    /// The common spawn case: the parent's last message holds the open
    /// call; the child's copy drops that call, whichever part it is in.
    #[test]
    fn the_open_spawn_call_is_dropped_from_the_tail_and_from_the_shared_part() {
        for n in [3, TAIL_MAX, TAIL_MAX + 1, 2 * TAIL_MAX + 1, 40] {
            let mut history: History = messages(n).into_iter().collect();
            if !history.is_paired() {
                history.push(Message::tool_result(
                    &call(&format!("c{}", n - 2)),
                    Value::Null,
                ));
            }
            history.push(Message::assistant(
                Some("spawning".into()),
                vec![call("spawn")],
            ));
            let len = history.len();
            let child = history.filter_unfinished_tool_calls();
            assert!(child.is_paired(), "{n}");
            assert_eq!(child.len(), len, "the text of the message stays ({n})");
            assert_eq!(child.last().unwrap().tool_calls().count(), 0);
            assert!(!child.id_taken("spawn"));
            assert!(history.id_taken("spawn"));
        }
    }
}
