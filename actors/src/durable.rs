//! Durable programs (issue 37): what the journal keeps of a program's run
//! (each yield, what the program drew from sources that differ from run to
//! run, and the results of its tool calls) and how a resumed run is held to
//! it.
//!
//! A program cannot be saved mid-way, so a resumed run starts its program
//! again from the beginning and feeds it what it got the first time: the
//! recorded tool results by call id (no tool runs twice), the recorded
//! model replies by step (no model call is made twice), and what it drew
//! (its clock readings, its random seed). Each yield it makes again is
//! compared with the one recorded at its place; the first that differs (its
//! file was edited) fails the run, naming both.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::handler::{ProgramCall, Yield};
use crate::message::Message;

/// One yield of a program's run as the journal keeps it (`programYielded`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedYield {
    /// Its place among the run's yields, from 1.
    pub index: u32,
    /// The yield ([`yield_value`]).
    pub yielded: Value,
    /// What the program drew on its way to it (see
    /// [`StepProgram::drawn`](crate::handler::StepProgram::drawn)).
    pub drawn: Option<Value>,
}

/// What a resumed or replayed run of a program gets back of its first life.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProgramRecord {
    /// Its yields, in order of their index.
    pub yields: Vec<RecordedYield>,
    /// The results of its tool calls, by call id: served instead of running
    /// the tools again (none in a replay, which runs its tools again).
    pub results: HashMap<String, Arc<Message>>,
}

impl ProgramRecord {
    /// Adds a yield read back from the journal, in journal order. A first
    /// yield starts the record over: the program was started over
    /// (`--restart-programs`), and what its earlier life recorded, results
    /// included, is not its own. (A resumed program never journals a yield
    /// its record has.)
    pub fn push_yield(&mut self, recorded: RecordedYield) {
        if recorded.index == 1 {
            *self = ProgramRecord::default();
        }
        if self.yield_at(recorded.index).is_none() {
            let at = self.yields.partition_point(|y| y.index < recorded.index);
            self.yields.insert(at, recorded);
        }
    }

    /// The recorded yield with index `index`, if the run got that far.
    pub fn yield_at(&self, index: u32) -> Option<&RecordedYield> {
        self.yields
            .binary_search_by_key(&index, |y| y.index)
            .ok()
            .map(|at| &self.yields[at])
    }

    /// Whether there is nothing to go on from.
    pub fn is_empty(&self) -> bool {
        self.yields.is_empty() && self.results.is_empty()
    }
}

/// A yield as the journal and the error naming a difference show it, in
/// Codebuff's spelling: `"STEP"`, `"STEP_ALL"`, `{type: "STEP_TEXT", text}`,
/// a tool call `{toolName, input}` (with `includeToolCall: false` when it
/// stays out of the history; several as a list), `"DONE"` when the program
/// ended, `{error}` when it failed.
pub fn yield_value(yielded: &Yield) -> Value {
    let call = |c: &ProgramCall| {
        let mut v = json!({ "toolName": c.name, "input": c.input });
        if !c.include_in_history {
            v["includeToolCall"] = Value::Bool(false);
        }
        v
    };
    let calls = |list: Vec<Value>| match <[Value; 1]>::try_from(list) {
        Ok([one]) => one,
        Err(list) => Value::Array(list),
    };
    match yielded {
        Yield::ToolCalls(list) => calls(
            list.iter()
                .map(|(name, input)| call(&ProgramCall::new(name.clone(), input.clone())))
                .collect(),
        ),
        Yield::Calls(list) => calls(list.iter().map(call).collect()),
        Yield::Step => json!("STEP"),
        Yield::StepAll => json!("STEP_ALL"),
        Yield::StepText(text) => json!({ "type": "STEP_TEXT", "text": text }),
        Yield::Done => json!("DONE"),
        Yield::Fail(error) => json!({ "error": error }),
    }
}

/// The longest a value is shown in an error, in characters.
const SHOWN: usize = 120;

/// `value` as compact JSON, cut to [`SHOWN`] characters.
fn short(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

/// The error of a resumed program whose yield `index` is `now` where its
/// record has `recorded`; `None` when they are the same.
pub fn divergence(index: u32, recorded: &Value, now: &Value) -> Option<String> {
    (recorded != now).then(|| {
        format!(
            "the program differs from its record at yield {index}: recorded {}, now {} \
             (was its file edited? arbor resume --restart-programs starts it over)",
            short(recorded),
            short(now)
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn yields_are_recorded_in_codebuffs_spelling() {
        assert_eq!(yield_value(&Yield::Step), json!("STEP"));
        assert_eq!(yield_value(&Yield::StepAll), json!("STEP_ALL"));
        assert_eq!(
            yield_value(&Yield::StepText("hi".into())),
            json!({"type": "STEP_TEXT", "text": "hi"})
        );
        assert_eq!(
            yield_value(&Yield::Calls(vec![ProgramCall::new(
                "echo",
                json!({"a": 1})
            )])),
            json!({"toolName": "echo", "input": {"a": 1}})
        );
        let hidden = ProgramCall {
            include_in_history: false,
            ..ProgramCall::new("set_messages", json!({}))
        };
        assert_eq!(
            yield_value(&Yield::Calls(vec![hidden])),
            json!({"toolName": "set_messages", "input": {}, "includeToolCall": false})
        );
        assert_eq!(
            yield_value(&Yield::ToolCalls(vec![
                ("a".into(), json!(1)),
                ("b".into(), json!(2))
            ])),
            json!([{"toolName": "a", "input": 1}, {"toolName": "b", "input": 2}])
        );
        assert_eq!(yield_value(&Yield::Done), json!("DONE"));
    }

    #[test]
    fn the_same_yield_is_no_divergence() {
        let y = json!({"toolName": "echo", "input": {"n": 1}});
        assert_eq!(divergence(3, &y, &y.clone()), None);
    }

    #[test]
    fn a_differing_yield_is_named_with_both_values() {
        let recorded = json!({"toolName": "count", "input": {"n": 2}});
        let now = json!({"toolName": "count", "input": {"n": 20}});
        let error = divergence(2, &recorded, &now).unwrap();
        assert!(error.contains("at yield 2"), "{error}");
        assert!(
            error.contains(r#"recorded {"input":{"n":2},"toolName":"count"}"#)
                || error.contains(r#"recorded {"toolName":"count","input":{"n":2}}"#),
            "{error}"
        );
        assert!(error.contains(r#""n":20"#), "{error}");
        assert!(error.contains("--restart-programs"), "{error}");
        // A program that now ends where it yielded.
        let error = divergence(4, &json!("STEP"), &json!("DONE")).unwrap();
        assert!(error.contains(r#"recorded "STEP", now "DONE""#), "{error}");
    }

    #[test]
    fn long_values_are_cut_short() {
        let long = json!({"toolName": "write", "input": {"text": "x".repeat(10_000)}});
        let error = divergence(1, &long, &json!("STEP")).unwrap();
        assert!(error.len() < 400, "{}", error.len());
        assert!(error.contains('…'), "{error}");
    }

    fn at(index: u32, yielded: Value) -> RecordedYield {
        RecordedYield {
            index,
            yielded,
            drawn: None,
        }
    }

    #[test]
    fn a_record_keeps_yields_by_index_and_the_first_of_two() {
        let mut record = ProgramRecord::default();
        assert!(record.is_empty());
        record.push_yield(at(1, json!("STEP_ALL")));
        record.push_yield(at(3, json!("STEP")));
        record.push_yield(at(2, json!("STEP")));
        record.push_yield(at(2, json!("DONE")));
        assert_eq!(record.yields.len(), 3);
        assert_eq!(record.yield_at(1).unwrap().yielded, json!("STEP_ALL"));
        assert_eq!(record.yield_at(2).unwrap().yielded, json!("STEP"));
        assert!(record.yield_at(4).is_none());
        assert!(!record.is_empty());
    }

    #[test]
    fn a_program_started_over_starts_its_record_over() {
        let mut record = ProgramRecord::default();
        record.push_yield(at(1, json!("STEP")));
        record.push_yield(at(2, json!("STEP")));
        record
            .results
            .insert("prog-1-0".into(), Arc::new(Message::user("old")));
        record.push_yield(at(1, json!("STEP_ALL")));
        assert_eq!(record.yields, vec![at(1, json!("STEP_ALL"))]);
        assert!(record.results.is_empty());
    }
}
