//! Native structured output (semantics §7): the request carries the output
//! schema and no `set_output`; the reply's text is the output, and a reply
//! that is not JSON or misses the schema is sent back for another step.

use super::*;
use arbor_actors::template::Structured;

fn scored() -> AgentTemplate {
    let mut t = AgentTemplate::new("scorer", "m").output_mode(OutputMode::StructuredOutput);
    t.output_schema = Some(
        Schema::compile(json!({
            "type": "object",
            "properties": {"score": {"type": "number"}},
            "required": ["score"]
        }))
        .unwrap(),
    );
    t
}

fn native() -> AgentTemplate {
    scored().structured(Structured::Native)
}

#[test]
fn a_native_request_carries_the_schema_and_offers_no_set_output() {
    let mut run = Run::solo(native());
    let req = request(run.start());
    assert!(
        !req.tools.contains_key("set_output"),
        "{:?}",
        req.tools.keys()
    );
    assert!(req.tools.contains_key("end_turn"));
    let format = req.meta.options.output.clone().expect("the output schema");
    assert_eq!(format.schema.source()["required"], json!(["score"]));
    // The schema leaves additional properties open: not OpenAI's strict subset.
    assert!(!format.strict);
}

#[test]
fn a_json_reply_that_fits_is_the_output() {
    let mut run = Run::solo(native());
    request(run.start());
    finish(run.reply(Message::assistant_text("{\"score\": 0.75}")));
    assert_eq!(run.state().output, Some(json!({"score": 0.75})));
    let events = run.m.take_events();
    assert!(
        events.iter().any(|e| matches!(
            e,
            EventKind::OutputSet { output } if *output == json!({"score": 0.75})
        )),
        "{events:?}"
    );
    assert_eq!(
        run.m.output_value(),
        json!({"type": "structuredOutput", "value": {"score": 0.75}})
    );
}

#[test]
fn an_invalid_reply_gets_a_message_naming_the_error_and_another_step() {
    let mut run = Run::solo(native());
    request(run.start());
    // Not JSON: the model reads why and takes another step.
    let next = request(run.reply(Message::assistant_text("The score is high.")));
    let told = next.messages.last().unwrap();
    assert!(
        matches!(**told, Message::User { .. }) && told.has_tag("OUTPUT_ERROR"),
        "{told:?}"
    );
    assert!(told.text().contains("not valid JSON"), "{}", told.text());
    assert_eq!(run.state().output, None);
    // JSON that misses the schema: the same, naming the path.
    let next = request(run.reply(Message::assistant_text("{\"score\": \"high\"}")));
    let told = next.messages.last().unwrap().text();
    assert!(told.contains("output schema: at /score"), "{told}");
    // The third answer fits.
    finish(run.reply(Message::assistant_text("{\"score\": 3}")));
    assert_eq!(run.state().output, Some(json!({"score": 3})));
    assert_eq!(run.state().status, AgentStatus::Completed);
}

#[test]
fn retries_are_bounded_by_the_step_limit() {
    let mut run = Run::solo(native().max_steps(2));
    request(run.start());
    request(run.reply(Message::assistant_text("nope")));
    let actions = run.reply(Message::assistant_text("still nope"));
    assert_eq!(kinds(&actions), ["Finish"]);
    assert_eq!(run.state().status, AgentStatus::Failed);
    let output = run.state().output.clone().unwrap();
    assert!(
        output["errorMessage"]
            .as_str()
            .unwrap()
            .contains("max_steps"),
        "{output}"
    );
}

#[test]
fn a_tool_mode_template_keeps_set_output_and_leaves_text_alone() {
    let mut run = Run::solo(scored().structured(Structured::Tool));
    let req = request(run.start());
    assert!(req.tools.contains_key("set_output"));
    assert_eq!(req.meta.options.output, None);
    finish(run.reply(Message::assistant_text("{\"score\": 1}")));
    assert_eq!(run.state().output, None);
}
