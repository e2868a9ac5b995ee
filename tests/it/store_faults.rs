//! Store faults a service meets in production (issue 33), made for real:
//! a Postgres server restarted under three replicas, its backends
//! terminated, a database down past `[store] fail_after`, and a SQLite
//! store on a small filesystem filled and freed. The service survives
//! each without a person: trees go on once the store is back, nothing is
//! lost or written twice, nothing is claimed while a store is down, and
//! readiness and health say what is going on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::serve::{Server, TOKEN, client, get, post};
use crate::support::{PgDatabase, poll, psql};

/// Waits (bounded by `GUARD`) until `check` gives something.
async fn until<T, F: std::future::Future<Output = Option<T>>>(
    mut check: impl FnMut() -> F,
) -> Option<T> {
    tokio::time::timeout(GUARD, async {
        loop {
            if let Some(found) = check().await {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .ok()
}

/// Bounds on what is awaited (none is reached when things work).
const GUARD: Duration = Duration::from_secs(120);

/// Three agents a tree (a root and two workers), 300 ms a step: a tree
/// runs for about a second, so a restart lands while trees are under way.
const CONFIG: &str = r#"
[limits]
max_live_agents = 400
deadline = "5m"

[service]
bind = "127.0.0.1:0"
shutdown_timeout = "5s"

[store]
fail_after = "FAIL_AFTER"

[models.sim]
provider = "simulated"
fanout = 2
depth = 1
latency = "300ms"
reply_tokens = 5

[agents.lead]
model = "sim"
spawnable_agents = ["worker"]

[agents.worker]
model = "sim"

# A model call that never ends on its own: a tree that runs until stopped.
[models.slow]
provider = "simulated"
fanout = 2
depth = 1
latency = "1h"

[agents.sleeper]
model = "slow"
"#;

fn setup(dir: &Path, fail_after: &str) {
    std::fs::write(
        dir.join("faults.toml"),
        CONFIG.replace("FAIL_AFTER", fail_after),
    )
    .unwrap();
}

/// A replica on `store`, once it is ready.
fn replica(dir: &Path, store: &str) -> Server {
    let mut server = Server::start(
        dir,
        &["--config", "faults.toml", "--store", store],
        Some(TOKEN),
    );
    server.wait_for("ready");
    server
}

/// A PostgreSQL server of the test's own (`tests/pg/start`), so it can be
/// restarted and stopped without touching the other tests' server.
struct PgServer {
    url: String,
    dir: PathBuf,
}

impl PgServer {
    fn start() -> PgServer {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(root.join("tests/pg/start"))
            .output()
            .expect("tests/pg/start runs");
        assert!(
            out.status.success(),
            "tests/pg/start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let vars: BTreeMap<String, String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let server = PgServer {
            url: vars["ARBOR_PG_URL"].clone(),
            dir: PathBuf::from(&vars["ARBOR_PG_DIR"]),
        };
        psql(&format!("{}/postgres", server.url), "CREATE DATABASE arbor");
        server
    }

    /// The database the replicas share.
    fn db(&self) -> String {
        format!("{}/arbor", self.url)
    }

    /// `pg_ctl ACTION` on this server (as the package's user when root).
    fn pg_ctl(&self, action: &[&str]) {
        let bin = ["17", "16", "15"]
            .iter()
            .map(|v| format!("/usr/lib/postgresql/{v}/bin/pg_ctl"))
            .find(|p| Path::new(p).exists())
            .expect("pg_ctl (tests/pg/start installed it)");
        let data = self.dir.join("data");
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let mut command = if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", &bin]);
            c
        } else {
            Command::new(&bin)
        };
        let out = command
            .arg("-D")
            .arg(&data)
            .args(["-w", "-t", "60"])
            .args(action)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl {action:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// What `pg_ctl restart` does for an operator's routine restart.
    fn restart(&self) {
        // With its log file: a server started without one would hold this
        // call's output pipes for its whole life.
        let log = self.dir.join("server.log");
        self.pg_ctl(&["-m", "fast", "-l", log.to_str().unwrap(), "restart"]);
    }

    fn stop(&self) {
        self.pg_ctl(&["-m", "fast", "stop"]);
    }

    /// Starts it again as `tests/pg/start` did (`pg_ctl start` alone would
    /// not take its port and options back).
    fn start_again(&self) {
        let log = self.dir.join("server.log");
        let port = self.url.rsplit(':').next().unwrap();
        let options = format!(
            "-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={} \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300",
            self.dir.display()
        );
        self.pg_ctl(&["-l", log.to_str().unwrap(), "-o", &options, "start"]);
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let _ = Command::new(root.join("tests/pg/stop"))
            .arg(&self.dir)
            .status();
    }
}

/// `(status, epoch, owner)` of every tree in the database.
fn trees(db: &str) -> BTreeMap<String, (String, i64, String)> {
    psql(db, "SELECT tree_id, status, epoch, owner FROM trees")
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (
                f[0].to_owned(),
                (f[1].to_owned(), f[2].parse().unwrap(), f[3].to_owned()),
            )
        })
        .collect()
}

async fn start_tree(server: &Server) -> String {
    let (status, created) =
        post(server, "/v1/runs", json!({"agent": "lead", "prompt": "go"})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    created["treeId"].as_str().unwrap().to_owned()
}

async fn health(server: &Server, path: &str) -> (StatusCode, Value) {
    let response = client().get(server.url(path)).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap())
}

/// What `/metrics` shows now.
async fn metrics(server: &Server) -> String {
    let response = client()
        .get(server.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    response.text().await.unwrap()
}

/// Everything stored of a tree (`arbor export`).
fn export(dir: &Path, store: &str, tree: &str) -> Value {
    let out = crate::arbor_in(dir, &["export", "--store", store, tree]);
    assert!(
        out.status.success(),
        "export {tree}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A count from the environment, or `default`.
fn sized(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// A config file whose `[store]` has only `url`, as docs/config.md shows
/// it, was refused by `check-config`, `run` and `serve` ("give path or
/// url, not both"): each takes it now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_files_postgres_url_is_refused_as_path_and_url_both() {
    let db = PgDatabase::new("config_url");
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[store]\nurl = \"{}\"\n\n[service]\nbind = \"127.0.0.1:0\"\n\n\
         [models.sim]\nprovider = \"simulated\"\n\n[agents.lead]\nmodel = \"sim\"\n",
        db.url()
    );
    std::fs::write(dir.path().join("pg.toml"), config).unwrap();
    let out = crate::arbor_in(dir.path(), &["check-config", "pg.toml"]);
    assert!(
        out.status.success(),
        "check-config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = crate::arbor_in(
        dir.path(),
        &["run", "--config", "pg.toml", "--quiet", "Say hi."],
    );
    assert!(
        out.status.success(),
        "run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(psql(&db.url(), "SELECT count(*) FROM trees").trim(), "1");
    assert!(!dir.path().join("arbor.db").exists(), "no SQLite file made");
    let mut server = Server::start(dir.path(), &["--config", "pg.toml"], Some(TOKEN));
    server.wait_for("ready");
    let (status, ready) = health(&server, "/readyz").await;
    assert_eq!(status, StatusCode::OK, "{ready}");
    let (status, listed) = get(&server, "/v1/runs").await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["runs"].as_array().map(Vec::len), Some(1), "{listed}");
}

/// Three replicas and many running trees through a routine Postgres
/// restart: before, the replicas' writers failed for good ("the store
/// failed: … terminating connection due to administrator command"), their
/// trees ended `failed` in memory while the database kept them `running`,
/// and each answered 503 until restarted by hand. Now every tree
/// completes on the replica that started it, no replica restarted,
/// nothing claimed while the store was down (every epoch is still 1), and
/// no event stored twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_took_every_replica_down_until_restarted_by_hand() {
    let pg = PgServer::start();
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), "60s");
    let replicas: Vec<Server> = (0..3).map(|_| replica(dir.path(), &pg.db())).collect();
    let count = sized("ARBOR_RESTART_TREES", 100);
    let mut started = Vec::new();
    for i in 0..count {
        started.push(start_tree(&replicas[i % 3]).await);
    }
    // Mid-run: the trees are under way.
    let running = trees(&pg.db())
        .values()
        .filter(|(s, _, _)| s == "running")
        .count();
    assert!(running > 0, "trees run when the store restarts");
    pg.restart();
    // Every tree completes, without a replica restarted.
    let done = poll(GUARD, || {
        let now = trees(&pg.db());
        let ended = now.values().filter(|(s, _, _)| s != "running").count();
        (ended == count).then_some(now)
    })
    .unwrap_or_else(|| panic!("not every tree ended: {:?}", trees(&pg.db())));
    for (tree, (status, epoch, _)) in &done {
        assert_eq!(status, "completed", "tree {tree}");
        assert_eq!(*epoch, 1, "tree {tree} was claimed again");
    }
    assert_eq!(done.len(), count);
    for server in &replicas {
        let (status, ready) = health(server, "/readyz").await;
        assert_eq!(status, StatusCode::OK, "{ready}");
        let (status, healthy) = health(server, "/healthz").await;
        assert_eq!(status, StatusCode::OK, "{healthy}");
    }
    // Nothing stored twice: each tree's journal numbers every event once,
    // each of its three runs ended once, and each model call was recorded
    // once (root: 2 steps, each worker: 1).
    for tree in started.iter().step_by(7) {
        let stored = export(dir.path(), &pg.db(), tree);
        let events = stored["events"].as_array().unwrap();
        let mut seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
        let n = seqs.len();
        seqs.sort_unstable();
        seqs.dedup();
        assert_eq!(seqs.len(), n, "tree {tree} has an event twice");
        let ends = events
            .iter()
            .filter(|e| e["type"] == "agentFinished")
            .count();
        assert_eq!(ends, 3, "tree {tree}: {events:?}");
        let calls = stored["modelCalls"].as_array().unwrap();
        let mut keys: Vec<String> = calls
            .iter()
            .map(|c| format!("{}#{}", c["runId"], c["step"]))
            .collect();
        keys.sort();
        keys.dedup();
        assert_eq!((keys.len(), calls.len()), (4, 4), "tree {tree}: {calls:?}");
    }
}

/// `pg_terminate_backend` of the service's connections (what an operator
/// or a failover does): the writer reconnects, the trees complete, and the
/// `LISTEN` connection is opened again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_backend_failed_every_running_tree() {
    let db = PgDatabase::new("terminated");
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), "60s");
    let mut server = replica(dir.path(), &db.url());
    let mut started = Vec::new();
    for _ in 0..10 {
        started.push(start_tree(&server).await);
    }
    let name = db.url().rsplit('/').next().unwrap().to_owned();
    let server_url = db.url().rsplit_once('/').unwrap().0.to_owned();
    psql(
        &format!("{server_url}/postgres"),
        &format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        ),
    );
    let done = poll(GUARD, || {
        let now = trees(&db.url());
        (now.values().all(|(s, _, _)| s != "running") && now.len() == 10).then_some(now)
    })
    .unwrap_or_else(|| panic!("not every tree ended: {:?}", trees(&db.url())));
    for (tree, (status, epoch, _)) in &done {
        assert_eq!(status, "completed", "tree {tree}");
        assert_eq!(*epoch, 1, "tree {tree}");
    }
    let (status, ready) = health(&server, "/readyz").await;
    assert_eq!(status, StatusCode::OK, "{ready}");
    let metrics = metrics(&server).await;
    assert!(metrics.contains("arbor_store_writable 1"), "{metrics}");
    // The notifications' connection was terminated too: it is open again
    // (before, it stayed closed and every wake-up waited for a poll).
    server.wait_for("following the store's notifications again");
}

/// A database down longer than `[store] fail_after`: meanwhile readiness
/// says the store is unavailable and why, new runs get a 503 saying so,
/// and no claim is taken; past it the replica fails `/healthz` (so an
/// orchestrator restarts it) and its trees are released as soon as the
/// database is back, for another replica to finish. Before, `/healthz`
/// said ok for ever and the trees stayed `running`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_down_past_fail_after_left_healthz_ok_and_its_trees_running() {
    let pg = PgServer::start();
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), "3s");
    let a = replica(dir.path(), &pg.db());
    let mut started = Vec::new();
    for _ in 0..5 {
        started.push(start_tree(&a).await);
    }
    pg.stop();
    // Down: not ready, and it says why; still healthy.
    let (_, ready) = until(|| async {
        let got = health(&a, "/readyz").await;
        (got.1["status"] == "store unavailable").then_some(got)
    })
    .await
    .unwrap_or_else(|| panic!("readiness never said the store is unavailable"));
    assert_eq!(ready["store"]["writable"], false, "{ready}");
    let why = ready["store"]["error"].as_str().unwrap_or_default();
    assert!(why.contains("cannot be reached"), "{ready}");
    assert!(!why.contains("password"), "{ready}");
    let (status, refused) = post(&a, "/v1/runs", json!({"agent": "lead", "prompt": "go"})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    assert_eq!(refused["error"]["code"], "store_unavailable", "{refused}");
    let metrics = metrics(&a).await;
    assert!(metrics.contains("arbor_store_writable 0"), "{metrics}");
    // Past fail_after: unhealthy, so an orchestrator restarts it.
    let (_, unhealthy) = until(|| async {
        let got = health(&a, "/healthz").await;
        (got.0 == StatusCode::SERVICE_UNAVAILABLE).then_some(got)
    })
    .await
    .unwrap_or_else(|| panic!("/healthz never failed"));
    assert_eq!(unhealthy["status"], "store failed", "{unhealthy}");
    // The database is back: the trees were released, not left running.
    pg.start_again();
    let released = poll(GUARD, || {
        let now = trees(&pg.db());
        now.values()
            .all(|(s, _, owner)| s != "running" || owner == "-:released")
            .then_some(now)
    })
    .unwrap_or_else(|| panic!("the trees were not released: {:?}", trees(&pg.db())));
    assert_eq!(released.len(), 5);
    // Another replica finishes them.
    let b = replica(dir.path(), &pg.db());
    let done = poll(GUARD, || {
        let now = trees(&pg.db());
        now.values()
            .all(|(s, _, _)| s == "completed")
            .then_some(now)
    })
    .unwrap_or_else(|| panic!("not every tree completed: {:?}", trees(&pg.db())));
    assert!(done.values().all(|(_, epoch, _)| *epoch == 2), "{done:?}");
    drop(b);
}

/// A small filesystem under a SQLite store, filled while a tree runs and
/// then freed: while full, a start is refused with "the store's disk is
/// full at PATH" (not "try again later") and readiness says so; once freed
/// the service goes on by itself and the tree completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_needed_a_person_to_restart_the_service() {
    let Some(mount) = Tmpfs::mount("8m") else {
        panic!("this test mounts a tmpfs: run it as root (CI does)");
    };
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), "10m");
    let store = mount.path.join("arbor.db");
    let a = replica(dir.path(), store.to_str().unwrap());
    let tree = start_tree(&a).await;
    // Fill the disk to its last bytes.
    let filler = mount.path.join("filler");
    let _ = Command::new("dd")
        .args([
            "if=/dev/zero",
            &format!("of={}", filler.display()),
            "bs=64k",
        ])
        .output()
        .unwrap();
    // Trees started until the writer meets the full disk (each accepted
    // one must complete once there is room again). A start the writer was
    // taking when the disk filled waits for it: each is sent on its own.
    let base = a.base.clone();
    let mut starts = Vec::new();
    let (_, ready) = until(|| {
        let url = format!("{base}/v1/runs");
        starts.push(tokio::spawn(async move {
            let response = client()
                .post(url)
                .bearer_auth(TOKEN)
                .json(&json!({"agent": "lead", "prompt": "more"}))
                .send()
                .await
                .unwrap();
            let status = response.status();
            let body: Value = response.json().await.unwrap();
            (status == StatusCode::CREATED).then(|| body["treeId"].as_str().unwrap().to_owned())
        }));
        async {
            let got = health(&a, "/readyz").await;
            (got.1["status"] == "store unavailable").then_some(got)
        }
    })
    .await
    .unwrap_or_else(|| panic!("readiness never said the disk is full"));
    let why = ready["store"]["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(why.contains("disk is full at"), "{ready}");
    let (status, refused) = post(&a, "/v1/runs", json!({"agent": "lead", "prompt": "go"})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the store's disk is full at") && message.contains("arbor.db"),
        "{refused}"
    );
    assert!(!message.contains("try again later"), "{refused}");
    // Freed: it recovers by itself.
    std::fs::remove_file(&filler).unwrap();
    until(|| async {
        let got = health(&a, "/readyz").await;
        (got.0 == StatusCode::OK).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("the service did not recover after space was freed"));
    let mut accepted = vec![tree];
    for start in starts {
        accepted.extend(start.await.unwrap());
    }
    assert!(
        accepted.len() > 1,
        "trees were started while the disk filled"
    );
    for tree in accepted {
        let ended = until(|| async {
            let got = get(&a, &format!("/v1/trees/{tree}")).await;
            (got.1["tree"]["status"] != "running").then_some(got.1)
        })
        .await
        .unwrap_or_else(|| panic!("tree {tree} did not end"));
        assert_eq!(ended["tree"]["status"], "completed", "{ended}");
    }
    let new = start_tree(&a).await;
    assert!(!new.is_empty());
}

/// A tmpfs of a given size, unmounted on drop.
struct Tmpfs {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let path = dir.path().join("disk");
        std::fs::create_dir(&path).ok()?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .ok()?;
        out.status.success().then_some(Tmpfs { path, _dir: dir })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// A tree whose stored log cannot be read (its last segment damaged) was
/// claimed by the service that adopted it and then listed `running` for
/// ever (nobody else could claim it): now it fails, naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_whose_log_cannot_be_loaded_was_listed_running_for_ever() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), "60s");
    let mut run = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args([
            "run",
            "--config",
            "faults.toml",
            "--store",
            "s.db",
            "--agent",
            "sleeper",
            "-q",
            "go",
        ])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let db = dir.path().join("s.db");
    let segments = || -> Option<(String, i64)> {
        let conn = rusqlite::Connection::open(&db).ok()?;
        conn.query_row(
            "SELECT tree_id, max(n) FROM segments GROUP BY tree_id",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .ok()
    };
    let (tree, last) = poll(GUARD, segments).expect("the tree's first segment is stored");
    run.kill().unwrap();
    run.wait().unwrap();
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute(
            "UPDATE segments SET body = x'00ff00ff' WHERE tree_id = ?1 AND n = ?2",
            rusqlite::params![tree, last],
        )
        .unwrap();
    }
    let server = replica(dir.path(), "s.db");
    // (Listed from the trees' rows: its log cannot be read.)
    let ended = until(|| async {
        let (_, listed) = get(&server, "/v1/runs").await;
        let row = listed["runs"]
            .as_array()?
            .iter()
            .find(|t| t["treeId"] == tree.as_str())?
            .clone();
        (row["status"] != "running").then_some(row)
    })
    .await
    .unwrap_or_else(|| panic!("tree {tree} is still listed running"));
    assert_eq!(ended["status"], "failed", "{ended}");
    let error = ended["error"].as_str().unwrap_or_default();
    assert!(error.contains("cannot be resumed"), "{ended}");
}
