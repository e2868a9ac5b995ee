//! The service under hostile connection load (issue 12, defect 13): slow and
//! half-open connections, connections past the cap, stalled uploads, too
//! many event streams; and the ranges of the `[service]` keys (defect 7).

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::serve::{Server, TOKEN, client, encoded, post};
use super::support::{GUARD, listening_pid, raise_open_files_limit};
use crate::{arbor, fixtures, text};

/// The bound the issue sets for an answer while the server is under load.
const ANSWER: Duration = Duration::from_secs(1);

/// The service fixture with `extra` lines added to its `[service]` table.
fn config(dir: &Path, extra: &str) -> PathBuf {
    let fixture = std::fs::read_to_string(fixtures().join("serve.toml")).unwrap();
    let marker = "shutdown_timeout = \"5s\"\n";
    assert!(fixture.contains(marker));
    let path = dir.join("serve.toml");
    std::fs::write(
        &path,
        fixture.replace(marker, &format!("{marker}{extra}\n")),
    )
    .unwrap();
    path
}

fn start(dir: &Path, extra: &str) -> Server {
    let path = config(dir, extra);
    let mut server = Server::start(dir, &["--config", path.to_str().unwrap()], Some(TOKEN));
    server.wait_for("ready");
    server
}

fn port(server: &Server) -> u16 {
    server.base.rsplit(':').next().unwrap().parse().unwrap()
}

fn addr(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_owned()
}

/// `count` connections that send half a request line (every other one) or
/// nothing, and then nothing more.
async fn slow_connections(server: &Server, count: usize) -> Vec<TcpStream> {
    let addr = addr(server);
    let mut held = Vec::with_capacity(count);
    for i in 0..count {
        let mut stream = tokio::time::timeout(GUARD, TcpStream::connect(&addr))
            .await
            .expect("connects")
            .unwrap();
        if i % 2 == 0 {
            stream.write_all(b"GET /healthz HT").await.unwrap();
        }
        held.push(stream);
    }
    held
}

/// Once the server answers this, it has accepted every connection made
/// before (the kernel's accept queue is first in, first out).
async fn barrier(server: &Server) {
    let response = client().get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

/// `/healthz` without a token and `/v1/agents` with one, each on a fresh
/// connection, each answered within the bound.
async fn both_answer_within_a_second(server: &Server) {
    let healthz = tokio::time::timeout(ANSWER, async {
        let response = client().get(server.url("/healthz")).send().await.unwrap();
        (response.status(), response.text().await.unwrap())
    })
    .await
    .expect("/healthz answers within 1 s");
    assert_eq!(healthz.0, StatusCode::OK, "{}", healthz.1);
    let agents = tokio::time::timeout(ANSWER, async {
        let response = client()
            .get(server.url("/v1/agents"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json::<Value>().await.unwrap())
    })
    .await
    .expect("an authenticated request answers within 1 s");
    assert_eq!(agents.0, StatusCode::OK, "{}", agents.1);
    assert!(agents.1.to_string().contains("coordinator"), "{}", agents.1);
}

/// Whether the server has closed `stream` (end of file, or reset); `false`
/// while it is open with nothing to read.
fn closed(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 256];
    match stream.try_read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// Reads `stream` until the server closes it, within `bound`; what it sent.
async fn read_to_close(stream: &mut TcpStream, bound: Duration) -> String {
    let mut got = Vec::new();
    match tokio::time::timeout(bound, stream.read_to_end(&mut got)).await {
        Ok(Ok(_)) => {}
        // A reset is a close too.
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Ok(Err(e)) => panic!("reading: {e}"),
        Err(_) => panic!(
            "still open after {bound:?}; got {:?}",
            String::from_utf8_lossy(&got)
        ),
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_thousand_slow_connections_do_not_stop_healthz_or_an_authenticated_request() {
    raise_open_files_limit(3_000 + 256);
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "header_read_timeout = \"60s\"");
    // As where the issue was found: the server's open-files limit is the
    // common 1024 (lowered after its start, so below the connection cap it
    // chose), and 3000 slow connections run it out of file descriptors.
    let pid = listening_pid(port(&server)).expect("the server's pid");
    let lowered = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), "--nofile=1024:"])
        .status()
        .expect("prlimit (util-linux) runs");
    assert!(lowered.success());
    let held = slow_connections(&server, 3_000).await;
    barrier(&server).await;
    both_answer_within_a_second(&server).await;
    // It kept as many slow connections as it had descriptors for, closing
    // only what it needed to let new ones in.
    let open = held.iter().filter(|s| !closed(s)).count();
    assert!((500..3_000).contains(&open), "{open} still open");
    let (status, _) = server.terminate();
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_connections_beyond_max_connections_make_room_for_healthz_and_are_logged_once() {
    raise_open_files_limit(1_000 + 256);
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        "header_read_timeout = \"60s\"\nmax_connections = 200",
    );
    let held = slow_connections(&server, 1_000).await;
    barrier(&server).await;
    both_answer_within_a_second(&server).await;
    // The longest-idle connections were closed to make room: at least all
    // but the 200 the cap holds.
    let mut closes = futures::stream::iter(held.into_iter().map(|mut stream| async move {
        let mut buf = [0u8; 256];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }))
    .buffer_unordered(1_000);
    let mut seen = 0;
    tokio::time::timeout(GUARD, async {
        while seen < 800 {
            closes.next().await.expect("800 closes");
            seen += 1;
        }
    })
    .await
    .expect("the server closes the idlest connections for new ones");
    drop(closes);
    let (status, lines) = server.terminate();
    assert!(status.success(), "{status}");
    let warnings = lines
        .iter()
        .filter(|l| l.contains("the most this server accepts ([service] max_connections)"))
        .count();
    assert_eq!(warnings, 1, "{lines:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_finishes_its_request_head_is_closed_after_header_read_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "header_read_timeout = \"1s\"");
    let addr = addr(&server);
    let mut half = TcpStream::connect(&addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let mut silent = TcpStream::connect(&addr).await.unwrap();
    // Closed by the server (1 s), well before the test's own bound.
    let bound = Duration::from_secs(10);
    let answer = read_to_close(&mut half, bound).await;
    assert!(answer.is_empty(), "{answer}");
    let answer = read_to_close(&mut silent, bound).await;
    assert!(answer.is_empty(), "{answer}");
    // A kept-alive connection waiting for its next request is bounded the
    // same way.
    let mut kept = TcpStream::connect(&addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let answer = read_to_close(&mut kept, bound).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_closed_after_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "idle_timeout = \"1s\"");
    let mut upload = TcpStream::connect(addr(&server)).await.unwrap();
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"agent\""
    );
    upload.write_all(head.as_bytes()).await.unwrap();
    // The body never comes: closed after 1 s without a byte either way.
    let answer = read_to_close(&mut upload, Duration::from_secs(10)).await;
    assert!(!answer.contains("201"), "{answer}");
}

/// Opens a run's event stream: the status and, on an error, its JSON body.
async fn open_stream(server: &Server, run_id: &str) -> (StatusCode, reqwest::Response) {
    let response = client()
        .get(server.url(&format!("/v1/runs/{}/events", encoded(run_id))))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    (response.status(), response)
}

async fn refused(server: &Server, run_id: &str) -> (StatusCode, Value) {
    let (status, response) = open_stream(server, run_id).await;
    assert_ne!(status, StatusCode::OK, "{run_id}: a stream past the cap");
    (status, response.json().await.unwrap())
}

/// A sleeper tree: its root waits an hour on its model, so its streams stay
/// quiet and open.
async fn sleeper(server: &Server) -> String {
    let (status, created) = post(
        server,
        "/v1/runs",
        json!({"agent": "sleeper", "prompt": "nap"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    created["runId"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_beyond_their_caps_are_refused_with_the_documented_error() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        "idle_timeout = \"1s\"\nmax_event_streams = 3\nmax_event_streams_per_tree = 2",
    );
    let a = sleeper(&server).await;
    let b = sleeper(&server).await;

    // Below the caps, streams work; a quiet one outlives the idle timeout
    // on its keep-alives (four of them take more than the 1 s).
    let (status, first) = open_stream(&server, &a).await;
    assert_eq!(status, StatusCode::OK);
    let mut first = first.bytes_stream();
    let mut seen = String::new();
    tokio::time::timeout(GUARD, async {
        while seen.matches("\n:\n").count() + usize::from(seen.starts_with(":\n")) < 4 {
            let chunk = first.next().await.expect("the stream stays open").unwrap();
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .expect("keep-alives on a quiet stream");
    assert!(seen.contains("event: agentStarted"), "{seen}");
    let (status, second) = open_stream(&server, &a).await;
    assert_eq!(status, StatusCode::OK);

    // A third stream of one tree: 429, naming the per-tree cap.
    let (status, body) = refused(&server, &a).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "too_many_streams", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("[service] max_event_streams_per_tree"),
        "{message}"
    );

    // Another tree's stream fits the total; one more does not: 503.
    let (status, third) = open_stream(&server, &b).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = refused(&server, &b).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "busy", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("[service] max_event_streams)"),
        "{message}"
    );

    // Streams that end give their places back: cancel tree A, read its two
    // streams to their end, and B gets a second stream.
    let (status, _) = post(
        &server,
        &format!("/v1/runs/{}/cancel", encoded(&a)),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    tokio::time::timeout(GUARD, async {
        while let Some(chunk) = first.next().await {
            chunk.unwrap();
        }
        second.bytes().await.unwrap();
    })
    .await
    .expect("tree A's streams end with it");
    let (status, fourth) = open_stream(&server, &b).await;
    assert_eq!(status, StatusCode::OK);
    drop((third, fourth));
}

#[test]
fn service_keys_out_of_range_are_refused_by_check_config_with_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ranges.toml");
    std::fs::write(
        &path,
        "[service]\n\
         shutdown_timeout = \"200000000000000d\"\n\
         header_read_timeout = \"10ms\"\n\
         idle_timeout = \"2h\"\n\
         body_limit = 1_000_000_000\n\
         max_running_trees = 1_000_000\n\
         max_connections = 0\n\
         max_event_streams = 100\n\
         max_event_streams_per_tree = 101\n",
    )
    .unwrap();
    let out = arbor(&["check-config", path.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for line in [
        // (Too big for a duration at all, or more than 1 h: refused either way.)
        "ranges.toml:2: service.shutdown_timeout: ",
        "ranges.toml:3: service.header_read_timeout: must be at least 100ms",
        "ranges.toml:4: service.idle_timeout: must be at most 1h",
        "ranges.toml:5: service.body_limit: must be at most 67108864 bytes",
        "ranges.toml:6: service.max_running_trees: must be at most 100000",
        "ranges.toml:7: service.max_connections: must be at least 1",
        "ranges.toml:9: service.max_event_streams_per_tree: must be at most 100 (max_event_streams)",
    ] {
        assert!(err.contains(line), "{line}\n{err}");
    }
    // The largest values in range pass, and so does the default.
    std::fs::write(
        &path,
        "[service]\n\
         shutdown_timeout = \"1h\"\n\
         header_read_timeout = \"5m\"\n\
         idle_timeout = \"1h\"\n\
         body_limit = 67_108_864\n\
         max_running_trees = 100_000\n\
         max_connections = 1_000_000\n\
         max_event_streams = 100_000\n\
         max_event_streams_per_tree = 100_000\n",
    )
    .unwrap();
    let out = arbor(&["check-config", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}
