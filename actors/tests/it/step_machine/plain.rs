//! The plain loop: model replies, tool calls and their results, the
//! built-in tools, the end of a turn, repair of a broken history.

use super::*;

#[test]
fn a_reply_without_tool_calls_completes_the_run() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m").system_prompt("be brief"));
    let req = request(run.start());
    assert_eq!(&*req.system_prompt, "be brief");
    assert_eq!(values(&req.messages.to_vec()), vec![Message::user("task")]);
    assert!(req.tools.contains_key("set_output") && req.tools.contains_key("end_turn"));
    assert_eq!(
        (
            req.meta.step,
            req.meta.run_id.as_str(),
            req.meta.agent_type.as_str(),
            req.meta.depth
        ),
        (1, "tree-1/0.1~1", "solo", 1)
    );
    assert_eq!(&*req.meta.tree_id, "tree-1");
    finish(run.reply(Message::assistant_text("hi")));
    let s = run.state();
    assert_eq!(s.status, AgentStatus::Completed);
    assert_eq!(
        run.history(),
        vec![Message::user("task"), Message::assistant_text("hi")]
    );
    assert_eq!(s.steps_remaining, 19);
    assert_eq!(s.context_token_count, 120);
    assert_eq!((s.direct_credits_used, s.credits_used), (0.5, 0.5));
    assert_eq!(
        run.m.output_value(),
        json!({"type": "lastMessage", "value": [{"role": "assistant", "content": "hi"}]})
    );
    let events: Vec<&str> = run.m.take_events().iter().map(EventKind::name).collect();
    assert_eq!(events, ["stepStarted", "modelResponded"]);
}

#[test]
fn without_provider_usage_the_context_size_is_estimated() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    let reply = Message::assistant_text("hello there");
    let expected = Message::user("task").estimated_tokens() + reply.estimated_tokens();
    finish(run.reply_with(reply, Usage::default()));
    assert_eq!(run.state().context_token_count, expected);
}

#[test]
fn each_step_costs_one_and_the_step_limit_fails_the_run() {
    let mut t = AgentTemplate::new("solo", "m").max_steps(2);
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    assert_eq!(run.state().steps_remaining, 1);
    let req = request(run.reply(calls("s1", &[add_user("more")])));
    assert_eq!(req.meta.step, 2);
    assert_eq!(run.state().steps_remaining, 0);
    finish(run.reply(calls("s2", &[add_user("again")])));
    let s = run.state();
    assert_eq!(s.status, AgentStatus::Failed);
    let error = s.error_message().unwrap();
    assert!(error.contains("max_steps"), "{error}");
    assert!(error.contains("2 step(s)"), "{error}");
    let value = run.m.output_value();
    assert_eq!(value["type"], "error");
    assert!(value["message"].as_str().unwrap().contains("max_steps"));
    // Everything the run did is kept.
    assert_eq!(run.history().len(), 7);
    assert_eq!(run.m.step(), 2);
}

#[test]
fn a_run_with_no_steps_left_fails_without_calling_the_model() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m").max_steps(0));
    finish(run.start());
    assert_eq!(run.state().status, AgentStatus::Failed);
    assert!(run.state().error_message().unwrap().contains("max_steps"));
    assert_eq!(run.m.step(), 0);
}

#[test]
fn tool_results_follow_the_call_order_whatever_order_they_finish_in() {
    let mut t = AgentTemplate::new("worker", "m");
    t.tools = vec!["echo".into(), "add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    let actions = run.reply(calls(
        "s1",
        &[
            ("echo", json!({"n": 1})),
            ("echo", json!({"n": 2})),
            add_user("note"),
        ],
    ));
    let tools: Vec<(u32, usize, Value)> = actions
        .iter()
        .map(|a| match a {
            Action::RunTool {
                step,
                index,
                tool,
                input,
                ..
            } => {
                assert_eq!(tool.name(), "echo");
                (*step, *index, input.clone())
            }
            other => panic!("unexpected {}", kind(other)),
        })
        .collect();
    assert_eq!(
        tools,
        vec![(1, 0, json!({"n": 1})), (1, 1, json!({"n": 2}))]
    );
    // The second finishes first; nothing moves until both have.
    assert!(
        run.m
            .tool_done(1, 1, Ok(json!("two").into()), &run.cat)
            .is_empty()
    );
    assert!(
        run.m
            .tool_done(1, 1, Ok(json!("late duplicate").into()), &run.cat)
            .is_empty()
    );
    assert!(
        run.m
            .tool_done(7, 0, Ok(json!("wrong step").into()), &run.cat)
            .is_empty()
    );
    let req = request(
        run.m
            .tool_done(1, 0, Err(ToolError::new("disk full")), &run.cat),
    );
    let h = run.history();
    assert_eq!(h.len(), 6, "{h:?}");
    assert_eq!(h[2].answers(), Some("s1-0"));
    assert_eq!(error_text(&h[2]), "disk full");
    assert_eq!(h[3].answers(), Some("s1-1"));
    assert_eq!(result_value(&h[3]), json!("two"));
    assert_eq!(h[4].answers(), Some("s1-2"));
    // add_message's message comes after all of the step's results.
    assert_eq!(h[5], Message::user("note"));
    assert_eq!(values(&req.messages.to_vec()), h);
}

#[test]
fn an_unknown_tool_is_an_error_result_the_model_sees() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    run.m.take_events();
    let req = request(run.reply(calls("s1", &[("grep", json!({"q": "x"}))])));
    let last = req.messages.last().unwrap();
    assert_eq!(last.answers(), Some("s1-0"));
    let error = error_text(last);
    assert!(error.contains("Tool grep not found"), "{error}");
    assert!(
        error.contains("end_turn"),
        "lists the available tools: {error}"
    );
    let called = run
        .m
        .take_events()
        .into_iter()
        .find_map(|e| match e {
            EventKind::ToolCalled { tool, error, .. } => Some((tool, error)),
            _ => None,
        })
        .unwrap();
    assert_eq!(called.0, "grep");
    assert!(called.1.unwrap().contains("grep"));
    assert_eq!(run.state().status, AgentStatus::Running);
}

#[test]
fn arguments_that_are_not_json_are_an_error_result() {
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    let req = request(run.reply(Message::assistant(
        None,
        vec![
            call(
                "bad",
                "add_message",
                Value::String("{\"role\": \"user\", ".into()),
            ),
            call(
                "good",
                "add_message",
                Value::String(r#"{"role":"user","content":"raw"}"#.into()),
            ),
        ],
    )));
    let h = run.history();
    let error = error_text(&h[2]);
    assert!(
        error.contains("add_message") && error.contains("not valid JSON"),
        "{error}"
    );
    // Arguments sent as a JSON string are parsed.
    assert!(!is_error(&h[3]));
    assert_eq!(h[4], Message::user("raw"));
    assert_eq!(values(&req.messages.to_vec()), h);
}

#[test]
fn arguments_that_fail_the_schema_are_an_error_result_naming_the_path() {
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["add_message".into(), "echo".into()];
    let mut run = Run::solo(t);
    request(run.start());
    let req = request(run.reply(calls(
        "s1",
        &[
            ("add_message", json!({"role": "robot", "content": "x"})),
            ("echo", json!({"n": "three"})),
        ],
    )));
    let h = run.history();
    let e0 = error_text(&h[2]);
    assert!(
        e0.contains("Invalid input for add_message") && e0.contains("/role"),
        "{e0}"
    );
    let e1 = error_text(&h[3]);
    assert!(
        e1.contains("Invalid input for echo") && e1.contains("/n"),
        "{e1}"
    );
    // Nothing was added and no tool was run.
    assert_eq!(h.len(), 4);
    assert_eq!(req.messages.len(), 4);
}

#[test]
fn set_messages_with_a_bad_message_changes_nothing_but_reports_the_error() {
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["set_messages".into()];
    let mut run = Run::solo(t);
    request(run.start());
    let req = request(run.reply(calls(
        "s1",
        &[(
            "set_messages",
            json!({"messages": [{"role": "user", "content": "fine"}, {"role": "robot", "content": "x"}]}),
        )],
    )));
    let h = run.history();
    assert_eq!(h.len(), 3);
    assert_eq!(h[0], Message::user("task"));
    let error = error_text(&h[2]);
    assert!(error.contains("messages[1]"), "{error}");
    assert_eq!(values(&req.messages.to_vec()), h);
}

#[test]
fn set_messages_replaces_the_history_with_pairing_repaired() {
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["set_messages".into()];
    let mut run = Run::solo(t);
    request(run.start());
    let new = json!([
        {"role": "user", "content": "fresh start"},
        {"role": "assistant", "content": [
            {"type": "tool-call", "toolCallId": "X", "toolName": "echo", "input": {}}
        ]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "looking"},
            {"type": "tool-call", "toolCallId": "Y", "toolName": "echo", "input": {}}
        ]},
        {"role": "tool", "toolCallId": "Y", "toolName": "echo",
         "content": [{"type": "json", "value": 1}]},
        {"role": "tool", "toolCallId": "Z", "toolName": "echo",
         "content": [{"type": "json", "value": 2}]}
    ]);
    let req = request(run.reply(calls("s1", &[("set_messages", json!({"messages": new}))])));
    let expected: Vec<Message> = serde_json::from_value(json!([
        {"role": "user", "content": "fresh start"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "looking"},
            {"type": "tool-call", "toolCallId": "Y", "toolName": "echo", "input": {}}
        ]},
        {"role": "tool", "toolCallId": "Y", "toolName": "echo",
         "content": [{"type": "json", "value": 1}]}
    ]))
    .unwrap();
    assert_eq!(run.history(), expected);
    assert_eq!(values(&req.messages.to_vec()), expected);
}

fn scored() -> AgentTemplate {
    let mut t = AgentTemplate::new("scorer", "m").output_mode(OutputMode::StructuredOutput);
    t.tools = vec!["add_message".into()];
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

#[test]
fn set_output_checks_the_output_schema() {
    let mut run = Run::solo(scored());
    request(run.start());
    // A good object is taken (and add_message keeps the turn going).
    request(run.reply(calls(
        "s1",
        &[("set_output", json!({"score": 1})), add_user("check")],
    )));
    assert_eq!(run.state().output, Some(json!({"score": 1})));
    assert!(!is_error(&run.history()[2]));
    // A bad one is an error naming the path; the output stays as it was, and the
    // turn goes on so the model reads the error (it was the step's only call).
    let next = request(run.reply(calls("s2", &[("set_output", json!({"score": "high"}))])));
    assert!(is_error(next.messages.last().unwrap()));
    let last = run.history().last().cloned().unwrap();
    let error = error_text(&last);
    assert!(error.contains("/score"), "{error}");
    assert_eq!(run.state().output, Some(json!({"score": 1})));
    finish(run.reply(Message::assistant_text("done")));
    assert_eq!(
        run.m.output_value(),
        json!({"type": "structuredOutput", "value": {"score": 1}})
    );
}

#[test]
fn a_bad_first_output_leaves_no_output() {
    let mut run = Run::solo(scored());
    request(run.start());
    request(run.reply(calls("s1", &[("set_output", json!({"total": 3}))])));
    assert_eq!(run.state().output, None);
    assert!(error_text(run.history().last().unwrap()).contains("score"));
    finish(run.reply(Message::assistant_text("giving up")));
    assert_eq!(
        run.m.output_value(),
        json!({"type": "structuredOutput", "value": null})
    );
}

#[test]
fn end_turn_ends_the_turn_after_the_step() {
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    finish(run.reply(calls(
        "s1",
        &[add_user("last words"), ("end_turn", json!({}))],
    )));
    assert_eq!(run.state().status, AgentStatus::Completed);
    let h = run.history();
    assert_eq!(h.len(), 5);
    assert_eq!(h[4], Message::user("last words"));
}

#[test]
fn a_reply_of_only_set_output_or_end_turn_ends_the_turn() {
    for list in [
        vec![("set_output", json!({"done": true}))],
        vec![
            ("set_output", json!({"done": true})),
            ("end_turn", json!({})),
        ],
        vec![("end_turn", Value::Null)],
    ] {
        let mut run = Run::solo(AgentTemplate::new("solo", "m"));
        request(run.start());
        finish(run.reply(calls("s1", &list)));
        assert_eq!(run.state().status, AgentStatus::Completed, "{list:?}");
        assert_eq!(run.m.step(), 1);
    }
    // Any other call keeps the turn going.
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    request(run.reply(calls("s1", &[("set_output", json!({})), add_user("x")])));
    assert_eq!(run.state().status, AgentStatus::Running);
}

#[test]
fn stale_replies_and_events_after_the_end_are_ignored() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    let stale = ModelResponse {
        message: Message::assistant_text("from step 9"),
        usage: USAGE,
    };
    assert!(run.m.model_replied(9, stale, &run.cat).is_empty());
    assert_eq!(run.history().len(), 1);
    finish(run.reply(Message::assistant_text("done")));
    assert!(run.reply(Message::assistant_text("again")).is_empty());
    assert!(
        run.m
            .fail(Failure::new(FailureKind::Internal, "too late"))
            .is_empty()
    );
    assert!(run.m.cancel().is_empty());
    assert_eq!(run.state().status, AgentStatus::Completed);
    assert_eq!(run.history().len(), 2);
}

#[test]
fn cancel_keeps_the_history_it_had() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    finish(run.m.cancel());
    assert_eq!(run.state().status, AgentStatus::Cancelled);
    assert_eq!(run.history(), vec![Message::user("task")]);
    assert_eq!(
        run.m.output_value(),
        json!({"type": "error", "message": "Agent was cancelled"})
    );
}

#[test]
fn a_broken_stored_history_is_repaired_in_the_request_and_reported() {
    let mut run = Run::new(
        AgentTemplate::new("solo", "m"),
        Vec::new(),
        vec![
            Message::user("task"),
            Message::assistant(Some("hm".into()), vec![call("lost", "echo", json!({}))]),
            Message::tool_result(&call("ghost", "echo", json!({})), json!(1)),
        ],
    );
    let req = request(run.start());
    assert_eq!(
        values(&req.messages.to_vec()),
        vec![
            Message::user("task"),
            Message::assistant(Some("hm".into()), vec![])
        ]
    );
    // The stored history is not changed by building the request.
    assert_eq!(run.history().len(), 3);
    let repaired = run
        .m
        .take_events()
        .into_iter()
        .find_map(|e| match e {
            EventKind::HistoryRepaired {
                unanswered_calls,
                orphan_results,
            } => Some((unanswered_calls, orphan_results)),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        repaired,
        (vec!["lost".to_owned()], vec!["ghost".to_owned()])
    );
}

#[test]
fn call_ids_reused_by_the_model_across_steps_still_pair() {
    let mut t = AgentTemplate::new("solo", "m");
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    let same = |text: &str| {
        Message::assistant(
            None,
            vec![call(
                "dup",
                "add_message",
                json!({"role": "user", "content": text}),
            )],
        )
    };
    request(run.reply(same("one")));
    let req = request(run.reply(same("two")));
    // Both exchanges reach the model: two calls, two results, two notes.
    let results = req
        .messages
        .iter()
        .filter(|m| m.answers().is_some())
        .count();
    let calls_seen = req
        .messages
        .iter()
        .map(|m| m.tool_calls().count())
        .sum::<usize>();
    assert_eq!((calls_seen, results, req.messages.len()), (2, 2, 7));
    // Within one reply, repeated and empty ids are made unique too.
    let req = request(run.reply(Message::assistant(
        None,
        vec![
            call("x", "add_message", json!({"role": "user", "content": "a"})),
            call("x", "add_message", json!({"role": "user", "content": "b"})),
            call("", "add_message", json!({"role": "user", "content": "c"})),
        ],
    )));
    assert_eq!(
        req.messages
            .iter()
            .filter(|m| m.answers().is_some())
            .count(),
        5
    );
}

#[test]
fn a_reply_cut_at_the_output_limit_counts_its_billed_usage_then_fails_the_run() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    let failure = Failure::new(FailureKind::ModelTruncated, "cut at the output limit");
    finish(run.m.model_failed(1, failure, Some(USAGE)));
    let s = run.state();
    assert_eq!(s.status, AgentStatus::Failed);
    assert_eq!(s.error_kind, Some(FailureKind::ModelTruncated));
    assert_eq!((s.direct_credits_used, s.credits_used), (0.5, 0.5));
    // Nothing of the cut reply joins the history.
    assert_eq!(run.history(), vec![Message::user("task")]);
    let events = run.m.take_events();
    let responded: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::ModelResponded {
                usage,
                tool_calls,
                refused,
                from_record,
                ..
            } => Some((*usage, *tool_calls, *refused, *from_record)),
            _ => None,
        })
        .collect();
    assert_eq!(responded, vec![(USAGE, 0, true, false)]);
}

#[test]
fn a_failed_call_with_no_reply_counts_nothing_and_a_stale_failure_is_ignored() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    let failure = || Failure::new(FailureKind::ModelUnavailable, "down");
    assert!(run.m.model_failed(2, failure(), Some(USAGE)).is_empty());
    assert_eq!(run.state().credits_used, 0.0);
    finish(run.m.model_failed(1, failure(), None));
    assert_eq!(run.state().credits_used, 0.0);
    let names: Vec<&str> = run.m.take_events().iter().map(EventKind::name).collect();
    assert_eq!(names, ["stepStarted"]);
}

#[test]
fn a_reply_served_from_the_record_counts_in_the_state_but_not_in_its_event() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    let recorded = Usage {
        source: UsageSource::Recorded,
        ..USAGE
    };
    finish(run.reply_with(Message::assistant_text("hi"), recorded));
    let s = run.state();
    assert_eq!(s.status, AgentStatus::Completed);
    // The run goes on from a checkpoint taken before the reply: it counts it.
    assert_eq!((s.direct_credits_used, s.credits_used), (0.5, 0.5));
    assert_eq!(s.context_token_count, 120);
    let events = run.m.take_events();
    let Some(EventKind::ModelResponded {
        usage, from_record, ..
    }) = events.last()
    else {
        panic!("{events:?}");
    };
    // The event bills nothing again: it was counted when it was recorded.
    assert!(*from_record);
    assert_eq!(*usage, Usage::default());
}

#[test]
fn a_reply_refused_as_no_assistant_message_still_counts_its_usage() {
    let mut run = Run::solo(AgentTemplate::new("solo", "m"));
    request(run.start());
    finish(run.reply(Message::user("not a reply")));
    let s = run.state();
    assert_eq!(s.error_kind, Some(FailureKind::ModelInvalid));
    assert_eq!(s.credits_used, 0.5);
    let refused = run.m.take_events().iter().any(
        |e| matches!(e, EventKind::ModelResponded { usage, refused: true, .. } if *usage == USAGE),
    );
    assert!(refused);
}
