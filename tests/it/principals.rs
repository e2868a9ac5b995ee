//! Tokens carry an identity (issue 33): `arbor serve` with named principals
//! (`[service.principals.NAME]`, roles admin, user and read) beside the
//! unnamed admin tokens of `ARBOR_API_TOKENS`. A user sees and controls only
//! the trees it started (another's answer 404, as a missing one does), a
//! `read` principal reads every tree and changes none (403), an admin sees
//! all; on every route, and on every replica of a shared store.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::serve::{Server, client, encoded};

/// How long any one wait may take before the test fails (never a pass).
const GUARD: Duration = Duration::from_secs(60);

const ALICE: &str = "alice-token";
const BOB: &str = "bob-token";
const OPS: &str = "ops-token";
const AUDIT: &str = "audit-token";
/// A token of `ARBOR_API_TOKENS`: an unnamed admin, as every token was.
const LEGACY: &str = "legacy-token";

/// A lead whose `echo` calls wait for a person (so its tree runs until
/// decided), and four principals.
const CONFIG: &str = r#"
[run]
agent = "lead"

[limits]
max_steps = 50

[store]
path = "arbor.db"

[service]
bind = "127.0.0.1:0"

[service.principals.alice]
token_env = "TEST_ALICE_TOKENS"
role = "user"

[service.principals.bob]
token_env = "TEST_BOB_TOKENS"
role = "user"

[service.principals.ops]
token_env = "TEST_OPS_TOKENS"
role = "admin"

[service.principals.audit]
token_env = "TEST_AUDIT_TOKENS"
role = "read"

[models.script]
provider = "scripted"
file = "script.json"

[tools.echo]
description = "Echoes its word."
input_schema = { type = "object", properties = { word = { type = "string" } }, required = ["word"] }
command = ["echo", "{word}"]

[agents.lead]
model = "script"
tools = ["echo"]
approve = ["echo"]
"#;

/// Every principal's variable.
const ENVS: &[(&str, &str)] = &[
    ("TEST_ALICE_TOKENS", ALICE),
    ("TEST_BOB_TOKENS", BOB),
    ("TEST_OPS_TOKENS", OPS),
    ("TEST_AUDIT_TOKENS", AUDIT),
];

/// The config and the script (each lead calls echo, waits for the
/// decision, then answers "done") in `dir`.
fn scene(dir: &Path) {
    std::fs::write(dir.join("config.toml"), CONFIG).unwrap();
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"word": "model"}}]},
            {"text": "done"}
        ]}
    ]});
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
}

/// A server on `dir`'s config (and `store`, when given), once ready.
fn server(dir: &Path, store: Option<&str>) -> Server {
    let mut args = vec!["--config", "config.toml"];
    if let Some(store) = store {
        args.extend(["--store", store]);
    }
    let mut server = Server::start_env(dir, &args, Some(LEGACY), ENVS);
    server.wait_for("ready");
    server
}

/// `method path` with `token` (and a JSON body): the status and the body
/// (JSON, or `Null`). An event stream is not read: its status is the answer.
async fn call(
    server: &Server,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = client()
        .request(method, server.url(path))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let streaming = response
        .headers()
        .get("content-type")
        .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
    if streaming {
        return (status, Value::Null);
    }
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(server: &Server, token: &str, path: &str) -> (StatusCode, Value) {
    call(server, token, Method::GET, path, None).await
}

/// Starts a lead as `token`'s principal: its tree and root run ids.
async fn start(server: &Server, token: &str) -> (String, String) {
    let (status, created) = call(
        server,
        token,
        Method::POST,
        "/v1/runs",
        Some(json!({"agent": "lead", "prompt": "go"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    (
        created["treeId"].as_str().unwrap().to_owned(),
        created["runId"].as_str().unwrap().to_owned(),
    )
}

/// The tree ids `GET /v1/runs` lists for `token`.
async fn listed(server: &Server, token: &str) -> Vec<String> {
    let (status, list) = get(server, token, "/v1/runs?limit=500").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["treeId"].as_str().unwrap().to_owned())
        .collect()
}

/// The trees of the calls `GET /v1/approvals` lists for `token`.
async fn approval_trees(server: &Server, token: &str) -> Vec<String> {
    let (status, list) = get(server, token, "/v1/approvals").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let mut trees: Vec<String> = list["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["treeId"].as_str().unwrap().to_owned())
        .collect();
    trees.sort();
    trees
}

/// The call waiting in `tree`, as its owner sees it (waited for, bounded).
async fn waiting_call(server: &Server, token: &str, tree: &str) -> String {
    let until = Instant::now() + GUARD;
    loop {
        let (status, list) = get(server, token, &format!("/v1/trees/{tree}/approvals")).await;
        assert_eq!(status, StatusCode::OK, "{list}");
        if let Some(call) = list["approvals"][0]["toolCallId"].as_str() {
            return call.to_owned();
        }
        assert!(
            Instant::now() < until,
            "no call of {tree} waited within {GUARD:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One request of every tree route on `tree` (root run `run`, waiting call
/// `call`): (what, method, path, body). The writes change nothing that
/// matters to the test when refused; the read ones are the first four.
fn routes(tree: &str, run: &str, call: &str) -> Vec<(&'static str, Method, String, Option<Value>)> {
    let run = encoded(run);
    let call = encoded(call);
    vec![
        ("get tree", Method::GET, format!("/v1/trees/{tree}"), None),
        ("get run", Method::GET, format!("/v1/runs/{run}"), None),
        (
            "events",
            Method::GET,
            format!("/v1/runs/{run}/events"),
            None,
        ),
        (
            "tree approvals",
            Method::GET,
            format!("/v1/trees/{tree}/approvals"),
            None,
        ),
        (
            "steer",
            Method::POST,
            format!("/v1/runs/{run}/messages"),
            Some(json!({"text": "take over"})),
        ),
        (
            "limits",
            Method::PATCH,
            format!("/v1/trees/{tree}/limits"),
            Some(json!({"addSteps": 5})),
        ),
        (
            "decide",
            Method::POST,
            format!("/v1/trees/{tree}/approvals/{call}"),
            Some(json!({"decision": "deny", "reason": "mine now"})),
        ),
        (
            "turn",
            Method::POST,
            format!("/v1/trees/{tree}/turns"),
            Some(json!({"prompt": "again", "multitask": "reject"})),
        ),
        (
            "cancel",
            Method::POST,
            format!("/v1/runs/{run}/cancel"),
            None,
        ),
    ]
}

/// An id of `tree`'s form that no tree has: its last character changed.
fn ghost(tree: &str) -> String {
    let (head, last) = tree.split_at(tree.len() - 1);
    format!("{head}{}", if last == "0" { "1" } else { "0" })
}

/// How many of `routes` only read.
const READS: usize = 4;

/// `token` gets `expected` on every one of `routes`; a 404 is exactly the
/// one a tree that does not exist gets (same code, same message but for
/// the id), so it tells nothing of the tree.
async fn every_route(
    server: &Server,
    token: &str,
    routes: &[(&'static str, Method, String, Option<Value>)],
    tree: &str,
    expected: StatusCode,
) {
    for (what, method, path, body) in routes {
        let (status, answer) = call(server, token, method.clone(), path, body.clone()).await;
        assert_eq!(status, expected, "{what} {path}: {answer}");
        if expected == StatusCode::NOT_FOUND {
            let ghost = &ghost(tree);
            let (ghost_status, ghost_answer) = call(
                server,
                token,
                method.clone(),
                &path.replace(tree, ghost),
                body.clone(),
            )
            .await;
            assert_eq!(
                ghost_status,
                StatusCode::NOT_FOUND,
                "{what}: {ghost_answer}"
            );
            assert_eq!(
                answer["error"]["message"]
                    .as_str()
                    .map(|m| m.replace(tree, ghost)),
                ghost_answer["error"]["message"].as_str().map(str::to_owned),
                "{what}: another's tree and a missing one answer alike"
            );
            assert_eq!(
                answer["error"]["code"], ghost_answer["error"]["code"],
                "{what}"
            );
        }
        if expected == StatusCode::FORBIDDEN {
            assert_eq!(answer["error"]["code"], "forbidden", "{what}: {answer}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_token_cannot_see_or_control_another_users_trees() {
    let dir = tempfile::tempdir().unwrap();
    scene(dir.path());
    let server = server(dir.path(), None);
    let (a_tree, a_run) = start(&server, ALICE).await;
    let (b_tree, b_run) = start(&server, BOB).await;
    let a_call = waiting_call(&server, ALICE, &a_tree).await;
    let b_call = waiting_call(&server, BOB, &b_tree).await;
    let a_routes = routes(&a_tree, &a_run, &a_call);
    let mut both = vec![a_tree.clone(), b_tree.clone()];
    both.sort();

    // Listing and the approvals list: each user its own; the read
    // principal, the named admin and the unnamed one every tree.
    assert_eq!(listed(&server, ALICE).await, [a_tree.as_str()]);
    assert_eq!(listed(&server, BOB).await, [b_tree.as_str()]);
    for token in [AUDIT, OPS, LEGACY] {
        let mut seen = listed(&server, token).await;
        seen.sort();
        assert_eq!(seen, both, "{token}");
        assert_eq!(approval_trees(&server, token).await, both, "{token}");
    }
    assert_eq!(approval_trees(&server, ALICE).await, [a_tree.as_str()]);
    assert_eq!(approval_trees(&server, BOB).await, [b_tree.as_str()]);
    // The list names each tree's principal.
    let (_, list) = get(&server, OPS, "/v1/runs").await;
    let principal = |tree: &str| {
        list["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["treeId"] == tree)
            .map(|t| t["principal"].clone())
    };
    assert_eq!(principal(&a_tree), Some(json!("alice")));
    assert_eq!(principal(&b_tree), Some(json!("bob")));

    // Bob: every route of Alice's tree is a 404, as if it did not exist.
    every_route(&server, BOB, &a_routes, &a_tree, StatusCode::NOT_FOUND).await;
    // The read principal reads it all and changes nothing: 403, whoever's.
    every_route(&server, AUDIT, &a_routes[..READS], &a_tree, StatusCode::OK).await;
    every_route(
        &server,
        AUDIT,
        &a_routes[READS..],
        &a_tree,
        StatusCode::FORBIDDEN,
    )
    .await;
    let (status, refused) = call(
        &server,
        AUDIT,
        Method::POST,
        "/v1/runs",
        Some(json!({"agent": "lead", "prompt": "mine"})),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    // The metrics count every tree: operators' (admin, read), not users'.
    for (token, expected) in [
        (BOB, StatusCode::FORBIDDEN),
        (AUDIT, StatusCode::OK),
        (OPS, StatusCode::OK),
        (LEGACY, StatusCode::OK),
    ] {
        let response = client()
            .get(server.url("/metrics"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), expected, "{token}");
    }
    // Nothing of that reached Alice's tree: still waiting, unsteered, unraised.
    let (status, run) = get(&server, ALICE, &format!("/v1/runs/{}", encoded(&a_run))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(run["state"]["status"], "running", "{run}");
    assert_eq!(waiting_call(&server, ALICE, &a_tree).await, a_call);

    // Alice herself: every read route of her tree answers.
    every_route(&server, ALICE, &a_routes[..READS], &a_tree, StatusCode::OK).await;
    // …and Bob's are hidden from her.
    let b_routes = routes(&b_tree, &b_run, &b_call);
    every_route(&server, ALICE, &b_routes, &b_tree, StatusCode::NOT_FOUND).await;
    // She controls hers: a steer and a budget raise are taken (the budget
    // raised once: none of the refused raises landed), her decision (the
    // call still waited: none of the refused ones landed) ends the tree,
    // then her follow-up turn starts.
    for (what, method, path, body) in &a_routes[READS..READS + 3] {
        let (status, answer) = call(&server, ALICE, method.clone(), path, body.clone()).await;
        assert!(status.is_success(), "{what}: {status} {answer}");
        if *what == "limits" {
            assert_eq!(answer["maxSteps"], 55, "{answer}");
        }
    }
    let until = Instant::now() + GUARD;
    loop {
        let (_, tree) = get(&server, ALICE, &format!("/v1/trees/{a_tree}")).await;
        if tree["tree"]["status"] == "completed" {
            break;
        }
        assert!(Instant::now() < until, "Alice's tree did not end: {tree}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Her message went into the history once: the refused ones did not.
    let (_, root) = get(&server, ALICE, &format!("/v1/runs/{}", encoded(&a_run))).await;
    let history = root["state"]["messageHistory"].to_string();
    assert_eq!(history.matches("take over").count(), 1, "{history}");
    let (_, method, path, body) = &a_routes[7];
    let (status, turn) = call(&server, ALICE, method.clone(), path, body.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{turn}");
    // The turn is still hers (and so still hidden from Bob).
    assert_eq!(listed(&server, BOB).await, [b_tree.as_str()]);
    let (status, _) = get(&server, BOB, &format!("/v1/trees/{a_tree}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // An admin controls anyone's: the named one cancels Bob's tree.
    let (status, answer) = call(
        &server,
        OPS,
        Method::POST,
        &format!("/v1/runs/{}/cancel", encoded(&b_run)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");

    // A second server on the same store (a replica; or this one after a
    // restart) reads the owners from the store: the same answers.
    let replica = server_on_same_store(dir.path());
    assert_eq!(listed(&replica, ALICE).await, [a_tree.as_str()]);
    assert_eq!(listed(&replica, BOB).await, [b_tree.as_str()]);
    let (status, _) = get(&replica, BOB, &format!("/v1/trees/{a_tree}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = get(&replica, ALICE, &format!("/v1/trees/{a_tree}")).await;
    assert_eq!(status, StatusCode::OK);
}

/// Another `arbor serve` on `dir`'s SQLite file.
fn server_on_same_store(dir: &Path) -> Server {
    server(dir, None)
}

/// Replicas over one Postgres database: a tree started on one is hidden
/// from another user on the other, which forwards its owner's controls.
/// Needs `ARBOR_PG_URL` (fails without, as the other replica tests do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_over_postgres_hides_a_users_tree_from_another_user() {
    let db = crate::support::PgDatabase::new("principals");
    let dir = tempfile::tempdir().unwrap();
    scene(dir.path());
    let url = db.url();
    let first = server(dir.path(), Some(&url));
    let second = server(dir.path(), Some(&url));
    let (tree, run) = start(&first, ALICE).await;
    let call_id = waiting_call(&first, ALICE, &tree).await;
    let routes = routes(&tree, &run, &call_id);
    // On the replica that does not run it: hidden from Bob on every route,
    // read-only for the read principal, Alice's own to read.
    every_route(&second, BOB, &routes, &tree, StatusCode::NOT_FOUND).await;
    every_route(
        &second,
        AUDIT,
        &routes[READS..],
        &tree,
        StatusCode::FORBIDDEN,
    )
    .await;
    // (Not the run's state: a replica that does not run a tree may not
    // have its checkpoint yet, issue 33 item 7.)
    let reads: Vec<_> = routes[..READS]
        .iter()
        .filter(|r| r.0 != "get run")
        .cloned()
        .collect();
    every_route(&second, ALICE, &reads, &tree, StatusCode::OK).await;
    assert_eq!(listed(&second, ALICE).await, [tree.as_str()]);
    assert!(listed(&second, BOB).await.is_empty());
    // Her decision, sent to the other replica, is forwarded and ends it.
    let (what, method, path, body) = &routes[6];
    let (status, answer) = call(&second, ALICE, method.clone(), path, body.clone()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{what}: {answer}");
    let until = Instant::now() + GUARD;
    loop {
        let (_, view) = get(&second, ALICE, &format!("/v1/trees/{tree}")).await;
        if view["tree"]["status"] == "completed" {
            break;
        }
        assert!(Instant::now() < until, "the tree did not end: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A role the service does not know, and a principal's variable that is
/// not set, are config errors naming the key and its line; the unnamed
/// tokens alone (no principals) serve as before.
#[test]
fn an_unknown_role_or_an_unset_token_env_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    scene(dir.path());
    let config = CONFIG.replace("role = \"read\"", "role = \"reader\"");
    std::fs::write(dir.path().join("bad.toml"), &config).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(["check-config", "bad.toml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let line = config
        .lines()
        .position(|l| l.contains("\"reader\""))
        .unwrap()
        + 1;
    assert!(
        err.contains(&format!(
            "bad.toml:{line}: service.principals.audit.role: \"reader\" is not a role (one of admin, user, read)"
        )),
        "{err}"
    );

    // `serve` with a principal's variable unset: refused at once, naming it.
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_arbor"));
    command
        .args(["serve", "--config", "config.toml"])
        .current_dir(dir.path())
        .env("ARBOR_API_TOKENS", LEGACY);
    for (key, value) in ENVS.iter().filter(|(k, _)| *k != "TEST_BOB_TOKENS") {
        command.env(key, value);
    }
    command.env_remove("TEST_BOB_TOKENS");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(command.output());
    });
    let out = rx
        .recv_timeout(GUARD)
        .expect("arbor serve exits at once")
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let line = CONFIG
        .lines()
        .position(|l| l.contains("TEST_BOB_TOKENS"))
        .unwrap()
        + 1;
    assert!(
        err.contains(&format!(
            "config.toml:{line}: service.principals.bob.token_env: TEST_BOB_TOKENS is not set"
        )),
        "{err}"
    );
}

/// Tenants keep to their own repositories: with `[workspace.principal_roots]`
/// alice's requests may name a workspace only under hers and bob's only
/// under his (422 naming the roots otherwise), while a principal without
/// roots of its own (the admin) keeps the service's `roots`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_request_cannot_point_its_agents_at_another_tenants_workspace() {
    let dir = tempfile::tempdir().unwrap();
    scene(dir.path());
    for who in ["alice", "bob", "shared"] {
        std::fs::create_dir_all(dir.path().join("repos").join(who).join("app")).unwrap();
    }
    let config = std::fs::read_to_string(dir.path().join("config.toml")).unwrap()
        + "\n[workspace]\nroots = [\"repos/shared\"]\n\n[workspace.principal_roots]\nalice = [\"repos/alice\"]\nbob = [\"repos/bob\"]\n";
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let server = server(dir.path(), None);
    let repo =
        |who: &str| std::fs::canonicalize(dir.path().join("repos").join(who).join("app")).unwrap();
    let start = |token: &'static str, who: &str| {
        let body =
            json!({"agent": "lead", "prompt": "go", "limits": {"workspace": {"root": repo(who)}}});
        let server = &server;
        async move { call(server, token, Method::POST, "/v1/runs", Some(body)).await }
    };
    let (status, body) = start(ALICE, "alice").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = start(ALICE, "bob").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body.to_string().contains("outside the workspace roots"),
        "{body}"
    );
    assert!(body.to_string().contains("repos/alice"), "{body}");
    let (status, body) = start(BOB, "bob").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = start(BOB, "shared").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    // The admin has no roots of its own: the service's.
    let (status, body) = start(OPS, "shared").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = start(OPS, "alice").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}
