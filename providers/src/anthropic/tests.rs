use std::collections::BTreeMap;

use arbor_actors::message::{Meta, STEP_PROMPT};
use arbor_actors::model::ModelOptions;

use super::*;
use crate::fixtures::{
    assemble, feed, joined, non_adjacent_history, request, sample_history, settings, sink, sse,
    weather_call,
};
use crate::settings::{ProviderKind, ProviderSettings};

// Captured from the aimock mock server (tests/mock): the same fixture
// (text + two calls, usage 42/17) non-streamed and streamed.
const TOOL_REPLY: &str = r#"{"id":"msg_boUndv3fNk5YHuoQ","type":"message","role":"assistant","content":[{"type":"text","text":"Checking both cities."},{"type":"tool_use","id":"call_paris","name":"get_weather","input":{"city":"Paris","unit":"celsius"}},{"type":"tool_use","id":"call_berlin","name":"get_weather","input":{"city":"Berlin","unit":"celsius"}}],"model":"claude-sonnet-4-5","stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":42,"output_tokens":17}}"#;

const TEXT_REPLY: &str = r#"{"id":"msg_NQ5i4d7uTs66Z6HA","type":"message","role":"assistant","content":[{"type":"text","text":"Hi there! How can I help?"}],"model":"claude-sonnet-4-5","stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}"#;

const TOOL_STREAM: &str = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_ICCOkWRWxKr2Wxm0","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":42,"output_tokens":17}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Checking both cities"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"."}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"call_paris","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\":\"Paris\",\"uni"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"t\":\"celsius\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"call_berlin","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"city\":\"Berlin\",\"un"}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"it\":\"celsius\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":17}}

event: message_stop
data: {"type":"message_stop"}

"#;

fn parse(body: &str) -> Result<Reply, Failure> {
    parse_response(&serde_json::from_str(body).unwrap())
}

fn stream_state() -> Box<dyn Assembler> {
    Box::new(StreamState::default())
}

/// Settings without cache breakpoints: the conversion tests are about the rest.
fn plain(stream: bool) -> ProviderSettings {
    let mut settings = settings(ProviderKind::Anthropic, stream);
    settings.prompt_cache = false;
    settings
}

fn body(messages: Vec<Message>) -> Value {
    request_body(&plain(false), &request("", messages, false))
}

fn tokens(input: u64, output: u64, cache_read: u64, cache_write: u64) -> Tokens {
    Tokens {
        input,
        output,
        cache_read,
        cache_write,
        reported: true,
    }
}

fn two_calls() -> Vec<ToolCall> {
    ["Paris", "Berlin"]
        .map(|city| ToolCall {
            tool_call_id: format!("call_{}", city.to_lowercase()),
            tool_name: "get_weather".into(),
            input: json!({"city": city, "unit": "celsius"}).into(),
        })
        .to_vec()
}

fn parts(parts: Vec<Part>) -> Message {
    Message::User {
        content: Content::Parts(parts),
        meta: Meta::default(),
    }
}

#[test]
fn request_body_lifts_the_system_prompt_and_groups_results_in_one_user_turn() {
    let body = request_body(
        &plain(true),
        &request("You are terse.", sample_history(), true),
    );
    assert_eq!(
        body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "stream": true,
            "system": "You are terse.",
            "messages": [
                // The two user messages are one turn (the API wants alternation).
                {"role": "user", "content": [
                    {"type": "text", "text": "What is the weather in Paris and Berlin?"},
                    {"type": "text", "text": "And this chart:"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/chart.png"}}
                ]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking both cities."},
                    {"type": "tool_use", "id": "call_paris", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "call_berlin", "name": "get_weather", "input": {"city": "Berlin"}}
                ]},
                // Both results, then the follow-up, in one user turn.
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_paris", "content": "{\"tempC\":18}"},
                    {"type": "tool_result", "tool_use_id": "call_berlin",
                     "content": "{\"errorMessage\":\"no station in Berlin\"}", "is_error": true},
                    {"type": "text", "text": "Thanks. Any rain?"}
                ]}
            ],
            "tools": [
                {"name": "get_weather", "description": "Current weather in a city",
                 "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
                {"name": "read_file", "description": "Reads a file",
                 "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
            ]
        })
    );
}

#[test]
fn request_body_without_streaming_tools_or_system_has_none_of_them() {
    assert_eq!(
        body(vec![Message::user("hi")]),
        json!({"model": "claude-sonnet-4-5", "max_tokens": 1024,
               "messages": [{"role": "user", "content": "hi"}]})
    );
}

#[test]
fn results_not_adjacent_to_their_call_are_moved_right_after_it() {
    assert_eq!(
        body(non_adjacent_history())["messages"],
        json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_paris", "name": "get_weather", "input": {"city": "Paris"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_paris", "content": "18C"},
                {"type": "text", "text": "Hurry up."}
            ]}
        ])
    );
}

#[test]
fn system_messages_join_the_system_prompt() {
    let body = request_body(
        &plain(false),
        &request(
            "Be brief.",
            vec![
                Message::system("Rule one."),
                Message::user("a"),
                Message::system("Rule two."),
                Message::user("b"),
            ],
            false,
        ),
    );
    assert_eq!(body["system"], json!("Be brief.\n\nRule one.\n\nRule two."));
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}
        ]}])
    );
    let only_history = body_with_system("", vec![Message::system("S"), Message::user("u")]);
    assert_eq!(only_history["system"], json!("S"));
}

fn body_with_system(system: &str, messages: Vec<Message>) -> Value {
    request_body(&plain(false), &request(system, messages, false))
}

#[test]
fn the_conversation_starts_and_ends_with_a_user_turn() {
    let reasoning_only = Message::Assistant {
        content: Content::Parts(vec![Part::Reasoning { text: "hm".into() }]),
        meta: Meta::default(),
    };
    assert_eq!(
        body(vec![
            Message::assistant_text("Hello."),
            Message::user(""),
            reasoning_only,
            Message::assistant_text("Anything else?"),
        ])["messages"],
        json!([
            {"role": "user", "content": "(continue)"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Hello."},
                {"type": "text", "text": "Anything else?"}
            ]},
            {"role": "user", "content": "(continue)"}
        ])
    );
    assert_eq!(
        body(vec![])["messages"],
        json!([{"role": "user", "content": "(continue)"}])
    );
}

#[test]
fn tool_inputs_are_always_objects() {
    let bad = ToolCall {
        tool_call_id: "c1".into(),
        tool_name: "get_weather".into(),
        input: json!("{oops").into(),
    };
    let as_text = ToolCall {
        tool_call_id: "c2".into(),
        tool_name: "get_weather".into(),
        input: json!("{\"city\":\"Oslo\"}").into(),
    };
    let null = ToolCall {
        tool_call_id: "c3".into(),
        tool_name: "get_weather".into(),
        input: Value::Null.into(),
    };
    let body = body(vec![
        Message::user("go"),
        Message::assistant(None, vec![bad.clone(), as_text.clone(), null.clone()]),
        Message::tool_error(&bad, "arguments are not JSON"),
        Message::tool_result(&as_text, json!("ok")),
        Message::tool_result(&null, json!("")),
    ]);
    let inputs: Vec<&Value> = (0..3)
        .map(|i| &body["messages"][1]["content"][i]["input"])
        .collect();
    assert_eq!(inputs, [&json!({}), &json!({"city": "Oslo"}), &json!({})]);
    assert_eq!(
        body["messages"][2]["content"],
        json!([
            {"type": "tool_result", "tool_use_id": "c1",
             "content": "{\"errorMessage\":\"arguments are not JSON\"}", "is_error": true},
            {"type": "tool_result", "tool_use_id": "c2", "content": "ok"},
            {"type": "tool_result", "tool_use_id": "c3"}
        ])
    );
}

#[test]
fn media_goes_as_image_and_document_blocks() {
    let call = weather_call("c1", "Oslo");
    let result = Message::Tool {
        tool_call_id: "c1".into(),
        tool_name: "get_weather".into(),
        content: vec![
            ToolResultPart::Json {
                value: json!("a map"),
            },
            ToolResultPart::Media {
                data: "iVBORw0KGgo=".into(),
                media_type: "image/png".into(),
            },
            ToolResultPart::Media {
                data: "AAAA".into(),
                media_type: "audio/wav".into(),
            },
        ],
        meta: Meta::default(),
    };
    let body = body(vec![
        parts(vec![
            Part::Image {
                image: "data:image/jpeg;base64,/9j/AA==".into(),
                media_type: None,
            },
            Part::Image {
                image: "/9j/AA==".into(),
                media_type: None,
            },
            Part::File {
                data: "JVBERi0=".into(),
                filename: Some("a.pdf".into()),
                media_type: "application/pdf".into(),
            },
            Part::File {
                data: "aGVsbG8gd29ybGQ=".into(),
                filename: None,
                media_type: "text/plain".into(),
            },
            Part::File {
                data: "UEsDBA==".into(),
                filename: Some("a.zip".into()),
                media_type: "application/zip".into(),
            },
        ]),
        Message::assistant(None, vec![call]),
        result,
    ]);
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/AA=="}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/AA=="}},
                {"type": "document", "title": "a.pdf",
                 "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}},
                {"type": "document",
                 "source": {"type": "text", "media_type": "text/plain", "data": "hello world"}},
                {"type": "text",
                 "text": "[a.zip (application/zip) omitted: Anthropic accepts only PDF, text and image files]"}
            ]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Oslo"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": [
                    {"type": "text", "text": "a map"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                    {"type": "text", "text": "[audio/wav attachment omitted: not supported in tool results]"}
                ]}
            ]}
        ])
    );
}

#[test]
fn base64_decodes_with_and_without_padding() {
    assert_eq!(decode_base64("aGVsbG8gd29ybGQ=").unwrap(), b"hello world");
    assert_eq!(decode_base64("aGk").unwrap(), b"hi");
    assert_eq!(decode_base64("aGVs\nbG8=").unwrap(), b"hello");
    assert_eq!(decode_base64("a?b"), None);
}

#[test]
fn parses_the_captured_reply_with_text_and_two_tool_calls() {
    let reply = parse(TOOL_REPLY).unwrap();
    assert_eq!(
        reply.message,
        Message::assistant(Some("Checking both cities.".into()), two_calls())
    );
    assert_eq!(reply.tokens, tokens(42, 17, 0, 0));
}

#[test]
fn parses_the_captured_text_reply() {
    let reply = parse(TEXT_REPLY).unwrap();
    assert_eq!(
        reply.message,
        Message::assistant(Some("Hi there! How can I help?".into()), vec![])
    );
    // Zeros that were reported are counts, not an absence.
    assert_eq!(reply.tokens, tokens(0, 0, 0, 0));
}

#[test]
fn thinking_is_reasoning_and_adjacent_text_blocks_are_one_part() {
    let body = json!({"type": "message", "content": [
        {"type": "thinking", "thinking": "Let me ", "signature": "sig"},
        {"type": "thinking", "thinking": "think."},
        {"type": "redacted_thinking", "data": "xyz"},
        {"type": "text", "text": "Part one, "},
        {"type": "text", "text": "part two."},
        {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Oslo"}},
        {"type": "text", "text": ""},
        {"type": "text", "text": "After."}
    ], "usage": {"input_tokens": 3, "output_tokens": 4}});
    assert_eq!(
        parse_response(&body).unwrap().message,
        Message::Assistant {
            content: Content::Parts(vec![
                Part::Reasoning {
                    text: "Let me think.".into()
                },
                Part::Text {
                    text: "Part one, part two.".into()
                },
                Part::ToolCall(weather_call("c1", "Oslo")),
                Part::Text {
                    text: "After.".into()
                },
            ]),
            // The signed and the redacted block, whole; the unsigned one
            // cannot be sent back.
            meta: Meta {
                provider_options: Some(json!({"anthropic": {"thinking": [
                    {"type": "thinking", "thinking": "Let me ", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "xyz"}
                ]}})),
                ..Meta::default()
            },
        }
    );
}

#[test]
fn the_captured_stream_gives_the_same_reply_as_its_non_streamed_form() {
    let (reply, deltas) = assemble(stream_state(), TOOL_STREAM);
    assert_eq!(reply.unwrap(), parse(TOOL_REPLY).unwrap());
    let (text, reasoning, args) = joined(&deltas);
    assert_eq!(text, "Checking both cities.");
    assert_eq!(reasoning, "");
    // Indexed by tool call, not by content block.
    assert_eq!(
        args,
        BTreeMap::from([
            (0, r#"{"city":"Paris","unit":"celsius"}"#.to_owned()),
            (1, r#"{"city":"Berlin","unit":"celsius"}"#.to_owned()),
        ])
    );
}

#[test]
fn a_streamed_thinking_reply_matches_its_non_streamed_form() {
    let events = [
        json!({"type": "message_start", "message": {"content": [], "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hm"}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "ping"}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "c1", "name": "read_file", "input": {}}}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
        json!({"type": "message_stop"}),
    ];
    let stream: String = events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect();
    let whole = json!({"type": "message", "content": [
        {"type": "thinking", "thinking": "Hm", "signature": "sig"},
        {"type": "text", "text": "Hi"},
        {"type": "tool_use", "id": "c1", "name": "read_file", "input": {}}
    ], "usage": {"input_tokens": 5, "output_tokens": 9}});
    let (reply, deltas) = assemble(stream_state(), &stream);
    assert_eq!(reply.unwrap(), parse_response(&whole).unwrap());
    let (text, reasoning, args) = joined(&deltas);
    assert_eq!((text.as_str(), reasoning.as_str()), ("Hi", "Hm"));
    assert!(args.is_empty());
}

#[test]
fn malformed_streamed_input_comes_back_as_a_string() {
    let stream = TOOL_STREAM
        .replace(r#"it\":\"celsius\"}"#, "")
        .replace(r#"{\"city\":\"Berlin\",\"un"#, "{oops");
    let (reply, _) = assemble(stream_state(), &stream);
    let calls: Vec<_> = reply.unwrap().message.tool_calls().cloned().collect();
    assert_eq!(calls[0].input, json!({"city": "Paris", "unit": "celsius"}));
    assert_eq!(calls[1].input, json!("{oops"));
}

#[test]
fn a_stream_cut_before_message_stop_never_completes() {
    let events = sse(TOOL_STREAM);
    let (sink, deltas) = sink();
    let mut state = StreamState::default();
    let outcomes = feed(&mut state, &events[..events.len() - 1], &sink);
    assert!(outcomes.into_iter().all(|o| o == Ok(false)));
    assert_eq!(joined(&deltas).0, "Checking both cities.");

    // aimock's truncation: message_start and content_block_start, then nothing.
    let mut state = StreamState::default();
    let outcomes = feed(&mut state, &events[..2], &sink);
    assert!(outcomes.into_iter().all(|o| o == Ok(false)));
}

#[test]
fn data_that_is_not_json_is_malformed() {
    let (sink, _) = sink();
    let mut state = StreamState::default();
    let outcome = state.event("message_start", "{malformed json: <<<chaos>>>", &sink);
    assert!(matches!(outcome, Err(Failure::Malformed(_))), "{outcome:?}");
    assert!(matches!(
        parse_response(&json!({"type": "message"})),
        Err(Failure::Malformed(_))
    ));
}

#[test]
fn a_delta_without_its_block_is_malformed() {
    let (sink, _) = sink();
    let mut state = StreamState::default();
    let delta = json!({"type": "content_block_delta", "index": 3,
                       "delta": {"type": "text_delta", "text": "x"}});
    let outcome = state.event("content_block_delta", &delta.to_string(), &sink);
    assert!(matches!(outcome, Err(Failure::Malformed(_))), "{outcome:?}");
}

#[test]
fn error_events_and_bodies_map_by_error_type() {
    let (sink, _) = sink();
    let mut state = StreamState::default();
    let event =
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    assert_eq!(
        state.event("error", &event.to_string(), &sink),
        Err(Failure::Transient {
            status: Some(529),
            message: "Overloaded (overloaded_error)".into(),
            retry_after: None
        })
    );
    let rejected =
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}});
    assert_eq!(
        parse_response(&rejected),
        Err(Failure::Rejected {
            status: 400,
            message: "bad (invalid_request_error)".into()
        })
    );
    let unknown = json!({"type": "error", "error": {"type": "mystery_error"}});
    assert_eq!(
        parse_response(&unknown),
        Err(Failure::transient("mystery_error"))
    );
}

#[test]
fn cache_tokens_are_read_streamed_or_not() {
    let usage = json!({"input_tokens": 12, "output_tokens": 30,
        "cache_read_input_tokens": 900, "cache_creation_input_tokens": 100});
    let mut body: Value = serde_json::from_str(TEXT_REPLY).unwrap();
    body["usage"] = usage.clone();
    assert_eq!(
        parse_response(&body).unwrap().tokens,
        tokens(12, 30, 900, 100)
    );

    let stream = TOOL_STREAM
        .replace(
            r#""usage":{"input_tokens":42,"output_tokens":17}"#,
            r#""usage":{"input_tokens":12,"output_tokens":1,"cache_read_input_tokens":900,"cache_creation_input_tokens":100}"#,
        )
        .replace(
            r#""usage":{"output_tokens":17}"#,
            r#""usage":{"input_tokens":0,"output_tokens":30,"cache_read_input_tokens":null}"#,
        );
    let (reply, _) = assemble(stream_state(), &stream);
    assert_eq!(reply.unwrap().tokens, tokens(12, 30, 900, 100));
}

// ---- Prompt caching -------------------------------------------------------

/// Every `cache_control` of a body, as JSON pointers, in body order.
fn breakpoints(body: &Value) -> Vec<String> {
    fn walk(value: &Value, at: String, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    if key == "cache_control" {
                        assert_eq!(v, &json!({"type": "ephemeral"}), "{at}");
                        out.push(at.clone());
                    } else {
                        walk(v, format!("{at}/{key}"), out);
                    }
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(body, String::new(), &mut out);
    assert!(out.len() <= 4, "more than the API's 4 breakpoints: {out:?}");
    out
}

/// A cached request (the fixture settings have `prompt_cache` on) whose
/// first `shared` messages are the shared prefix.
fn cached(system: &str, messages: Vec<Message>, tools: bool, shared: usize) -> Value {
    let mut request = request(system, messages, tools);
    request.meta.shared_prefix = shared;
    request_body(&settings(ProviderKind::Anthropic, false), &request)
}

#[test]
fn a_root_request_marks_the_last_tool_the_system_prompt_and_the_last_block() {
    let body = cached("You are terse.", sample_history(), true, 0);
    assert_eq!(
        breakpoints(&body),
        ["/tools/1", "/system/0", "/messages/2/content/2"]
    );
    assert_eq!(
        body["system"],
        json!([{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}])
    );
    // The body lists tools, system, messages: the order the API caches in.
    let keys: Vec<&str> = body
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["model", "max_tokens", "tools", "system", "messages"]);
    // Without caching, none at all and the system prompt is a string.
    let plain = request_body(
        &plain(false),
        &request("You are terse.", sample_history(), true),
    );
    assert!(breakpoints(&plain).is_empty());
    assert_eq!(plain["system"], json!("You are terse."));
}

#[test]
fn the_shared_prefix_ends_on_its_own_block_inside_a_merged_turn() {
    // The parent's task and the child's prompt are both user messages: one
    // turn, whose first block ends the prefix.
    let messages = vec![
        Message::user("Parent task."),
        Message::assistant(Some("Spawning.".into()), vec![]),
        Message::user("Context for the children."),
        Message::user("Child prompt A."),
    ];
    let body = cached("S", messages, true, 3);
    assert_eq!(
        breakpoints(&body),
        [
            "/tools/1",
            "/system/0",
            "/messages/2/content/0",
            "/messages/2/content/1"
        ]
    );
    assert_eq!(
        body["messages"][2]["content"][0]["text"],
        "Context for the children."
    );
}

#[test]
fn the_prefix_breakpoint_stops_before_a_result_moved_into_it() {
    // The call is the parent's, its (repaired) result comes after the child's
    // prompt: sent right after the call, so the prefix ends on the call.
    let call = weather_call("c1", "Oslo");
    let messages = vec![
        Message::user("Parent task."),
        Message::assistant(None, vec![call.clone()]),
        Message::user("Child prompt."),
        Message::tool_result(&call, json!("cancelled")),
    ];
    let body = cached("", messages, false, 2);
    assert_eq!(
        breakpoints(&body),
        ["/messages/1/content/0", "/messages/2/content/1"]
    );
    assert_eq!(body["messages"][1]["content"][0]["type"], "tool_use");
}

#[test]
fn a_prefix_that_is_the_whole_history_has_one_breakpoint() {
    let body = cached("", vec![Message::user("a"), Message::user("b")], false, 2);
    assert_eq!(breakpoints(&body), ["/messages/0/content/1"]);
    // A root (or a prefix of system messages only) has no prefix breakpoint.
    let body = cached("", vec![Message::system("s"), Message::user("b")], false, 1);
    assert_eq!(breakpoints(&body), ["/system/0", "/messages/0/content/0"]);
}

#[test]
fn the_step_prompt_and_fillers_never_carry_the_history_breakpoint() {
    let body = cached(
        "",
        vec![
            Message::user("Task."),
            Message::user("Keep going.").with_tag(STEP_PROMPT),
        ],
        false,
        0,
    );
    assert_eq!(breakpoints(&body), ["/messages/0/content/0"]);
    // A history ending with the model's text gets a (continue) turn; the
    // breakpoint stays on the text.
    let body = cached(
        "",
        vec![Message::user("Task."), Message::assistant_text("Done.")],
        false,
        0,
    );
    assert_eq!(body["messages"][2]["content"], json!("(continue)"));
    assert_eq!(breakpoints(&body), ["/messages/1/content/0"]);
}

#[test]
fn thinking_blocks_never_carry_a_breakpoint() {
    let reply = parse_response(&json!({"content": [
        {"type": "thinking", "thinking": "Hm.", "signature": "sig-1"},
        {"type": "text", "text": "Done."}
    ], "stop_reason": "end_turn"}))
    .unwrap();
    let body = cached("", vec![Message::user("Task."), reply.message], false, 0);
    assert_eq!(breakpoints(&body), ["/messages/1/content/1"]);
}

// ---- Options --------------------------------------------------------------

fn with_options(settings_options: ModelOptions, request_options: ModelOptions) -> Value {
    let mut settings = plain(false);
    settings.options = settings_options;
    let mut request = request("", vec![Message::user("hi")], true);
    request.meta.options = std::sync::Arc::new(request_options);
    request_body(&settings, &request)
}

fn options(value: Value) -> ModelOptions {
    serde_json::from_value(value).unwrap()
}

#[test]
fn sampling_and_stop_options_become_their_fields() {
    let body = with_options(
        options(json!({"temperature": 0.2, "top_p": 0.9, "seed": 7})),
        options(json!({"stop": ["END", "STOP"], "temperature": 0.5,
                       "reasoning": {"effort": "high"}})),
    );
    assert_eq!(
        body["temperature"],
        json!(0.5),
        "the template's options win"
    );
    assert_eq!(body["top_p"], json!(0.9));
    assert_eq!(body["stop_sequences"], json!(["END", "STOP"]));
    // No Messages API field for a seed or an effort.
    for absent in [
        "seed",
        "stop",
        "reasoning_effort",
        "thinking",
        "tool_choice",
    ] {
        assert!(body.get(absent).is_none(), "{absent}: {body}");
    }
    let none = with_options(ModelOptions::default(), ModelOptions::default());
    for absent in [
        "temperature",
        "top_p",
        "stop_sequences",
        "tool_choice",
        "thinking",
    ] {
        assert!(none.get(absent).is_none(), "{absent}");
    }
}

#[test]
fn tool_choice_and_parallel_calls_become_one_tool_choice() {
    let choice = |value: Value| {
        with_options(ModelOptions::default(), options(value))
            .get("tool_choice")
            .cloned()
    };
    assert_eq!(
        choice(json!({"tool_choice": "auto"})),
        Some(json!({"type": "auto"}))
    );
    assert_eq!(
        choice(json!({"tool_choice": "required"})),
        Some(json!({"type": "any"}))
    );
    assert_eq!(
        choice(json!({"tool_choice": "none"})),
        Some(json!({"type": "none"}))
    );
    assert_eq!(
        choice(json!({"tool_choice": "read_file"})),
        Some(json!({"type": "tool", "name": "read_file"}))
    );
    assert_eq!(
        choice(json!({"tool_choice": "required", "parallel_tool_calls": false})),
        Some(json!({"type": "any", "disable_parallel_tool_use": true}))
    );
    assert_eq!(
        choice(json!({"parallel_tool_calls": false})),
        Some(json!({"type": "auto", "disable_parallel_tool_use": true}))
    );
    assert_eq!(choice(json!({"parallel_tool_calls": true})), None);
    // `none` takes no other field.
    assert_eq!(
        choice(json!({"tool_choice": "none", "parallel_tool_calls": false})),
        Some(json!({"type": "none"}))
    );
    // Without tools the API refuses a tool_choice: none is sent.
    let mut request = request("", vec![Message::user("hi")], false);
    request.meta.options = std::sync::Arc::new(options(json!({"tool_choice": "required"})));
    assert!(
        request_body(&plain(false), &request)
            .get("tool_choice")
            .is_none()
    );
}

#[test]
fn a_thinking_budget_enables_thinking_and_leaves_room_for_the_reply() {
    let thinking = |max_tokens: Option<u32>, budget: u32| {
        let mut settings = plain(false);
        settings.max_tokens = max_tokens;
        settings.options = options(json!({"reasoning": {"budget_tokens": budget}}));
        let body = request_body(&settings, &request("", vec![Message::user("hi")], false));
        assert_eq!(
            body["thinking"],
            json!({"type": "enabled", "budget_tokens": budget})
        );
        body["max_tokens"].as_u64().unwrap()
    };
    // Room enough: max_tokens as configured.
    assert_eq!(thinking(Some(8192), 2048), 8192);
    assert_eq!(thinking(None, 2048), 4096);
    // Not more than the budget: the configured length on top of it.
    assert_eq!(thinking(Some(1024), 2048), 3072);
    assert_eq!(thinking(Some(2048), 2048), 4096);
    assert_eq!(thinking(None, 10_000), 14_096);
}

#[test]
fn extra_body_goes_last_and_wins() {
    let body = with_options(
        options(json!({"temperature": 0.2, "extra_body": {"top_k": 5}})),
        options(json!({"extra_body": {"temperature": 1.0, "metadata": {"user_id": "u1"}}})),
    );
    assert_eq!(body["temperature"], json!(1.0));
    assert_eq!(body["top_k"], json!(5));
    assert_eq!(body["metadata"], json!({"user_id": "u1"}));
    let keys: Vec<&str> = body
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(&keys[keys.len() - 2..], ["top_k", "metadata"]);
}

// ---- Thinking round trip --------------------------------------------------

const THINKING_REPLY: &str = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"thinking","thinking":"The user wants Oslo.","signature":"EqQBCkYIARgCIkD+sig=="},{"type":"redacted_thinking","data":"EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"},{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Oslo"}}],"stop_reason":"tool_use","usage":{"input_tokens":10,"output_tokens":20}}"#;

/// The next request after `reply`, its call answered.
fn next_assistant_turn(reply: Message) -> Value {
    let call = reply.tool_calls().next().unwrap().clone();
    let body = body(vec![
        Message::user("Weather in Oslo?"),
        reply,
        Message::tool_result(&call, json!("-3C")),
    ]);
    body["messages"][1].clone()
}

#[test]
fn thinking_blocks_go_back_unchanged_and_first() {
    let reply = parse(THINKING_REPLY).unwrap().message;
    let sent: Value = serde_json::from_str(THINKING_REPLY).unwrap();
    assert_eq!(
        next_assistant_turn(reply.clone()),
        json!({"role": "assistant", "content": sent["content"]})
    );
    // Through the stored form (a journal, a checkpoint) as well.
    let stored: Message = serde_json::from_value(serde_json::to_value(&reply).unwrap()).unwrap();
    assert_eq!(stored, reply);
    // Reasoning without kept blocks (another provider's) is not sent.
    let Message::Assistant { content, .. } = reply else {
        unreachable!()
    };
    let bare = Message::Assistant {
        content,
        meta: Meta::default(),
    };
    let turn = next_assistant_turn(bare);
    assert_eq!(turn["content"][0]["type"], "text");
    assert_eq!(turn["content"].as_array().unwrap().len(), 2);
}

#[test]
fn streamed_thinking_keeps_its_signature_and_redacted_blocks() {
    let events = [
        json!({"type": "message_start", "message": {"content": [], "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "The user "}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "wants Oslo."}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQBCkYIARgCIkD+sig=="}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "Checking."}}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}}),
        json!({"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta", "partial_json": "{\"city\":\"Oslo\"}"}}),
        json!({"type": "content_block_stop", "index": 3}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 20}}),
        json!({"type": "message_stop"}),
    ];
    let stream: String = events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect();
    let (reply, _) = assemble(stream_state(), &stream);
    assert_eq!(reply.unwrap(), parse(THINKING_REPLY).unwrap());
}

// ---- Truncation -----------------------------------------------------------

#[test]
fn a_reply_cut_at_max_tokens_is_truncated_streamed_or_not() {
    let mut body: Value = serde_json::from_str(TOOL_REPLY).unwrap();
    body["stop_reason"] = json!("max_tokens");
    let failure = parse_response(&body).unwrap_err();
    // The cut reply's usage is kept: it was billed (issue 34).
    let tokens = Tokens {
        input: 42,
        output: 17,
        reported: true,
        ..Tokens::default()
    };
    assert_eq!(
        failure,
        Failure::Truncated(
            "stop_reason max_tokens after 17 output tokens (raise max_tokens)".into(),
            tokens
        )
    );
    assert!(!failure.retryable());

    let stream = TOOL_STREAM.replace(
        r#""stop_reason":"tool_use""#,
        r#""stop_reason":"max_tokens""#,
    );
    let (reply, _) = assemble(stream_state(), &stream);
    assert!(
        matches!(reply, Err(Failure::Truncated(_, t)) if t == tokens),
        "{reply:?}"
    );
}

#[test]
fn a_native_structured_output_is_the_output_config_format() {
    let native = ModelOptions {
        output: Some(arbor_actors::model::OutputFormat {
            name: "judge".into(),
            schema: arbor_actors::schema::Schema::compile(json!({
                "type": "object", "properties": {"score": {"type": "number"}},
                "required": ["score"], "additionalProperties": false
            }))
            .unwrap(),
            strict: true,
        }),
        ..ModelOptions::default()
    };
    let body = with_options(ModelOptions::default(), native);
    assert_eq!(
        body["output_config"],
        json!({"format": {"type": "json_schema", "schema": {
            "type": "object", "properties": {"score": {"type": "number"}},
            "required": ["score"], "additionalProperties": false
        }}})
    );
    // No beta header: the field is generally available.
    assert!(
        Anthropic
            .fixed_headers()
            .iter()
            .all(|(name, _)| *name != "anthropic-beta")
    );
    let plain = with_options(ModelOptions::default(), ModelOptions::default());
    assert!(plain.get("output_config").is_none(), "{plain}");
}

#[test]
fn a_truncated_retry_gets_more_room_and_keeps_the_thinking_budgets() {
    // max_tokens as sent after `with_room(retry)`, for a configured length
    // and a thinking budget.
    let retried = |max_tokens: Option<u32>, budget: Option<u32>, retry: u32| {
        let mut settings = plain(false);
        settings.max_tokens = max_tokens;
        if let Some(budget) = budget {
            settings.options = options(json!({"reasoning": {"budget_tokens": budget}}));
        }
        let mut body = request_body(&settings, &request("", vec![Message::user("hi")], false));
        Anthropic.with_room(&mut body, &settings, retry);
        body["max_tokens"].as_u64().unwrap()
    };
    assert_eq!(retried(Some(1024), None, 8192), 8192);
    assert_eq!(retried(None, None, 8192), 8192);
    // The budget fitted under the configured length: it fits under the larger.
    assert_eq!(retried(Some(8192), Some(2048), 16_384), 16_384);
    // The budget got the configured length on top: it gets the larger on
    // top, so the reply's room is the retry's length (not 16384 - 10000).
    assert_eq!(retried(Some(4096), Some(10_000), 16_384), 26_384);
    assert_eq!(retried(None, Some(10_000), 16_384), 26_384);
}
