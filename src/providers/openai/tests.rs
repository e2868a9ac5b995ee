use std::collections::BTreeMap;

use arbor_actors::message::TOOL_CALL_ERROR;

use super::*;
use crate::providers::fixtures::{
    assemble, feed, joined, non_adjacent_history, request, sample_history, settings, sink, sse,
    weather_call,
};
use crate::providers::settings::ProviderKind;

// Captured from aimock (/tmp/aimock-notes.md §2, §3, §6).
const TOOL_REPLY: &str = r#"{"id":"chatcmpl-xfPTaIHe6YghaB2t","object":"chat.completion","created":1796020799,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"tool_calls":[{"id":"call_paris","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"unit\":\"celsius\"}"}},{"id":"call_berlin","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Berlin\",\"unit\":\"celsius\"}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":23,"total_tokens":33}}"#;

const TEXT_REPLY: &str = r#"{"id":"chatcmpl-feEjdkNHgIRHoHqX","object":"chat.completion","created":1796020909,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Paris is 18°C and Berlin is 12°C.","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":17,"completion_tokens":9,"total_tokens":26}}"#;

/// The streamed form of the text + two calls fixture (usage 42/17).
const TOOL_STREAM: &str = r#"data: {"id":"chatcmpl-hozWG605QVkeTSS6","object":"chat.completion.chunk","created":1796020909,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-hozWG605QVkeTSS6","object":"chat.completion.chunk","created":1796020909,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"Checking both cities"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-hozWG605QVkeTSS6","object":"chat.completion.chunk","created":1796020909,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"."},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-hozWG605QVkeTSS6","object":"chat.completion.chunk","created":1796020909,"model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_paris","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-hozWG605QVkeTSS6","object":"chat.completion.chunk","created":1796020909,"model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":\"Paris\",\"uni"}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-hozWG605QVkeTSS6","object":"chat.completion.chunk","created":1796020909,"model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"t\":\"celsius\"}"}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-hozWG605QVkeTSS6","object":"chat.completion.chunk","created":1796020909,"model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_berlin","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-hozWG605QVkeTSS6","object":"chat.completion.chunk","created":1796020909,"model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"city\":\"Berlin\",\"un"}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-hozWG605QVkeTSS6","object":"chat.completion.chunk","created":1796020909,"model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"it\":\"celsius\"}"}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-hozWG605QVkeTSS6","object":"chat.completion.chunk","created":1796020909,"model":"gpt-4o","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}]}

data: {"id":"chatcmpl-hozWG605QVkeTSS6","object":"chat.completion.chunk","created":1796020909,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":42,"completion_tokens":17,"total_tokens":59}}

data: [DONE]

"#;

fn parse(body: &str) -> Result<Reply, Failure> {
    parse_response(&serde_json::from_str(body).unwrap())
}

fn two_calls() -> Vec<ToolCall> {
    vec![
        ToolCall {
            tool_call_id: "call_paris".into(),
            tool_name: "get_weather".into(),
            input: json!({"city": "Paris", "unit": "celsius"}),
        },
        ToolCall {
            tool_call_id: "call_berlin".into(),
            tool_name: "get_weather".into(),
            input: json!({"city": "Berlin", "unit": "celsius"}),
        },
    ]
}

fn tokens(input: u64, output: u64, cache_read: u64) -> Tokens {
    Tokens {
        input,
        output,
        cache_read,
        cache_write: 0,
        reported: true,
    }
}

#[test]
fn request_body_puts_system_first_and_results_right_after_their_call() {
    let body = request_body(
        &settings(ProviderKind::OpenAi, true),
        &request("You are terse.", sample_history(), true),
    );
    assert_eq!(
        body,
        json!({
            "model": "gpt-4o",
            "max_tokens": 1024,
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is the weather in Paris and Berlin?"},
                {"role": "user", "content": [
                    {"type": "text", "text": "And this chart:"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/chart.png"}}
                ]},
                {"role": "assistant", "content": "Checking both cities.", "tool_calls": [
                    {"id": "call_paris", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_berlin", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Berlin\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_paris", "content": "{\"tempC\":18}"},
                {"role": "tool", "tool_call_id": "call_berlin",
                 "content": "{\"errorMessage\":\"no station in Berlin\"}"},
                {"role": "user", "content": "Thanks. Any rain?"}
            ],
            "tools": [
                {"type": "function", "function": {
                    "name": "get_weather", "description": "Current weather in a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
                }},
                {"type": "function", "function": {
                    "name": "read_file", "description": "Reads a file",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}
                }}
            ]
        })
    );
}

#[test]
fn request_body_without_streaming_tools_or_system_has_none_of_them() {
    let body = request_body(
        &settings(ProviderKind::OpenAi, false),
        &request("", vec![Message::user("hi")], false),
    );
    assert_eq!(
        body,
        json!({"model": "gpt-4o", "max_tokens": 1024,
               "messages": [{"role": "user", "content": "hi"}]})
    );
}

#[test]
fn results_not_adjacent_to_their_call_are_moved_right_after_it() {
    let body = request_body(
        &settings(ProviderKind::OpenAi, false),
        &request("", non_adjacent_history(), false),
    );
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_paris", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_paris", "content": "18C"},
            {"role": "user", "content": "Hurry up."}
        ])
    );
}

#[test]
fn history_system_messages_stay_in_place_and_reasoning_only_replies_are_dropped() {
    let reasoning_only = Message::Assistant {
        content: Content::Parts(vec![Part::Reasoning { text: "hmm".into() }]),
        meta: Default::default(),
    };
    let body = request_body(
        &settings(ProviderKind::OpenAi, false),
        &request(
            "sys",
            vec![
                Message::user("a"),
                reasoning_only,
                Message::system("later"),
                Message::user("b"),
            ],
            false,
        ),
    );
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "a"},
            {"role": "system", "content": "later"},
            {"role": "user", "content": "b"}
        ])
    );
}

#[test]
fn a_malformed_stored_input_is_sent_back_as_the_model_wrote_it() {
    let call = ToolCall {
        tool_call_id: "c1".into(),
        tool_name: "get_weather".into(),
        input: json!("{oops"),
    };
    let body = request_body(
        &settings(ProviderKind::OpenAi, false),
        &request(
            "",
            vec![
                Message::user("go"),
                Message::assistant(None, vec![call.clone()]),
                Message::tool_error(&call, "arguments are not JSON"),
            ],
            false,
        ),
    );
    assert_eq!(
        body.pointer("/messages/1/tool_calls/0/function/arguments"),
        Some(&json!("{oops"))
    );
}

#[test]
fn parses_the_captured_reply_with_two_tool_calls() {
    let reply = parse(TOOL_REPLY).unwrap();
    assert_eq!(reply.message, Message::assistant(None, two_calls()));
    assert_eq!(reply.tokens, tokens(10, 23, 0));
}

#[test]
fn parses_the_captured_text_reply() {
    let reply = parse(TEXT_REPLY).unwrap();
    assert_eq!(
        reply.message,
        Message::assistant(Some("Paris is 18°C and Berlin is 12°C.".into()), vec![])
    );
    assert_eq!(reply.message.text(), "Paris is 18°C and Berlin is 12°C.");
    assert_eq!(reply.tokens, tokens(17, 9, 0));
}

#[test]
fn a_reply_without_usage_says_its_counts_were_not_reported() {
    let mut body: Value = serde_json::from_str(TEXT_REPLY).unwrap();
    body.as_object_mut().unwrap().remove("usage");
    let reply = parse_response(&body).unwrap();
    assert_eq!(reply.tokens, Tokens::default());
    assert!(!reply.tokens.reported);
    body["usage"] = Value::Null;
    assert!(!parse_response(&body).unwrap().tokens.reported);
    // A stream whose usage chunk never comes (no `include_usage` support).
    let stream: String = TOOL_STREAM
        .split("\n\n")
        .filter(|event| !event.trim().is_empty() && !event.contains("\"usage\""))
        .map(|event| format!("{event}\n\n"))
        .collect();
    let (reply, _) = assemble(Box::new(StreamState::default()), &stream);
    assert!(!reply.unwrap().tokens.reported);
    // Reported zeros are counts.
    assert!(parse(TEXT_REPLY).unwrap().tokens.reported);
}

#[test]
fn the_captured_stream_gives_the_same_reply_as_its_non_streamed_form() {
    // The non-streamed form of the same fixture (text, two calls, usage 42/17).
    let mut whole: Value = serde_json::from_str(TOOL_REPLY).unwrap();
    whole["choices"][0]["message"]["content"] = json!("Checking both cities.");
    whole["usage"] = json!({"prompt_tokens": 42, "completion_tokens": 17, "total_tokens": 59});
    let expected = parse_response(&whole).unwrap();
    assert_eq!(
        expected.message,
        Message::assistant(Some("Checking both cities.".into()), two_calls())
    );
    assert_eq!(expected.tokens, tokens(42, 17, 0));

    let (reply, deltas) = assemble(Box::new(StreamState::default()), TOOL_STREAM);
    assert_eq!(reply.unwrap(), expected);
    let (text, reasoning, args) = joined(&deltas);
    assert_eq!(text, "Checking both cities.");
    assert_eq!(reasoning, "");
    assert_eq!(
        args,
        BTreeMap::from([
            (0, r#"{"city":"Paris","unit":"celsius"}"#.to_owned()),
            (1, r#"{"city":"Berlin","unit":"celsius"}"#.to_owned()),
        ])
    );
}

#[test]
fn malformed_arguments_come_back_as_a_string_input() {
    let mut body: Value = serde_json::from_str(TOOL_REPLY).unwrap();
    body["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"] = json!("{oops");
    let reply = parse_response(&body).unwrap();
    let calls: Vec<_> = reply.message.tool_calls().cloned().collect();
    assert_eq!(calls[0].input, json!({"city": "Paris", "unit": "celsius"}));
    assert_eq!(calls[1].input, json!("{oops"));

    let stream = TOOL_STREAM.replace(r#"it\":\"celsius\"}"#, "");
    let stream = stream.replace(r#"{\"city\":\"Berlin\",\"un"#, "{oops");
    let (reply, _) = assemble(Box::new(StreamState::default()), &stream);
    let calls: Vec<_> = reply.unwrap().message.tool_calls().cloned().collect();
    assert_eq!(calls[1].input, json!("{oops"));
}

#[test]
fn empty_arguments_are_an_empty_object() {
    let mut body: Value = serde_json::from_str(TOOL_REPLY).unwrap();
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = json!("");
    let reply = parse_response(&body).unwrap();
    assert_eq!(reply.message.tool_calls().next().unwrap().input, json!({}));
}

#[test]
fn a_stream_cut_before_done_never_completes() {
    let events = sse(TOOL_STREAM);
    let (sink, _) = sink();
    let mut state = StreamState::default();
    let cut = &events[..events.len() - 1];
    assert!(
        feed(&mut state, cut, &sink)
            .into_iter()
            .all(|o| o == Ok(false))
    );

    // [DONE] without a finish reason is a truncated reply too.
    let mut state = StreamState::default();
    let outcomes = feed(&mut state, &events[..3], &sink);
    assert!(outcomes.into_iter().all(|o| o == Ok(false)));
    let done = state.event("message", "[DONE]", &sink);
    assert!(matches!(done, Err(Failure::Transient { .. })), "{done:?}");
}

#[test]
fn a_stream_closed_after_its_finish_reason_is_whole_without_done() {
    let events = sse(TOOL_STREAM);
    let (sink, _) = sink();
    let mut cut = StreamState::default();
    feed(&mut cut, &events[..3], &sink);
    assert!(!cut.complete_without_end(), "no finish reason yet");
    // Everything but the final [DONE]: the finish reason was seen.
    let mut state = StreamState::default();
    feed(&mut state, &events[..events.len() - 1], &sink);
    assert!(state.complete_without_end());
    let reply = Box::new(state).finish().unwrap();
    assert_eq!(reply.message.tool_calls().count(), 2);
}

#[test]
fn a_chunk_that_is_not_json_is_malformed() {
    let (sink, _) = sink();
    let mut state = StreamState::default();
    let outcome = state.event("message", "{malformed json: <<<chaos>>>", &sink);
    assert!(matches!(outcome, Err(Failure::Malformed(_))), "{outcome:?}");
}

#[test]
fn an_error_chunk_or_body_is_transient() {
    let (sink, _) = sink();
    let mut state = StreamState::default();
    let outcome = state.event(
        "message",
        r#"{"error":{"message":"Provider returned error","code":502}}"#,
        &sink,
    );
    assert_eq!(outcome, Err(Failure::transient("Provider returned error")));
    let body = json!({"error": {"message": "upstream overloaded"}});
    assert_eq!(
        parse_response(&body),
        Err(Failure::transient("upstream overloaded"))
    );
    assert!(matches!(
        parse_response(&json!({"id": "x"})),
        Err(Failure::Malformed(_))
    ));
}

#[test]
fn cached_tokens_are_split_from_input() {
    let mut body: Value = serde_json::from_str(TEXT_REPLY).unwrap();
    body["usage"] = json!({"prompt_tokens": 1000, "completion_tokens": 50,
        "prompt_tokens_details": {"cached_tokens": 800}});
    assert_eq!(parse_response(&body).unwrap().tokens, tokens(200, 50, 800));

    let stream = TOOL_STREAM.replace(
        r#""usage":{"prompt_tokens":42,"#,
        r#""usage":{"prompt_tokens_details":{"cached_tokens":40},"prompt_tokens":42,"#,
    );
    let (reply, _) = assemble(Box::new(StreamState::default()), &stream);
    assert_eq!(reply.unwrap().tokens, tokens(2, 17, 40));
}

#[test]
fn reasoning_is_read_under_either_name_streamed_or_not() {
    for key in ["reasoning_content", "reasoning"] {
        let mut body: Value = serde_json::from_str(TEXT_REPLY).unwrap();
        body["choices"][0]["message"]["reasoning_content"] = Value::Null;
        body["choices"][0]["message"][key] = json!("think");
        let expected = parse_response(&body).unwrap();
        assert_eq!(
            expected.message,
            Message::Assistant {
                content: Content::Parts(vec![
                    Part::Reasoning {
                        text: "think".into()
                    },
                    Part::Text {
                        text: "Paris is 18°C and Berlin is 12°C.".into()
                    },
                ]),
                meta: Default::default(),
            }
        );

        let stream = format!(
            "data: {}\n\ndata: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": null, key: "th"}}]}),
            json!({"choices": [{"index": 0, "delta": {key: "ink"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "Paris is 18°C and Berlin is 12°C."}, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 17, "completion_tokens": 9}}),
        );
        let (reply, deltas) = assemble(Box::new(StreamState::default()), &stream);
        assert_eq!(reply.unwrap(), expected);
        assert_eq!(joined(&deltas).1, "think");
    }
}

#[test]
fn a_refusal_is_the_text_streamed_or_not() {
    let mut body: Value = serde_json::from_str(TEXT_REPLY).unwrap();
    body["choices"][0]["message"]["content"] = Value::Null;
    body["choices"][0]["message"]["refusal"] = json!("I can't help with that.");
    let expected = parse_response(&body).unwrap();
    assert_eq!(expected.message.text(), "I can't help with that.");

    let stream = format!(
        "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null, "refusal": "I can't "}}]}),
        json!({"choices": [{"index": 0, "delta": {"refusal": "help with that."}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 17, "completion_tokens": 9}}),
    );
    let (reply, deltas) = assemble(Box::new(StreamState::default()), &stream);
    assert_eq!(reply.unwrap(), expected);
    assert_eq!(joined(&deltas).0, "I can't help with that.");
}

#[test]
fn repeated_ids_and_names_in_later_chunks_are_not_appended() {
    let stream = format!(
        "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "c1", "function": {"name": "get_weather", "arguments": "{\"city\":"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "", "function": {"name": "get_weather", "arguments": "\"Oslo\"}"}}]},
            "finish_reason": "tool_calls"}]}),
    );
    let (reply, _) = assemble(Box::new(StreamState::default()), &stream);
    assert_eq!(
        reply.unwrap().message,
        Message::assistant(None, vec![weather_call("c1", "Oslo")])
    );
}

#[test]
fn tool_call_error_tag_is_carried_by_the_content() {
    // OpenAI has no error flag: the error object is the content the model reads.
    let history = sample_history();
    assert!(history[4].has_tag(TOOL_CALL_ERROR));
    let body = request_body(
        &settings(ProviderKind::OpenAi, false),
        &request("", history, false),
    );
    assert_eq!(
        body["messages"][4]["content"],
        json!("{\"errorMessage\":\"no station in Berlin\"}")
    );
}
