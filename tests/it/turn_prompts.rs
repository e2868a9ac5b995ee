//! Issue 34 (12): follow-up turns do not pile up prompts. A template's
//! instructions live for the turn they were given in (Codebuff's
//! `timeToLive: "userPrompt"`), and under truncation only the current turn's
//! prompt is kept: an ended turn's prompt is cut like any message.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arbor::providers::ProviderKind;
use serde_json::Value;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::support::{self, MODEL_ID, guarded, wire};
use crate::text;

const INSTRUCTIONS: &str = "Answer in one paragraph, cite the figure you rely on, \
    and say plainly when the data does not settle the question.";

/// Answers the `n`th request with "answer n" and a long tail, so each answer
/// is about 150 estimated tokens.
struct Numbered(Arc<AtomicUsize>);

impl Respond for Numbered {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        let reply = format!("answer {n}: {}", "figures ".repeat(75));
        ResponseTemplate::new(200).set_body_json(wire::text_json(ProviderKind::OpenAi, &reply))
    }
}

fn arbor(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let out = crate::arbor_in(dir, args);
    assert!(
        out.status.success(),
        "arbor {args:?}: {}",
        text(&out.stderr)
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_continue_turns_send_one_copy_of_the_instructions_and_keep_every_earlier_answer() {
    guarded(async {
        let kind = ProviderKind::OpenAi;
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(support::path(kind)))
            .respond_with(Numbered(Arc::default()))
            .mount(&server)
            .await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.toml"),
            format!(
                "[models.m]\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"{MODEL_ID}\"\n\
                 stream = false\nretry = {{ max_retries = 0 }}\n\n\
                 [agents.analyst]\nmodel = \"m\"\nsystem_prompt = \"You analyse.\"\n\
                 instructions_prompt = \"{INSTRUCTIONS}\"\ncontext_window = 2000\n",
                support::base_url(kind, &server.uri())
            ),
        )
        .unwrap();
        let at = dir.path().to_path_buf();
        tokio::task::spawn_blocking(move || {
            arbor(&at, &["run", "--tree-id", "t10", "--quiet", "question 1"]);
            for turn in 2..=10 {
                let prompt = format!("question {turn}");
                arbor(&at, &["run", "--continue", "t10", "--quiet", &prompt]);
            }
        })
        .await
        .unwrap();
        let requests = server.received_requests().await.unwrap();
        assert_eq!(requests.len(), 10, "one request a turn");
        let last: Value = serde_json::from_slice(&requests[9].body).unwrap();
        let sent = last["messages"].to_string();
        assert_eq!(
            sent.matches(INSTRUCTIONS).count(),
            1,
            "the instructions once, for the current turn: {sent}"
        );
        for n in 1..=9 {
            assert!(
                sent.contains(&format!("answer {n}:")),
                "answer {n} was cut: {sent}"
            );
        }
        assert!(
            !sent.contains("earlier message(s) removed"),
            "it fits the window: {sent}"
        );
        // The turn's own prompt and instructions end the request.
        let messages = last["messages"].as_array().unwrap();
        let tail: Vec<&str> = messages[messages.len() - 2..]
            .iter()
            .map(|m| m["content"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(tail, ["question 10", INSTRUCTIONS]);
    })
    .await;
}
