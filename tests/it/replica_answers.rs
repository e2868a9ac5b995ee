//! Every replica gives the same answer (issue 33): `arbor serve` replicas on
//! one store (a SQLite file, or a Postgres database of the test's own on
//! `ARBOR_PG_URL`) answer a running run's state, the list of waiting
//! approvals and a fenced replica's event stream as the store has them,
//! whichever replica runs the tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::serve::{Server, Sse, TOKEN, client, encoded, get, post, stream};
use crate::support::{FakeOpenAi, PgDatabase, psql};

/// Bounds on what is awaited (none is reached when things work).
const GUARD: Duration = Duration::from_secs(60);

/// The tokens of the two user principals.
const ALICE: &str = "alice-token-1";
const BOB: &str = "bob-token-1";

/// How long the fake model holds each request: long enough that a replica
/// stopped right after its requests went out is stopped while they wait.
const HOLD: Duration = Duration::from_secs(2);

/// The replicas' config: a run that never ends its first step (`sleeper`),
/// one that waits for an approval (`writer`), and a tree on a fake OpenAI
/// server (`lead`, three `worker`s) whose key each replica has its own of.
const CONFIG: &str = r#"
[limits]
max_live_agents = 64
deadline = "5m"

[service]
bind = "127.0.0.1:0"
shutdown_timeout = "5s"

[service.principals.alice]
token_env = "ARBOR_TEST_ALICE"
role = "user"

[service.principals.bob]
token_env = "ARBOR_TEST_BOB"
role = "user"

[models.slow]
provider = "simulated"
fanout = 2
depth = 1
latency = "1h"

[agents.sleeper]
model = "slow"

[models.script]
provider = "scripted"
file = "script.json"

[tools.say]
description = "Says something out loud."
input_schema = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }
command = ["echo", "{text}"]

[agents.writer]
model = "script"
tools = ["say"]
approve = ["say"]

[models.fake]
provider = "openai"
base_url = "FAKE_URL"
model = "test"
stream = false
api_key_env = "ARBOR_TEST_FAKE_KEY"
retry = { base_delay = "1ms", max_retries = 0 }

[agents.lead]
model = "fake"
system_prompt = "spawn worker 3"
spawnable_agents = ["worker"]
max_steps = 4

[agents.worker]
model = "fake"
system_prompt = "answer briefly"
max_steps = 2
"#;

/// The shared store: a SQLite file in the test's directory, or a Postgres
/// database of the test's own.
enum Store {
    Sqlite,
    Postgres(PgDatabase),
}

impl Store {
    /// What `--store` says.
    fn arg(&self) -> String {
        match self {
            Store::Sqlite => "arbor.db".into(),
            Store::Postgres(db) => db.url(),
        }
    }
}

/// The test's directory: the config (on `fake`, if given) and the script.
fn setup(dir: &Path, fake: Option<&FakeOpenAi>) {
    let script = json!({"replies": [{"agent": "writer", "steps": [
        {"text": "Saying it.", "toolCalls": [{"name": "say", "input": {"text": "hello"}}]},
        {"text": "Said."}
    ]}]});
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
    let url = fake.map_or("http://127.0.0.1:9/v1".to_owned(), |f| f.base_url.clone());
    std::fs::write(dir.join("answers.toml"), CONFIG.replace("FAKE_URL", &url)).unwrap();
}

/// A replica on the shared store, once it is ready; `key` is the fake
/// model's API key it sends.
fn replica(dir: &Path, store: &Store, key: &str) -> Server {
    let mut server = Server::start_env(
        dir,
        &["--config", "answers.toml", "--store", &store.arg()],
        Some(TOKEN),
        &[
            ("ARBOR_TEST_ALICE", ALICE),
            ("ARBOR_TEST_BOB", BOB),
            ("ARBOR_TEST_FAKE_KEY", key),
        ],
    );
    server.wait_for("ready");
    server
}

/// Starts `agent` on `server` as the caller of `token`; its tree and root run.
async fn start_as(server: &Server, token: &str, agent: &str) -> (String, String) {
    let response = client()
        .post(server.url("/v1/runs"))
        .bearer_auth(token)
        .json(&json!({"agent": agent, "prompt": "go"}))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let created: Value = response.json().await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{created}");
    (
        created["treeId"].as_str().unwrap().to_owned(),
        created["runId"].as_str().unwrap().to_owned(),
    )
}

/// `GET path` as the caller of `token`.
async fn get_as(server: &Server, token: &str, path: &str) -> (StatusCode, Value) {
    let response = client()
        .get(server.url(path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Reads a run's stream (from `server`) until an event of type `kind` is
/// in it: the events read.
async fn read_until(server: &Server, run_id: &str, kind: &str) -> Vec<Sse> {
    use futures::StreamExt;
    let response = client()
        .get(server.url(&format!("/v1/runs/{}/events", encoded(run_id))))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "the stream of {run_id}");
    let mut body = response.bytes_stream();
    let mut text = String::new();
    let needle = format!("event: {kind}\n");
    tokio::time::timeout(GUARD, async {
        while !text.contains(&needle) {
            let Some(chunk) = body.next().await else {
                panic!("the stream ended before {kind}: {text}");
            };
            text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {kind} in the stream of {run_id}: {text}"));
    text.split("\n\n")
        .filter_map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(name).map(str::to_owned))
            };
            Some(Sse {
                id: field("id: ")?.parse().ok()?,
                event: field("event: ")?,
                data: serde_json::from_str(&field("data: ")?).ok()?,
            })
        })
        .collect()
}

/// A running run read on the replica that runs it and on one that does not:
/// both 200, alike in everything but where the state comes from.
async fn a_running_run_reads_alike(store: Store) {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), None);
    let a = replica(dir.path(), &store, "unused");
    let b = replica(dir.path(), &store, "unused");
    // A root whose first step never ends: it has no checkpoint, ever.
    let (tree_id, run_id) = start_as(&a, TOKEN, "sleeper").await;
    // Its start is in the journal (as B follows it).
    read_until(&b, &run_id, "stepStarted").await;
    let path = format!("/v1/runs/{}", encoded(&run_id));
    let (status, owner) = get(&a, &path).await;
    assert_eq!(status, StatusCode::OK, "the owner: {owner}");
    let (status, other) = get(&b, &path).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the replica that does not run it: {other}"
    );
    let keys = |v: &Value| -> BTreeSet<String> { v.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&owner), keys(&other), "one shape: {owner} / {other}");
    for (key, want) in [
        ("runId", json!(run_id)),
        ("treeId", json!(tree_id)),
        ("parentRunId", Value::Null),
        ("agentType", json!("sleeper")),
        ("status", json!("running")),
        ("final", json!(false)),
        ("value", Value::Null),
    ] {
        assert_eq!(owner[key], want, "{key} on the owner: {owner}");
        assert_eq!(other[key], want, "{key} on the other replica: {other}");
    }
    // The owner has the live state; the other has none stored yet.
    assert_eq!(owner["live"], true, "{owner}");
    assert_eq!(owner["state"]["status"], "running", "{owner}");
    assert_eq!(owner["state"]["runId"], run_id.as_str(), "{owner}");
    assert_eq!(other["live"], false, "{other}");
    assert_eq!(other["state"], Value::Null, "{other}");
    // A run that exists nowhere is 404 on both.
    let missing = format!("/v1/runs/{}", encoded(&format!("{tree_id}/0.7")));
    assert_eq!(get(&a, &missing).await.0, StatusCode::NOT_FOUND);
    assert_eq!(get(&b, &missing).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_run_was_404_on_a_replica_that_does_not_own_it_sqlite() {
    a_running_run_reads_alike(Store::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_run_was_404_on_a_replica_that_does_not_own_it_postgres() {
    a_running_run_reads_alike(Store::Postgres(PgDatabase::new("run_alike"))).await;
}

/// The waiting calls a listing shows: `(tree, run, tool)` of each, sorted.
fn calls(list: &Value) -> Vec<(String, String, String)> {
    let mut calls: Vec<(String, String, String)> = list["approvals"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|a| {
            (
                a["treeId"].as_str().unwrap().to_owned(),
                a["runId"].as_str().unwrap().to_owned(),
                a["tool"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    calls.sort();
    calls
}

/// Alice starts a tree on each of two replicas and Bob one on the first;
/// each waits for an approval. Every replica lists every waiting call to an
/// admin, Alice's two to Alice and Bob's one to Bob; once one is decided
/// (through the replica that does not run it), no replica lists it.
async fn every_replica_lists_every_call(store: Store) {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), None);
    let a = replica(dir.path(), &store, "unused");
    let b = replica(dir.path(), &store, "unused");
    let (alice_a, alice_a_run) = start_as(&a, ALICE, "writer").await;
    let (alice_b, alice_b_run) = start_as(&b, ALICE, "writer").await;
    let (bob_a, bob_a_run) = start_as(&a, BOB, "writer").await;
    for run in [&alice_a_run, &alice_b_run, &bob_a_run] {
        read_until(&a, run, "approvalRequested").await;
    }
    let call = |tree: &str, run: &str| (tree.to_owned(), run.to_owned(), "say".to_owned());
    let every = vec![
        call(&alice_a, &alice_a_run),
        call(&alice_b, &alice_b_run),
        call(&bob_a, &bob_a_run),
    ];
    let sorted = |mut v: Vec<(String, String, String)>| {
        v.sort();
        v
    };
    for (name, server) in [("A", &a), ("B", &b)] {
        let (status, list) = get_as(server, TOKEN, "/v1/approvals").await;
        assert_eq!(status, StatusCode::OK, "{name}: {list}");
        assert_eq!(calls(&list), sorted(every.clone()), "{name}, admin: {list}");
        let (_, list) = get_as(server, ALICE, "/v1/approvals").await;
        assert_eq!(
            calls(&list),
            sorted(vec![
                call(&alice_a, &alice_a_run),
                call(&alice_b, &alice_b_run)
            ]),
            "{name}, alice: {list}"
        );
        let (_, list) = get_as(server, BOB, "/v1/approvals").await;
        assert_eq!(
            calls(&list),
            vec![call(&bob_a, &bob_a_run)],
            "{name}, bob: {list}"
        );
        // Every field as the replica that runs the tree has it.
        let (_, list) = get_as(server, TOKEN, "/v1/approvals").await;
        for pending in list["approvals"].as_array().unwrap() {
            assert_eq!(pending["input"], json!({"text": "hello"}), "{pending}");
            assert_eq!(pending["step"], 1, "{pending}");
            assert!(pending["toolCallId"].is_string(), "{pending}");
            assert!(pending["requestedMs"].as_u64().unwrap() > 0, "{pending}");
        }
    }
    // Decided through B (forwarded to A, which runs the tree): the call is
    // listed nowhere once its decision is in the journal.
    let (_, list) = get_as(&a, TOKEN, &format!("/v1/trees/{alice_a}/approvals")).await;
    let call_id = list["approvals"][0]["toolCallId"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = post(
        &b,
        &format!("/v1/trees/{alice_a}/approvals/{}", encoded(&call_id)),
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    read_until(&b, &alice_a_run, "agentFinished").await;
    let rest = sorted(vec![call(&alice_b, &alice_b_run), call(&bob_a, &bob_a_run)]);
    for (name, server) in [("A", &a), ("B", &b)] {
        let (_, list) = get_as(server, TOKEN, "/v1/approvals").await;
        assert_eq!(calls(&list), rest, "{name}, after the decision: {list}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_listed_only_the_local_replicas_calls_sqlite() {
    every_replica_lists_every_call(Store::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_listed_only_the_local_replicas_calls_postgres() {
    every_replica_lists_every_call(Store::Postgres(PgDatabase::new("approvals_alike"))).await;
}

/// Waits (bounded by `GUARD`) until `check` gives something.
async fn until<T>(mut check: impl FnMut() -> Option<T>) -> Option<T> {
    tokio::time::timeout(GUARD, async {
        loop {
            if let Some(found) = check() {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .ok()
}

/// `(owner, epoch)` of a tree in the store.
fn claim(db: &PgDatabase, tree: &str) -> (String, i64) {
    let row = psql(
        &db.url(),
        &format!("SELECT owner, epoch FROM trees WHERE tree_id = '{tree}'"),
    );
    let (owner, epoch) = row
        .trim()
        .split_once('|')
        .unwrap_or_else(|| panic!("{row:?}"));
    (owner.to_owned(), epoch.parse().unwrap())
}

/// The pid of a replica (the process listening on its port).
fn pid(server: &Server) -> nix::unistd::Pid {
    let port: u16 = server.base.rsplit(':').next().unwrap().parse().unwrap();
    let pid = crate::support::listening_pid(port).expect("the replica listens");
    nix::unistd::Pid::from_raw(pid as i32)
}

/// Stops (SIGSTOP) the replica `pid` at a moment it holds no transaction
/// open on the store (no session of the database but idle ones): one
/// stopped in the middle of a commit keeps its tree's row locked, and no
/// replica claims the tree while it stays stopped (claims skip locked
/// rows). Tried again, a few times, until it is so.
async fn stop_between_transactions(db: &PgDatabase, pid: nix::unistd::Pid) {
    use nix::sys::signal::{Signal, kill};
    let open = || {
        psql(
            &db.url(),
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND state <> 'idle'",
        )
        .trim()
        .to_owned()
    };
    for _ in 0..10 {
        kill(pid, Signal::SIGSTOP).unwrap();
        let stopped = until(|| stopped(pid).then_some(())).await;
        assert!(stopped.is_some(), "the replica ({pid}) did not stop");
        // A statement it sent may still be running; then its transaction
        // (if it is in one) waits for its next.
        tokio::time::sleep(Duration::from_millis(50)).await;
        if open() == "0" {
            return;
        }
        kill(pid, Signal::SIGCONT).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the replica was stopped in the middle of a transaction ten times");
}

/// Whether the process is stopped (its state in `/proc` is `T`).
fn stopped(pid: nix::unistd::Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}

/// The fake model's requests that carried `key`.
fn sent_with(fake: &FakeOpenAi, key: &str) -> usize {
    let key = format!("Bearer {key}");
    fake.authorizations().iter().filter(|a| **a == key).count()
}

/// A replica A runs a tree (a lead and three workers on a fake model, each
/// request held for `HOLD`) and a client streams it from A. A is stopped
/// (SIGSTOP) while the workers' requests wait, past its lease; B adopts the
/// tree; A goes on (SIGCONT) and is fenced out. A's stream shows only events
/// of the tree's journal and ends with its real end (the lead's
/// `agentFinished`, as B ran it), not with A's own stopping; and A sends the
/// model no request after it was stopped (its agents wait for a write,
/// which the fence refuses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_replicas_stream_showed_events_in_no_journal() {
    let db = PgDatabase::new("fenced_stream");
    let store = Store::Postgres(db);
    let fake = FakeOpenAi::start(HOLD, None).await;
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), Some(&fake));
    let mut a = replica(dir.path(), &store, "key-a");
    let b = replica(dir.path(), &store, "key-b");
    let Store::Postgres(db) = &store else {
        unreachable!()
    };
    let (tree, run_id) = start_as(&a, TOKEN, "lead").await;
    // A client follows the tree on A, to the stream's end.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let follower = {
        let (base, run_id, seen) = (a.base.clone(), run_id.clone(), seen.clone());
        tokio::spawn(async move {
            let response = client()
                .get(format!("{base}/v1/runs/{}/events", encoded(&run_id)))
                .bearer_auth(TOKEN)
                .timeout(Duration::from_secs(120))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            sse_events(response, &seen).await
        })
    };
    // The lead's step and its three workers' requests are out: A is
    // stopped while the workers' wait.
    let out = until(|| (fake.requests() >= 4).then_some(())).await;
    assert!(out.is_some(), "requests: {}", fake.requests());
    let a_pid = pid(&a);
    stop_between_transactions(db, a_pid).await;
    let before = claim(db, &tree);
    // What A sent before it stopped has reached the fake server.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent_by_a = sent_with(&fake, "key-a");
    assert_eq!(sent_by_a, 4, "{:?}", fake.authorizations());
    // B adopts once A's heartbeat is older than the lease.
    let adopted = until(|| {
        let now = claim(db, &tree);
        (now.1 > before.1 && now.0 != before.0).then_some(now)
    })
    .await;
    nix::sys::signal::kill(a_pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(
        adopted.is_some(),
        "B did not adopt the stopped replica's tree: {:?}, then {before:?}; {:?}",
        claim(db, &tree),
        fake.authorizations()
    );
    a.wait_for(&format!("fenced out of tree {tree}"));
    let ended = tokio::time::timeout(Duration::from_secs(90), follower).await;
    let shown = match ended {
        Ok(read) => read.expect("A's stream was read"),
        Err(_) => panic!("A's stream did not end: {:?}", seen.lock().unwrap()),
    };
    // The journal, whole, read once the tree has ended (B streams it).
    let journal = tokio::time::timeout(GUARD, stream(&b, &run_id, None, |_| {}))
        .await
        .expect("the journal's stream ends");
    let last = journal.last().unwrap();
    assert_eq!(last.event, "agentFinished", "{journal:?}");
    assert_eq!(last.data["runId"], run_id.as_str(), "{journal:?}");
    let stored: BTreeMap<u64, (String, Value)> = journal
        .iter()
        .map(|e| (e.id, (e.event.clone(), e.data["runId"].clone())))
        .collect();
    let foreign: Vec<&Sse> = shown
        .iter()
        .filter(|e| stored.get(&e.id) != Some(&(e.event.clone(), e.data["runId"].clone())))
        .collect();
    assert!(
        foreign.is_empty(),
        "A's stream showed {} events in no journal: {foreign:?}",
        foreign.len()
    );
    let ids: Vec<u64> = shown.iter().map(|e| e.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert_eq!(
        shown.last().map(|e| (e.id, e.event.as_str())),
        Some((last.id, "agentFinished")),
        "A's stream ends with the tree's real end: {shown:?}"
    );
    // A took no model step once stopped; B ran the rest.
    assert_eq!(
        sent_with(&fake, "key-a"),
        sent_by_a,
        "A sent the model requests after it was fenced out"
    );
    assert!(sent_with(&fake, "key-b") > 0, "{:?}", fake.authorizations());
}

/// The events of an SSE response, each kept in `seen` as it arrives, until
/// the server ends the stream.
async fn sse_events(response: reqwest::Response, seen: &std::sync::Mutex<Vec<Sse>>) -> Vec<Sse> {
    use futures::StreamExt;
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { break };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(name).map(str::to_owned))
            };
            let (Some(id), Some(event), Some(data)) =
                (field("id: "), field("event: "), field("data: "))
            else {
                continue;
            };
            seen.lock().unwrap().push(Sse {
                id: id.parse().unwrap(),
                event,
                data: serde_json::from_str(&data).unwrap(),
            });
        }
    }
    seen.lock().unwrap().clone()
}
