//! Arbor in a program of one's own, start to end: the config read from a file,
//! a tool written in Rust, a two-level tree (a lead and the researchers it
//! spawns, who call the tool) with its events printed as they come, its final
//! text, and a second tree cancelled while its researcher works.
//!
//! The agents run on the scripted model (examples/embedding/script.json, its
//! format in docs/scripted.md), so no API key is needed:
//!
//! ```text
//! cargo run --example embedding
//! ```
//!
//! In a crate of one's own: `arbor-agents = { version = "0.1",
//! default-features = false }` (the library, imported as `arbor`), `tokio`,
//! `serde`, `serde_json` and `schemars` (its `JsonSchema` derive). (Its
//! functions are `pub` for tests/it/embedding.rs, which runs them.)

use std::path::Path;
use std::sync::Arc;

use arbor::tool::{Tool, ToolContext, ToolError, ToolOutput, async_trait, parse_input, schema_for};
use arbor::{Config, EventKind, RunResult, Runtime};
use serde_json::{Value, json};

/// A tool written in Rust: how many words a text has.
struct WordCount;

/// What the model passes to `word_count`; Arbor checks its arguments against
/// this type's JSON Schema before `call` runs.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct WordCountInput {
    /// The text to count the words of.
    text: String,
}

#[async_trait]
impl Tool for WordCount {
    fn name(&self) -> &str {
        "word_count"
    }

    fn description(&self) -> &str {
        "Counts the words of a text."
    }

    fn input_schema(&self) -> Value {
        schema_for::<WordCountInput>()
    }

    async fn call(&self, input: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let input: WordCountInput = parse_input(input)?;
        Ok(json!({ "words": input.text.split_whitespace().count() }).into())
    }
}

/// A runtime on the config next to this file, with the Rust tool registered
/// (the config's researchers list it: `tools = ["word_count"]`).
pub fn runtime() -> Result<Runtime, arbor::Error> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/embedding/config.toml");
    let config = Config::load(&file)?;
    Runtime::builder(config).tool(Arc::new(WordCount)).build()
}

/// Runs a tree on `question`, printing its events as they come, to its end.
pub async fn research(runtime: &Runtime, question: &str) -> Result<RunResult, arbor::Error> {
    let mut run = runtime.start("lead", question, None).await?;
    let mut events = run.take_events();
    while let Some(event) = events.recv().await {
        // Every event but the streamed pieces of the models' replies.
        if !matches!(event.kind, EventKind::ModelDelta { .. }) {
            println!("{event}");
        }
    }
    run.result().await
}

/// Starts a tree and cancels it once its researcher has started: the whole
/// tree stops, and its result still comes, with status `cancelled`.
pub async fn cancel_midway(runtime: &Runtime) -> Result<RunResult, arbor::Error> {
    let mut run = runtime.start("lead", "Take your time.", None).await?;
    let mut events = run.take_events();
    while let Some(event) = events.recv().await {
        println!("{event}");
        if let EventKind::AgentStarted { depth: 1, .. } = event.kind {
            run.cancel();
        }
    }
    run.result().await
}

#[tokio::main]
pub async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = runtime()?;

    let result = research(&runtime, "How long are the motto and the tagline?").await?;
    println!("final text: {}", result.text());
    // Any run of the tree, by its id.
    for child in &result.state.child_run_ids {
        let child = runtime.state(child).await?;
        println!("  {} {}", child.run_id, child.status.as_str());
    }

    let cancelled = cancel_midway(&runtime).await?;
    let status = cancelled.state.status.as_str();
    println!("second tree: {status} ({})", cancelled.text());
    Ok(())
}
