//! The live page's follow-up turns, steering and budget raise in a real
//! headless Chromium (Debian's, driven by playwright-core from
//! `tests/browser/page_turns.mjs`, like the approvals panel's test): a tree
//! paused on its step budget is steered and raised from the page, runs to
//! its end, and is given a second turn through the page's form.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::approvals_restart::read_until;
use crate::serve::{Server, Sse, TOKEN, encoded, get, post, stream};
use crate::support::browser::Browser;

/// One step for the whole tree, then it pauses (semantics §13); the page
/// raises it.
const CONFIG: &str = r#"
[limits]
max_steps = 1
on_budget = "pause"
deadline = "2m"

[store]
path = "arbor.db"

[service]
bind = "127.0.0.1:0"
shutdown_timeout = "5s"

[models.script]
provider = "scripted"
file = "script.json"

[agents.chat]
model = "script"
tools = ["add_message"]
"#;

/// What the page's "say" form sends: markup that must show as text.
const STEER: &str = r#"<b>hurry</b> & <img src=x onerror="window.__xss = 1">"#;
/// The follow-up turn's prompt, markup too.
const TURN: &str = r#"second question <i>twice</i>"#;

/// Turn 1: a tool call (the tree's one step), then a reply (the step the
/// budget refuses until the page raises it), then the answer to the steering
/// message (which arrives while the refused step's request is kept, so it
/// takes one more step). Turn 2 (its prompt has "second question"): one reply.
fn script() -> Value {
    json!({"replies": [
        {"agent": "chat", "prompt": "second question", "steps": [
            {"text": "second answer"}
        ]},
        {"agent": "chat", "steps": [
            {"toolCalls": [{"name": "add_message", "input": {"role": "user", "content": "more"}}]},
            {"text": "first answer"},
            {"text": "answer to steer"}
        ]}
    ]})
}

fn of<'a>(events: &'a [Sse], kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e.event == kind)
        .map(|e| &e.data)
        .collect()
}

/// In real Chromium: a tree paused on `max_steps` shows the budget notice
/// (prefilled for steps) and a "paused on budget" badge on its root; a
/// message sent with the root's "say" form is POSTed to
/// `/v1/runs/{runId}/messages` and shows under the row, as text, once its
/// `steered` event arrives; "Raise budget" PATCHes `addSteps` and the notice
/// goes as the turn completes; the follow-up form POSTs the prompt and the
/// chosen multitask to `/v1/trees/{treeId}/turns`, and the page follows the
/// new turn live: two sections, "turn 1" and "turn 2", each with its
/// prompt and its root's result. The server recorded the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_steers_raises_the_budget_and_starts_a_follow_up_turn_in_chromium() {
    let browser = Browser::new();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), CONFIG).unwrap();
    std::fs::write(dir.path().join("script.json"), script().to_string()).unwrap();
    let config = dir.path().join("config.toml");
    let mut server = Server::start(
        dir.path(),
        &["--config", config.to_str().unwrap()],
        Some(TOKEN),
    );
    server.wait_for("ready");

    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "chat", "prompt": "first question"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let tree = created["treeId"].as_str().unwrap().to_owned();
    let root_1 = created["runId"].as_str().unwrap().to_owned();
    // Its second step waits for budget before the page is opened.
    let text = read_until(&server, &root_1, "event: budgetReached", 1).await;
    assert!(!text.contains("event: agentFailed"), "{text}");

    // What the page looked like, for a person to see.
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("page-turns.png");
    let _ = std::fs::remove_file(&shot);
    let shot_paused = Path::new(env!("CARGO_TARGET_TMPDIR")).join("page-turns-paused.png");
    let _ = std::fs::remove_file(&shot_paused);
    let report = browser
        .drive(
            &browser.script("page_turns.mjs"),
            &[server.base.as_str(), TOKEN, tree.as_str(), STEER, TURN],
            &[("ARBOR_SHOT", &shot), ("ARBOR_SHOT_PAUSED", &shot_paused)],
        )
        .await;

    // Paused: the notice names the budget, its form is set for steps.
    let paused = &report["paused"];
    assert_eq!(paused["heading"], "Paused on its budget", "{report:#}");
    assert_eq!(paused["budget"], "max_steps", "{report:#}");
    assert_eq!(paused["runId"], root_1.as_str(), "{report:#}");
    assert!(
        paused["item"].as_str().unwrap().starts_with("max_steps: "),
        "{report:#}"
    );
    assert_eq!(paused["kind"], "steps", "{report:#}");
    assert_eq!(paused["rootRunId"], root_1.as_str(), "{report:#}");
    assert_eq!(paused["rootStatus"], "running", "{report:#}");
    assert_eq!(paused["badge"], "paused on budget", "{report:#}");
    // One turn: no sections yet.
    assert_eq!(paused["sections"], 0, "{report:#}");

    // Steered: the POST, and the message under the row as text.
    let steer = &report["steerRequest"];
    assert_eq!(
        steer["path"],
        format!("/v1/runs/{}/messages", encoded(&root_1)),
        "{report:#}"
    );
    assert_eq!(steer["body"], json!({"text": STEER}), "{report:#}");
    assert_eq!(steer["status"], 202, "{report:#}");
    assert_eq!(report["steered"]["text"], STEER, "{report:#}");
    assert!(
        report["steered"]["line"]
            .as_str()
            .unwrap()
            .starts_with("steered (step 2): "),
        "{report:#}"
    );
    assert_eq!(report["steered"]["elements"], 0, "{report:#}");
    assert_eq!(report["steered"]["xss"], Value::Null, "{report:#}");
    assert_eq!(report["steered"]["inputAfter"], "", "{report:#}");

    // Raised by 5 steps: 6 in force; the notice went, the turn completed.
    assert_eq!(
        report["raise"]["body"],
        json!({"addSteps": 5}),
        "{report:#}"
    );
    assert_eq!(report["raise"]["status"], 200, "{report:#}");
    assert_eq!(report["raise"]["answer"]["maxSteps"], 6, "{report:#}");
    assert_eq!(report["afterRaise"]["pausedBadges"], 0, "{report:#}");
    assert_eq!(report["afterRaise"]["steers"], 1, "{report:#}");
    assert_eq!(
        report["afterRaise"]["sayButtonShown"], "hidden",
        "{report:#}"
    );

    // Turn 2 from the form, followed live.
    let root_2 = format!("{tree}/0~1");
    assert_eq!(report["turnButton"], "Start turn 2", "{report:#}");
    let turn = &report["turnRequest"];
    assert_eq!(
        turn["path"],
        format!("/v1/trees/{tree}/turns"),
        "{report:#}"
    );
    assert_eq!(
        turn["body"],
        json!({"prompt": TURN, "multitask": "reject"}),
        "{report:#}"
    );
    assert_eq!(turn["status"], 201, "{report:#}");
    assert_eq!(turn["answer"]["runId"], root_2.as_str(), "{report:#}");
    let turns = &report["turns"];
    assert_eq!(
        turns["sections"],
        json!([
            {"turn": "1", "label": "turn 1", "status": "completed", "prompt": "first question",
             "result": "answer to steer", "roots": [root_1], "nodes": 1},
            {"turn": "2", "label": "turn 2", "status": "completed", "prompt": TURN,
             "result": "second answer", "roots": [root_2], "nodes": 1},
        ]),
        "{report:#}"
    );
    assert_eq!(turns["topLevelNodes"], 0, "{report:#}");
    assert_eq!(turns["elements"], 0, "{report:#}");
    assert_eq!(turns["xss"], Value::Null, "{report:#}");
    assert_eq!(turns["hashTree"], tree.as_str(), "{report:#}");
    assert_eq!(turns["turnButton"], "Start turn 3", "{report:#}");
    assert_eq!(turns["formShown"], true, "{report:#}");
    assert_eq!(report["consoleErrors"], json!([]), "{report:#}");

    // What the page did is what the server recorded.
    let (_, view) = get(&server, &format!("/v1/trees/{tree}")).await;
    assert_eq!(view["tree"]["status"], "completed", "{view:#}");
    assert_eq!(view["tree"]["rootRunId"], root_2.as_str(), "{view:#}");
    let roots: Vec<(&str, &str)> = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["depth"] == 0)
        .map(|n| (n["runId"].as_str().unwrap(), n["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        roots,
        [
            (root_1.as_str(), "completed"),
            (root_2.as_str(), "completed")
        ],
        "{view:#}"
    );
    let events = stream(&server, &root_1, None, |_| {}).await;
    let steered = of(&events, "steered");
    assert_eq!(steered.len(), 1, "{events:#?}");
    assert_eq!(steered[0]["text"], STEER);
    let raised = of(&events, "limitsRaised");
    assert_eq!(raised.len(), 1, "{events:#?}");
    assert_eq!(raised[0]["maxSteps"], 6);
    assert_eq!(of(&events, "budgetReached").len(), 1, "{events:#?}");
    let (_, run) = get(&server, &format!("/v1/runs/{}", encoded(&root_2))).await;
    let history = run["state"]["messageHistory"].to_string();
    assert!(
        history.contains("STEERING") && history.contains("second question <i>twice</i>"),
        "{run:#}"
    );
}
