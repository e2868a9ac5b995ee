//! Tool-call ids: every call of a reply gets one of its own, unique in the history.

use std::collections::HashSet;

use crate::history::History;
use crate::message::Message;

/// `base`, or `base-N` when `base` is taken in the history or this batch;
/// recorded as taken.
pub(super) fn fresh_id(base: String, history: &History, seen: &mut HashSet<String>) -> String {
    let taken = |id: &str| seen.contains(id) || history.id_taken(id);
    let id = if taken(&base) {
        (1..)
            .map(|n| format!("{base}-{n}"))
            .find(|id| !taken(id))
            .unwrap_or_default()
    } else {
        base
    };
    seen.insert(id.clone());
    id
}

/// Whether every tool call of a reply has an id of its own (`with_call_ids`
/// would leave it as it is).
pub(super) fn call_ids_ok(message: &Message, history: &History) -> bool {
    let mut seen = HashSet::new();
    message.tool_calls().all(|call| {
        let id = call.tool_call_id.as_str();
        !id.is_empty() && seen.insert(id) && !history.id_taken(id)
    })
}

/// Gives every tool call of a reply a non-empty id, unique within the reply and
/// the history (models may reuse ids across steps; pairing is by id).
pub(super) fn with_call_ids(message: Message, step: u32, history: &History) -> Message {
    if message.tool_calls().next().is_none() {
        return message;
    }
    let Message::Assistant {
        content: crate::message::Content::Parts(mut parts),
        meta,
    } = message
    else {
        return message;
    };
    let mut seen = HashSet::new();
    for (i, part) in parts.iter_mut().enumerate() {
        if let crate::message::Part::ToolCall(call) = part {
            let id = call.tool_call_id.as_str();
            if id.is_empty() || seen.contains(id) || history.id_taken(id) {
                call.tool_call_id = fresh_id(format!("call-{step}-{i}"), history, &mut seen);
            } else {
                seen.insert(call.tool_call_id.clone());
            }
        }
    }
    Message::Assistant {
        content: crate::message::Content::Parts(parts),
        meta,
    }
}
