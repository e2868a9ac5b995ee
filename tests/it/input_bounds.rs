//! Every input is bounded (issue 33, items 4, 6 and 8): request heads and
//! bodies before authentication, steering messages a run holds, the config
//! file, and client commands against a server that never answers.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::serve::{Server, TOKEN, encoded, post};
use super::support::GUARD;
use crate::{fixtures, text};

/// How long the server may take to refuse what it refuses at once.
const PROMPTLY: Duration = Duration::from_secs(10);

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

fn addr(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_owned()
}

/// Reads `stream` until the server closes it (end of file, or a reset
/// after its answer), within `bound`; what it sent.
async fn read_to_close(stream: &mut TcpStream, bound: Duration) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(bound, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                // A reset is a close too (the server closed with unread input).
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
                Err(e) => panic!("reading: {e}"),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "still open after {bound:?}; got {:?}",
        String::from_utf8_lossy(&got)
    );
    String::from_utf8_lossy(&got).into_owned()
}

/// Writes what it can of `bytes`: the server may close (and reset) the
/// connection before it has read them all.
async fn write_some(stream: &mut TcpStream, bytes: &[u8]) {
    let _ = stream.write_all(bytes).await;
}

/// A request head for `/healthz` with one header of `pad` bytes, ended
/// (`finished`) or not.
fn head(pad: usize, finished: bool) -> Vec<u8> {
    let mut head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', pad));
    if finished {
        head.extend_from_slice(b"\r\n\r\n");
    }
    head
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_head_is_refused_with_431_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    // The header read timeout is far off: only the size cap can end these.
    let server = start(dir.path(), "header_read_timeout = \"60s\"");
    // A whole head of 64 KB (the default cap is 32 KiB): 431, no token needed.
    let mut whole = TcpStream::connect(addr(&server)).await.unwrap();
    write_some(&mut whole, &head(64 << 10, true)).await;
    let answer = read_to_close(&mut whole, PROMPTLY).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    // An unfinished one of 48 KB: refused as soon as the cap's worth is in,
    // long before the header read timeout.
    let started = Instant::now();
    let mut unfinished = TcpStream::connect(addr(&server)).await.unwrap();
    write_some(&mut unfinished, &head(48 << 10, false)).await;
    let answer = read_to_close(&mut unfinished, PROMPTLY).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    assert!(started.elapsed() < PROMPTLY);
    // A client that goes on sending long past the cap reads the 431 too:
    // the server drains what it sends before closing, rather than resetting
    // the connection under the answer.
    let sender = TcpStream::connect(addr(&server)).await.unwrap();
    let (mut reader, mut writer) = sender.into_split();
    let flood = tokio::spawn(async move {
        let _ = writer.write_all(&head(512 << 10, false)).await;
        writer
    });
    let mut got = Vec::new();
    let read = tokio::time::timeout(PROMPTLY, async {
        let mut buf = [0u8; 4096];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let answer = String::from_utf8_lossy(&got);
    assert!(read.is_ok(), "still open: {answer:?}");
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    drop(flood.await);
    // A head under the cap is served.
    let mut small = TcpStream::connect(addr(&server)).await.unwrap();
    small
        .write_all(&[&head(16 << 10, false)[..], b"\r\nConnection: close\r\n\r\n"].concat())
        .await
        .unwrap();
    let answer = read_to_close(&mut small, PROMPTLY).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_head_size_is_configurable_and_its_range_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "max_head_size = 12288");
    let mut over = TcpStream::connect(addr(&server)).await.unwrap();
    write_some(&mut over, &head(16 << 10, true)).await;
    let answer = read_to_close(&mut over, PROMPTLY).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    drop(server);
    // Below what the HTTP parser needs: a config error naming the key.
    let path = config(dir.path(), "max_head_size = 4096");
    let out = crate::arbor_in(dir.path(), &["check-config", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("max_head_size: must be at least 8192 bytes"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_length_above_body_limit_is_refused_with_413_before_the_body_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    // The fixture's body_limit is 64 KiB; the body never comes.
    let server = start(dir.path(), "");
    let mut upload = TcpStream::connect(addr(&server)).await.unwrap();
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 10000000\r\n\r\n"
    );
    upload.write_all(head.as_bytes()).await.unwrap();
    let answer = read_to_close(&mut upload, PROMPTLY).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:?}");
    assert!(answer.contains("\"payload_too_large\""), "{answer}");
    assert!(
        answer.contains("(10000000 bytes by its Content-Length)")
            && answer.contains("[service] body_limit"),
        "{answer}"
    );
    // Without a token too: nothing is read for a request that cannot fit.
    let mut anonymous = TcpStream::connect(addr(&server)).await.unwrap();
    anonymous
        .write_all(b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 70000\r\n\r\n")
        .await
        .unwrap();
    let answer = read_to_close(&mut anonymous, PROMPTLY).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_trickled_a_byte_at_a_time_is_cut_off_with_408_after_body_read_timeout() {
    let dir = tempfile::tempdir().unwrap();
    // Idle timeout far off: a byte every 200 ms keeps the connection from
    // ever being idle; only the body read timeout can end it.
    let server = start(
        dir.path(),
        "body_read_timeout = \"1s\"\nidle_timeout = \"60s\"",
    );
    let mut upload = TcpStream::connect(addr(&server)).await.unwrap();
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    );
    upload.write_all(head.as_bytes()).await.unwrap();
    let (mut reader, mut writer) = upload.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..1000 {
            if writer.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let mut got = Vec::new();
    let read = tokio::time::timeout(PROMPTLY, async {
        let mut buf = [0u8; 4096];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    trickle.abort();
    let answer = String::from_utf8_lossy(&got);
    assert!(read.is_ok(), "still open: {answer:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(answer.contains("\"request_timeout\""), "{answer}");
    assert!(answer.contains("[service] body_read_timeout"), "{answer}");
}

/// A sleeper tree (its root waits an hour on its model, so it takes no
/// steering message meanwhile); its root's run id.
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

async fn say(server: &Server, run_id: &str, text: &str) -> (StatusCode, Value) {
    post(
        server,
        &format!("/v1/runs/{}/messages", encoded(run_id)),
        json!({ "text": text }),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steering_messages_beyond_the_pending_cap_are_refused_with_429() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        "max_pending_steers = 3\nmax_pending_steer_bytes = 2048",
    );
    let run = sleeper(&server).await;
    for n in 1..=3 {
        let (status, body) = say(&server, &run, &format!("note {n}")).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    let (status, body) = say(&server, &run, "note 4").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "too_many_messages", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("3 messages (") && message.contains("max_pending_steers"),
        "{message}"
    );
    // The bytes cap holds for a run with room for more messages.
    let other = sleeper(&server).await;
    let (status, body) = say(&server, &other, &"x".repeat(1500)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (status, body) = say(&server, &other, &"y".repeat(600)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_pending_steer_bytes"),
        "{body}"
    );
}

/// Runs `arbor` with `args` in `dir`, killing it (and failing) if it has
/// not exited within `bound`.
fn run_bounded(dir: &Path, args: &[&str], bound: Duration) -> Output {
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("ARBOR_SERVER")
        .env_remove("ARBOR_API_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + bound;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("arbor {args:?} still running after {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_config_that_is_a_fifo_a_device_or_too_large_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    // A FIFO no one writes to: refused at once, not waited on.
    let fifo = dir.path().join("config.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let fifo = fifo.to_str().unwrap();
    let out = run_bounded(dir.path(), &["check-config", fifo], GUARD);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("{fifo}: (file): is a FIFO, not a regular file")),
        "{stderr}"
    );
    // A device that never ends: refused, not read until memory runs out.
    let out = run_bounded(dir.path(), &["check-config", "/dev/full"], GUARD);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("/dev/full: (file): is a character device, not a regular file"),
        "{stderr}"
    );
    // A file over the cap (sparse: no disk is used).
    let big = dir.path().join("big.toml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len((4 << 20) + 1)
        .unwrap();
    let big = big.to_str().unwrap();
    let out = run_bounded(dir.path(), &["serve", "--config", big], GUARD);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{big}: (file): is larger than 4 MiB, the most a config file may be"
        )),
        "{stderr}"
    );
}

#[test]
fn client_commands_against_a_server_that_never_answers_give_up_naming_it() {
    // Accepts every connection and holds it, never answering.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            // Reads the request, so only the answer is missing.
            let mut buf = [0u8; 1024];
            let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
            let _ = stream.read(&mut buf);
            let _ = stream.flush();
            held.push(stream);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let with = |args: &[&str]| -> Vec<String> {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend([
            "--server".into(),
            server.clone(),
            "--timeout".into(),
            "1s".into(),
        ]);
        all
    };
    let commands: [&[&str]; 5] = [
        &["approvals"],
        &["say", "t1/0", "hello"],
        &["approve", "t1", "call_1"],
        &["deny", "t1", "call_1"],
        &["budget", "t1", "--add-steps", "5"],
    ];
    for command in commands {
        let args = with(command);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = Instant::now();
        let out = run_bounded(dir.path(), &args, GUARD);
        assert!(!out.status.success(), "{command:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "the server at {server} did not answer within 1s (--timeout)"
            )),
            "{command:?}: {stderr}"
        );
        assert!(
            started.elapsed() < PROMPTLY,
            "{command:?} took {:?}",
            started.elapsed()
        );
    }
    // The timeout's own bad value is named.
    let out = run_bounded(
        dir.path(),
        &["approvals", "--server", &server, "--timeout", "0s"],
        GUARD,
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--timeout must be longer than 0"),
        "{}",
        text(&out.stderr)
    );
}
