//! Command tools (`[tools.NAME]` with `command`): templates, the process
//! (argv, stdin, environment, cwd), results and failures, the output cap,
//! timeouts and cancellation killing the whole process group, and the
//! problems `build` reports. Real processes: `tests/fixtures/cmd_tool.py`.

use std::path::Path;
use std::time::Duration;

use arbor::actors::{Tool, ToolContext, ToolError, ToolOutput};
use arbor::tools::command::{CommandTool, CommandToolSection};
use serde_json::{Value, json};
use tokio::time::{Instant, timeout};

use crate::fixtures;

/// The bound on any one call in these tests (their tools' timeouts are shorter).
const CALL_BOUND: Duration = Duration::from_secs(30);

fn script() -> String {
    fixtures().join("cmd_tool.py").display().to_string()
}

fn section(text: &str) -> CommandToolSection {
    toml::from_str(text).unwrap()
}

/// A tool named `name` from a TOML table, paths relative to the fixtures.
fn tool_named(name: &str, text: &str) -> CommandTool {
    section(text).build(name, &fixtures()).unwrap()
}

fn tool(text: &str) -> CommandTool {
    tool_named("t", text)
}

/// `python3 cmd_tool.py MODE` then `rest` as the command, as a TOML array.
fn command(mode: &str, rest: &[&str]) -> String {
    let mut elements = vec!["python3".to_owned(), script(), mode.to_owned()];
    elements.extend(rest.iter().map(|s| (*s).to_owned()));
    serde_json::to_string(&elements).unwrap()
}

/// A context of its own per call: calls of one tree, run and id take the
/// same call lock (they would wait for each other across tests).
fn ctx() -> ToolContext {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ToolContext {
        tree_id: format!("tree-{}", std::process::id()).parse().unwrap(),
        run_id: format!("tree-{}/0", std::process::id()).parse().unwrap(),
        agent_type: "tester".into(),
        call_id: format!("call-{n}"),
        workspace: None,
    }
}

async fn call(tool: &CommandTool, input: Value) -> Result<ToolOutput, ToolError> {
    timeout(CALL_BOUND, tool.call(input, ctx()))
        .await
        .expect("the call did not end in time")
}

/// The stdout text of a successful call.
async fn stdout(tool: &CommandTool, input: Value) -> String {
    match call(tool, input).await {
        Ok(ToolOutput::Json(Value::String(text))) => text,
        other => panic!("expected stdout text, got {other:?}"),
    }
}

/// The message of a failed call.
async fn failure(tool: &CommandTool, input: Value) -> String {
    match call(tool, input).await {
        Err(e) => e.message,
        Ok(out) => panic!("expected a failure, got {out:?}"),
    }
}

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            // "pid (comm) S ...": the state follows the last ')'.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z' | 'X' | 'x'))
        }
    }
}

/// Polls (bounded) until `pid` is gone.
async fn gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// Polls (bounded) until the fixture wrote its pid file: (its pid, the
/// grandchild's pid).
async fn pids(path: &Path) -> (u32, u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            let (own, child) = text.split_once(' ').unwrap();
            return (own.parse().unwrap(), child.parse().unwrap());
        }
        assert!(Instant::now() < deadline, "no pid file {}", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn hostile_values_are_one_literal_argument_each() {
    let dir = tempfile::tempdir().unwrap();
    let canary = dir.path().join("pwned");
    let canary2 = dir.path().join("pwned2");
    let names = [
        "space", "quotes", "semi", "subst", "tick", "star", "newline", "dash", "empty", "braces",
    ];
    let placeholders: Vec<String> = names.iter().map(|n| format!("{{{n}}}")).collect();
    let placeholders: Vec<&str> = placeholders.iter().map(String::as_str).collect();
    let properties: String = names
        .iter()
        .map(|n| format!("properties.{n} = {{ type = \"string\" }}\n"))
        .collect();
    let t = tool(&format!(
        "description = \"echo argv\"\ncommand = {}\ncwd = {:?}\n[input_schema]\ntype = \"object\"\n{properties}",
        command("argv", &placeholders),
        dir.path().display().to_string(),
    ));
    let values = json!({
        "space": "two words  and more",
        "quotes": "it's \"quoted\" 'twice'",
        "semi": "a; echo injected; b",
        "subst": format!("$(touch {})", canary.display()),
        "tick": format!("`touch {}`", canary2.display()),
        "star": "*",
        "newline": "line one\nline two",
        "dash": "-rf",
        "empty": "",
        "braces": "{space} stays {{literal}}",
    });
    let out: Value = serde_json::from_str(&stdout(&t, values.clone()).await).unwrap();
    let expected: Vec<Value> = names.iter().map(|n| values[n].clone()).collect();
    assert_eq!(out, Value::Array(expected));
    assert!(!canary.exists(), "$(…) ran");
    assert!(!canary2.exists(), "backticks ran");
}

#[tokio::test]
async fn argv_renders_values_and_drops_elements_of_absent_properties() {
    let t = tool(&format!(
        r#"
        description = "echo argv"
        command = {}
        [input_schema]
        type = "object"
        properties.n = {{ type = "number" }}
        properties.flag = {{ type = "boolean" }}
        properties.list = {{ type = "array" }}
        properties.obj = {{ type = "object" }}
        properties.glob = {{ type = "string" }}
        properties.opt = {{ type = "string" }}
        "#,
        command(
            "argv",
            &[
                "{n}",
                "--flag={flag}",
                "{list}",
                "{obj}",
                "--glob={glob}",
                "{opt}",
                "{n}-{opt}",
                "lit{{x}}",
                "{{{n}}}"
            ]
        )
    ));
    let input =
        json!({"n": 2.5, "flag": true, "list": [1, "a"], "obj": {"k": null, "a": 1}, "opt": null});
    let expected_args = [
        "2.5",
        "--flag=true",
        r#"[1,"a"]"#,
        r#"{"k":null,"a":1}"#,
        "lit{x}",
        "{2.5}",
    ];
    let argv = t.argv(&input);
    assert_eq!(argv[0], "python3");
    assert_eq!(&argv[3..], &expected_args);
    // The real process gets exactly that.
    let out: Value = serde_json::from_str(&stdout(&t, input).await).unwrap();
    assert_eq!(out, json!(expected_args));
    // With the glob: its element is back.
    let argv = t.argv(&json!({"n": 7, "flag": false, "list": [], "obj": {}, "glob": "*.rs"}));
    assert_eq!(
        &argv[3..],
        &[
            "7",
            "--flag=false",
            "[]",
            "{}",
            "--glob=*.rs",
            "lit{x}",
            "{7}"
        ]
    );
}

#[tokio::test]
async fn stdin_template_reaches_the_process_and_stdin_is_otherwise_empty() {
    let t = tool(&format!(
        r#"
        description = "cat"
        command = {}
        stdin = "hello {{who}}\n{{{{literal}}}} {{n}}{{missing}}\n"
        [input_schema]
        type = "object"
        properties.who = {{ type = "string" }}
        properties.n = {{ type = "integer" }}
        properties.missing = {{ type = "string" }}
        "#,
        command("stdin", &[])
    ));
    let input = json!({"who": "world; $(x)", "n": 3});
    assert_eq!(
        t.stdin_text(&input).as_deref(),
        Some("hello world; $(x)\n{literal} 3\n")
    );
    let out: Value = serde_json::from_str(&stdout(&t, input).await).unwrap();
    assert_eq!(out, json!("hello world; $(x)\n{literal} 3\n"));

    let t = tool(&format!(
        "description = \"cat\"\ncommand = {}\n[input_schema]\ntype = \"object\"\n",
        command("stdin", &[])
    ));
    assert_eq!(t.stdin_text(&json!({})), None);
    let out: Value = serde_json::from_str(&stdout(&t, json!({})).await).unwrap();
    assert_eq!(out, json!(""));
}

#[tokio::test]
async fn non_zero_exit_gives_the_code_and_the_tail_of_stderr() {
    let t = tool_named(
        "failing",
        &format!(
            "description = \"fails\"\ncommand = {}\n[input_schema]\ntype = \"object\"\n",
            command("fail", &["3"])
        ),
    );
    let message = failure(&t, json!({})).await;
    assert!(
        message.starts_with("command failing exited with code 3\n"),
        "{message}"
    );
    // 1000 lines of 11 bytes, then 18: the last 4096 bytes are shown.
    assert!(
        message.contains("stderr (the last 4096 of 11018 bytes):"),
        "{message}"
    );
    assert!(message.contains("the end of stderr"), "{message}");
    assert!(message.contains("line 00999"), "{message}");
    assert!(!message.contains("line 00000"), "{message}");
    assert!(message.ends_with("stdout:\npartial result"), "{message}");
}

#[tokio::test]
async fn death_by_signal_is_named() {
    let t = tool(&format!(
        "description = \"dies\"\ncommand = {}\n[input_schema]\ntype = \"object\"\n",
        command("signal", &[])
    ));
    let message = failure(&t, json!({})).await;
    assert!(
        message.starts_with("command t was killed by signal 15 (SIGTERM)"),
        "{message}"
    );
}

#[tokio::test]
async fn oversized_output_is_cut_with_exact_counts() {
    let t = tool(&format!(
        r#"
        description = "big"
        command = {}
        max_output_bytes = 1000
        [input_schema]
        type = "object"
        properties.n = {{ type = "integer" }}
        "#,
        command("big", &["{n}"])
    ));
    // Far more than a pipe buffer: the rest is drained, not left to block the writer.
    let text = stdout(&t, json!({"n": 250_000})).await;
    assert_eq!(
        text,
        format!(
            "{}\n[output cut: showed the first 1000 of 250000 bytes]",
            "x".repeat(1000)
        )
    );
    // Exactly at the cap: no note.
    assert_eq!(stdout(&t, json!({"n": 1000})).await, "x".repeat(1000));
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    let t = tool_named(
        "rg",
        &format!(
            r#"
            description = "hangs"
            command = {}
            timeout = "3s"
            [input_schema]
            type = "object"
            properties.pidfile = {{ type = "string" }}
            "#,
            command("spawn", &["{pidfile}"])
        ),
    );
    let message = failure(&t, json!({"pidfile": pidfile.display().to_string()})).await;
    assert_eq!(
        message,
        "command rg timed out after 3s (process group killed)"
    );
    let (own, grandchild) = pids(&pidfile).await;
    assert!(gone(own).await, "the program {own} survived its timeout");
    assert!(
        gone(grandchild).await,
        "the grandchild {grandchild} survived the timeout"
    );
}

#[tokio::test]
async fn cancelling_the_call_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    let t = tool(&format!(
        r#"
        description = "hangs"
        command = {}
        [input_schema]
        type = "object"
        properties.pidfile = {{ type = "string" }}
        "#,
        command("spawn", &["{pidfile}"])
    ));
    let call = t.call(json!({"pidfile": pidfile.display().to_string()}), ctx());
    // The call future is dropped when the pid file appears.
    let (own, grandchild) = tokio::select! {
        result = call => panic!("the call ended: {result:?}"),
        pids = pids(&pidfile) => pids,
    };
    assert!(gone(own).await, "the program {own} survived the cancel");
    assert!(
        gone(grandchild).await,
        "the grandchild {grandchild} survived the cancel"
    );
}

#[tokio::test]
async fn leftovers_in_the_group_are_killed_when_the_program_exits() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    let t = tool(&format!(
        r#"
        description = "leaves a sleep behind"
        command = {}
        [input_schema]
        type = "object"
        properties.pidfile = {{ type = "string" }}
        "#,
        command("leave", &["{pidfile}"])
    ));
    // The grandchild (a `sleep 30`) holds stdout open; the call still ends
    // with the output, well before the sleep would.
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        stdout(&t, json!({"pidfile": pidfile.display().to_string()})),
    )
    .await
    .expect("the call waited for the grandchild's end");
    assert_eq!(out, "done\n");
    let (_, grandchild) = pids(&pidfile).await;
    assert!(
        gone(grandchild).await,
        "the grandchild {grandchild} survived"
    );
}

#[tokio::test]
async fn only_listed_variables_and_path_are_passed() {
    // Cargo sets both for a test run; only the first is listed.
    assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    // `env` itself (not python3, which may be a shim that changes the environment).
    let t = tool(
        r#"
        description = "env"
        command = ["env"]
        env = ["CARGO_PKG_NAME", "ARBOR_TEST_SURELY_UNSET_VARIABLE"]
        [input_schema]
        type = "object"
        "#,
    );
    let out = stdout(&t, json!({})).await;
    let mut env: Vec<(&str, &str)> = out.lines().map(|l| l.split_once('=').unwrap()).collect();
    env.sort_unstable();
    let path = std::env::var("PATH").unwrap();
    assert_eq!(
        env,
        [
            ("CARGO_PKG_NAME", env!("CARGO_PKG_NAME")),
            ("PATH", path.as_str())
        ]
    );
}

#[tokio::test]
async fn cwd_is_relative_to_the_base_dir_and_so_is_a_relative_program() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let t = section(&format!(
        "description = \"pwd\"\ncommand = {}\ncwd = \"sub\"\n[input_schema]\ntype = \"object\"\n",
        command("cwd", &[])
    ))
    .build("t", dir.path())
    .unwrap();
    let out = stdout(&t, json!({})).await;
    assert_eq!(
        Path::new(out.trim_end()).canonicalize().unwrap(),
        dir.path().join("sub").canonicalize().unwrap()
    );

    // "./cmd_tool.py" is the fixture (relative to the base dir), not ./ of the test.
    let t = tool(
        r#"
        description = "argv"
        command = ["./cmd_tool.py", "argv", "{a}"]
        [input_schema]
        type = "object"
        properties.a = { type = "string" }
        "#,
    );
    assert_eq!(t.program(), fixtures().join("cmd_tool.py"));
    assert_eq!(stdout(&t, json!({"a": "x y"})).await, "[\"x y\"]\n");
}

#[tokio::test]
async fn a_program_that_cannot_start_is_named() {
    let t = tool_named(
        "ghost",
        "description = \"x\"\ncommand = [\"arbor-no-such-program-7f3a\", \"--help\"]\n[input_schema]\ntype = \"object\"\n",
    );
    let message = failure(&t, json!({})).await;
    assert!(
        message.starts_with("command ghost could not start program \"arbor-no-such-program-7f3a\""),
        "{message}"
    );
    assert!(message.contains("No such file"), "{message}");

    // A file without the execute bit.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("plain.sh"), "echo hi\n").unwrap();
    let t = section(
        "description = \"x\"\ncommand = [\"./plain.sh\"]\n[input_schema]\ntype = \"object\"\n",
    )
    .build("plain", dir.path())
    .unwrap();
    let message = failure(&t, json!({})).await;
    assert!(message.contains("plain.sh"), "{message}");
    assert!(message.contains("Permission denied"), "{message}");
}

fn problems(text: &str) -> Vec<(String, String)> {
    match section(text).build("t", &fixtures()) {
        Ok(_) => panic!("built: {text}"),
        Err(problems) => problems,
    }
}

fn keys(problems: &[(String, String)]) -> Vec<&str> {
    problems.iter().map(|(k, _)| k.as_str()).collect()
}

#[test]
fn build_reports_every_problem_with_its_key() {
    let found = problems(
        r#"
        description = "everything wrong"
        command = []
        stdin = "hello {nobody"
        cwd = "no-such-directory"
        env = ["A=B"]
        timeout = "soon"
        max_output_bytes = 0
        [input_schema]
        type = "string"
        "#,
    );
    assert_eq!(
        keys(&found),
        [
            "input_schema",
            "command",
            "stdin",
            "cwd",
            "env",
            "timeout",
            "max_output_bytes"
        ],
        "{found:?}"
    );
    let message = |key: &str| {
        found
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, m)| m.clone())
            .unwrap()
    };
    assert!(message("command").contains("is empty"));
    assert!(message("stdin").contains("unclosed `{`"));
    assert!(message("cwd").contains("no-such-directory"));
    assert!(message("input_schema").contains("type = \"object\""));
    assert!(message("timeout").contains("soon"));
    // Its range (issue 12, defect 7): from 1 byte to 64 MiB.
    assert!(message("max_output_bytes").contains("must be from 1 to 67108864"));
}

#[test]
fn build_reports_template_problems() {
    let found = problems(
        r#"
        description = "bad templates"
        command = ["{prog}", "{pattern}", "{nope}", "--glob={glob", "a}b", "{}", "ok {{x}}"]
        stdin = "{missing} {pattern}"
        timeout = "0"
        [input_schema]
        type = "object"
        properties.pattern = { type = "string" }
        properties.prog = { type = "string" }
        "#,
    );
    let messages: Vec<String> = found.iter().map(|(k, m)| format!("{k}: {m}")).collect();
    assert_eq!(
        keys(&found),
        [
            "command", "command", "command", "command", "command", "stdin", "timeout"
        ],
        "{messages:#?}"
    );
    assert!(
        messages[0]
            .contains("command[0] (\"{prog}\") is the program and may not contain placeholders")
    );
    assert_eq!(
        messages[1],
        "command: command[2] (\"{nope}\"): placeholder {nope} is not a property of input_schema (input_schema's properties are: pattern, prog)"
    );
    assert!(messages[2].contains("command[3]") && messages[2].contains("unclosed `{`"));
    assert!(messages[3].contains("command[4]") && messages[3].contains("unmatched `}`"));
    assert!(messages[4].contains("command[5]") && messages[4].contains("empty placeholder"));
    assert!(messages[5].contains("placeholder {missing}"));
    assert!(
        messages[6].contains("must be at least 1ms"),
        "{messages:#?}"
    );

    // No properties at all.
    let found = problems(
        "description = \"x\"\ncommand = [\"echo\", \"{a}\"]\n[input_schema]\ntype = \"object\"\n",
    );
    assert!(
        found[0].1.contains("input_schema defines no properties"),
        "{found:?}"
    );
}

#[test]
fn build_reports_schemas_that_do_not_compile() {
    let found = problems(
        r#"
        description = "x"
        command = ["echo", "{a}"]
        [input_schema]
        type = "object"
        properties.a = { type = "no-such-type" }
        "#,
    );
    assert_eq!(keys(&found), ["input_schema"], "{found:?}");
    assert!(
        found[0].1.contains("is not a valid JSON Schema"),
        "{found:?}"
    );
}

#[test]
fn unknown_keys_are_rejected() {
    let err = toml::from_str::<CommandToolSection>(
        "description = \"x\"\ncommand = [\"echo\"]\nshell = true\n[input_schema]\ntype = \"object\"\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("shell"), "{err}");
}

#[test]
fn defaults() {
    let t = tool("description = \"x\"\ncommand = [\"echo\"]\n[input_schema]\ntype = \"object\"\n");
    assert_eq!(t.timeout(), Duration::from_secs(60));
    assert_eq!(t.max_output_bytes(), 100_000);
    assert_eq!(t.name(), "t");
    assert_eq!(t.description(), "x");
    assert_eq!(t.input_schema(), json!({"type": "object"}));
    assert_eq!(t.argv(&json!({})), ["echo"]);
}
