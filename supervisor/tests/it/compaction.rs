//! Compaction (issue 37) as a tree's events show it.

use arbor_actors::compact::Compaction;
use arbor_actors::{Delta, EventKind, Model};
use arbor_supervisor::{Catalog, Supervisor, TreeLimits};
use serde_json::json;

use crate::common::*;

/// The symptom: a compaction's summary call streamed its words as the
/// step's `modelDelta` events, so a page or a terminal showed the summary
/// as the step's reply. Only the step's own reply streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_call_streams_nothing_as_the_steps_reply() {
    let long = "w ".repeat(600);
    let script = json!({"replies": [{
        "agent": "scribe",
        "steps": [
            {"text": long, "toolCalls": [{"name": "echo", "input": {"n": 1}}]},
            {"text": long, "toolCalls": [{"name": "echo", "input": {"n": 2}}]},
            {"text": long, "toolCalls": [{"name": "echo", "input": {"n": 3}}]},
            {"text": "the step's own words", "wordMs": 1}
        ],
        "summary": {"text": "summarised words here", "wordMs": 1}
    }]});
    let mut scribe = with_echo(template("scribe"));
    scribe.compact = Some(Compaction {
        at: 400,
        keep: 1,
        prompt: None,
    });
    let catalog = Catalog::builder()
        .model(scripted(script) as std::sync::Arc<dyn Model>)
        .tool(echo())
        .template(scribe)
        .build()
        .unwrap();
    let sup = Supervisor::new(catalog, TreeLimits::default());
    let (result, events) = run(&sup, "scribe", "Take notes.").await;
    assert_eq!(
        result.state.status,
        arbor_actors::AgentStatus::Completed,
        "{:?}",
        result.state.error_message()
    );
    assert!(
        events.iter().any(|e| matches!(
            &e.kind,
            EventKind::HistoryCompacted {
                summary: Some(_),
                ..
            }
        )),
        "no summary was made"
    );
    let streamed: String = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModelDelta {
                delta: Delta::Text { text },
                ..
            } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        streamed.ends_with("the step's own words"),
        "{:?}",
        &streamed[streamed.len().saturating_sub(200)..]
    );
    assert!(
        !streamed.contains("summarised"),
        "the summary streamed as the step's reply"
    );
}
