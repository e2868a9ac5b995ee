//! The supervisor owns every request (issue 35): the same bad request gets
//! the same error from the library (`Runtime::start_with`), the command line
//! (`arbor run`) and HTTP (`POST /v1/runs`), because each hands it to
//! `Supervisor::start`, which checks it, tightens it against its own limits
//! and decides. Each row of the table goes through every surface that can
//! say it and compares what each answers. A follow-up turn on a running
//! tree is asked the same way of `Runtime::start_turn`, `POST
//! /v1/trees/{treeId}/turns` and `arbor run --continue`, under each
//! multitask policy: each hands it to `Supervisor::start_turn`.

use arbor::config::Config;
use arbor::{Multitask, Runtime, StartRequest, ToolRule, TreeLimits, TurnRequest, TurnRun};
use serde_json::{Value, json};

use crate::serve::{Server, TOKEN, post};
use crate::tools::scene;
use crate::{arbor_in, text};

/// A tree id from a test's literal.
fn as_tree(id: &str) -> arbor::TreeId {
    id.parse().unwrap()
}

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

/// A lead whose `echo` calls wait for a person's decision, and a store that
/// `arbor serve`, `arbor run` and the library share (one SQLite file).
const WAITS: &str = r#"
[run]
agent = "lead"

[store]
path = "arbor.db"

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

/// The answer of a follow-up turn asked with `instead` in its prompt.
const INSTEAD: &str = "the new turn's answer";

/// Bounds every wait of the turns test (none is reached when things work).
const GUARD: std::time::Duration = std::time::Duration::from_secs(60);

/// A surface a follow-up turn is asked through.
#[derive(Clone, Copy, Debug)]
enum Surface {
    /// `Runtime::start_turn`, in the test's process, on the server's store file.
    Library,
    /// `POST /v1/trees/{treeId}/turns` of the `arbor serve` that runs the tree.
    Http,
    /// `arbor run --continue TREE --multitask M`, a process on the same store.
    Cli,
}

const SURFACES: [Surface; 3] = [Surface::Library, Surface::Http, Surface::Cli];

/// What a surface answered a follow-up turn.
#[derive(Debug, PartialEq)]
enum Answer {
    /// Refused, saying this (the CLI: its whole stderr, and it exited non-zero).
    Refused(String),
    /// Queued as this run to be, at this place in line.
    Queued { run_id: String, position: usize },
}

/// Starts a tree through `server` and waits until its root asks for a
/// person's decision on its `echo` call: a turn that runs until decided.
async fn waiting_tree(server: &Server) -> String {
    let (status, created) =
        post(server, "/v1/runs", json!({"agent": "lead", "prompt": "go"})).await;
    assert_eq!(status.as_u16(), 201, "{created}");
    let root = created["runId"].as_str().unwrap().to_owned();
    crate::approvals_restart::read_until(server, &root, "event: approvalRequested", 1).await;
    created["treeId"].as_str().unwrap().to_owned()
}

/// Waits (bounded) until `run_id` has a final state: its view.
async fn ended(server: &Server, run_id: &str) -> Value {
    let started = std::time::Instant::now();
    loop {
        let path = format!("/v1/runs/{}", crate::serve::encoded(run_id));
        let (status, view) = crate::serve::get(server, &path).await;
        if status.as_u16() == 200 && view["final"] == true {
            return view;
        }
        assert!(
            started.elapsed() < GUARD,
            "run {run_id} did not end within {GUARD:?} ({status}: {view})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// `arbor run --continue` as a child process whose stderr is read line by
/// line, so that a queued turn's line is seen while the command waits.
struct Continue {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    said: String,
}

impl Continue {
    fn start(dir: &std::path::Path, tree: &str, multitask: Multitask, prompt: &str) -> Continue {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_arbor"))
            .args([
                "run",
                "--continue",
                tree,
                "--multitask",
                multitask.as_str(),
                prompt,
            ])
            .current_dir(dir)
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Continue {
            child,
            lines,
            said: String::new(),
        }
    }

    /// Its answer: the turn it queued (it goes on waiting for it), or its
    /// refusal once it has exited (non-zero).
    fn answer(&mut self) -> Answer {
        let started = std::time::Instant::now();
        loop {
            let left = GUARD.saturating_sub(started.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.said.push_str(&line);
                    self.said.push('\n');
                    // "turn N of tree T queued as T/0~N (place P in line): …"
                    if let Some((_, rest)) = line.split_once(" queued as ") {
                        let (run_id, rest) = rest.split_once(" (place ").unwrap();
                        let (position, _) = rest.split_once(' ').unwrap();
                        return Answer::Queued {
                            run_id: run_id.to_owned(),
                            position: position.parse().unwrap(),
                        };
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.exit();
                    assert!(!status.success(), "arbor run exited 0: {}", self.said);
                    return Answer::Refused(self.said.clone());
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!(
                        "arbor run neither queued nor refused within {GUARD:?}: {}",
                        self.said
                    );
                }
            }
        }
    }

    /// Waits (bounded) for it to exit: its status.
    fn exit(&mut self) -> std::process::ExitStatus {
        let started = std::time::Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if started.elapsed() > GUARD {
                let _ = self.child.kill();
                panic!("arbor run did not exit within {GUARD:?}: {}", self.said);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Its stdout, once it has exited.
    fn printed(self) -> String {
        let out = self.child.wait_with_output().unwrap();
        text(&out.stdout)
    }

    /// SIGTERM: it exits at once and leaves its queued turn in the queue.
    fn stop(&mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = self.exit();
        assert_eq!(status.code(), Some(143), "{}", self.said);
    }
}

/// Asks the running tree `tree` a follow-up turn through `surface`: what it
/// answered, and the `arbor run` that still waits for its queued turn.
async fn ask(
    surface: Surface,
    runtime: &Runtime,
    server: &Server,
    dir: &std::path::Path,
    tree: &str,
    multitask: Multitask,
    prompt: &str,
) -> (Answer, Option<Continue>) {
    match surface {
        Surface::Library => {
            let request = TurnRequest {
                prompt: prompt.to_owned(),
                params: None,
                multitask,
                ..TurnRequest::default()
            };
            let answer = match runtime.start_turn(&as_tree(tree), request).await {
                Err(error) => Answer::Refused(error.to_string()),
                Ok(TurnRun::Queued(queued)) => Answer::Queued {
                    run_id: queued.turn.run_id().to_string(),
                    position: queued.turn.position,
                },
                Ok(TurnRun::Started(_)) => panic!("the library started a turn of a running tree"),
            };
            (answer, None)
        }
        Surface::Http => {
            let body = json!({"prompt": prompt, "multitask": multitask.as_str()});
            let (status, body) = post(server, &format!("/v1/trees/{tree}/turns"), body).await;
            let answer = match status.as_u16() {
                409 => {
                    assert_eq!(body["error"]["code"], "conflict", "{body}");
                    Answer::Refused(body["error"]["message"].as_str().unwrap().to_owned())
                }
                202 => {
                    assert_eq!(body["queued"], true, "{body}");
                    Answer::Queued {
                        run_id: body["runId"].as_str().unwrap().to_owned(),
                        position: body["position"].as_u64().unwrap() as usize,
                    }
                }
                other => panic!("POST /v1/trees/{tree}/turns answered {other}: {body}"),
            };
            (answer, None)
        }
        Surface::Cli => {
            let (dir, tree, prompt) = (dir.to_owned(), tree.to_owned(), prompt.to_owned());
            tokio::task::spawn_blocking(move || {
                let mut cli = Continue::start(&dir, &tree, multitask, &prompt);
                let answer = cli.answer();
                let waiting = matches!(answer, Answer::Queued { .. }).then_some(cli);
                (answer, waiting)
            })
            .await
            .unwrap()
        }
    }
}

/// The turns a tree has queued, as the store lists them: (run id, prompt).
async fn queued(runtime: &Runtime, tree: &str) -> Vec<(String, String)> {
    let tree = tree.to_owned();
    runtime
        .supervisor()
        .read_store(move |store| store.queued_turns(&as_tree(&tree)))
        .await
        .unwrap()
        .into_iter()
        .map(|q| (q.run_id().to_string(), q.prompt))
        .collect()
}

/// A follow-up turn asked of a tree that is running a turn (its root waits
/// for a person's decision on a call, so it runs until decided or
/// cancelled) gets the same answer from each surface under each multitask
/// policy: `reject` the same refusal (HTTP 409 `conflict`, `arbor run` a
/// non-zero exit, the library an `Err`, all saying the supervisor's text),
/// `enqueue` a turn queued in the store at the next place in line, the
/// running turn untouched, and `interrupt` a queued turn and the running
/// turn cancelled, after which the queued turn runs from the cancelled
/// turn's state.
///
/// What they share: one `arbor serve` runs every tree and answers HTTP;
/// `arbor run --continue` is its own process on the same store file, and
/// the library is a `Runtime` of the test's process on that file too (a
/// store is shared by the processes that open it: docs/store.md, "Two
/// processes on one file"). Each asks `Supervisor::start_turn`, which reads
/// the tree's turn as running from the store and decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_turn_on_a_running_tree_gets_the_same_answer_from_the_library_the_cli_and_http_under_each_multitask_policy()
 {
    let script = json!({"replies": [
        {"agent": "lead", "prompt": "instead", "steps": [{"text": INSTEAD}]},
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"word": "model"}}]},
            {"text": "done"}
        ]}
    ]});
    let dir = scene(WAITS, &script);
    let config = Config::load(&dir.path().join("config.toml")).unwrap();
    let runtime = Runtime::with_store(config, &dir.path().join("arbor.db")).unwrap();
    let mut server = Server::start(
        dir.path(),
        &["--config", "config.toml", "--bind", "127.0.0.1:0"],
        Some(TOKEN),
    );
    server.wait_for("ready");
    let tree = waiting_tree(&server).await;

    // reject: the same refusal everywhere, nothing queued.
    let refusal = format!("tree {tree} is running a turn (multitask = reject)");
    for surface in SURFACES {
        let (answer, _) = ask(
            surface,
            &runtime,
            &server,
            dir.path(),
            &tree,
            Multitask::Reject,
            "refused",
        )
        .await;
        let Answer::Refused(said) = answer else {
            panic!("{surface:?} did not refuse a turn with reject: {answer:?}");
        };
        match surface {
            Surface::Cli => assert!(said.contains(&refusal), "{surface:?} said {said}"),
            _ => assert_eq!(said, refusal, "{surface:?}"),
        }
    }
    assert_eq!(
        queued(&runtime, &tree).await,
        vec![],
        "reject queued a turn"
    );

    // enqueue: each queued at the next place in line; the running turn runs on.
    let mut waiting = Vec::new();
    let mut expected = Vec::new();
    for (i, surface) in SURFACES.into_iter().enumerate() {
        let prompt = format!("later, from {surface:?}");
        let (answer, cli) = ask(
            surface,
            &runtime,
            &server,
            dir.path(),
            &tree,
            Multitask::Enqueue,
            &prompt,
        )
        .await;
        let run_id = format!("{tree}/0~{}", i + 1);
        assert_eq!(
            answer,
            Answer::Queued {
                run_id: run_id.clone(),
                position: i + 1
            },
            "{surface:?}"
        );
        expected.push((run_id, prompt));
        waiting.extend(cli);
    }
    for mut cli in waiting {
        cli.stop();
    }
    assert_eq!(queued(&runtime, &tree).await, expected);
    let path = format!("/v1/runs/{}", crate::serve::encoded(&format!("{tree}/0")));
    let (_, root) = crate::serve::get(&server, &path).await;
    assert_eq!(
        root["final"], false,
        "enqueue ended the running turn: {root}"
    );

    // interrupt: queued, the running turn cancelled, the new turn run after it.
    for surface in SURFACES {
        let tree = waiting_tree(&server).await;
        let prompt = format!("instead, from {surface:?}");
        let (answer, cli) = ask(
            surface,
            &runtime,
            &server,
            dir.path(),
            &tree,
            Multitask::Interrupt,
            &prompt,
        )
        .await;
        let run_id = format!("{tree}/0~1");
        assert_eq!(
            answer,
            Answer::Queued {
                run_id: run_id.clone(),
                position: 1
            },
            "{surface:?}"
        );
        let first = ended(&server, &format!("{tree}/0")).await;
        assert_eq!(
            first["state"]["status"], "cancelled",
            "{surface:?}: {first}"
        );
        let second = ended(&server, &run_id).await;
        assert_eq!(
            second["state"]["status"], "completed",
            "{surface:?}: {second}"
        );
        if let Some(mut cli) = cli {
            let status = tokio::task::spawn_blocking(move || {
                let status = cli.exit();
                (status, cli.said.clone(), cli.printed())
            })
            .await
            .unwrap();
            assert!(status.0.success(), "{surface:?}: {}", status.1);
            assert_eq!(status.2.trim(), INSTEAD, "{surface:?}: {}", status.1);
        }
    }
}
