//! Fixtures shared by the wire formats' tests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arbor_actors::message::{Content, Message, Part, ToolCall};
use arbor_actors::model::RequestMeta;
use arbor_actors::{Delta, DeltaSink, ModelRequest, ToolDefinition};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::json;

use super::settings::{Api, ProviderKind, ProviderSettings, Timeouts};
use super::wire::{Assembler, Failure, Reply};

pub(crate) fn settings(kind: ProviderKind, stream: bool) -> ProviderSettings {
    ProviderSettings {
        kind,
        api: Api::Chat,
        base_url: kind.default_base_url().to_owned(),
        model: match kind {
            ProviderKind::OpenAi => "gpt-4o".into(),
            ProviderKind::Anthropic => "claude-sonnet-4-5".into(),
        },
        api_key_env: None,
        api_key: None,
        stream,
        max_tokens: Some(1024),
        truncated_max_tokens: None,
        pricing: Default::default(),
        limits: Default::default(),
        retry: Default::default(),
        timeouts: Timeouts::default(),
        headers: Vec::new(),
        options: Default::default(),
        prompt_cache: true,
    }
}

pub(crate) fn request(system: &str, messages: Vec<Message>, with_tools: bool) -> ModelRequest {
    let mut tools = BTreeMap::new();
    if with_tools {
        tools.insert(
            "get_weather".to_owned(),
            ToolDefinition {
                description: "Current weather in a city".into(),
                input_schema: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
            },
        );
        tools.insert(
            "read_file".to_owned(),
            ToolDefinition {
                description: "Reads a file".into(),
                input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            },
        );
    }
    ModelRequest {
        system_prompt: system.into(),
        messages: messages.into_iter().map(Arc::new).collect(),
        tools: Arc::new(tools),
        meta: RequestMeta::default(),
    }
}

pub(crate) fn weather_call(id: &str, city: &str) -> ToolCall {
    ToolCall {
        tool_call_id: id.into(),
        tool_name: "get_weather".into(),
        input: json!({"city": city}).into(),
    }
}

/// User text, a user image (base64 and URL), an assistant message with text
/// and two calls, their results (the second an error), a follow-up question.
pub(crate) fn sample_history() -> Vec<Message> {
    let paris = weather_call("call_paris", "Paris");
    let berlin = weather_call("call_berlin", "Berlin");
    vec![
        Message::user("What is the weather in Paris and Berlin?"),
        Message::User {
            content: Content::Parts(vec![
                Part::Text {
                    text: "And this chart:".into(),
                },
                Part::Image {
                    image: "aGk=".into(),
                    media_type: Some("image/png".into()),
                },
                Part::Image {
                    image: "https://example.com/chart.png".into(),
                    media_type: None,
                },
            ]),
            meta: Default::default(),
        },
        Message::assistant(
            Some("Checking both cities.".into()),
            vec![paris.clone(), berlin.clone()],
        ),
        Message::tool_result(&paris, json!({"tempC": 18})),
        Message::tool_error(&berlin, "no station in Berlin"),
        Message::user("Thanks. Any rain?"),
    ]
}

/// A result separated from its call by a user message (`set_messages` can do it).
pub(crate) fn non_adjacent_history() -> Vec<Message> {
    let paris = weather_call("call_paris", "Paris");
    vec![
        Message::user("Weather in Paris?"),
        Message::assistant(None, vec![paris.clone()]),
        Message::user("Hurry up."),
        Message::tool_result(&paris, json!("18C")),
    ]
}

pub(crate) type Deltas = Arc<Mutex<Vec<Delta>>>;

pub(crate) fn sink() -> (DeltaSink, Deltas) {
    let deltas: Deltas = Arc::default();
    let into = deltas.clone();
    let sink: DeltaSink = Arc::new(move |d| into.lock().unwrap().push(d));
    (sink, deltas)
}

/// The text, reasoning and per-call argument deltas, each concatenated.
pub(crate) fn joined(deltas: &Deltas) -> (String, String, BTreeMap<usize, String>) {
    let (mut text, mut reasoning, mut args) = (String::new(), String::new(), BTreeMap::new());
    for d in deltas.lock().unwrap().iter() {
        match d {
            Delta::Text { text: t } => text.push_str(t),
            Delta::Reasoning { text: t } => reasoning.push_str(t),
            Delta::ToolCallArgs { index, text: t } => {
                args.entry(*index).or_insert_with(String::new).push_str(t)
            }
            _ => panic!("unexpected {d:?}"),
        }
    }
    (text, reasoning, args)
}

/// The (event, data) pairs of an SSE text, through the parser the client uses.
pub(crate) fn sse(text: &str) -> Vec<(String, String)> {
    let bytes = futures::stream::iter([Ok::<_, std::convert::Infallible>(text.to_owned())]);
    futures::executor::block_on(bytes.eventsource().collect::<Vec<_>>())
        .into_iter()
        .map(|e| {
            let e = e.unwrap();
            (e.event, e.data)
        })
        .collect()
}

/// Feeds every event; the outcome of each.
pub(crate) fn feed(
    assembler: &mut dyn Assembler,
    events: &[(String, String)],
    sink: &DeltaSink,
) -> Vec<Result<bool, Failure>> {
    events
        .iter()
        .map(|(event, data)| assembler.event(event, data, sink))
        .collect()
}

/// Feeds a whole stream, which must complete at its last event exactly.
pub(crate) fn assemble(
    mut assembler: Box<dyn Assembler>,
    stream: &str,
) -> (Result<Reply, Failure>, Deltas) {
    let (sink, deltas) = sink();
    let events = sse(stream);
    let outcomes = feed(assembler.as_mut(), &events, &sink);
    let last = outcomes.len() - 1;
    for (i, outcome) in outcomes.into_iter().enumerate() {
        assert_eq!(outcome, Ok(i == last), "event {i}: {:?}", events[i]);
    }
    (assembler.finish(), deltas)
}
