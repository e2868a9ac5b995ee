//! `arbor serve` as replicas over one shared store (issue 16): real server
//! processes on one Postgres database (a fresh one per test on
//! `ARBOR_PG_URL`, dropped after) and, where it is cheap, on one SQLite
//! file. Every route on every replica: a stream opened on a replica that
//! does not run the tree follows its journal, a control sent there reaches
//! the owner (202, then the tree's events show it), a SIGTERM hands the
//! trees over at once, a kill -9 loses no event of any stream.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::json;

use crate::serve::{Server, Sse, TOKEN, client, encoded, get, post, stream};

/// Bounds on what is awaited (none is reached when things work).
const GUARD: Duration = Duration::from_secs(60);

/// Trees the kill test starts, round-robin over three replicas: as many as
/// run in well under a minute on two loaded cores; `ARBOR_REPLICA_TREES`
/// runs it at another size (the issue's 300: see the issue 16 note).
fn kill_trees() -> usize {
    sized("ARBOR_REPLICA_TREES", 60)
}

/// Trees one replica runs when it gets SIGTERM (`ARBOR_HANDOVER_TREES`):
/// the issue's 200 (adopted in well under its 2 s: one claim per batch of
/// 64 trees, and the release wakes the other replica at once).
fn handover_trees() -> usize {
    sized("ARBOR_HANDOVER_TREES", 200)
}

/// A count from the environment, or `default`; a bad value is an error.
fn sized(var: &str, default: usize) -> usize {
    match std::env::var(var) {
        Ok(n) => n
            .parse()
            .unwrap_or_else(|_| panic!("{var}={n:?} is not a count")),
        Err(_) => default,
    }
}

const CONFIG: &str = r#"
[limits]
max_live_agents = 64
deadline = "5m"

[service]
bind = "127.0.0.1:0"
shutdown_timeout = "5s"

# 13 agents (3 × 3 below the root), 400 ms a step: a tree runs for two
# seconds or more, so a replica killed mid-load has trees under way.
[models.sim]
provider = "simulated"
fanout = 3
depth = 2
latency = "400ms"
reply_tokens = 5

[agents.lead]
model = "sim"
spawnable_agents = ["worker"]

[agents.worker]
model = "sim"
spawnable_agents = ["helper"]

[agents.helper]
model = "sim"

# A model call that never ends on its own: a tree that runs until cancelled.
[models.slow]
provider = "simulated"
fanout = 2
depth = 1
latency = "1h"

[agents.sleeper]
model = "slow"

# A tool call that waits for a person's decision.
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
"#;

/// One shared store: a SQLite file in the test's directory, or a Postgres
/// database of its own (dropped with this).
enum Shared {
    Sqlite,
    Postgres(crate::support::PgDatabase),
}

impl Shared {
    /// A fresh database on `ARBOR_PG_URL`; fails (never skips) without it.
    fn postgres(test: &str) -> Shared {
        Shared::Postgres(crate::support::PgDatabase::new(test))
    }

    /// What `--store` says.
    fn store(&self) -> String {
        match self {
            Shared::Sqlite => "arbor.db".into(),
            Shared::Postgres(db) => db.url(),
        }
    }

    /// `(tree, owner, epoch)` of every tree in the store.
    fn claims(&self, dir: &Path) -> BTreeMap<String, (String, i64)> {
        let query = "SELECT tree_id, owner, epoch FROM trees";
        match self {
            Shared::Sqlite => {
                let db = rusqlite::Connection::open(dir.join("arbor.db")).unwrap();
                db.busy_timeout(GUARD).unwrap();
                let mut stmt = db.prepare(query).unwrap();
                stmt.query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            }
            Shared::Postgres(_) => psql(&self.store(), query)
                .lines()
                .filter_map(|line| {
                    let mut cols = line.split('|');
                    let tree = cols.next()?.to_owned();
                    let owner = cols.next()?.to_owned();
                    let epoch = cols.next()?.parse().ok()?;
                    Some((tree, (owner, epoch)))
                })
                .collect(),
        }
    }
}

use crate::support::psql;

/// The test's directory: the config and the approval test's script.
fn setup(dir: &Path) -> String {
    let script = json!({"replies": [{"agent": "writer", "steps": [
        {"text": "Saying it.", "toolCalls": [{"name": "say", "input": {"text": "hello"}}]},
        {"text": "Said."}
    ]}]});
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
    std::fs::write(dir.join("replicas.toml"), CONFIG).unwrap();
    "replicas.toml".into()
}

/// A replica on the shared store, once it is ready.
fn replica(dir: &Path, shared: &Shared) -> Server {
    let store = shared.store();
    let mut server = Server::start(
        dir,
        &["--config", "replicas.toml", "--store", &store],
        Some(TOKEN),
    );
    server.wait_for("ready");
    server
}

/// The pid of a replica (the process listening on its port).
fn pid(server: &Server) -> i32 {
    let port: u16 = server.base.rsplit(':').next().unwrap().parse().unwrap();
    crate::support::listening_pid(port).expect("the replica listens") as i32
}

fn signal(server: &Server, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid(server)), signal).unwrap();
}

async fn start(server: &Server, agent: &str) -> (String, String) {
    let (status, created) = post(server, "/v1/runs", json!({"agent": agent, "prompt": "go"})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    (
        created["treeId"].as_str().unwrap().to_owned(),
        created["runId"].as_str().unwrap().to_owned(),
    )
}

/// Reads a run's stream until `needle` is in it; the text read.
async fn read_until(server: &Server, run_id: &str, needle: &str) -> String {
    let response = client()
        .get(server.url(&format!("/v1/runs/{}/events", encoded(run_id))))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "the stream of {run_id}");
    let mut body = response.bytes_stream();
    let mut text = String::new();
    tokio::time::timeout(GUARD, async {
        while !text.contains(needle) {
            let Some(chunk) = body.next().await else {
                panic!("the stream ended before {needle:?}: {text}");
            };
            text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {needle:?} in the stream: {text}"));
    text
}

/// Cancel and an approval sent to the replica that does not run the tree:
/// answered 202 naming the owner, and the tree's events (streamed from that
/// same replica) show them taking effect.
async fn controls_reach_the_owner(shared: Shared) {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let a = replica(dir.path(), &shared);
    let b = replica(dir.path(), &shared);
    // Readiness reports the shared store.
    let ready: serde_json::Value = client()
        .get(b.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["status"], "ok", "{ready}");
    assert_eq!(ready["store"]["reachable"], true, "{ready}");

    // Cancel.
    let (_, run_id) = start(&a, "sleeper").await;
    let text = read_until(&b, &run_id, "event: stepStarted").await;
    assert!(text.contains("event: agentStarted"), "{text}");
    let (status, body) = post(
        &b,
        &format!("/v1/runs/{}/cancel", encoded(&run_id)),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert!(
        body["forwarded"]["forwardedTo"].is_string(),
        "names the owner: {body}"
    );
    assert!(
        body["forwarded"]["note"]
            .as_str()
            .unwrap()
            .contains("forwarded"),
        "{body}"
    );
    let events = tokio::time::timeout(GUARD, stream(&b, &run_id, None, |_| {}))
        .await
        .expect("the stream on the other replica ends with the root's end");
    let last = events.last().unwrap();
    assert_eq!(last.event, "agentCancelled", "{events:?}");
    assert_eq!(last.data["status"], "cancelled", "{:?}", last.data);
    let (_, run) = get(&a, &format!("/v1/runs/{}", encoded(&run_id))).await;
    assert_eq!(run["state"]["status"], "cancelled", "{run}");
    // The tree has ended: a second cancel is refused as locally.
    let (status, body) = post(
        &b,
        &format!("/v1/runs/{}/cancel", encoded(&run_id)),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // An approval.
    let (tree_id, run_id) = start(&a, "writer").await;
    read_until(&b, &run_id, "event: approvalRequested").await;
    // Listed by the replica that does not run the tree too (from the journal).
    let (_, listed) = get(&b, &format!("/v1/trees/{tree_id}/approvals")).await;
    assert_eq!(listed["approvals"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["approvals"][0]["tool"], "say", "{listed}");
    let call = listed["approvals"][0]["toolCallId"]
        .as_str()
        .unwrap_or_else(|| panic!("{listed}"))
        .to_owned();
    let (status, body) = post(
        &b,
        &format!("/v1/trees/{tree_id}/approvals/{}", encoded(&call)),
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert!(body["forwarded"]["forwardedTo"].is_string(), "{body}");
    let text = read_until(&b, &run_id, "event: agentFinished").await;
    assert!(text.contains("event: approvalDecided"), "{text}");
    let (_, run) = get(&b, &format!("/v1/runs/{}", encoded(&run_id))).await;
    assert_eq!(run["state"]["status"], "completed", "{run}");
    assert!(
        run["state"]["messageHistory"].to_string().contains("hello"),
        "the approved command ran: {run}"
    );
    // What the owner counted.
    let metrics = client()
        .get(a.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("arbor_replica_controls_applied_total 2"),
        "{metrics}"
    );
    // And what the replica that forwarded them counted, by route template.
    let metrics = client()
        .get(b.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("arbor_replica_controls_forwarded_total 2"),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("arbor_http_requests_total{")
                && l.contains(r#"route="/v1/runs/{run_id}/cancel""#)
                && l.contains(r#"status="202""#)),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_and_an_approval_sent_to_a_replica_that_does_not_own_the_tree_take_effect_sqlite()
{
    controls_reach_the_owner(Shared::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_and_an_approval_sent_to_a_replica_that_does_not_own_the_tree_take_effect_postgres()
 {
    controls_reach_the_owner(Shared::postgres("controls")).await;
}

/// SIGTERM one of two replicas with many trees running: the other has
/// claimed every one of them (a later epoch, its own owner id) within 2 s.
async fn sigterm_hands_over(shared: Shared) {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let a = replica(dir.path(), &shared);
    let b = replica(dir.path(), &shared);
    let mut trees = BTreeSet::new();
    for _ in 0..handover_trees() {
        trees.insert(start(&a, "sleeper").await.0);
    }
    let before = shared.claims(dir.path());
    let a_owner = before[trees.first().unwrap()].0.clone();
    assert!(
        trees.iter().all(|t| before[t].0 == a_owner),
        "A owns them all: {before:?}"
    );
    let (status, _) = a.terminate();
    assert!(status.success());
    // From A's exit: every tree claimed by B, bounded by the issue's 2 s.
    let exited = Instant::now();
    let handed = loop {
        let now = shared.claims(dir.path());
        let pending: Vec<&String> = trees
            .iter()
            .filter(|t| now[*t].0 == a_owner || now[*t].1 <= before[*t].1)
            .collect();
        if pending.is_empty() {
            break Ok(now);
        }
        if exited.elapsed() > Duration::from_secs(2) {
            break Err(format!("{} not adopted: {pending:?}", pending.len()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // For the issue's record (`--nocapture`): how long the hand-over took.
    eprintln!(
        "hand-over: {} trees, {} adopted within {} ms of the exit",
        trees.len(),
        if handed.is_ok() { "all" } else { "not all" },
        exited.elapsed().as_millis()
    );
    let now = handed.unwrap_or_else(|e| panic!("within 2 s of the SIGTERM: {e}"));
    let b_owner = &now[trees.first().unwrap()].0;
    assert!(trees.iter().all(|t| &now[t].0 == b_owner), "{now:?}");
    // B runs them once it has started them (a claim is in the store before
    // its tree starts): then a cancel on B is local (no forwarding).
    let owned = format!("arbor_replica_trees_owned {}\n", trees.len());
    let deadline = Instant::now() + GUARD;
    loop {
        let metrics = client()
            .get(b.url("/metrics"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if metrics.contains(&owned) {
            break;
        }
        assert!(Instant::now() < deadline, "B never ran them all: {metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let root = format!("{}/0", trees.first().unwrap());
    let (status, body) = post(
        &b,
        &format!("/v1/runs/{}/cancel", encoded(&root)),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert!(body.get("forwarded").is_none(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_one_of_two_replicas_hands_all_its_trees_to_the_other_within_2s_sqlite() {
    sigterm_hands_over(Shared::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_one_of_two_replicas_hands_all_its_trees_to_the_other_within_2s_postgres() {
    sigterm_hands_over(Shared::postgres("handover")).await;
}

/// Follows a run's stream to its end across replicas: when the replica it
/// reads from dies, it reconnects to the next one with `Last-Event-ID`.
async fn follow_to_the_end(servers: &[&Server], first: usize, run_id: &str) -> Vec<Sse> {
    let mut seen: Vec<Sse> = Vec::new();
    for attempt in 0..servers.len() * 2 {
        let server = servers[(first + attempt) % servers.len()];
        let last = seen.last().map(|e| e.id);
        // Kept as they arrive: a stream cut by its replica's death (the
        // helper panics on the broken body) keeps what it had read.
        let got = std::sync::Mutex::new(Vec::new());
        let read = stream(server, run_id, last, |e| {
            got.lock().unwrap().push(e.clone())
        });
        let ended = tokio::time::timeout(
            GUARD,
            futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(read)),
        )
        .await;
        assert!(ended.is_ok(), "{run_id}: the stream did not end");
        seen.extend(got.into_inner().unwrap());
        if seen
            .last()
            .is_some_and(|e| e.event == "agentFinished" && e.data["runId"] == run_id)
        {
            return seen;
        }
    }
    panic!("{run_id}: no stream reached the root's end: {seen:?}");
}

/// Three replicas, trees started round-robin, each streamed from a replica
/// that does not run it; one replica is killed (SIGKILL) mid-load. Every
/// tree completes (the dead replica's adopted after their owner is gone),
/// every stream ends with its root's final event and holds exactly the
/// tree's journal (no seq twice, none missing), and replays of adopted
/// trees match.
async fn a_kill_loses_nothing(shared: Shared) {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let servers = [
        replica(dir.path(), &shared),
        replica(dir.path(), &shared),
        replica(dir.path(), &shared),
    ];
    let refs: Vec<&Server> = servers.iter().collect();
    let doomed = pid(&servers[0]);
    let mut started = Vec::new();
    for i in 0..kill_trees() {
        let (tree, run) = start(&servers[i % 3], "lead").await;
        started.push((i % 3, tree, run));
    }
    let streams = futures::future::join_all(
        started
            .iter()
            .map(|(owner, _, run)| follow_to_the_end(&refs, (owner + 1) % 3, run)),
    );
    // Mid-load: killed while the streams are being opened and while it runs
    // a tree of its own whose root has not ended (as it says itself; at 300
    // trees its first ones have ended by the time the last one starts), so
    // that one is adopted mid-run. On a task of its own, so that the
    // streams' reading does not hold it up.
    let mine: Vec<String> = started
        .iter()
        .rev()
        .filter(|(owner, _, _)| *owner == 0)
        .map(|(_, tree, _)| tree.clone())
        .collect();
    let urls: Vec<String> = mine
        .iter()
        .map(|tree| servers[0].url(&format!("/v1/trees/{tree}")))
        .collect();
    let kill = tokio::spawn(async move {
        let deadline = Instant::now() + GUARD;
        let running = 'found: loop {
            let mut seen = Vec::new();
            for (tree, url) in mine.iter().zip(&urls) {
                let view: serde_json::Value = client()
                    .get(url)
                    .bearer_auth(TOKEN)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if view["tree"]["status"] == "running" {
                    break 'found tree.clone();
                }
                seen.push(view["tree"]["status"].clone());
            }
            assert!(
                Instant::now() < deadline,
                "the replica to kill runs none of its trees any more: {seen:?}"
            );
            tokio::task::yield_now().await;
        };
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(doomed),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        running
    });
    let streams = streams.await;
    let running = kill.await.unwrap();

    for ((_, tree, run), events) in started.iter().zip(&streams) {
        let ids: Vec<u64> = events.iter().map(|e| e.id).collect();
        let unique: BTreeSet<u64> = ids.iter().copied().collect();
        assert_eq!(unique.len(), ids.len(), "{run}: a seq twice: {ids:?}");
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{run}: {ids:?}");
        // The whole journal, read afresh from a live replica.
        let journal = stream(&servers[1], run, None, |_| {}).await;
        let want: Vec<u64> = journal.iter().map(|e| e.id).collect();
        assert_eq!(ids, want, "{run}: the stream is the journal");
        let (_, view) = get(&servers[2], &format!("/v1/trees/{tree}")).await;
        assert_eq!(view["tree"]["status"], "completed", "{view}");
        assert_eq!(view["nodes"].as_array().unwrap().len(), 13, "{view}");
    }
    // The killed replica's trees that were adopted (resumed at least once).
    let adopted: Vec<&String> = started
        .iter()
        .filter(|(owner, _, _)| *owner == 0)
        .map(|(_, tree, _)| tree)
        .collect();
    // The tree it ran when it was killed was taken over mid-run.
    let (_, view) = get(&servers[1], &format!("/v1/trees/{running}")).await;
    assert!(
        view["tree"]["resumes"].as_u64().unwrap_or(0) > 0,
        "{running} ran on the killed replica and was not adopted: {view}"
    );
    let store = shared.store();
    let mut replayed = 0;
    for tree in adopted {
        let (_, view) = get(&servers[1], &format!("/v1/trees/{tree}")).await;
        if view["tree"]["resumes"].as_u64().unwrap_or(0) == 0 {
            continue;
        }
        let out = crate::arbor_in(dir.path(), &["replay", tree, "--store", &store]);
        assert!(
            crate::text(&out.stdout).starts_with("match: 13 runs"),
            "{tree}: {}{}",
            crate::text(&out.stdout),
            crate::text(&out.stderr)
        );
        replayed += 1;
        if replayed == 3 {
            break;
        }
    }
    assert!(
        replayed > 0,
        "no tree of the killed replica was adopted mid-run: {:?}",
        shared.claims(dir.path())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_one_killed_mid_load_every_tree_completes_and_every_stream_is_whole_sqlite()
{
    a_kill_loses_nothing(Shared::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_one_killed_mid_load_every_tree_completes_and_every_stream_is_whole_postgres()
 {
    a_kill_loses_nothing(Shared::postgres("kill")).await;
}

/// SIGSTOP a replica past its lease, let the other adopt its tree, SIGCONT:
/// the paused replica's writes for that tree are refused by the fence, it
/// stops the tree and logs why, and the tree's log holds nothing of it
/// after the adoption (its journal stays in one increasing order, and the
/// tree ends as the adopter ends it). (On one SQLite file the same is
/// `fencing.rs`'s test, with `arbor run` processes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_paused_past_its_lease_is_fenced_out_of_the_tree_another_adopted_postgres() {
    let shared = Shared::postgres("fence");
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let mut a = replica(dir.path(), &shared);
    let b = replica(dir.path(), &shared);
    let (tree, run_id) = start(&a, "sleeper").await;
    read_until(&b, &run_id, "event: stepStarted").await;
    let before = shared.claims(dir.path())[&tree].clone();
    signal(&a, nix::sys::signal::Signal::SIGSTOP);
    // B adopts once A's heartbeat is older than the lease.
    let adopted = crate::support::poll(GUARD, || {
        let now = shared.claims(dir.path())[&tree].clone();
        (now.1 > before.1 && now.0 != before.0).then_some(now)
    });
    signal(&a, nix::sys::signal::Signal::SIGCONT);
    let adopted = adopted.expect("B adopted the paused replica's tree");
    // A's next heartbeat for the tree is refused: it says so and stops it.
    let line = a.wait_for(&format!("fenced out of tree {tree}"));
    assert!(line.contains("WARN"), "{line}");
    // ... and counts it, by the stopped tree's failure kind (`fenced`).
    tokio::time::timeout(GUARD, async {
        loop {
            let metrics = client()
                .get(a.url("/metrics"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            if metrics.contains("arbor_replica_fenced_trees_total 1\n") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the paused replica counts the tree it was fenced out of");
    // B runs it: a cancel there is local, and the tree ends cancelled (not
    // failed, as A's stopped copy ended).
    let (status, body) = post(
        &b,
        &format!("/v1/runs/{}/cancel", encoded(&run_id)),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert!(body.get("forwarded").is_none(), "{body}");
    let events = tokio::time::timeout(GUARD, stream(&b, &run_id, None, |_| {}))
        .await
        .unwrap();
    let ids: Vec<u64> = events.iter().map(|e| e.id).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "one writer at a time: {ids:?}"
    );
    let last = events.last().unwrap();
    assert_eq!(last.event, "agentCancelled", "{events:?}");
    assert_eq!(
        shared.claims(dir.path())[&tree],
        adopted,
        "no claim after B's"
    );
    // A's own stopped copy wrote nothing: exactly one root end in the log.
    let ends = events
        .iter()
        .filter(|e| {
            e.data["runId"] == run_id.as_str()
                && matches!(
                    e.event.as_str(),
                    "agentFinished" | "agentFailed" | "agentCancelled"
                )
        })
        .count();
    assert_eq!(ends, 1, "{events:?}");
}
