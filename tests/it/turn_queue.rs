//! An accepted follow-up turn is never lost (issue 33): a turn asked for
//! while its tree runs a turn is queued in the store and answered at once
//! (202, with the run id it will have and its place in line); it starts
//! when the turn before it ends, whatever the connection does, across a
//! kill -9 of the server and a replica takeover; `arbor run --continue`
//! takes the same path. The real binary on loopback, a scripted model.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::approvals_restart::read_until;
use crate::serve::{Server, TOKEN, encoded, get, post};

/// Bounds on what is awaited (none is reached when things work).
const GUARD: Duration = Duration::from_secs(60);
/// How soon a turn request must be answered: at once, not when the running
/// turn ends (which takes longer than this in every test here).
const AT_ONCE: Duration = Duration::from_secs(5);

/// The chat agent on the scripted model, and `[service]` lines of the test.
fn config(service: &str) -> String {
    format!(
        r#"
[service]
bind = "127.0.0.1:0"
{service}

[models.script]
provider = "scripted"
file = "script.json"

[agents.chat]
model = "script"
"#
    )
}

/// Writes the script and the config into `dir`: a first turn ("slow …")
/// whose one step takes `slow_ms`, a second that answers at once.
fn setup(dir: &Path, slow_ms: u64, service: &str) -> String {
    let script = json!({"replies": [
        {"agent": "chat", "prompt": "slow", "steps": [{"text": "slow answer", "delayMs": slow_ms}]},
        {"agent": "chat", "prompt": "second", "steps": [{"text": "second answer"}]},
        {"agent": "chat", "steps": [{"text": "answer"}]}
    ]});
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
    std::fs::write(dir.join("chat.toml"), config(service)).unwrap();
    "chat.toml".into()
}

/// Starts a tree whose first turn is slow, once its step has started:
/// its tree id.
async fn slow_tree(server: &Server) -> String {
    let (status, created) = post(
        server,
        "/v1/runs",
        json!({"agent": "chat", "prompt": "slow one"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let root = created["runId"].as_str().unwrap();
    read_until(server, root, "event: stepStarted", 1).await;
    created["treeId"].as_str().unwrap().to_owned()
}

/// Asks a turn, answered within `AT_ONCE` (else the test fails).
async fn turn(server: &Server, tree: &str, body: Value) -> (StatusCode, Value) {
    tokio::time::timeout(
        AT_ONCE,
        post(server, &format!("/v1/trees/{tree}/turns"), body),
    )
    .await
    .unwrap_or_else(|_| panic!("a turn request of tree {tree} was not answered within {AT_ONCE:?}"))
}

/// Waits until the run has a final state (it may not exist yet); its view.
async fn finished(server: &Server, run_id: &str) -> Value {
    let started = Instant::now();
    loop {
        let (status, view) = get(server, &format!("/v1/runs/{}", encoded(run_id))).await;
        if status == StatusCode::OK && view["final"] == true {
            return view;
        }
        assert!(
            started.elapsed() < GUARD,
            "run {run_id} did not end within {GUARD:?} ({status}: {view})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The texts of a state's history, in order.
fn texts(view: &Value) -> Vec<String> {
    view["state"]["messageHistory"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match &m["content"] {
            Value::String(text) => text.clone(),
            parts => parts
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join(""),
        })
        .collect()
}

/// The queued turn's run ended completed after the first turn's, on the
/// first turn's history.
fn ran_after_the_first(second: &Value, prompt: &str) {
    assert_eq!(second["state"]["status"], "completed", "{second}");
    let texts = texts(second);
    let first = texts.iter().position(|t| t == "slow answer");
    let asked = texts.iter().position(|t| t == prompt);
    assert!(
        first.is_some() && asked.is_some() && first < asked,
        "the second turn goes on from the first turn's end: {texts:?}"
    );
    assert_eq!(texts.last().unwrap(), "second answer", "{texts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueued_turn_was_lost_when_its_client_hung_up() {
    let dir = tempfile::tempdir().unwrap();
    // A connection idle for 1 s is closed by the server itself: a request
    // held open until the running turn (3 s) ends would be cut by it too.
    let config = setup(dir.path(), 3000, r#"idle_timeout = "1s""#);
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let tree = slow_tree(&server).await;

    // A client that sends its turn and hangs up without reading an answer.
    let body = json!({"prompt": "second, after the hang-up"}).to_string();
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut socket = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        socket,
        "POST /v1/trees/{tree}/turns HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    socket.flush().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(socket);

    // The first turn ends as it would have; the queued one runs after it.
    let first = finished(&server, &format!("{tree}/0")).await;
    assert_eq!(first["state"]["status"], "completed", "{first}");
    let second = finished(&server, &format!("{tree}/0~1")).await;
    ran_after_the_first(&second, "second, after the hang-up");
    // The journal shows it queued before it started.
    let journal = read_until(&server, &format!("{tree}/0~1"), "event: agentFinished", 1).await;
    let queued = journal.find("event: turnQueued");
    let started = journal.find("event: agentStarted");
    assert!(
        queued.is_some() && queued < started,
        "turnQueued, then the turn: {journal}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueued_turn_survives_a_kill_9_of_the_server() {
    let dir = tempfile::tempdir().unwrap();
    // The first turn's step never ends on its own (cancelled below).
    let config = setup(dir.path(), 600_000, "");
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let tree = slow_tree(&server).await;

    let (status, queued) = turn(&server, &tree, json!({"prompt": "second, across a kill"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{queued}");
    assert_eq!(queued["runId"], format!("{tree}/0~1"), "{queued}");
    assert_eq!(queued["position"], 1, "{queued}");
    assert_eq!(queued["queued"], true, "{queued}");

    // kill -9 while the turn is queued, then a new server on the same store.
    drop(server);
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    // It resumed the first turn; ending it lets the queued turn start.
    cancel_here(&server, &format!("{tree}/0")).await;
    let second = finished(&server, &format!("{tree}/0~1")).await;
    assert_eq!(second["state"]["status"], "completed", "{second}");
    let texts = texts(&second);
    assert!(
        texts.iter().any(|t| t == "second, across a kill"),
        "{texts:?}"
    );
    assert_eq!(texts.last().unwrap(), "second answer", "{texts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_beyond_the_queue_bound_is_refused_and_reject_refuses_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path(), 600_000, "max_queued_turns = 1");
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let tree = slow_tree(&server).await;
    let (status, queued) = turn(&server, &tree, json!({"prompt": "second"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{queued}");
    // The queue holds one turn (max_queued_turns = 1).
    let (status, full) = turn(&server, &tree, json!({"prompt": "third"})).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{full}");
    assert_eq!(full["error"]["code"], "too_many_turns", "{full}");
    assert!(
        full["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_queued_turns"),
        "{full}"
    );
    // `reject` while a turn runs: 409, at once.
    let (status, refused) = turn(
        &server,
        &tree,
        json!({"prompt": "third", "multitask": "reject"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    // Params the root's template refuses: 422, nothing queued.
    let (status, bad) = turn(&server, &tree, json!({"prompt": "x", "params": [1]})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbor_run_continue_enqueues_behind_a_running_turn() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path(), 4000, "");
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let tree = slow_tree(&server).await;
    let run = |extra: &[&str], prompt: &str| {
        let mut args = vec!["run", "--config", &config, "--continue", &tree];
        args.extend_from_slice(extra);
        args.push(prompt);
        Command::new(env!("CARGO_BIN_EXE_arbor"))
            .args(&args)
            .current_dir(dir.path())
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };

    // `enqueue` (the default): queued behind the running turn; the command
    // waits for it, and shows its answer once it has run.
    let started = Instant::now();
    let out = tokio::task::spawn_blocking({
        let child = run(&[], "second, from the command line");
        move || bounded(child)
    })
    .await
    .unwrap();
    let (said, printed) = (crate::text(&out.stderr), crate::text(&out.stdout));
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!("queued as {tree}/0~1 (place 1 in line)")),
        "{said}"
    );
    assert_eq!(printed.trim(), "second answer", "{said}");
    assert!(started.elapsed() < GUARD);
    let first = finished(&server, &format!("{tree}/0")).await;
    assert_eq!(first["state"]["status"], "completed", "{first}");
    let second = finished(&server, &format!("{tree}/0~1")).await;
    ran_after_the_first(&second, "second, from the command line");

    // `reject`: refused at once while a turn runs (a slow third one).
    let (status, third) = turn(&server, &tree, json!({"prompt": "slow third"})).await;
    assert!(status.is_success(), "{status}: {third}");
    assert_eq!(third["runId"], format!("{tree}/0~2"), "{third}");
    read_until(&server, &format!("{tree}/0~2"), "event: stepStarted", 1).await;
    let rejected = tokio::task::spawn_blocking({
        let child = run(&["--multitask", "reject", "--quiet"], "second, refused");
        move || bounded(child)
    })
    .await
    .unwrap();
    assert!(!rejected.status.success());
    let said = crate::text(&rejected.stderr);
    assert!(said.contains("multitask = reject"), "{said}");
}

/// Cancels `run_id`, which `server` resumes or adopts (until then the
/// cancel is refused, or forwarded for the replica that will run it), and
/// waits until it has ended.
async fn cancel_here(server: &Server, run_id: &str) {
    let started = Instant::now();
    loop {
        let path = format!("/v1/runs/{}", encoded(run_id));
        let (status, body) = post(server, &format!("{path}/cancel"), json!({})).await;
        assert!(!status.is_server_error(), "{status}: {body}");
        let (_, view) = get(server, &path).await;
        if view["final"] == true {
            assert_eq!(view["state"]["status"], "cancelled", "{view}");
            return;
        }
        assert!(
            started.elapsed() < GUARD,
            "{run_id} was not cancelled: {status}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (at most `GUARD`) for a command to exit; kills it past that.
fn bounded(mut child: std::process::Child) -> std::process::Output {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > GUARD {
            let _ = child.kill();
            panic!("arbor run did not exit within {GUARD:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// A turn queued on one replica behind the turn another runs is journaled
/// there; when that replica is killed (kill -9), the other adopts the tree
/// and runs the queued turn after the adopted one ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_queued_on_one_replica_runs_on_the_replica_that_adopts_the_tree_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::support::PgDatabase::new("turn_queue_takeover");
    let store = db.url();
    let config = setup(dir.path(), 600_000, "");
    let replica = || {
        let mut server = Server::start(
            dir.path(),
            &["--config", &config, "--store", &store],
            Some(TOKEN),
        );
        server.wait_for("ready");
        server
    };
    let (a, b) = (replica(), replica());
    let tree = slow_tree(&a).await;

    // Asked of the replica that does not run the tree: queued all the same.
    let (status, queued) = turn(&b, &tree, json!({"prompt": "second, adopted"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{queued}");
    let run = format!("{tree}/0~1");
    assert_eq!(queued["runId"], run, "{queued}");
    // Journaled by the replica that runs the tree (a forwarded control).
    read_until(&a, &run, "event: turnQueued", 1).await;

    // kill -9 of that replica: the other adopts the tree, resumes its turn.
    let pid =
        crate::support::listening_pid(a.base.rsplit(':').next().unwrap().parse().unwrap()).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    drop(a);
    cancel_here(&b, &format!("{tree}/0")).await;
    let second = finished(&b, &run).await;
    assert_eq!(second["state"]["status"], "completed", "{second}");
    assert_eq!(texts(&second).last().unwrap(), "second answer");
    let (_, view) = get(&b, &format!("/v1/trees/{tree}")).await;
    let roots = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["depth"] == 0)
        .count();
    assert_eq!(roots, 2, "{view}");
}
