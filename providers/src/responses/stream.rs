//! Assembling a streamed Responses reply.
//!
//! The stream builds the response's output items by `output_index`:
//! `response.output_item.added` opens one, the deltas (`output_text`,
//! `refusal`, `function_call_arguments`, `reasoning_summary_text`,
//! `reasoning_text`) grow it, `response.output_item.done` replaces it with the
//! whole item. A server whose events have no `output_index` (llama-server's)
//! names the item instead: an event's `item_id`, or its item's `id` or
//! `call_id`, finds the item that carried it first, and an item not seen yet
//! goes after the others. `response.completed` (or `response.incomplete`)
//! ends the reply: its status and usage, with its own `output` when that has
//! every item the stream built (the server's whole list) and the items built
//! otherwise, make the same reply as the non-streamed parse.
//! `response.failed` and `error` fail it. There is no `[DONE]`.

use std::collections::{BTreeMap, HashMap};

use arbor_actors::{Delta, DeltaSink};
use serde_json::{Value, json};

use super::{api_error, reply};
use crate::wire::{Assembler, Failure, Reply};

/// Assembles a streamed Responses reply.
#[derive(Default)]
pub(crate) struct StreamState {
    /// The output items so far, by `output_index` (or the place given to
    /// an item without one: see [`StreamState::slot`]).
    items: BTreeMap<u64, Value>,
    /// Each function call's index among the reply's calls, by `output_index`.
    calls: BTreeMap<u64, usize>,
    /// The `output_index` of each item id and call id seen.
    ids: HashMap<String, u64>,
    /// The `output_index` after every one seen.
    next: u64,
    /// The reply, once the response completed.
    reply: Option<Reply>,
}

impl StreamState {
    /// The `output_index` of the item `event` is about: its own, else that
    /// of the item named by its `item_id` (or its item's `id` or `call_id`),
    /// else, for an item not seen yet, the one after every item seen (0 for
    /// an event that names none).
    fn slot(&mut self, event: &Value) -> u64 {
        let item = event.get("item");
        let names: Vec<&str> = [
            event.get("item_id"),
            item.and_then(|item| item.get("id")),
            item.and_then(|item| item.get("call_id")),
        ]
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|name| !name.is_empty())
        .collect();
        let slot = match event.get("output_index").and_then(Value::as_u64) {
            Some(index) => index,
            None if names.is_empty() => return 0,
            None => match names.iter().find_map(|name| self.ids.get(*name)) {
                Some(&slot) => slot,
                None => self.next,
            },
        };
        for name in names {
            self.ids.entry(name.to_owned()).or_insert(slot);
        }
        self.next = self.next.max(slot + 1);
        slot
    }

    fn item(&mut self, index: u64) -> &mut Value {
        self.items.entry(index).or_insert_with(|| json!({}))
    }

    /// The call index of the function call at `output_index`, given one when
    /// it is first seen.
    fn call_index(&mut self, output_index: u64) -> usize {
        let next = self.calls.len();
        *self.calls.entry(output_index).or_insert(next)
    }

    /// Appends `delta` to `field` of element `index` of the item's `list`,
    /// creating the element as `empty` when the stream did not announce it.
    fn append(
        &mut self,
        output_index: u64,
        list: &str,
        index: usize,
        empty: Value,
        field: &str,
        delta: &str,
    ) {
        let item = self.item(output_index);
        if !item.get(list).is_some_and(Value::is_array) {
            item[list] = json!([]);
        }
        let Some(elements) = item[list].as_array_mut() else {
            return;
        };
        while elements.len() <= index {
            elements.push(empty.clone());
        }
        let element = &mut elements[index];
        let mut text = element
            .get(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        text.push_str(delta);
        element[field] = json!(text);
    }

    fn set_element(&mut self, output_index: u64, list: &str, index: usize, value: Value) {
        let item = self.item(output_index);
        if !item.get(list).is_some_and(Value::is_array) {
            item[list] = json!([]);
        }
        if let Some(elements) = item[list].as_array_mut() {
            while elements.len() <= index {
                elements.push(Value::Null);
            }
            elements[index] = value;
        }
    }

    /// The end of the response: the reply, or why there is none. Its
    /// items are the response's own `output` when that has at least as many
    /// as the stream built (the server's whole list, which a stream whose
    /// items could not be told apart may have run together), else the items
    /// built (a server may end without them, or with fewer).
    fn end(&mut self, response: &Value) -> Result<bool, Failure> {
        let whole = response
            .get("output")
            .and_then(Value::as_array)
            .filter(|output| !output.is_empty() && output.len() >= self.items.len());
        let output: Vec<Value> = match whole {
            Some(output) => output.clone(),
            None => std::mem::take(&mut self.items).into_values().collect(),
        };
        self.reply = Some(reply(response, &output)?);
        Ok(true)
    }
}

fn index(event: &Value, key: &str) -> u64 {
    event.get(key).and_then(Value::as_u64).unwrap_or(0)
}

impl Assembler for StreamState {
    fn event(&mut self, event: &str, data: &str, sink: &DeltaSink) -> Result<bool, Failure> {
        let data = data.trim();
        if data == "[DONE]" {
            return Err(Failure::transient(
                "the stream ended before response.completed",
            ));
        }
        if data.is_empty() {
            return Ok(false);
        }
        let value: Value = serde_json::from_str(data)
            .map_err(|e| Failure::Malformed(format!("stream event is not JSON: {e}")))?;
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event)
            .to_owned();
        let output_index = self.slot(&value);
        let delta = value.get("delta").and_then(Value::as_str).unwrap_or("");
        match kind.as_str() {
            "response.output_item.added" | "response.output_item.done" => {
                let item = value.get("item").cloned().unwrap_or_else(|| json!({}));
                if item.get("type").and_then(Value::as_str) == Some("function_call") {
                    self.call_index(output_index);
                }
                self.items.insert(output_index, item);
            }
            "response.content_part.added" => {
                if let Some(part) = value.get("part") {
                    let at = index(&value, "content_index") as usize;
                    self.set_element(output_index, "content", at, part.clone());
                }
            }
            "response.reasoning_summary_part.added" => {
                let at = index(&value, "summary_index") as usize;
                if at > 0 {
                    sink(Delta::Reasoning {
                        text: "\n\n".into(),
                    });
                }
                if let Some(part) = value.get("part") {
                    self.set_element(output_index, "summary", at, part.clone());
                }
            }
            "response.output_text.delta" | "response.refusal.delta" if !delta.is_empty() => {
                let (kind, field) = if kind == "response.output_text.delta" {
                    ("output_text", "text")
                } else {
                    ("refusal", "refusal")
                };
                let at = index(&value, "content_index") as usize;
                self.append(
                    output_index,
                    "content",
                    at,
                    json!({"type": kind}),
                    field,
                    delta,
                );
                sink(Delta::Text {
                    text: delta.to_owned(),
                });
            }
            "response.reasoning_summary_text.delta" if !delta.is_empty() => {
                let at = index(&value, "summary_index") as usize;
                let empty = json!({"type": "summary_text"});
                self.append(output_index, "summary", at, empty, "text", delta);
                sink(Delta::Reasoning {
                    text: delta.to_owned(),
                });
            }
            "response.reasoning_text.delta" if !delta.is_empty() => {
                let at = index(&value, "content_index") as usize;
                let empty = json!({"type": "reasoning_text"});
                self.append(output_index, "content", at, empty, "text", delta);
                sink(Delta::Reasoning {
                    text: delta.to_owned(),
                });
            }
            "response.function_call_arguments.delta" if !delta.is_empty() => {
                let call = self.call_index(output_index);
                let item = self.item(output_index);
                let mut arguments = item
                    .get("arguments")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                arguments.push_str(delta);
                item["arguments"] = json!(arguments);
                sink(Delta::ToolCallArgs {
                    index: call,
                    text: delta.to_owned(),
                });
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                let mut response = value.get("response").cloned().unwrap_or_else(|| json!({}));
                if kind == "response.failed" {
                    response["status"] = json!("failed");
                }
                return self.end(&response);
            }
            "error" => {
                let error = value
                    .get("error")
                    .filter(|e| e.is_object())
                    .unwrap_or(&value);
                return Err(api_error(error));
            }
            _ => {}
        }
        Ok(false)
    }

    fn finish(self: Box<Self>) -> Result<Reply, Failure> {
        self.reply
            .ok_or_else(|| Failure::transient("the stream ended before response.completed"))
    }
}
