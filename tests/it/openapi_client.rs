//! A client generated from the OpenAPI document types the service's real
//! answers (issue 34): `openapi-typescript` (pinned in
//! tests/openapi/package.json) generates the TypeScript types of
//! `GET /openapi.json` of a live `arbor serve`, and `tsc --noEmit --strict`
//! type-checks a file that assigns what the server answered (finished runs'
//! `GET /v1/runs/{id}` with their AgentState, a `GET /v1/trees/{id}`, every
//! event of the streams) to those types. An answer the document does not
//! describe (a field it lacks, a type it gets wrong, a missing schema) fails
//! the check.
//!
//! Needs Node.js and `npm ci --prefix tests/openapi` (`.ci/run` does both):
//! without node the test is skipped with a note, except under `CI=true`,
//! where it fails; without the packages it fails, saying what to run.

use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::serve::{Server, TOKEN, encoded, get, post, stream};

/// `node`, when there is one: `None` (a skip, with a note) only outside CI.
fn node() -> Option<String> {
    let node = std::env::var("ARBOR_NODE").unwrap_or_else(|_| "node".into());
    let found = Command::new(&node)
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if found {
        return Some(node);
    }
    let message = format!(
        "no Node.js ({node} --version failed): install Node.js 20 or later (or set ARBOR_NODE) \
         and run `npm ci --prefix tests/openapi`; .ci/run does"
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{message}");
    eprintln!("skipped: {message}");
    None
}

/// tests/openapi, with its packages installed.
fn packages() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openapi");
    for package in ["openapi-typescript", "typescript"] {
        assert!(
            dir.join("node_modules").join(package).is_dir(),
            "run `npm ci --prefix tests/openapi` first (.ci/run does): {package} is missing"
        );
    }
    dir
}

fn run(node: &str, dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(node)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// lead → 2 workers → 2 leaves each (spawn calls and their results in the
/// histories), on the simulated model.
const CONFIG: &str = r#"
[limits]
max_depth = 3
deadline = "2m"

[store]
path = "arbor.db"

[service]
bind = "127.0.0.1:0"
shutdown_timeout = "5s"

[models.sim]
provider = "simulated"
fanout = 2
depth = 2
latency = "0"
reply_tokens = 5

[agents.lead]
name = "Lead"
model = "sim"
system_prompt = "You split the work."
spawnable_agents = ["worker"]

[agents.worker]
name = "Worker"
model = "sim"
system_prompt = "You split it again."
spawnable_agents = ["leaf"]

[agents.leaf]
name = "Leaf"
model = "sim"
system_prompt = "You answer."
"#;

/// Starts a tree and waits (bounded, on the server's log) for its end;
/// returns the `Created` answer.
async fn finished_tree(server: &mut Server, body: Value) -> Value {
    let (status, created) = post(server, "/v1/runs", body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let tree = created["treeId"].as_str().unwrap().to_owned();
    let line = tokio::task::block_in_place(|| server.wait_for("tree ended"));
    assert!(line.contains(&tree), "{line}");
    created
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typescript_client_generated_from_the_document_types_real_answers() {
    let Some(node) = node() else {
        return;
    };
    let packages = packages();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("openapi.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let config = config.display().to_string();
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");

    // A tree that completes (7 runs), and one whose root fails on a limit.
    let done = finished_tree(&mut server, json!({"agent": "lead", "prompt": "split it"})).await;
    let failed = finished_tree(
        &mut server,
        json!({"agent": "lead", "prompt": "split it", "limits": {"maxSteps": 1}}),
    )
    .await;

    let mut runs = Vec::new();
    let mut trees = Vec::new();
    let mut events = Vec::new();
    let mut event_names = Vec::new();
    for created in [&done, &failed] {
        let run_id = created["runId"].as_str().unwrap();
        let tree_id = created["treeId"].as_str().unwrap();
        let (status, tree) = get(&server, &format!("/v1/trees/{tree_id}")).await;
        assert_eq!(status, StatusCode::OK, "{tree}");
        // Every run of the tree: the root's history has the spawn calls and
        // their results, a leaf's its answer.
        for node in tree["nodes"].as_array().unwrap() {
            let id = node["runId"].as_str().unwrap();
            let (status, run) = get(&server, &format!("/v1/runs/{}", encoded(id))).await;
            assert_eq!(status, StatusCode::OK, "{run}");
            assert!(
                run["state"].is_object(),
                "a finished run has its state: {run}"
            );
            runs.push(run);
        }
        trees.push(tree);
        for sse in stream(&server, run_id, None, |_| {}).await {
            assert_eq!(sse.data["type"], sse.event.as_str());
            event_names.push(Value::String(sse.event.clone()));
            events.push(sse.data);
        }
    }
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    for kind in [
        "agentStarted",
        "modelResponded",
        "toolCalled",
        "agentFinished",
        "agentFailed",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }
    let statuses: Vec<&Value> = runs.iter().map(|r| &r["state"]["status"]).collect();
    assert!(statuses.contains(&&json!("failed")), "{statuses:?}");

    let (status, document) = get(&server, "/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    drop(server);

    let work = dir.path();
    std::fs::write(work.join("openapi.json"), document.to_string()).unwrap();
    let generate = packages.join("node_modules/openapi-typescript/bin/cli.js");
    let (ok, said) = run(
        &node,
        work,
        &[generate.to_str().unwrap(), "openapi.json", "-o", "api.d.ts"],
    );
    assert!(ok, "openapi-typescript failed:\n{said}");
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap();
    let check = format!(
        r#"import type {{ components }} from "./api";
type S = components["schemas"];

export const runs: S["RunView"][] = {runs};
export const trees: S["TreeView"][] = {trees};
export const events: S["StreamEventData"][] = {events};
export const eventNames: S["EventType"][] = {event_names};

// The types are the document's, not `unknown`: what it does not allow fails.
// @ts-expect-error a status the document does not have
export const badStatus: S["AgentState"]["status"] = "finished";
// @ts-expect-error a history that is not a list of messages
export const badHistory: S["AgentState"]["messageHistory"] = [{{ role: "robot" }}];
// @ts-expect-error an event payload without its common fields
export const badEvent: S["StreamEventData"] = {{ type: "stepStarted", step: 1 }};
"#,
        runs = pretty(&Value::Array(runs)),
        trees = pretty(&Value::Array(trees)),
        events = pretty(&Value::Array(events)),
        event_names = pretty(&Value::Array(event_names)),
    );
    std::fs::write(work.join("check.ts"), check).unwrap();
    let tsc = packages.join("node_modules/typescript/bin/tsc");
    let (ok, said) = run(
        &node,
        work,
        &[
            tsc.to_str().unwrap(),
            "--noEmit",
            "--strict",
            "--exactOptionalPropertyTypes",
            "--target",
            "es2022",
            "--module",
            "es2022",
            "--moduleResolution",
            "bundler",
            "check.ts",
        ],
    );
    if !ok {
        let kept = std::env::temp_dir().join("arbor-openapi-client-check");
        let _ = std::fs::remove_dir_all(&kept);
        let _ = std::fs::create_dir_all(&kept);
        for file in ["openapi.json", "api.d.ts", "check.ts"] {
            let _ = std::fs::copy(work.join(file), kept.join(file));
        }
        panic!(
            "tsc rejects the server's answers against the generated client (files kept in {}):\n{said}",
            kept.display()
        );
    }
}
