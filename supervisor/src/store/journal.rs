//! The journal as readers see it, whatever the backend: an event as the
//! journal keeps it (without the states and replies, stored once elsewhere),
//! and a live event in the shape `Store::events` gives back once stored.

use arbor_actors::{AgentStatus, Event, EventKind, Usage};
use serde::Serialize;
use serde_json::Value;

/// A live event as `Store::events` gives it back once stored: the journal's
/// body with `usage` and a final event's `output` put back, then `seq`, `runId`
/// and `atMs`. `None` for what the journal leaves out (streaming deltas and
/// checkpoints). A reader that follows a tree live and from the store (a
/// resumable event stream) sees one shape either way.
pub fn journal_view(event: &Event) -> Option<Value> {
    if matches!(
        event.kind,
        EventKind::ModelDelta { .. } | EventKind::Checkpointed { .. }
    ) {
        return None;
    }
    let mut body = Vec::with_capacity(128);
    journal_body(&event.kind, &mut body, false).ok()?;
    let Ok(Value::Object(mut map)) = serde_json::from_slice::<Value>(&body) else {
        return None;
    };
    if let Some(state) = event.kind.final_state() {
        map.insert("output".into(), state.output.clone().unwrap_or(Value::Null));
    }
    map.insert("seq".into(), event.seq.into());
    map.insert("runId".into(), Value::from(&*event.run_id));
    map.insert("atMs".into(), event.at_ms.into());
    Some(Value::Object(map))
}

/// An event as the journal keeps it: without the states and replies, which are
/// stored once elsewhere in the segment (checkpoints, model calls).
pub(super) fn journal_body(
    kind: &EventKind,
    out: &mut Vec<u8>,
    reply_written: bool,
) -> serde_json::Result<()> {
    /// (Its usage is the reply record's when one was written just before it:
    /// put back when the journal is read.)
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Responded<'a> {
        r#type: &'static str,
        step: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        usage: Option<&'a Usage>,
        tool_calls: usize,
    }
    /// (Its output is the final state's: put back when the journal is read.)
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Ended<'a> {
        r#type: &'static str,
        status: AgentStatus,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<&'a str>,
    }
    match kind {
        EventKind::ModelResponded {
            step,
            usage,
            tool_calls,
            ..
        } => serde_json::to_writer(
            out,
            &Responded {
                r#type: kind.name(),
                step: *step,
                usage: (!reply_written).then_some(usage),
                tool_calls: *tool_calls,
            },
        ),
        EventKind::AgentFinished { state, .. }
        | EventKind::AgentCancelled { state, .. }
        | EventKind::AgentFailed { state, .. } => serde_json::to_writer(
            out,
            &Ended {
                r#type: kind.name(),
                status: state.status,
                error: match kind {
                    EventKind::AgentFailed { error, .. } => Some(error),
                    _ => state.error_message(),
                },
            },
        ),
        _ => serde_json::to_writer(out, kind),
    }
}
