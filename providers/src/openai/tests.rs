use std::collections::BTreeMap;

use arbor_actors::message::TOOL_CALL_ERROR;

use super::*;
use crate::ProviderSettings;
use crate::fixtures::{
    assemble, feed, joined, non_adjacent_history, request, sample_history, settings, sink, sse,
    weather_call,
};
use crate::settings::ProviderKind;

// Captured from the aimock mock server (tests/mock).
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
            input: json!({"city": "Paris", "unit": "celsius"}).into(),
        },
        ToolCall {
            tool_call_id: "call_berlin".into(),
            tool_name: "get_weather".into(),
            input: json!({"city": "Berlin", "unit": "celsius"}).into(),
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
            "max_completion_tokens": 1024,
            "tool_choice": "auto",
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
        json!({"model": "gpt-4o", "max_completion_tokens": 1024,
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
            {"role": "assistant", "content": "", "tool_calls": [
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
        input: json!("{oops").into(),
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

fn with_options(options: ModelOptions) -> ProviderSettings {
    let mut settings = settings(ProviderKind::OpenAi, false);
    settings.options = options;
    settings
}

fn options(value: Value) -> ModelOptions {
    serde_json::from_value(value).unwrap()
}

/// The request of `fixtures::request` with the template's own options.
fn request_with(options: ModelOptions, with_tools: bool) -> ModelRequest {
    let mut request = request("", vec![Message::user("hi")], with_tools);
    request.meta.options = std::sync::Arc::new(options);
    request
}

#[test]
fn each_option_is_sent_under_its_chat_completions_name() {
    let settings = with_options(options(json!({
        "temperature": 0.2, "top_p": 0.9, "stop": ["END", "STOP"], "seed": 7,
        "tool_choice": "required", "parallel_tool_calls": false,
        "reasoning": {"effort": "high", "budget_tokens": 2048}
    })));
    let body = request_body(&settings, &request("", vec![Message::user("hi")], true));
    let sent = |key: &str| body.get(key).cloned();
    assert_eq!(sent("temperature"), Some(json!(0.2)));
    assert_eq!(sent("top_p"), Some(json!(0.9)));
    assert_eq!(sent("stop"), Some(json!(["END", "STOP"])));
    assert_eq!(sent("seed"), Some(json!(7)));
    assert_eq!(sent("tool_choice"), Some(json!("required")));
    assert_eq!(sent("parallel_tool_calls"), Some(json!(false)));
    // An effort is OpenAI's; a token budget is Anthropic's and is not sent.
    assert_eq!(sent("reasoning_effort"), Some(json!("high")));
    assert!(!body.to_string().contains("budget"), "{body}");
}

#[test]
fn options_left_unset_send_nothing() {
    let body = request_body(
        &settings(ProviderKind::OpenAi, false),
        &request("", vec![Message::user("hi")], false),
    );
    for key in [
        "temperature",
        "top_p",
        "stop",
        "seed",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning_effort",
    ] {
        assert!(body.get(key).is_none(), "{key} in {body}");
    }
}

#[test]
fn tool_choice_is_a_mode_or_a_named_function() {
    for (choice, wire) in [
        (json!("auto"), json!("auto")),
        (json!("required"), json!("required")),
        (json!("none"), json!("none")),
        (
            json!("get_weather"),
            json!({"type": "function", "function": {"name": "get_weather"}}),
        ),
    ] {
        let settings = with_options(options(json!({ "tool_choice": choice })));
        let body = request_body(&settings, &request("", vec![Message::user("hi")], true));
        assert_eq!(body["tool_choice"], wire, "{choice}");
    }
}

#[test]
fn llama_cpp_reads_no_tool_choice_as_no_tools_so_auto_is_sent_with_tools() {
    let body = request_body(
        &settings(ProviderKind::OpenAi, false),
        &request("", vec![Message::user("hi")], true),
    );
    assert_eq!(body["tool_choice"], json!("auto"));
    assert_eq!(body["tools"].as_array().map(Vec::len), Some(2));
}

#[test]
fn tool_choice_and_parallel_tool_calls_are_not_sent_without_tools() {
    // vLLM: "When using `tool_choice`, `tools` must be set"; OpenAI refuses
    // `parallel_tool_calls` without tools.
    let settings = with_options(options(json!({
        "tool_choice": "required", "parallel_tool_calls": true
    })));
    let body = request_body(&settings, &request("", vec![Message::user("hi")], false));
    assert!(body.get("tools").is_none());
    assert!(body.get("tool_choice").is_none(), "{body}");
    assert!(body.get("parallel_tool_calls").is_none(), "{body}");
}

#[test]
fn a_templates_options_win_over_the_models_and_extra_bodies_merge() {
    let settings = with_options(options(json!({
        "temperature": 1.0, "seed": 1, "tool_choice": "required",
        "extra_body": {"options": {"num_ctx": 8192}, "top_k": 20}
    })));
    let template = options(json!({
        "temperature": 0.0, "tool_choice": "read_file",
        "extra_body": {"top_k": 40}
    }));
    let body = request_body(&settings, &request_with(template, true));
    assert_eq!(body["temperature"], json!(0.0));
    assert_eq!(body["seed"], json!(1));
    assert_eq!(
        body["tool_choice"],
        json!({"type": "function", "function": {"name": "read_file"}})
    );
    assert_eq!(body["options"], json!({"num_ctx": 8192}));
    assert_eq!(body["top_k"], json!(40));
}

#[test]
fn extra_body_is_merged_last_and_its_keys_replace_arbors() {
    let mut settings = with_options(options(json!({
        "temperature": 0.5,
        "extra_body": {"temperature": 0.9, "max_completion_tokens": 64,
                       "chat_template_kwargs": {"enable_thinking": false}}
    })));
    settings.stream = true;
    let body = request_body(&settings, &request("", vec![Message::user("hi")], false));
    assert_eq!(body["temperature"], json!(0.9));
    assert_eq!(body["max_completion_tokens"], json!(64));
    assert_eq!(
        body["chat_template_kwargs"],
        json!({"enable_thinking": false})
    );
    // What it does not name stays.
    assert_eq!(body["stream"], json!(true));
    assert_eq!(body["model"], json!("gpt-4o"));
}

#[test]
fn openai_itself_gets_max_completion_tokens_and_compatible_servers_max_tokens() {
    for (base_url, field) in [
        ("https://api.openai.com/v1", "max_completion_tokens"),
        ("https://API.OpenAI.com/v1/", "max_completion_tokens"),
        ("https://eu.api.openai.com/v1", "max_completion_tokens"),
        ("https://api.openai.com:443/v1", "max_completion_tokens"),
        ("http://localhost:8000/v1", "max_tokens"), // vLLM
        ("http://127.0.0.1:8080/v1", "max_tokens"), // llama.cpp
        ("http://localhost:11434/v1", "max_tokens"), // Ollama
        ("https://openrouter.ai/api/v1", "max_tokens"),
        ("https://api.openai.com.proxy.example/v1", "max_tokens"),
        ("https://notapi.openai.com/v1", "max_tokens"),
        ("not a url", "max_tokens"),
    ] {
        assert_eq!(max_tokens_field(base_url), field, "{base_url}");
    }
    let mut settings = settings(ProviderKind::OpenAi, false);
    settings.base_url = "http://localhost:11434/v1".into();
    let body = request_body(&settings, &request("", vec![Message::user("hi")], false));
    assert_eq!(body["max_tokens"], json!(1024));
    assert!(body.get("max_completion_tokens").is_none());
    // Not set: neither is sent.
    settings.max_tokens = None;
    let body = request_body(&settings, &request("", vec![Message::user("hi")], false));
    assert!(body.get("max_tokens").is_none() && body.get("max_completion_tokens").is_none());
}

#[test]
fn an_assistant_tool_call_without_text_never_sends_content_null() {
    let paris = weather_call("call_paris", "Paris");
    let body = request_body(
        &settings(ProviderKind::OpenAi, false),
        &request(
            "",
            vec![
                Message::user("Weather in Paris?"),
                Message::assistant(None, vec![paris.clone()]),
                Message::tool_result(&paris, json!("18C")),
            ],
            true,
        ),
    );
    let assistant = &body["messages"][1];
    assert_eq!(assistant["content"], json!(""), "{assistant}");
    assert_eq!(assistant["tool_calls"][0]["id"], json!("call_paris"));
    for m in body["messages"].as_array().unwrap() {
        assert!(m["content"].is_string() || m["content"].is_array(), "{m}");
    }
}

/// Ollama's streamed parallel calls: each whole in one chunk, all at `index: 0`.
fn ollama_stream() -> String {
    format!(
        "data: {}\n\ndata: {}\n\ndata: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_paris", "index": 0, "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            "finish_reason": null}]}),
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_berlin", "index": 0, "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":"}}]},
            "finish_reason": null}]}),
        // A piece without an id continues the call last started at its index.
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "\"Berlin\"}"}}]}, "finish_reason": null}]}),
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
            "finish_reason": "tool_calls"}]}),
    )
}

#[test]
fn ollama_parallel_calls_all_at_index_0_come_out_as_separate_calls() {
    let (reply, deltas) = assemble(Box::new(StreamState::default()), &ollama_stream());
    assert_eq!(
        reply.unwrap().message,
        Message::assistant(
            None,
            vec![
                weather_call("call_paris", "Paris"),
                weather_call("call_berlin", "Berlin")
            ]
        )
    );
    // Each call's argument deltas carry its own index in the reply.
    assert_eq!(
        joined(&deltas).2,
        BTreeMap::from([
            (0, r#"{"city":"Paris"}"#.to_owned()),
            (1, r#"{"city":"Berlin"}"#.to_owned()),
        ])
    );
}

#[test]
fn calls_without_an_index_are_told_apart_by_their_id() {
    // Ollama before 0.4.7 sent no `index` at all.
    let stream = ollama_stream().replace("\"index\":0,\"type\"", "\"type\"");
    assert!(
        !stream.contains("\"id\":\"call_paris\",\"index\""),
        "{stream}"
    );
    let (reply, _) = assemble(Box::new(StreamState::default()), &stream);
    let calls: Vec<_> = reply.unwrap().message.tool_calls().cloned().collect();
    assert_eq!(
        calls,
        vec![
            weather_call("call_paris", "Paris"),
            weather_call("call_berlin", "Berlin")
        ]
    );
}

#[test]
fn a_call_whose_id_is_repeated_in_every_chunk_stays_one_call() {
    let stream = format!(
        "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "c1", "function": {"name": "get_weather", "arguments": "{\"city\":"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "c1", "function": {"arguments": "\"Oslo\"}"}}]},
            "finish_reason": "tool_calls"}]}),
    );
    let (reply, _) = assemble(Box::new(StreamState::default()), &stream);
    assert_eq!(
        reply.unwrap().message,
        Message::assistant(None, vec![weather_call("c1", "Oslo")])
    );
}

#[test]
fn a_reply_cut_at_the_output_limit_is_truncated_and_never_a_tool_call() {
    // Non-streamed: the call's arguments stop mid-value.
    let mut body: Value = serde_json::from_str(TOOL_REPLY).unwrap();
    body["choices"][0]["finish_reason"] = json!("length");
    body["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"] =
        json!("{\"city\":\"Ber");
    let failure = parse_response(&body).unwrap_err();
    let Failure::Truncated(message, tokens) = &failure else {
        panic!("{failure:?}");
    };
    // Billed all the same: the usage is kept (issue 34).
    assert_eq!(
        (tokens.input, tokens.output, tokens.reported),
        (10, 23, true)
    );
    assert!(!failure.retryable());
    assert!(message.contains("finish_reason \"length\""), "{message}");
    assert!(message.contains("after 23 output tokens"), "{message}");
    assert!(message.contains("`get_weather`"), "{message}");
    assert!(message.contains("max_tokens"), "{message}");

    // Streamed: the same, with the usage chunk after the finish reason.
    let stream = TOOL_STREAM.replace(r#"it\":\"celsius\"}"#, "").replace(
        r#""finish_reason":"tool_calls""#,
        r#""finish_reason":"length""#,
    );
    let (reply, _) = assemble(Box::new(StreamState::default()), &stream);
    let failure = reply.unwrap_err();
    let Failure::Truncated(message, tokens) = &failure else {
        panic!("{failure:?}");
    };
    assert!(message.contains("after 17 output tokens"), "{message}");
    assert_eq!((tokens.input, tokens.output), (42, 17));
    assert!(message.contains("`get_weather`"), "{message}");

    // A stream closed right after the finish reason (no usage, no [DONE]).
    let events = sse(&stream);
    let (sink, _) = sink();
    let mut state = StreamState::default();
    feed(&mut state, &events[..events.len() - 2], &sink);
    assert!(state.complete_without_end());
    assert!(matches!(
        Box::new(state).finish(),
        Err(Failure::Truncated(..))
    ));
}

#[test]
fn a_text_reply_cut_at_the_output_limit_is_truncated_too() {
    let mut body: Value = serde_json::from_str(TEXT_REPLY).unwrap();
    body["choices"][0]["finish_reason"] = json!("length");
    let Err(Failure::Truncated(message, _)) = parse_response(&body) else {
        panic!("not truncated");
    };
    assert!(message.contains("text may be incomplete"), "{message}");
    let stream = format!(
        "data: {}\n\ndata: [DONE]\n\n",
        json!({"choices": [{"index": 0, "delta": {"content": "Paris is"}, "finish_reason": "length"}]}),
    );
    let (reply, _) = assemble(Box::new(StreamState::default()), &stream);
    assert!(matches!(reply, Err(Failure::Truncated(..))), "{reply:?}");
    // Other finish reasons are whole replies.
    body["choices"][0]["finish_reason"] = json!("stop");
    assert!(parse_response(&body).is_ok());
}

/// A native structured output's format, strict or not.
fn output_format(strict: bool) -> arbor_actors::model::OutputFormat {
    arbor_actors::model::OutputFormat {
        name: "judge".into(),
        schema: arbor_actors::schema::Schema::compile(json!({
            "type": "object", "properties": {"score": {"type": "number"}},
            "required": ["score"], "additionalProperties": false
        }))
        .unwrap(),
        strict,
    }
}

#[test]
fn a_native_structured_output_is_a_json_schema_response_format() {
    for strict in [true, false] {
        let options = ModelOptions {
            output: Some(output_format(strict)),
            ..ModelOptions::default()
        };
        let body = request_body(
            &settings(ProviderKind::OpenAi, false),
            &request_with(options, false),
        );
        assert_eq!(
            body["response_format"],
            json!({"type": "json_schema", "json_schema": {
                "name": "judge",
                "schema": {"type": "object", "properties": {"score": {"type": "number"}},
                    "required": ["score"], "additionalProperties": false},
                "strict": strict
            }})
        );
    }
    let plain = request_body(
        &settings(ProviderKind::OpenAi, false),
        &request_with(ModelOptions::default(), false),
    );
    assert!(plain.get("response_format").is_none(), "{plain}");
}

#[test]
fn a_truncated_retry_sets_the_field_max_tokens_goes_in() {
    for (base_url, field) in [
        ("https://api.openai.com/v1", "max_completion_tokens"),
        ("http://localhost:11434/v1", "max_tokens"),
    ] {
        let mut settings = settings(ProviderKind::OpenAi, false);
        settings.base_url = base_url.into();
        let mut body = request_body(&settings, &request("", vec![Message::user("hi")], false));
        OpenAi.with_room(&mut body, &settings, 8192);
        assert_eq!(body[field], json!(8192), "{base_url}");
        let other = if field == "max_tokens" {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        assert!(body.get(other).is_none(), "{base_url}: {body}");
        // Without a configured max_tokens the retry still says one.
        settings.max_tokens = None;
        let mut body = request_body(&settings, &request("", vec![Message::user("hi")], false));
        OpenAi.with_room(&mut body, &settings, 8192);
        assert_eq!(body[field], json!(8192), "{base_url}");
    }
}
