//! README's embedding program (issue 35): the code README shows is
//! examples/embedding.rs, byte for byte, and that program runs as it says (a
//! Rust tool called by a two-level tree on the config beside it, the final
//! text, a second tree cancelled). The example is compiled into this test as
//! a module, so the code that runs here is the code README shows.

use std::path::Path;

use arbor::{AgentStatus, Message};

/// The example, as a module of this test.
#[path = "../../examples/embedding.rs"]
mod example;

fn repo_file(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The first ```rust block of README's "## Embedding" section.
fn readme_embedding_block(readme: &str) -> Option<&str> {
    let section = &readme[readme.find("\n## Embedding\n")?..];
    let start = section.find("\n```rust\n")? + "\n```rust\n".len();
    let end = start + section[start..].find("\n```\n")?;
    Some(&section[start..=end])
}

#[test]
fn readme_shows_the_embedding_example_as_it_is_in_examples() {
    let readme = repo_file("README.md");
    let block = readme_embedding_block(&readme)
        .expect("README.md has a \"## Embedding\" section with a ```rust block");
    let example = repo_file("examples/embedding.rs");
    if block != example {
        let (line, (shown, kept)) = block
            .lines()
            .zip(example.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .unwrap_or((
                block.lines().count().min(example.lines().count()),
                ("(end)", "(end)"),
            ));
        panic!(
            "README.md's embedding block and examples/embedding.rs differ first at line {}:\n\
             README:  {shown}\nexample: {kept}\n(copy the example into README)",
            line + 1
        );
    }
}

#[test]
fn the_embedding_example_runs_to_its_end() {
    example::main().expect("the example program succeeds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedding_example_calls_its_rust_tool_from_a_two_level_tree_and_cancels_the_second() {
    let runtime = example::runtime().expect("the example's config loads");
    let result = example::research(&runtime, "How long are the motto and the tagline?")
        .await
        .unwrap();
    assert_eq!(result.state.status, AgentStatus::Completed);
    assert_eq!(result.text(), "The motto has 4 words and the tagline 6.");
    assert_eq!(result.state.child_run_ids.len(), 2);
    // Each researcher called the Rust tool, which counted its text's words.
    let mut counted = Vec::new();
    for child in &result.state.child_run_ids {
        let child = runtime.state(child).await.unwrap();
        assert_eq!(child.status, AgentStatus::Completed, "{}", child.run_id);
        counted.extend(
            child
                .message_history
                .iter()
                .filter(|m| matches!(***m, Message::Tool { .. }))
                .map(|m| m.text()),
        );
    }
    counted.sort();
    assert_eq!(counted, [r#"{"words":4}"#, r#"{"words":6}"#]);

    let cancelled = example::cancel_midway(&runtime).await.unwrap();
    assert_eq!(cancelled.state.status, AgentStatus::Cancelled);
    assert_eq!(cancelled.error(), Some("Agent was cancelled"));
    let researcher = runtime
        .state(&cancelled.state.child_run_ids[0])
        .await
        .unwrap();
    assert_eq!(researcher.status, AgentStatus::Cancelled);
}

#[test]
fn the_script_docs_scripted_md_shows_is_a_valid_script() {
    let doc = repo_file("docs/scripted.md");
    let section = &doc[doc
        .find("## The script")
        .expect("a \"## The script\" section")..];
    let start = section.find("```json\n").expect("a json block") + "```json\n".len();
    let end = start + section[start..].find("\n```").expect("its end");
    let script = arbor::actors::models::scripted::Script::from_json(
        &section[start..end],
        "docs/scripted.md",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(script.replies.len(), 3);
    assert_eq!(script.replies[1].prompt.as_deref(), Some("motto"));
}
