//! The journal as readers see it, whatever the backend: an event as the
//! journal keeps it (without the states and replies, stored once elsewhere),
//! and a `JournalEntry`, an event in the shape `Store::events` gives back once
//! stored and event streams send.

use std::fmt;
use std::sync::Arc;

use arbor_actors::{AgentStatus, Event, EventKind, FailureKind, Usage};
use serde::Serialize;
use serde_json::{Map, Value};

pub use arbor_actors::{EventType, UnknownEventType};

/// A journal record that is no event (`JournalEntry::from_record`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BadRecord {
    /// Its `type` is missing or not a string.
    NoType,
    /// Its `type` names no journal type.
    UnknownType(UnknownEventType),
    /// A `seq`, `runId` or `atMs` is missing or of the wrong kind.
    Missing(&'static str),
}

impl fmt::Display for BadRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadRecord::NoType => f.write_str("an event without a type"),
            BadRecord::UnknownType(e) => write!(f, "an event of {e}"),
            BadRecord::Missing(field) => write!(f, "an event without {field}"),
        }
    }
}

impl std::error::Error for BadRecord {}

/// An event as `Store::events` gives it back once stored, and as event
/// streams send it: a reader that follows a tree live and from the store (a
/// resumable event stream) sees one entry either way. It serialises as
/// `type`, the event's own fields, a final event's `output`, then `seq`,
/// `runId` and `atMs`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalEntry {
    /// Its `type`.
    #[serde(rename = "type")]
    pub kind: EventType,
    /// The event's own fields as the journal has them (`usage` put back in
    /// its place), in the event's order; without `type` and a final event's
    /// `output`.
    #[serde(flatten)]
    pub body: Map<String, Value>,
    /// A final event's output (the final state's, `null` when it has none);
    /// `None` for the other types.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Its place in the tree's events, from 1 (an event stream's id).
    pub seq: u64,
    /// The run it is about.
    pub run_id: Arc<str>,
    /// Wall-clock milliseconds since the Unix epoch.
    pub at_ms: u64,
}

impl JournalEntry {
    /// Whether it ends its run.
    pub fn is_final(&self) -> bool {
        self.kind.is_final()
    }

    /// One of the event's own fields.
    pub fn get(&self, field: &str) -> Option<&Value> {
        self.body.get(field)
    }

    /// An entry from an event stream's `data` (`GET /v1/runs/{runId}/events`:
    /// the entry's JSON with the `treeId` it is of); `None` for what is no
    /// journaled event (a `modelDelta`, or text of another shape).
    pub fn from_stream(mut data: Map<String, Value>) -> Option<JournalEntry> {
        data.shift_remove("treeId");
        JournalEntry::from_record(data).ok()
    }

    /// An entry from a journal record as a store reads it back: the record's
    /// body with `seq`, `runId` and `atMs`, a final event's `output` and a
    /// responded event's `usage` put back (anywhere in the record). Fails on
    /// a record that is no event.
    pub(crate) fn from_record(mut record: Map<String, Value>) -> Result<JournalEntry, BadRecord> {
        let kind: EventType = match record.shift_remove("type") {
            Some(Value::String(name)) => name.parse().map_err(BadRecord::UnknownType)?,
            _ => return Err(BadRecord::NoType),
        };
        let mut number = |key: &'static str| {
            record
                .shift_remove(key)
                .and_then(|v| v.as_u64())
                .ok_or(BadRecord::Missing(key))
        };
        let (seq, at_ms) = (number("seq")?, number("atMs")?);
        let run_id: Arc<str> = match record.shift_remove("runId") {
            Some(Value::String(run)) => run.into(),
            _ => return Err(BadRecord::Missing("runId")),
        };
        let output = kind
            .is_final()
            .then(|| record.shift_remove("output").unwrap_or(Value::Null));
        // Where the event has it: after the step. (A store that puts it
        // there, as the SQLite one does, has nothing moved.)
        let after_step = |record: &Map<String, Value>| {
            let mut keys = record.keys();
            keys.any(|k| k == "step") && keys.next().is_some_and(|k| k == "usage")
        };
        if kind == EventType::ModelResponded
            && !after_step(&record)
            && let Some(usage) = record.shift_remove("usage")
        {
            let at = record.keys().position(|k| k == "step").map_or(0, |i| i + 1);
            record.shift_insert(at, "usage".into(), usage);
        }
        Ok(JournalEntry {
            kind,
            body: record,
            output,
            seq,
            run_id,
            at_ms,
        })
    }
}

/// A live event as `Store::events` gives it back once stored: the journal's
/// body with `usage` and a final event's `output` put back, then `seq`, `runId`
/// and `atMs`. `None` for what the journal leaves out (streaming deltas and
/// checkpoints).
pub fn journal_view(event: &Event) -> Option<JournalEntry> {
    let kind = EventType::of(&event.kind)?;
    let mut body = Vec::with_capacity(128);
    journal_body(&event.kind, &mut body, false).ok()?;
    let Ok(mut map) = serde_json::from_slice::<Map<String, Value>>(&body) else {
        return None;
    };
    // The record's `type`: the entry's is its `kind`.
    map.shift_remove("type");
    Some(JournalEntry {
        kind,
        body: map,
        output: event
            .kind
            .final_state()
            .map(|state| state.output.clone().unwrap_or(Value::Null)),
        seq: event.seq,
        run_id: event.run_id.to_string().into(),
        at_ms: event.at_ms,
    })
}

/// An event as the journal keeps it: without the states and replies, which are
/// stored once elsewhere in the segment (checkpoints, model calls). Its `type`
/// first: `EventKind`'s tag, or for the two shapes of the journal's own
/// (`Typed`), the same name written in one place.
pub(super) fn journal_body(
    kind: &EventKind,
    out: &mut Vec<u8>,
    reply_written: bool,
) -> serde_json::Result<()> {
    /// A shape of the journal's own, after its `type` (the kind's name).
    #[derive(Serialize)]
    struct Typed<T> {
        r#type: &'static str,
        #[serde(flatten)]
        fields: T,
    }
    /// (Its usage is the reply record's when one was written just before it:
    /// put back when the journal is read.)
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Responded<'a> {
        step: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        usage: Option<&'a Usage>,
        tool_calls: usize,
        /// The names of the reply's tool calls, in order (what a reader
        /// shows while they run; the reply itself is a record of its own).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tools: Vec<&'a str>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        from_record: bool,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        refused: bool,
    }
    /// (Its output is the final state's: put back when the journal is read.)
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Ended<'a> {
        status: AgentStatus,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error_kind: Option<FailureKind>,
    }
    let r#type = kind.name();
    match kind {
        EventKind::ModelResponded {
            step,
            usage,
            tool_calls,
            reply,
            from_record,
            refused,
        } => {
            let fields = Responded {
                step: *step,
                usage: (!reply_written).then_some(usage),
                tool_calls: *tool_calls,
                tools: reply
                    .iter()
                    .flat_map(|m| m.tool_calls().map(|c| c.tool_name.as_str()))
                    .collect(),
                from_record: *from_record,
                refused: *refused,
            };
            serde_json::to_writer(out, &Typed { r#type, fields })
        }
        EventKind::AgentFinished { state, .. }
        | EventKind::AgentCancelled { state, .. }
        | EventKind::AgentFailed { state, .. } => {
            let fields = Ended {
                status: state.status,
                error: match kind {
                    EventKind::AgentFailed { error, .. } => Some(error),
                    _ => state.error_message(),
                },
                error_kind: state.error_kind,
            };
            serde_json::to_writer(out, &Typed { r#type, fields })
        }
        _ => serde_json::to_writer(out, kind),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use arbor_actors::{AgentState, AgentStatus, Event, EventKind, Usage};
    use serde_json::{Value, json};

    use super::{BadRecord, EventType, JournalEntry, journal_view};

    fn event(seq: u64, run_id: &str, at_ms: u64, kind: EventKind) -> Event {
        Event {
            seq,
            tree_id: "t".parse().unwrap(),
            run_id: run_id.parse().unwrap(),
            at_ms,
            kind,
        }
    }

    fn finished() -> Event {
        let state = AgentState {
            run_id: "t/0".parse().unwrap(),
            status: AgentStatus::Completed,
            output: Some(json!({"answer": 42})),
            ..AgentState::of_run("t/0".parse().unwrap())
        };
        let state = Arc::new(state);
        event(
            9,
            "t/0",
            1700,
            EventKind::AgentFinished {
                state,
                inherited: 0,
            },
        )
    }

    fn failed() -> Event {
        let state = AgentState {
            run_id: "t/0.1".parse().unwrap(),
            status: AgentStatus::Failed,
            ..AgentState::of_run("t/0".parse().unwrap())
        };
        let (error, state) = ("boom".into(), Arc::new(state));
        let kind = EventKind::AgentFailed {
            error,
            state,
            inherited: 0,
        };
        event(10, "t/0.1", 1701, kind)
    }

    fn responded() -> Event {
        let usage = Usage {
            input_tokens: 10,
            output_tokens: 3,
            cost: 0.5,
            ..Usage::default()
        };
        let kind = EventKind::ModelResponded {
            step: 2,
            usage,
            tool_calls: 1,
            reply: None,
            from_record: false,
            refused: false,
        };
        event(5, "t/0", 1500, kind)
    }

    fn record(json: &str) -> JournalEntry {
        JournalEntry::from_record(serde_json::from_str(json).unwrap()).unwrap()
    }

    /// A failed run's final entry carries its failure's kind beside the text
    /// (semantics §7); one without a kind (stored before kinds) has none.
    #[test]
    fn a_failed_runs_entry_names_its_error_kind() {
        let mut state = AgentState {
            run_id: "t/0.2".parse().unwrap(),
            status: AgentStatus::Failed,
            error_kind: Some(arbor_actors::FailureKind::ModelRateLimited),
            ..AgentState::of_run("t/0".parse().unwrap())
        };
        let failed = |state: &AgentState| {
            let kind = EventKind::AgentFailed {
                error: "model m is rate-limited: 429".into(),
                state: Arc::new(state.clone()),
                inherited: 0,
            };
            let entry = journal_view(&event(3, "t/0.2", 1, kind)).unwrap();
            serde_json::to_value(&entry).unwrap()
        };
        assert_eq!(failed(&state)["errorKind"], "model_rate_limited");
        state.error_kind = None;
        assert!(failed(&state).get("errorKind").is_none());
    }

    /// The JSON `journal_view` gave (as a `Value`) before the entry was typed,
    /// byte for byte.
    #[test]
    fn an_entry_serialises_as_the_journal_view_did() {
        let cases = [
            (
                finished(),
                r#"{"type":"agentFinished","status":"completed","output":{"answer":42},"seq":9,"runId":"t/0","atMs":1700}"#,
            ),
            (
                failed(),
                r#"{"type":"agentFailed","status":"failed","error":"boom","output":null,"seq":10,"runId":"t/0.1","atMs":1701}"#,
            ),
            (
                responded(),
                r#"{"type":"modelResponded","step":2,"usage":{"inputTokens":10,"outputTokens":3,"cacheReadTokens":0,"cacheWriteTokens":0,"cost":0.5},"toolCalls":1,"seq":5,"runId":"t/0","atMs":1500}"#,
            ),
        ];
        for (event, expected) in cases {
            let entry = journal_view(&event).unwrap();
            assert_eq!(serde_json::to_string(&entry).unwrap(), expected);
        }
        let entry = journal_view(&finished()).unwrap();
        assert!(entry.is_final() && entry.kind == EventType::AgentFinished);
        assert_eq!(&*entry.run_id, "t/0");
        assert_eq!((entry.seq, entry.at_ms), (9, 1700));
        assert_eq!(entry.get("status"), Some(&json!("completed")));
        assert!(!journal_view(&responded()).unwrap().is_final());
    }

    /// A record read back from a store (`usage` and `output` put back after
    /// `atMs`) is the same entry as the live event's, byte for byte.
    #[test]
    fn a_stored_record_is_the_live_events_entry() {
        let stored = [
            (
                finished(),
                r#"{"type":"agentFinished","status":"completed","seq":9,"runId":"t/0","atMs":1700,"output":{"answer":42}}"#,
            ),
            (
                failed(),
                r#"{"type":"agentFailed","status":"failed","error":"boom","seq":10,"runId":"t/0.1","atMs":1701,"output":null}"#,
            ),
            (
                responded(),
                r#"{"type":"modelResponded","step":2,"toolCalls":1,"seq":5,"runId":"t/0","atMs":1500,"usage":{"inputTokens":10,"outputTokens":3,"cacheReadTokens":0,"cacheWriteTokens":0,"cost":0.5}}"#,
            ),
        ];
        for (event, json) in stored {
            let (live, read) = (journal_view(&event).unwrap(), record(json));
            assert_eq!(read, live);
            assert_eq!(
                serde_json::to_string(&read).unwrap(),
                serde_json::to_string(&live).unwrap()
            );
        }
        // `output` is a final event's only: an outputSet keeps its own.
        let set = record(r#"{"type":"outputSet","output":1,"seq":3,"runId":"t/0","atMs":2}"#);
        assert_eq!(
            (set.output, set.body.get("output")),
            (None, Some(&json!(1)))
        );
        for bad in [
            r#"{"seq":1,"runId":"t/0","atMs":2}"#,
            r#"{"type":"modelDelta","seq":1,"runId":"t/0","atMs":2}"#,
            r#"{"type":"resumed","runId":"t/0","atMs":2}"#,
            r#"{"type":"resumed","seq":1,"atMs":2}"#,
        ] {
            let map = serde_json::from_str(bad).unwrap();
            assert!(JournalEntry::from_record(map).is_err(), "{bad}");
        }
        let map = serde_json::from_str(r#"{"type":"resumed","seq":1,"atMs":2}"#).unwrap();
        let err = JournalEntry::from_record(map).unwrap_err();
        assert_eq!(err, BadRecord::Missing("runId"));
        assert_eq!(err.to_string(), "an event without runId");
    }

    #[test]
    fn an_event_types_name_is_its_kinds_and_its_wire_name() {
        for t in EventType::ALL {
            assert_eq!(serde_json::to_value(t).unwrap(), Value::from(t.name()));
            assert_eq!(t.name().parse::<EventType>(), Ok(t));
            assert_eq!(t.to_string(), t.name());
        }
        for event in [finished(), failed(), responded()] {
            assert_eq!(
                EventType::of(&event.kind).unwrap().name(),
                event.kind.name()
            );
        }
        assert!(EventType::of(&EventKind::Resumed).is_some_and(|t| !t.is_final()));
        let finals = EventType::ALL.into_iter().filter(|t| t.is_final()).count();
        assert_eq!(finals, 3);
        assert!("modelDelta".parse::<EventType>().is_err());
    }
}
