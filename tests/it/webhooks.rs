//! Completion webhooks (issue 38, item 4): a tree started with a `webhook`
//! posts its end, signed with the service's secret, to a receiver on
//! loopback; failed attempts are retried with backoff; the delivery is
//! journaled, so a server killed between the tree's end and the delivery
//! delivers it once after its restart, and never again after that; a
//! later turn's webhook is its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, KeyInit as _, Mac as _};
use reqwest::StatusCode as Status;
use serde_json::{Value, json};
use sha2::Sha256;

use crate::serve::{Server, TOKEN, client, post};

const SECRET: &str = "whsec-test-0123456789abcdef";

/// One attempt the receiver saw.
#[derive(Clone, Debug)]
struct Seen {
    headers: HeaderMap,
    body: Bytes,
    /// What it answered.
    status: u16,
}

/// A webhook receiver on loopback: answers 500 to the first `fail` attempts
/// (and to every attempt while `failing` is set), 200 to the rest.
struct Receiver {
    fail: AtomicUsize,
    failing: std::sync::atomic::AtomicBool,
    seen: Mutex<Vec<Seen>>,
    url: String,
}

impl Receiver {
    async fn start(fail: usize) -> Arc<Receiver> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks/arbor", listener.local_addr().unwrap());
        let receiver = Arc::new(Receiver {
            fail: AtomicUsize::new(fail),
            failing: Default::default(),
            seen: Mutex::new(Vec::new()),
            url,
        });
        let app = axum::Router::new()
            .route("/hooks/arbor", axum::routing::post(hook))
            .with_state(receiver.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        receiver
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn accepted(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.status == 200)
            .collect()
    }

    /// Until `done` holds of what the receiver saw (bounded: the test fails).
    async fn until(&self, what: &str, done: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let seen = self.seen();
            if done(&seen) {
                return seen;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {what} within 30s; the receiver saw {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn hook(State(r): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let failed = r.failing.load(Ordering::SeqCst)
        || r.fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
    let status = if failed {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    r.seen.lock().unwrap().push(Seen {
        headers,
        body,
        status: status.as_u16(),
    });
    status
}

/// Checks a delivery's signature as a receiver would (docs/service.md):
/// HMAC-SHA256 with the shared secret over `timestamp.body`.
fn signed(seen: &Seen, secret: &str) -> bool {
    let header = |name: &str| seen.headers[name].to_str().unwrap().to_owned();
    let timestamp = header("x-arbor-timestamp");
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(&seen.body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    header("x-arbor-signature") == format!("sha256={hex}")
}

fn body(seen: &Seen) -> Value {
    serde_json::from_slice(&seen.body).unwrap()
}

/// The fixture config with the webhook keys in `[service]` (short backoffs,
/// for a test that takes well under a second per retry).
fn config(dir: &std::path::Path, webhook_keys: &str) -> String {
    let text = std::fs::read_to_string(crate::fixtures().join("serve.toml")).unwrap();
    let text = text.replacen("[service]\n", &format!("[service]\n{webhook_keys}\n"), 1);
    let path = dir.join("webhooks.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

const KEYS: &str = r#"webhook_secret = "whsec-test-0123456789abcdef"
webhook_backoff = "100ms"
webhook_backoff_max = "400ms"
webhook_attempts = 5
webhook_timeout = "2s""#;

fn serving(dir: &std::path::Path, keys: &str) -> Server {
    let config = config(dir, keys);
    let mut server = Server::start(dir, &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_that_ends_posts_its_end_signed_with_the_shared_secret_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = serving(dir.path(), KEYS);
    let receiver = Receiver::start(0).await;
    let (status, waited) = post(
        &server,
        "/v1/runs/wait?timeout=30s",
        json!({"agent": "coordinator", "prompt": "Compare three sorting algorithms",
               "webhook": receiver.url}),
    )
    .await;
    assert_eq!(status, Status::OK, "{waited}");
    let seen = receiver.until("delivery", |s| !s.is_empty()).await;
    let delivery = &seen[0];
    assert!(signed(delivery, SECRET), "{delivery:?}");
    assert!(!signed(delivery, "another-secret-0123456789"));
    assert_eq!(
        delivery.headers["content-type"].to_str().unwrap(),
        "application/json"
    );
    assert_eq!(delivery.headers["x-arbor-attempt"].to_str().unwrap(), "1");
    let payload = body(delivery);
    assert_eq!(payload["event"], "tree.ended", "{payload}");
    assert_eq!(payload["treeId"], waited["treeId"], "{payload}");
    // One delivery per run: its id is the run's.
    assert_eq!(
        delivery.headers["x-arbor-delivery"].to_str().unwrap(),
        waited["runId"]
    );
    assert_eq!(payload["runId"], waited["runId"]);
    assert_eq!(payload["status"], "completed");
    assert_eq!(payload["agentType"], "coordinator");
    assert_eq!(payload["text"], waited["text"], "{payload}");
    assert_eq!(payload["usage"]["runs"], 13, "{payload}");
    assert!(
        payload["usage"]["inputTokens"].as_u64().unwrap() > 0,
        "{payload}"
    );
    assert!(payload["error"].is_null(), "{payload}");
    // Delivered: never sent again.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(receiver.seen().len(), 1, "{:?}", receiver.seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_fails_twice_gets_three_attempts_and_one_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let server = serving(dir.path(), KEYS);
    let receiver = Receiver::start(2).await;
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "go", "webhook": receiver.url}),
    )
    .await;
    assert_eq!(status, Status::CREATED, "{created}");
    let seen = receiver
        .until("accepted delivery", |s| s.iter().any(|s| s.status == 200))
        .await;
    let statuses: Vec<u16> = seen.iter().map(|s| s.status).collect();
    assert_eq!(statuses, [500, 500, 200]);
    let attempts: Vec<&str> = seen
        .iter()
        .map(|s| s.headers["x-arbor-attempt"].to_str().unwrap())
        .collect();
    assert_eq!(attempts, ["1", "2", "3"]);
    // Each attempt signed; the body is the same tree's end each time.
    for attempt in &seen {
        assert!(signed(attempt, SECRET));
        assert_eq!(body(attempt), body(&seen[0]));
    }
    assert_eq!(body(&seen[2])["treeId"], created["treeId"]);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(receiver.seen().len(), 3);
    let metrics = client()
        .get(server.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("arbor_webhook_deliveries_total 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("arbor_webhook_attempts_failed_total 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("arbor_webhook_failures_total 0\n"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_before_the_delivery_delivers_it_once_after_its_restart() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(0).await;
    receiver.failing.store(true, Ordering::SeqCst);
    let server = serving(dir.path(), KEYS);
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "go", "webhook": receiver.url}),
    )
    .await;
    assert_eq!(status, Status::CREATED, "{created}");
    // The tree ended and its webhook is being retried (its first attempt
    // journaled before the second was made): the server dies.
    receiver
        .until("two failed attempts", |s| s.len() >= 2)
        .await;
    drop(server);
    let before = receiver.seen().len();
    assert!(receiver.accepted().is_empty());
    receiver.failing.store(false, Ordering::SeqCst);
    // Nothing is sent while no server runs.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.seen().len(), before);
    let server = serving(dir.path(), KEYS);
    let seen = receiver
        .until("accepted delivery", |s| s.iter().any(|s| s.status == 200))
        .await;
    let accepted: Vec<&Seen> = seen.iter().filter(|s| s.status == 200).collect();
    assert_eq!(accepted.len(), 1);
    assert!(signed(accepted[0], SECRET));
    assert_eq!(body(accepted[0])["treeId"], created["treeId"]);
    // Its attempt number goes on from the journal's (the attempt in flight
    // at the kill may not be journaled).
    let attempt: usize = accepted[0].headers["x-arbor-attempt"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (before..=before + 1).contains(&attempt),
        "{attempt} after {before}: {seen:?}"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(receiver.accepted().len(), 1);
    // Delivered: a later start does not send it again.
    let total = receiver.seen().len();
    let (exit, _) = server.terminate();
    assert!(exit.success(), "{exit:?}");
    let _server = serving(dir.path(), KEYS);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(receiver.seen().len(), total, "{:?}", receiver.seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_without_a_secret_or_with_a_bad_url_is_refused_naming_why() {
    let dir = tempfile::tempdir().unwrap();
    // No secret: a webhook would go unsigned, so the start is refused.
    let unsigned = serving(dir.path(), "");
    let (status, body) = post(
        &unsigned,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "go", "webhook": "http://127.0.0.1:9/hook"}),
    )
    .await;
    assert_eq!(status, Status::UNPROCESSABLE_ENTITY, "{body}");
    let message = body.to_string();
    assert!(message.contains("webhook_secret"), "{message}");
    drop(unsigned);
    let dir = tempfile::tempdir().unwrap();
    let keyed = serving(dir.path(), KEYS);
    for (url, why) in [
        ("ftp://127.0.0.1/hook", "not an http(s) URL"),
        ("http://user:pw@127.0.0.1/hook", "holds no credentials"),
    ] {
        for path in ["/v1/runs", "/v1/runs/wait"] {
            let (status, body) = post(
                &keyed,
                path,
                json!({"agent": "lead", "prompt": "go", "webhook": url}),
            )
            .await;
            assert_eq!(status, Status::UNPROCESSABLE_ENTITY, "{path} {url}: {body}");
            let message = body.to_string();
            assert!(
                message.contains("webhook") && message.contains(why),
                "{message}"
            );
        }
    }
    let (_, runs) = crate::serve::get(&keyed, "/v1/runs").await;
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(0), "{runs}");
}

/// A default webhook needs a secret: the config says so, naming the key.
#[test]
fn a_default_webhook_without_a_secret_is_a_config_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), r#"webhook = "https://example.com/hook""#);
    let out = crate::arbor(&["serve", "--config", &config]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("service.webhook"), "{stderr}");
    assert!(stderr.contains("needs webhook_secret"), "{stderr}");
}

/// `[service] webhook_hosts` lists where a caller's webhook may post: one
/// to another host (the cloud's metadata address) is refused naming the
/// host and the key, so a caller cannot make the service post inside its
/// network; a listed host is taken; an entry that is no host is a config
/// error naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_to_a_host_not_listed_is_refused_and_a_bad_entry_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let keys = format!("{KEYS}\nwebhook_hosts = [\"127.0.0.1\", \"*.hooks.example\"]");
    let server = serving(dir.path(), &keys);
    let (status, body) = post(
        &server,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "go",
               "webhook": "http://169.254.169.254/latest/meta-data"}),
    )
    .await;
    assert_eq!(status, Status::UNPROCESSABLE_ENTITY, "{body}");
    let message = body.to_string();
    assert!(
        message.contains("169.254.169.254") && message.contains("webhook_hosts"),
        "{message}"
    );
    let receiver = Receiver::start(0).await;
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "go", "webhook": receiver.url}),
    )
    .await;
    assert_eq!(status, Status::CREATED, "{created}");
    receiver.until("the delivery", |s| !s.is_empty()).await;
    drop(server);
    let bad = config(
        dir.path(),
        r#"webhook_hosts = ["https://hooks.example.com/x"]"#,
    );
    let out = crate::arbor(&["serve", "--config", &bad]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("service.webhook_hosts"), "{stderr}");
    assert!(stderr.contains("is no host"), "{stderr}");
}

/// A webhook is the run's, a later turn's too: a tree asked a second turn
/// (queued behind the first, with a webhook of its own) posts two
/// deliveries, each of its own run with its own answer, the first as soon
/// as its turn ended (before, a tree had one webhook, delivered once the
/// tree stood still and telling of whichever turn was latest then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_turn_with_a_webhook_posts_its_own_end() {
    let dir = tempfile::tempdir().unwrap();
    let script = json!({"replies": [
        {"agent": "chat", "prompt": "first", "steps": [{"text": "first answer", "delayMs": 1500}]},
        {"agent": "chat", "prompt": "second", "steps": [{"text": "second answer", "delayMs": 1500}]}
    ]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let config = dir.path().join("chat.toml");
    std::fs::write(
        &config,
        format!(
            "[service]\nbind = \"127.0.0.1:0\"\n{KEYS}\n\n[models.script]\nprovider = \"scripted\"\n\
             file = \"script.json\"\n\n[agents.chat]\nmodel = \"script\"\n"
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let receiver = Receiver::start(0).await;
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "chat", "prompt": "first", "webhook": receiver.url}),
    )
    .await;
    assert_eq!(status, Status::CREATED, "{created}");
    let tree = created["treeId"].as_str().unwrap().to_owned();
    let (status, queued) = post(
        &server,
        &format!("/v1/trees/{tree}/turns"),
        json!({"prompt": "second", "webhook": receiver.url}),
    )
    .await;
    assert_eq!(status, Status::ACCEPTED, "{queued}");
    // The first turn's end is posted while the second runs.
    let first = receiver
        .until("the first turn's delivery", |s| !s.is_empty())
        .await;
    let one = body(&first[0]);
    assert_eq!(one["runId"], created["runId"], "{one}");
    assert_eq!(one["text"], "first answer", "{one}");
    assert_eq!(one["status"], "completed", "{one}");
    let seen = receiver.until("both deliveries", |s| s.len() >= 2).await;
    let two = body(&seen[1]);
    assert_eq!(two["runId"], queued["runId"], "{two}");
    assert_eq!(two["treeId"], tree.as_str(), "{two}");
    assert_eq!(two["text"], "second answer", "{two}");
    assert_eq!(
        seen[1].headers["x-arbor-delivery"].to_str().unwrap(),
        queued["runId"]
    );
    assert!(signed(&seen[1], SECRET));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(receiver.seen().len(), 2, "{:?}", receiver.seen());
}
