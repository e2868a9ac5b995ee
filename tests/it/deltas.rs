//! The model's reply as it streams in (issue 38 item 3): `modelDelta` events
//! on `GET /v1/runs/{runId}/events?deltas=true` and on the live page, before
//! the step ends; a stream that does not ask has none and is otherwise the
//! same.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::serve::{Server, Sse, TOKEN, encoded, get, post, stream, stream_with};
use crate::support::browser::Browser;

const CONFIG: &str = r#"
[store]
path = "arbor.db"

[service]
bind = "127.0.0.1:0"
shutdown_timeout = "5s"

[models.script]
provider = "scripted"
file = "script.json"

[agents.writer]
model = "script"

[agents.essayist]
model = "script"
"#;

/// Eight words, one every 300 ms: the step takes 2.4 s after its first word.
const TEXT: &str = "the answer streams in one word at a time";

/// Forty words, one every 250 ms: ten seconds in which the page, however
/// slow its browser is to start, sees the reply grow.
fn essay() -> String {
    (1..=40)
        .map(|i| format!("word{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn script() -> Value {
    json!({"replies": [
        {"agent": "writer", "steps": [{"text": TEXT, "wordMs": 300}]},
        {"agent": "essayist", "steps": [{"text": essay(), "wordMs": 250}]}
    ]})
}

fn server(dir: &std::path::Path) -> Server {
    std::fs::write(dir.join("config.toml"), CONFIG).unwrap();
    std::fs::write(dir.join("script.json"), script().to_string()).unwrap();
    let config = dir.join("config.toml");
    let mut server = Server::start(dir, &["--config", config.to_str().unwrap()], Some(TOKEN));
    server.wait_for("ready");
    server
}

async fn start(server: &Server, agent: &str) -> String {
    let (status, created) = post(server, "/v1/runs", json!({"agent": agent, "prompt": "go"})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    created["runId"].as_str().unwrap().to_owned()
}

/// A client that asks for deltas gets the reply word by word, each piece
/// while the run still runs (asked of the server when the first arrives),
/// all before the step's `modelResponded`, and together the reply's text;
/// they have no SSE id. A stream that does not ask, read at the same time,
/// has exactly the journaled events the other has, with the same ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_reply_reaches_an_sse_client_word_by_word_before_its_step_ends() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let run = start(&server, "writer").await;

    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    let mut first_tx = Some(first_tx);
    let with = stream_with(&server, &run, "?deltas=true", None, |e: &Sse| {
        if e.event == "modelDelta"
            && let Some(tx) = first_tx.take()
        {
            let _ = tx.send(());
        }
    });
    let without = stream(&server, &run, None, |_| {});
    let asked = async {
        first_rx.await.expect("a modelDelta arrived");
        get(&server, &format!("/v1/runs/{}", encoded(&run))).await
    };
    let (with, without, (status, during)) = tokio::join!(with, without, asked);
    assert_eq!(status, StatusCode::OK, "{during}");
    assert_eq!(
        during["status"], "running",
        "the run ended before its first word arrived: {during}"
    );

    let deltas: Vec<&Sse> = with.iter().filter(|e| e.event == "modelDelta").collect();
    assert_eq!(deltas.len(), TEXT.split(' ').count(), "{with:#?}");
    let text: String = deltas
        .iter()
        .map(|e| {
            assert_eq!(e.id, 0, "a delta has no SSE id: {e:?}");
            assert_eq!(e.data["runId"], run.as_str());
            assert_eq!(e.data["step"], 1);
            assert_eq!(e.data["delta"]["kind"], "text");
            e.data["delta"]["text"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(text, TEXT);
    let responded = with
        .iter()
        .position(|e| e.event == "modelResponded")
        .unwrap();
    let last_delta = with.iter().rposition(|e| e.event == "modelDelta").unwrap();
    assert!(last_delta < responded, "{with:#?}");
    assert_eq!(with.last().unwrap().event, "agentFinished");

    // Without asking: no deltas, the same journaled events.
    let journaled: Vec<(u64, &str)> = with
        .iter()
        .filter(|e| e.event != "modelDelta")
        .map(|e| (e.id, e.event.as_str()))
        .collect();
    let plain: Vec<(u64, &str)> = without.iter().map(|e| (e.id, e.event.as_str())).collect();
    assert_eq!(plain, journaled);
    assert!(plain.iter().all(|(id, _)| *id > 0));

    // A reconnect after the end repeats no delta (no journal has them).
    let again = stream_with(&server, &run, "?deltas=true", None, |_| {}).await;
    assert!(again.iter().all(|e| e.event != "modelDelta"), "{again:#?}");
    assert_eq!(again.len(), plain.len());
}

/// An unknown query key is refused by name, not ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_deltas_query_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let run = start(&server, "writer").await;
    let response = crate::serve::client()
        .get(server.url(&format!("/v1/runs/{}/events?delta=true", encoded(&run))))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body = response.text().await.unwrap();
    assert!(body.contains("delta"), "{body}");
}

/// In real Chromium: the running agent's row says "writing: …" with the
/// words that have come so far while it still runs, and the note goes when
/// it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_shows_a_reply_as_it_streams_in_chromium() {
    let browser = Browser::new();
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let run = start(&server, "essayist").await;
    let tree = run.split('/').next().unwrap().to_owned();
    let report = browser
        .drive(
            &browser.script("page_deltas.mjs"),
            &[server.base.as_str(), TOKEN, tree.as_str(), run.as_str()],
            &[],
        )
        .await;
    let note = report["seen"]["note"].as_str().unwrap();
    let words = note.strip_prefix("writing: ").unwrap();
    // The end of what has come so far: a piece of the essay, not its end.
    let shown = words.trim_start_matches('…');
    assert!(!shown.is_empty() && essay().contains(shown), "{report:#}");
    assert!(
        !shown.ends_with("word40"),
        "the whole text came at once: {report:#}"
    );
    assert_eq!(report["seen"]["status"], "running", "{report:#}");
    assert_eq!(report["end"]["status"], "completed", "{report:#}");
    assert_eq!(report["end"]["note"], "", "{report:#}");
    assert_eq!(report["consoleErrors"], json!([]), "{report:#}");
}
