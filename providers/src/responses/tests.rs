use std::collections::BTreeMap;
use std::sync::Arc;

use arbor_actors::model::{Reasoning, ReasoningEffort};

use super::*;
use crate::fixtures::{
    assemble, feed, joined, non_adjacent_history, request, sample_history, settings, sink, sse,
    weather_call,
};
use crate::settings::{Api, HttpSection};

const TOOL_REPLY: &str = include_str!("../../../tests/fixtures/responses/tool_reply.json");
const TOOL_STREAM: &str = include_str!("../../../tests/fixtures/responses/tool_reply.sse");
const TEXT_REPLY: &str = include_str!("../../../tests/fixtures/responses/text_reply.json");
const TRUNCATED_REPLY: &str =
    include_str!("../../../tests/fixtures/responses/truncated_reply.json");
const TRUNCATED_STREAM: &str =
    include_str!("../../../tests/fixtures/responses/truncated_reply.sse");

fn responses_settings(stream: bool) -> ProviderSettings {
    let mut s = settings(ProviderKind::OpenAi, stream);
    s.api = Api::Responses;
    s
}

fn parse(body: &str) -> Result<Reply, Failure> {
    parse_response(&serde_json::from_str(body).unwrap())
}

/// The reasoning item of the tool fixture, as kept and as sent back.
fn kept_item() -> Value {
    json!({"id": "rs_01", "encrypted_content": "gAAAAB-enc-1",
           "summary": [{"type": "summary_text", "text": "Two cities, two calls."}]})
}

/// The assistant message the tool fixture parses to.
fn tool_message() -> Message {
    Message::Assistant {
        content: Content::Parts(vec![
            Part::Reasoning {
                text: "Two cities, two calls.".into(),
            },
            Part::Text {
                text: "Checking both cities.".into(),
            },
            Part::ToolCall(weather_call("call_paris", "Paris")),
            Part::ToolCall(weather_call("call_berlin", "Berlin")),
        ]),
        meta: Meta {
            provider_options: Some(json!({"openai": {"reasoning": [kept_item()]}})),
            ..Meta::default()
        },
    }
}

fn with_options(mut req: ModelRequest, options: Value) -> ModelRequest {
    req.meta.options = Arc::new(serde_json::from_value(options).unwrap());
    req
}

#[test]
fn request_body_has_instructions_input_items_tools_and_no_storage() {
    let body = request_body(
        &responses_settings(true),
        &request("You are terse.", sample_history(), true),
    );
    assert_eq!(
        body,
        json!({
            "model": "gpt-4o",
            "instructions": "You are terse.",
            "max_output_tokens": 1024,
            "store": false,
            "include": ["reasoning.encrypted_content"],
            "stream": true,
            "input": [
                {"role": "user", "content": [
                    {"type": "input_text", "text": "What is the weather in Paris and Berlin?"}
                ]},
                {"role": "user", "content": [
                    {"type": "input_text", "text": "And this chart:"},
                    {"type": "input_image", "image_url": "data:image/png;base64,aGk=", "detail": "auto"},
                    {"type": "input_image", "image_url": "https://example.com/chart.png", "detail": "auto"}
                ]},
                {"role": "assistant", "content": [
                    {"type": "output_text", "text": "Checking both cities."}
                ]},
                {"type": "function_call", "call_id": "call_paris", "name": "get_weather",
                 "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call", "call_id": "call_berlin", "name": "get_weather",
                 "arguments": "{\"city\":\"Berlin\"}"},
                {"type": "function_call_output", "call_id": "call_paris", "output": "{\"tempC\":18}"},
                {"type": "function_call_output", "call_id": "call_berlin",
                 "output": "{\"errorMessage\":\"no station in Berlin\"}"},
                {"role": "user", "content": [{"type": "input_text", "text": "Thanks. Any rain?"}]}
            ],
            "tools": [
                {"type": "function", "name": "get_weather", "description": "Current weather in a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                 "strict": false},
                {"type": "function", "name": "read_file", "description": "Reads a file",
                 "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
                 "strict": false}
            ]
        })
    );
}

#[test]
fn request_body_without_streaming_tools_system_or_limit_has_none_of_them() {
    let mut s = responses_settings(false);
    s.max_tokens = None;
    let body = request_body(&s, &request("", vec![Message::user("hi")], false));
    assert_eq!(
        body,
        json!({"model": "gpt-4o", "store": false, "include": ["reasoning.encrypted_content"],
               "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]})
    );
}

#[test]
fn results_not_adjacent_to_their_call_are_moved_right_after_it() {
    let body = request_body(
        &responses_settings(false),
        &request("", non_adjacent_history(), false),
    );
    assert_eq!(
        body["input"],
        json!([
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "function_call", "call_id": "call_paris", "name": "get_weather",
             "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_paris", "output": "18C"},
            {"role": "user", "content": [{"type": "input_text", "text": "Hurry up."}]}
        ])
    );
}

#[test]
fn history_system_messages_stay_in_place_and_files_go_as_input_files() {
    let file = Message::User {
        content: Content::Parts(vec![
            Part::File {
                data: "JVBERi0=".into(),
                filename: Some("a.pdf".into()),
                media_type: "application/pdf".into(),
            },
            Part::File {
                data: "https://example.com/b.pdf".into(),
                filename: None,
                media_type: "application/pdf".into(),
            },
        ]),
        meta: Default::default(),
    };
    let body = request_body(
        &responses_settings(false),
        &request(
            "sys",
            vec![Message::user("a"), Message::system("later"), file],
            false,
        ),
    );
    assert_eq!(
        body["input"],
        json!([
            {"role": "user", "content": [{"type": "input_text", "text": "a"}]},
            {"role": "system", "content": [{"type": "input_text", "text": "later"}]},
            {"role": "user", "content": [
                {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0="},
                {"type": "input_file", "file_url": "https://example.com/b.pdf"}
            ]}
        ])
    );
    assert_eq!(body["instructions"], "sys");
}

#[test]
fn a_malformed_stored_input_is_sent_back_as_the_model_wrote_it() {
    let call = ToolCall {
        tool_call_id: "c1".into(),
        tool_name: "get_weather".into(),
        input: json!("{oops").into(),
    };
    let body = request_body(
        &responses_settings(false),
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
    assert_eq!(body["input"][1]["arguments"], "{oops");
    assert_eq!(
        body["input"][2]["output"],
        "{\"errorMessage\":\"arguments are not JSON\"}"
    );
}

#[test]
fn a_tool_result_with_media_is_a_list_of_content_parts() {
    let call = weather_call("c1", "Paris");
    let result = Message::Tool {
        tool_call_id: "c1".into(),
        tool_name: "get_weather".into(),
        content: vec![
            ToolResultPart::Json {
                value: json!("a map"),
            },
            ToolResultPart::Media {
                data: "aGk=".into(),
                media_type: "image/png".into(),
            },
            ToolResultPart::Media {
                data: "AAA=".into(),
                media_type: "audio/wav".into(),
            },
        ],
        meta: Default::default(),
    };
    let body = request_body(
        &responses_settings(false),
        &request(
            "",
            vec![
                Message::user("go"),
                Message::assistant(None, vec![call]),
                result,
            ],
            false,
        ),
    );
    assert_eq!(
        body["input"][2]["output"],
        json!([
            {"type": "input_text", "text": "a map"},
            {"type": "input_image", "image_url": "data:image/png;base64,aGk=", "detail": "auto"},
            {"type": "input_text", "text": "[audio/wav attachment omitted: not supported in tool results]"}
        ])
    );
}

#[test]
fn options_are_sent_as_the_responses_api_names_them_and_extra_body_goes_last() {
    let mut s = responses_settings(false);
    s.options = serde_json::from_value(json!({
        "temperature": 0.2, "top_p": 0.9, "seed": 7, "stop": ["END"],
        "parallel_tool_calls": false,
        "extra_body": {"store": true, "service_tier": "flex"}
    }))
    .unwrap();
    let req = with_options(
        request("", vec![Message::user("hi")], true),
        json!({"temperature": 0.7, "tool_choice": "get_weather", "reasoning": {"effort": "high"},
               "extra_body": {"truncation": "auto"}}),
    );
    let body = request_body(&s, &req);
    assert_eq!(body["temperature"], json!(0.7));
    assert_eq!(body["top_p"], json!(0.9));
    assert_eq!(
        body["tool_choice"],
        json!({"type": "function", "name": "get_weather"})
    );
    assert_eq!(body["parallel_tool_calls"], json!(false));
    assert_eq!(body["reasoning"], json!({"effort": "high"}));
    // No `stop` or `seed` in this API.
    assert!(body.get("stop").is_none() && body.get("seed").is_none());
    // extra_body (the model's and the template's, merged) has the last word.
    assert_eq!(body["store"], json!(true));
    assert_eq!(body["service_tier"], "flex");
    assert_eq!(body["truncation"], "auto");
}

#[test]
fn tool_choice_takes_each_form_and_only_with_tools() {
    let s = responses_settings(false);
    for (choice, wire) in [
        ("auto", json!("auto")),
        ("required", json!("required")),
        ("none", json!("none")),
    ] {
        let req = with_options(
            request("", vec![Message::user("hi")], true),
            json!({ "tool_choice": choice, "parallel_tool_calls": true }),
        );
        assert_eq!(request_body(&s, &req)["tool_choice"], wire);
        let without = with_options(
            request("", vec![Message::user("hi")], false),
            json!({ "tool_choice": choice, "parallel_tool_calls": true }),
        );
        let body = request_body(&s, &without);
        assert!(body.get("tool_choice").is_none(), "{body}");
        assert!(body.get("parallel_tool_calls").is_none(), "{body}");
    }
    let mut effort = ModelOptions::default();
    effort.reasoning = Some(Reasoning {
        effort: Some(ReasoningEffort::Minimal),
        budget_tokens: Some(2048),
    });
    let mut s = responses_settings(false);
    s.options = effort;
    let body = request_body(&s, &request("", vec![Message::user("hi")], false));
    assert_eq!(body["reasoning"], json!({"effort": "minimal"}));
}

#[test]
fn a_reply_parses_to_reasoning_text_and_calls_in_output_order_with_usage() {
    let reply = parse(TOOL_REPLY).unwrap();
    assert_eq!(reply.message, tool_message());
    assert_eq!(
        reply.tokens,
        Tokens {
            input: 20,
            output: 40,
            cache_read: 100,
            cache_write: 0,
            reported: true
        }
    );
    let text = parse(TEXT_REPLY).unwrap();
    assert_eq!(text.message.text(), "Paris is 18°C; Berlin has no station.");
    assert_eq!(text.message.meta().provider_options, None);
    assert_eq!((text.tokens.input, text.tokens.output), (180, 12));
}

#[test]
fn a_reply_without_usage_reports_none_and_a_refusal_is_its_text() {
    let reply = parse_response(&json!({
        "status": "completed",
        "output": [{"type": "message", "role": "assistant",
                    "content": [{"type": "refusal", "refusal": "I can't help with that."}]}]
    }))
    .unwrap();
    assert_eq!(reply.message.text(), "I can't help with that.");
    assert!(!reply.tokens.reported);
}

#[test]
fn the_reasoning_item_goes_back_before_the_text_and_calls_it_came_with() {
    let reply = parse(TOOL_REPLY).unwrap().message;
    let paris = weather_call("call_paris", "Paris");
    let berlin = weather_call("call_berlin", "Berlin");
    let history = vec![
        Message::user("Weather in Paris and Berlin?"),
        reply,
        Message::tool_result(&paris, json!({"tempC": 18})),
        Message::tool_error(&berlin, "no station in Berlin"),
    ];
    let body = request_body(&responses_settings(false), &request("", history, true));
    assert_eq!(
        body["input"],
        json!([
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris and Berlin?"}]},
            {"type": "reasoning", "id": "rs_01", "encrypted_content": "gAAAAB-enc-1",
             "summary": [{"type": "summary_text", "text": "Two cities, two calls."}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Checking both cities."}]},
            {"type": "function_call", "call_id": "call_paris", "name": "get_weather",
             "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "call_berlin", "name": "get_weather",
             "arguments": "{\"city\":\"Berlin\"}"},
            {"type": "function_call_output", "call_id": "call_paris", "output": "{\"tempC\":18}"},
            {"type": "function_call_output", "call_id": "call_berlin",
             "output": "{\"errorMessage\":\"no station in Berlin\"}"}
        ])
    );
}

#[test]
fn reasoning_items_survive_the_stored_message_form() {
    let reply = parse(TOOL_REPLY).unwrap().message;
    let stored = serde_json::to_value(&reply).unwrap();
    assert_eq!(
        stored["providerOptions"],
        json!({"openai": {"reasoning": [kept_item()]}})
    );
    let back: Message = serde_json::from_value(stored).unwrap();
    assert_eq!(back, reply);
    let body = request_body(
        &responses_settings(false),
        &request("", vec![Message::user("q"), back], false),
    );
    assert_eq!(body["input"][1]["type"], "reasoning");
    assert_eq!(body["input"][1]["encrypted_content"], "gAAAAB-enc-1");
}

#[test]
fn several_reasoning_items_go_back_each_at_its_place() {
    let reply = parse_response(&json!({
        "status": "completed",
        "output": [
            {"type": "reasoning", "id": "rs_a", "encrypted_content": "A", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "reasoning", "id": "rs_b", "encrypted_content": "B", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}
        ]
    }))
    .unwrap()
    .message;
    // One reasoning part per item (empty without a summary), in place.
    let Message::Assistant {
        content: Content::Parts(parts),
        ..
    } = &reply
    else {
        panic!("{reply:?}")
    };
    assert_eq!(parts[0], Part::Reasoning { text: "".into() });
    assert_eq!(parts[2], Part::Reasoning { text: "".into() });
    let body = request_body(
        &responses_settings(false),
        &request("", vec![Message::user("q"), reply], false),
    );
    let kinds: Vec<String> = body["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            i.get("id")
                .or(i.get("call_id"))
                .or(i.get("role"))
                .and_then(Value::as_str)
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(kinds, ["user", "rs_a", "c1", "rs_b", "assistant"]);
}

#[test]
fn reasoning_without_encrypted_content_or_without_an_item_is_not_sent() {
    // A reasoning part of another API's reply (no item), and an item a server
    // sent without encrypted content (which `store: false` cannot resolve).
    let chat_reply = Message::Assistant {
        content: Content::Parts(vec![
            Part::Reasoning { text: "hmm".into() },
            Part::Text { text: "a".into() },
        ]),
        meta: Default::default(),
    };
    let bare = parse_response(&json!({
        "status": "completed",
        "output": [
            {"type": "reasoning", "id": "rs_x",
             "content": [{"type": "reasoning_text", "text": "thinking aloud"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]}
        ]
    }))
    .unwrap()
    .message;
    assert!(
        matches!(&bare, Message::Assistant { content: Content::Parts(p), .. }
        if p[0] == Part::Reasoning { text: "thinking aloud".into() })
    );
    let body = request_body(
        &responses_settings(false),
        &request("", vec![Message::user("q"), chat_reply, bare], false),
    );
    assert!(
        body["input"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["type"] != "reasoning"),
        "{body}"
    );
    assert_eq!(body["input"].as_array().unwrap().len(), 3);
}

#[test]
fn a_reply_cut_at_max_output_tokens_is_truncated_streamed_or_not() {
    assert!(matches!(
        parse(TRUNCATED_REPLY),
        Err(Failure::Truncated(..))
    ));
    let mut assembler = StreamState::default();
    let (sink, _) = sink();
    let outcomes = feed(&mut assembler, &sse(TRUNCATED_STREAM), &sink);
    assert!(
        matches!(outcomes.last(), Some(Err(Failure::Truncated(m, _))) if m.contains("max_output_tokens")),
        "{outcomes:?}"
    );
    assert!(!Failure::Truncated(String::new(), Default::default()).retryable());
}

#[test]
fn an_incomplete_reply_for_another_reason_is_the_reply_so_far() {
    let reply = parse_response(&json!({
        "status": "incomplete", "incomplete_details": {"reason": "content_filter"},
        "output": [{"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": "Part"}]}]
    }))
    .unwrap();
    assert_eq!(reply.message.text(), "Part");
}

#[test]
fn failed_responses_and_error_bodies_are_transient_or_rejected_by_code() {
    let failed = |code: &str| {
        parse_response(&json!({"status": "failed", "output": [],
            "error": {"code": code, "message": "boom"}}))
        .unwrap_err()
    };
    assert_eq!(
        failed("server_error"),
        Failure::transient("boom (server_error)")
    );
    assert!(matches!(
        failed("rate_limit_exceeded"),
        Failure::Transient {
            status: Some(429),
            ..
        }
    ));
    assert!(matches!(
        failed("invalid_prompt"),
        Failure::Rejected { status: 400, .. }
    ));
    assert!(
        parse_response(&json!({"error": {"message": "overloaded"}}))
            .unwrap_err()
            .retryable()
    );
    assert!(matches!(
        parse_response(&json!({"status": "completed"})),
        Err(Failure::Malformed(_))
    ));
    assert_eq!(
        parse_response(&json!({"status": "failed", "output": [], "error": null})).unwrap_err(),
        Failure::transient("the response failed")
    );
}

#[test]
fn a_stream_assembles_the_same_reply_as_the_whole_response() {
    let (streamed, deltas) = assemble(Box::new(StreamState::default()), TOOL_STREAM);
    let whole = parse(TOOL_REPLY).unwrap();
    assert_eq!(streamed.unwrap(), whole);
    let (text, reasoning, args) = joined(&deltas);
    assert_eq!(text, "Checking both cities.");
    assert_eq!(reasoning, "Two cities, two calls.");
    assert_eq!(
        args,
        BTreeMap::from([
            (0, "{\"city\":\"Paris\"}".to_owned()),
            (1, "{\"city\":\"Berlin\"}".to_owned())
        ])
    );
}

#[test]
fn a_stream_without_whole_items_is_assembled_from_its_deltas() {
    // Only `added` and the deltas; the last event's response has no output.
    let events: Vec<(String, String)> = sse(TOOL_STREAM)
        .into_iter()
        .filter(|(e, _)| e != "response.output_item.done")
        .map(|(e, d)| {
            if e != "response.completed" {
                return (e, d);
            }
            let mut v: Value = serde_json::from_str(&d).unwrap();
            v["response"]["output"] = json!([]);
            (e, v.to_string())
        })
        .collect();
    let mut assembler = Box::new(StreamState::default());
    let (sink, _) = sink();
    let outcomes = feed(assembler.as_mut(), &events, &sink);
    assert_eq!(outcomes.last(), Some(&Ok(true)));
    let reply = assembler.finish().unwrap();
    // The same text and calls; the reasoning item has no encrypted content
    // (only `output_item.done` carries it).
    assert_eq!(reply.message.text(), "Checking both cities.");
    let calls: Vec<&ToolCall> = reply.message.tool_calls().collect();
    assert_eq!(
        calls,
        [
            &weather_call("call_paris", "Paris"),
            &weather_call("call_berlin", "Berlin")
        ]
    );
    assert_eq!(reply.tokens, parse(TOOL_REPLY).unwrap().tokens);
}

#[test]
fn a_stream_whose_last_event_only_has_the_output_uses_it() {
    let completed = sse(TOOL_STREAM).pop().unwrap();
    let mut assembler = Box::new(StreamState::default());
    let (sink, _) = sink();
    assert_eq!(assembler.event(&completed.0, &completed.1, &sink), Ok(true));
    assert_eq!(assembler.finish().unwrap(), parse(TOOL_REPLY).unwrap());
}

#[test]
fn stream_errors_fail_the_attempt() {
    let (sink, _) = sink();
    let one = |event: &str, data: Value| {
        StreamState::default()
            .event(event, &data.to_string(), &sink)
            .unwrap_err()
    };
    assert_eq!(
        one(
            "error",
            json!({"type": "error", "code": "server_error", "message": "oops", "param": null})
        ),
        Failure::transient("oops (server_error)")
    );
    assert!(matches!(
        one(
            "response.failed",
            json!({"type": "response.failed", "response": {"status": "failed",
                "error": {"code": "invalid_prompt", "message": "no"}}})
        ),
        Failure::Rejected { status: 400, .. }
    ));
    assert!(matches!(
        StreamState::default().event("", "[DONE]", &sink),
        Err(Failure::Transient { .. })
    ));
    assert!(matches!(
        StreamState::default().event("response.output_text.delta", "{\"type\": ", &sink),
        Err(Failure::Malformed(_))
    ));
    // Events this format does not use are passed over.
    assert_eq!(
        StreamState::default().event(
            "response.web_search_call.searching",
            "{\"type\": \"response.web_search_call.searching\"}",
            &sink
        ),
        Ok(false)
    );
    // A stream cut before its end is not a reply.
    assert!(Box::new(StreamState::default()).finish().is_err());
}

#[test]
fn api_is_chat_by_default_responses_when_asked_and_refused_on_anthropic() {
    let section = |extra: &str| -> HttpSection {
        toml::from_str(&format!("model = \"m\"\n{extra}")).unwrap()
    };
    let chat = ProviderSettings::from_section(ProviderKind::OpenAi, &section("")).unwrap();
    assert_eq!(chat.api, Api::Chat);
    let responses =
        ProviderSettings::from_section(ProviderKind::OpenAi, &section("api = \"responses\""))
            .unwrap();
    assert_eq!(responses.api, Api::Responses);
    let (key, why) =
        ProviderSettings::from_section(ProviderKind::Anthropic, &section("api = \"chat\""))
            .unwrap_err();
    assert_eq!(key, "api");
    assert!(why.contains("openai"), "{why}");
    let bad = toml::from_str::<HttpSection>("model = \"m\"\napi = \"completions\"")
        .unwrap_err()
        .to_string();
    assert!(bad.contains("responses"), "{bad}");
}

#[test]
fn every_streamed_fixture_is_the_reply_of_its_whole_response() {
    for (whole, streamed) in [
        (
            TEXT_REPLY,
            include_str!("../../../tests/fixtures/responses/text_reply.sse"),
        ),
        (
            include_str!("../../../tests/fixtures/responses/echo_call.json"),
            include_str!("../../../tests/fixtures/responses/echo_call.sse"),
        ),
    ] {
        let (reply, _) = assemble(Box::new(StreamState::default()), streamed);
        assert_eq!(reply.unwrap(), parse(whole).unwrap());
    }
}

#[test]
fn a_native_structured_output_is_the_texts_json_schema_format() {
    let options = ModelOptions {
        output: Some(arbor_actors::model::OutputFormat {
            name: "judge".into(),
            schema: arbor_actors::schema::Schema::compile(json!({"type": "object"})).unwrap(),
            strict: false,
        }),
        ..ModelOptions::default()
    };
    let mut req = request("", vec![Message::user("hi")], true);
    req.meta.options = Arc::new(options);
    let body = request_body(&responses_settings(false), &req);
    assert_eq!(
        body["text"],
        json!({"format": {"type": "json_schema", "name": "judge",
            "schema": {"type": "object"}, "strict": false}})
    );
    let plain = request_body(
        &responses_settings(false),
        &request("", vec![Message::user("hi")], true),
    );
    assert!(plain.get("text").is_none(), "{plain}");
}

#[test]
fn a_truncated_retry_sets_max_output_tokens() {
    let settings = responses_settings(false);
    let mut body = request_body(&settings, &request("", vec![Message::user("hi")], false));
    Responses.with_room(&mut body, &settings, 8192);
    assert_eq!(body["max_output_tokens"], json!(8192));
    assert!(body.get("max_tokens").is_none());
}

/// llama-server's `/v1/responses` stream: no `output_index`, each event
/// naming its item by `item_id` (a function call's `call_id`).
const LLAMA_CALLS: &str = include_str!("../../../tests/fixtures/responses/llama_server_calls.sse");
const LLAMA_TEXT_CALLS: &str =
    include_str!("../../../tests/fixtures/responses/llama_server_text_calls.sse");

/// The stream's events without `response.output_item.done` and with a
/// `response.completed` whose output is empty: the reply is what the
/// stream's items were keyed into.
fn deltas_only(stream: &str) -> Vec<(String, String)> {
    sse(stream)
        .into_iter()
        .filter(|(e, _)| e != "response.output_item.done")
        .map(|(e, d)| {
            if e != "response.completed" {
                return (e, d);
            }
            let mut v: Value = serde_json::from_str(&d).unwrap();
            v["response"]["output"] = json!([]);
            (e, v.to_string())
        })
        .collect()
}

/// Issue 34: three calls streamed without `output_index` were filed under
/// index 0 and ran together into one; they are three, each with its own
/// arguments, streamed and in the reply.
#[test]
fn streamed_calls_without_output_index_are_not_run_together_into_one() {
    let calls = [
        weather_call("fc_Vb1qZ8xK2mT4nR7pL0sW3eY6uI9oA5dF", "Paris"),
        weather_call("fc_Hj2kL4zX6cV8bN0mQ1wE3rT5yU7iO9pA", "Berlin"),
        weather_call("fc_Sd4fG6hJ8kL0zX2cV4bN6mQ8wE0rT2yU", "Rome"),
    ];
    let (reply, deltas) = assemble(Box::new(StreamState::default()), LLAMA_CALLS);
    let reply = reply.unwrap();
    assert_eq!(
        reply.message.tool_calls().collect::<Vec<_>>(),
        calls.each_ref()
    );
    let (text, _, args) = joined(&deltas);
    assert_eq!(text, "");
    assert_eq!(
        args,
        BTreeMap::from([
            (0, "{\"city\":\"Paris\"}".to_owned()),
            (1, "{\"city\":\"Berlin\"}".to_owned()),
            (2, "{\"city\":\"Rome\"}".to_owned()),
        ])
    );
    assert_eq!((reply.tokens.input, reply.tokens.output), (212, 61));

    // From the deltas alone (no whole items, an empty output at the end).
    let mut assembler = Box::new(StreamState::default());
    let (sink, _) = sink();
    let outcomes = feed(assembler.as_mut(), &deltas_only(LLAMA_CALLS), &sink);
    assert_eq!(outcomes.last(), Some(&Ok(true)));
    let reply = assembler.finish().unwrap();
    assert_eq!(
        reply.message.tool_calls().collect::<Vec<_>>(),
        calls.each_ref()
    );
}

/// Issue 34: a message followed by calls, without `output_index`: the text
/// stays the message's and each call its own.
#[test]
fn a_streamed_message_followed_by_calls_without_output_index_is_kept_apart() {
    let calls = [
        weather_call("fc_Pq7wE9rT1yU3iO5pA7sD9fG1hJ3kL5zX", "Oslo"),
        weather_call("fc_Mn6bV8cX0zL2kJ4hG6fD8sA0pO2iU4yT", "Lima"),
    ];
    let (reply, deltas) = assemble(Box::new(StreamState::default()), LLAMA_TEXT_CALLS);
    let reply = reply.unwrap();
    assert_eq!(reply.message.text(), "Checking both cities.");
    assert_eq!(
        reply.message.tool_calls().collect::<Vec<_>>(),
        calls.each_ref()
    );
    let (text, _, args) = joined(&deltas);
    assert_eq!(text, "Checking both cities.");
    assert_eq!(
        args,
        BTreeMap::from([
            (0, "{\"city\":\"Oslo\"}".to_owned()),
            (1, "{\"city\":\"Lima\"}".to_owned()),
        ])
    );

    let mut assembler = Box::new(StreamState::default());
    let (sink, _) = sink();
    feed(assembler.as_mut(), &deltas_only(LLAMA_TEXT_CALLS), &sink);
    let reply = assembler.finish().unwrap();
    assert_eq!(reply.message.text(), "Checking both cities.");
    assert_eq!(
        reply.message.tool_calls().collect::<Vec<_>>(),
        calls.each_ref()
    );
}

/// The completed response's output is the server's whole list: when the
/// stream built fewer items (here, two calls it could not tell apart), the
/// reply is that list; when it built more, the items built.
#[test]
fn the_completed_output_is_the_reply_when_it_has_every_item_built() {
    let (sink, _) = sink();
    let call = |id: &str, city: &str| {
        json!({"type": "function_call", "call_id": id, "name": "get_weather",
               "arguments": json!({"city": city}).to_string()})
    };
    let mut state = StreamState::default();
    // Neither an output_index nor an id: both go to index 0.
    let added = json!({"type": "response.output_item.added",
        "item": {"type": "function_call", "name": "get_weather", "arguments": ""}});
    for _ in 0..2 {
        state
            .event("response.output_item.added", &added.to_string(), &sink)
            .unwrap();
    }
    let completed = json!({"type": "response.completed", "response": {"status": "completed",
        "output": [call("a", "Paris"), call("b", "Rome")]}});
    assert_eq!(
        state.event("response.completed", &completed.to_string(), &sink),
        Ok(true)
    );
    let reply = Box::new(state).finish().unwrap();
    assert_eq!(
        reply.message.tool_calls().collect::<Vec<_>>(),
        [&weather_call("a", "Paris"), &weather_call("b", "Rome")]
    );
}
