use std::collections::BTreeMap;

use arbor_actors::message::Meta;

use super::*;
use crate::providers::fixtures::{
    assemble, feed, joined, non_adjacent_history, request, sample_history, settings, sink, sse,
    weather_call,
};
use crate::providers::settings::ProviderKind;

// Captured from aimock (/tmp/aimock-notes.md §2, §3): the same fixture
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

fn body(messages: Vec<Message>) -> Value {
    request_body(
        &settings(ProviderKind::Anthropic, false),
        &request("", messages, false),
    )
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
            input: json!({"city": city, "unit": "celsius"}),
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
        &settings(ProviderKind::Anthropic, true),
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
        &settings(ProviderKind::Anthropic, false),
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
    request_body(
        &settings(ProviderKind::Anthropic, false),
        &request(system, messages, false),
    )
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
        input: json!("{oops"),
    };
    let as_text = ToolCall {
        tool_call_id: "c2".into(),
        tool_name: "get_weather".into(),
        input: json!("{\"city\":\"Oslo\"}"),
    };
    let null = ToolCall {
        tool_call_id: "c3".into(),
        tool_name: "get_weather".into(),
        input: Value::Null,
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
            meta: Meta::default(),
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
