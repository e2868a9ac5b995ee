//! The supervisor owns every request (issue 35): the same bad request gets
//! the same error from the library (`Runtime::start_with`), the command line
//! (`arbor run`) and HTTP (`POST /v1/runs`), because each hands it to
//! `Supervisor::start`, which checks it, tightens it against its own limits
//! and decides. Each row of the table goes through every surface that can
//! say it and compares what each answers.

use arbor::config::Config;
use arbor::{Runtime, StartRequest, ToolRule, TreeLimits};
use serde_json::{Value, json};

use crate::serve::{Server, TOKEN, post};
use crate::tools::scene;
use crate::{arbor_in, text};

const CONFIG: &str = r#"
[run]
agent = "lead"

[limits]
max_depth = 2
max_steps = 10

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
"#;

/// One bad request as each surface spells it.
struct Row {
    name: &'static str,
    /// For the library: the request's model, tools rule and limits.
    model: Option<&'static str>,
    rule: Option<ToolRule>,
    limits: Option<TreeLimits>,
    /// For `arbor run` (`None`: the command line cannot ask it).
    flags: Option<Vec<&'static str>>,
    /// For `POST /v1/runs`.
    body: Value,
    /// What every surface says (after the field or flag it names).
    said: &'static str,
}

fn rows() -> Vec<Row> {
    let rule = ToolRule {
        deny: vec!["fs read".into()],
        ..ToolRule::default()
    };
    vec![
        Row {
            name: "a bad tool pattern",
            model: None,
            rule: Some(rule),
            limits: None,
            flags: Some(vec!["--deny-tools", "fs read"]),
            body: json!({"agent": "lead", "prompt": "go", "tools": {"deny": ["fs read"]}}),
            said: "pattern \"fs read\": ' ' cannot be in a tool name",
        },
        Row {
            name: "a structural built-in denied",
            model: None,
            rule: Some(ToolRule {
                deny: vec!["end_turn".into()],
                ..ToolRule::default()
            }),
            limits: None,
            flags: Some(vec!["--deny-tools", "end_turn"]),
            body: json!({"agent": "lead", "prompt": "go", "tools": {"deny": ["end_turn"]}}),
            said: "pattern \"end_turn\": end_turn is a structural built-in",
        },
        Row {
            name: "limits wider than the configured ones",
            model: None,
            rule: None,
            limits: Some(serde_json::from_value(json!({"maxSteps": 50})).expect("limits")),
            flags: None,
            body: json!({"agent": "lead", "prompt": "go", "limits": {"maxSteps": 50}}),
            said: "limits.maxSteps: asks for more than this supervisor allows (10)",
        },
        Row {
            name: "an unknown model override",
            model: Some("gpt-9"),
            rule: None,
            limits: None,
            flags: Some(vec!["--model", "gpt-9"]),
            body: json!({"agent": "lead", "prompt": "go", "model": "gpt-9"}),
            said: "model gpt-9 (used by agent lead) is not configured",
        },
    ]
}

#[tokio::test]
async fn the_same_bad_request_gets_the_same_error_from_the_library_the_cli_and_http() {
    let dir = scene(CONFIG, &json!({"replies": []}));
    let config = Config::load(&dir.path().join("config.toml")).unwrap();
    let runtime = Runtime::new(config).unwrap();
    let path = dir.path().join("config.toml").display().to_string();
    let args = ["--config", path.as_str(), "--bind", "127.0.0.1:0"];
    let mut server = Server::start(dir.path(), &args, Some(TOKEN));
    server.wait_for("ready");
    for row in rows() {
        let mut limits = row.limits.clone().unwrap_or_default();
        if let Some(rule) = row.rule.clone() {
            limits.tools = limits.tools.narrowed(rule);
        }
        let library = runtime
            .start_with(StartRequest {
                agent: "lead".into(),
                prompt: "go".into(),
                model: row.model.map(str::to_owned),
                limits: Some(limits),
                ..StartRequest::default()
            })
            .await
            .err()
            .unwrap_or_else(|| panic!("{}: the library started it", row.name))
            .to_string();
        assert!(
            library.contains(row.said),
            "{}: library said {library}",
            row.name
        );

        let (status, body) = post(&server, "/v1/runs", row.body.clone()).await;
        let http = body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert_eq!(status.as_u16(), 422, "{}: {body}", row.name);
        assert_eq!(http, library, "{}: HTTP and the library differ", row.name);

        if let Some(flags) = &row.flags {
            let mut argv = vec!["run"];
            argv.extend(flags.iter().copied());
            argv.push("go");
            let out = arbor_in(dir.path(), &argv);
            let cli = text(&out.stderr);
            assert!(cli.contains(row.said), "{}: arbor run said {cli}", row.name);
            assert_ne!(
                out.status.code(),
                Some(0),
                "{}: arbor run started it",
                row.name
            );
        }
    }
}
