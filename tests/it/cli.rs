//! `arbor run` and `arbor agents` through the binary.

use serde_json::Value;

use crate::{arbor, fixtures, text};

#[test]
fn run_on_the_builtin_config_shows_a_three_level_tree_and_an_output() {
    let out = arbor(&["run", "Compare three sorting algorithms"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stderr: {stderr}");
    assert!(
        stdout.contains("Compare three sorting algorithms"),
        "stdout: {stdout}"
    );
    let depth_of = |line: &str| line.len() - line.trim_start().len();
    let started: Vec<&str> = stderr
        .lines()
        .filter(|l| l.trim_start().starts_with('▸'))
        .collect();
    let deepest = started.iter().map(|l| depth_of(l)).max().unwrap();
    assert!(deepest >= 4, "expected three levels of agents:\n{stderr}");
    assert_eq!(
        started.len(),
        stderr
            .lines()
            .filter(|l| l.trim_start().starts_with('✓'))
            .count(),
        "every started agent finishes:\n{stderr}"
    );
}

#[test]
fn run_json_prints_the_root_state_with_children_in_request_order() {
    let out = arbor(&["run", "--json", "Compare three sorting algorithms"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["status"], "completed");
    let children: Vec<&str> = state["childRunIds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(children.len(), 3);
    // The spawn_agents result lists the children in request order; childRunIds matches it.
    let result = state["messageHistory"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["toolName"] == "spawn_agents")
        .unwrap();
    let entries = result["content"][0]["value"].as_array().unwrap();
    let in_request_order: Vec<&str> = entries
        .iter()
        .map(|e| e["runId"].as_str().unwrap())
        .collect();
    assert_eq!(children, in_request_order);
    let prompts: Vec<String> = entries
        .iter()
        .map(|e| e["value"]["type"].as_str().unwrap().to_owned())
        .collect();
    assert!(prompts.iter().all(|t| t == "lastMessage"), "{prompts:?}");
}

#[test]
fn a_scripted_tree_merges_in_request_order_although_children_finish_in_reverse() {
    let config = fixtures().join("scripted.toml");
    let out = arbor(&["run", "--json", "--config", config.to_str().unwrap(), "go"]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tree = state["runId"]
        .as_str()
        .unwrap()
        .strip_suffix("/0")
        .unwrap()
        .to_owned();
    let expected: Vec<String> = (1..=3).map(|i| format!("{tree}/0.{i}")).collect();
    assert_eq!(state["childRunIds"], serde_json::json!(expected));
    // The fast worker finished first, the slow one last.
    let finished: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("✓ worker"))
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(finished, vec!["0.3", "0.2", "0.1"], "{stderr}");
    // Credits roll up from every level: 0.5 + 0.25 (lead) + 0.125 (slow worker) + 0.0625 (helper).
    assert_eq!(state["creditsUsed"], 0.9375);
    assert_eq!(state["directCreditsUsed"], 0.75);
    let last = state["messageHistory"].as_array().unwrap().last().unwrap();
    assert_eq!(last["content"][0]["text"], "All three workers reported.");
}

#[test]
fn agents_lists_the_templates() {
    let out = arbor(&["agents"]);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    for agent in ["coordinator", "researcher", "analyst"] {
        assert!(stdout.contains(agent), "{stdout}");
    }
}

#[test]
fn an_unknown_agent_is_a_clear_error() {
    let out = arbor(&["run", "--agent", "nobody", "hi"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("agent type nobody not found"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bad_params_json_is_a_clear_error() {
    let out = arbor(&["run", "--params", "{oops", "hi"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--params is not valid JSON"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn params_that_are_not_a_json_object_are_refused_by_name() {
    for (params, kind) in [
        ("[1,2]", "an array"),
        ("\"str\"", "a string"),
        ("7", "a number"),
    ] {
        let out = arbor(&["run", "--params", params, "--no-store", "go"]);
        assert_eq!(out.status.code(), Some(1), "{params}");
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("params must be a JSON object, not {kind}")),
            "{params}: {err}"
        );
        assert!(text(&out.stdout).is_empty(), "{params}: nothing ran");
    }
}

#[test]
fn an_empty_prompt_adds_no_empty_message_to_the_root() {
    let out = arbor(&["run", "--json", "--no-store", "--params", "{}", ""]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    let history = state["messageHistory"].as_array().unwrap();
    assert!(
        history
            .iter()
            .all(|m| m["content"] != Value::String(String::new())
                && !m["content"].to_string().contains("Params: {}")),
        "{history:?}"
    );
}

const UNREACHABLE: &str = r#"
[models.m]
provider = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "x"
retry = { max_retries = 1, base_delay = "1ms", max_delay = "2ms" }

[agents.lead]
model = "m"
"#;

#[test]
fn a_failed_run_says_its_error_once_without_colour_codes_and_prints_nothing_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), UNREACHABLE).unwrap();
    for quiet in [false, true] {
        let mut args = vec!["run", "--no-store"];
        if quiet {
            args.push("--quiet");
        }
        args.push("go");
        let out = crate::arbor_in(dir.path(), &args);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stdout).is_empty(),
            "stdout: {}",
            text(&out.stdout)
        );
        let err = text(&out.stderr);
        // stderr is a pipe here: no ANSI escapes, in the tree or the logs.
        assert!(!err.contains('\u{1b}'), "{err:?}");
        assert_eq!(
            err.matches("Connection refused (os error 111) (gave up")
                .count(),
            1,
            "{err}"
        );
        // A final failure is not worded as if it were passing.
        assert!(
            err.contains("is unavailable:") && !err.contains("transiently"),
            "{err}"
        );
        assert!(err.contains("(gave up after 2 attempts)"), "{err}");
    }
}

/// The arguments and options of `arbor <command> --help` that have no help
/// text (only a default, or nothing).
fn undocumented(command: &str) -> Vec<String> {
    let out = arbor(&[command, "--help"]);
    assert!(out.status.success(), "{command}: {}", text(&out.stderr));
    let mut section = false;
    let mut missing = Vec::new();
    for line in text(&out.stdout).lines() {
        if line == "Arguments:" || line == "Options:" {
            section = true;
            continue;
        }
        if !line.starts_with("  ") {
            section = false;
            continue;
        }
        if !section || line.starts_with("          ") {
            continue;
        }
        let item = line.trim();
        let help = item.split_once("  ").map_or("", |(_, h)| h.trim());
        if help.is_empty() || help.starts_with("[default") {
            missing.push(format!("{command}: {item}"));
        }
    }
    missing
}

#[test]
fn every_argument_and_option_of_every_command_has_help() {
    // Every command `arbor --help` lists, so a new one is checked too.
    let out = arbor(&["--help"]);
    let help = text(&out.stdout);
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    for expected in [
        "run",
        "serve",
        "say",
        "approvals",
        "approve",
        "deny",
        "budget",
    ] {
        assert!(commands.contains(&expected), "{expected} in {commands:?}");
    }
    let missing: Vec<String> = commands.iter().flat_map(|c| undocumented(c)).collect();
    assert!(missing.is_empty(), "no help text:\n{}", missing.join("\n"));
}

/// The sections of an `arbor … --help` text: the first word of every line
/// under `Commands:` and every long flag under `Options:`.
fn help_commands_and_flags(path: &[&str]) -> (Vec<String>, Vec<String>) {
    let mut args = path.to_vec();
    args.push("--help");
    let out = arbor(&args);
    assert!(out.status.success(), "{path:?}: {}", text(&out.stderr));
    let (mut commands, mut flags) = (Vec::new(), Vec::new());
    let mut section = "";
    for line in text(&out.stdout).lines() {
        if !line.starts_with(' ') {
            section = line;
            continue;
        }
        let item = line.trim_start();
        // A wrapped help text is indented further than an item.
        if line.len() - item.len() > 6 {
            continue;
        }
        match section {
            "Commands:" => commands.extend(
                item.split_whitespace()
                    .next()
                    .filter(|c| *c != "help")
                    .map(str::to_owned),
            ),
            "Options:" => flags.extend(
                item.split(|c: char| c.is_whitespace() || c == ',')
                    .find(|w| w.starts_with("--"))
                    .filter(|f| *f != "--help" && *f != "--version")
                    .map(str::to_owned),
            ),
            _ => {}
        }
    }
    (commands, flags)
}

/// Every command `arbor --help` leads to (a command with subcommands, like
/// `store`, by its subcommands: `store copy`), with its long flags.
fn every_command_and_its_flags() -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    let mut todo: Vec<Vec<String>> = help_commands_and_flags(&[])
        .0
        .into_iter()
        .map(|c| vec![c])
        .collect();
    while let Some(path) = todo.pop() {
        let words: Vec<&str> = path.iter().map(String::as_str).collect();
        let (subcommands, flags) = help_commands_and_flags(&words);
        if subcommands.is_empty() {
            found.push((path.join(" "), flags));
        }
        todo.extend(subcommands.into_iter().map(|s| {
            let mut deeper = path.clone();
            deeper.push(s);
            deeper
        }));
    }
    found.sort();
    found
}

/// README's command table: each row's command (the words after `arbor` up to
/// the first option or argument) and the long flags its synopsis shows.
fn readme_command_table() -> Vec<(String, Vec<String>)> {
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .unwrap();
    readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `arbor "))
        .map(|row| {
            let synopsis = row.split('`').next().unwrap();
            let command = synopsis
                .split_whitespace()
                .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
                .take_while(|w| !w.starts_with('-'))
                .collect::<Vec<_>>()
                .join(" ");
            let flags = synopsis
                .match_indices("--")
                .map(|(at, _)| {
                    let name = synopsis[at + 2..]
                        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                        .next()
                        .unwrap();
                    format!("--{name}")
                })
                .collect();
            (command, flags)
        })
        .collect()
}

#[test]
fn readmes_command_table_lists_every_command_and_flag() {
    let table = readme_command_table();
    let commands = every_command_and_its_flags();
    assert!(
        commands.iter().any(|(c, _)| c == "store copy"),
        "subcommands are walked: {commands:?}"
    );
    let mut wrong = Vec::new();
    for (command, flags) in &commands {
        let Some((_, documented)) = table.iter().find(|(c, _)| c == command) else {
            wrong.push(format!("`arbor {command}` has no row"));
            continue;
        };
        for flag in flags.iter().filter(|f| !documented.contains(f)) {
            wrong.push(format!("`arbor {command}`: {flag} is not in its row"));
        }
        for flag in documented.iter().filter(|f| !flags.contains(f)) {
            wrong.push(format!(
                "`arbor {command}`: its row shows {flag}, which --help does not have"
            ));
        }
    }
    for (command, _) in &table {
        if !commands.iter().any(|(c, _)| c == command) {
            wrong.push(format!(
                "README's row `arbor {command}` is no command of `arbor --help`"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "README.md's command table and --help disagree:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn show_given_a_tree_id_says_it_is_a_tree_and_how_to_name_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = crate::arbor_in(dir.path(), &["run", "--tree-id", "tshow", "--quiet", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = crate::arbor_in(dir.path(), &["show", "tshow"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("tshow is a tree, not a run: `arbor tree tshow` lists its runs")
            && err.contains("tshow/0"),
        "{err}"
    );
}

#[test]
fn an_empty_token_variable_is_called_empty_not_unset() {
    let dir = tempfile::tempdir().unwrap();
    let config = fixtures().join("serve.toml").display().to_string();
    let server = crate::serve::Server::start(dir.path(), &["--config", &config], Some(""));
    let seen = server.seen.lock().unwrap().join("\n");
    assert!(
        seen.contains("no API tokens (ARBOR_API_TOKENS is empty)"),
        "{seen}"
    );
}

#[test]
fn the_simulated_coordinator_does_not_claim_reports_from_children_that_never_ran() {
    let dir = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml"),
    )
    .unwrap()
    .replace("max_agents = 200 ", "max_agents = 1   ");
    assert!(config.contains("max_agents = 1 "));
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let out = crate::arbor_in(dir.path(), &["run", "--no-store", "--quiet", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.starts_with("None of the 3 sub-agents reported on \"go\"."),
        "{said}"
    );
}

#[test]
fn an_agent_shows_the_same_tokens_in_the_run_tree_and_in_arbor_tree() {
    let dir = tempfile::tempdir().unwrap();
    for file in ["scripted.toml", "script.json"] {
        std::fs::copy(fixtures().join(file), dir.path().join(file)).unwrap();
    }
    let out = crate::arbor_in(
        dir.path(),
        &[
            "run",
            "--config",
            "scripted.toml",
            "--tree-id",
            "ttok",
            "go",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // "✓ worker 0.1 completed in 301ms (1 child, 43 tokens)"
    let shown: std::collections::HashMap<String, u64> = text(&out.stderr)
        .lines()
        .filter(|l| l.contains(" completed in "))
        .map(|l| {
            let path = l.split_whitespace().nth(2).unwrap().to_owned();
            let tokens = l.rsplit_once(", ").unwrap().1.split(' ').next().unwrap();
            (format!("ttok/{path}"), tokens.parse().unwrap())
        })
        .collect();
    assert_eq!(shown.len(), 5, "{}", text(&out.stderr));
    // The last line is the whole tree's, as cargo's Finished: its agents and
    // the sum of every run's tokens (the root's line has only its own).
    let stderr = text(&out.stderr);
    let last = stderr.lines().last().unwrap();
    let sum: u64 = shown.values().sum();
    assert!(
        last.starts_with("Finished tree ttok in ")
            && last.ends_with(&format!(": 5 agents (5 completed), {sum} tokens in all")),
        "{stderr}"
    );
    // A child's start line names its parent: it reads right out of order.
    assert!(stderr.contains("▸ worker 0.1 (parent 0)"), "{stderr}");
    let out = crate::arbor_in(
        dir.path(),
        &["tree", "--config", "scripted.toml", "--json", "ttok"],
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    for run in doc["runs"].as_array().unwrap() {
        let id = run["runId"].as_str().unwrap();
        let stored = run["inputTokens"].as_u64().unwrap() + run["outputTokens"].as_u64().unwrap();
        assert_eq!(shown[id], stored, "{id}: run tree vs arbor tree");
    }
}

#[test]
fn a_closed_stdout_pipe_ends_every_printing_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let out = crate::arbor_in(dir.path(), &["run", "--tree-id", "tpipe", "--quiet", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let commands: &[&[&str]] = &[
        &["export", "tpipe"],
        &["show", "tpipe/0"],
        &["tree", "tpipe", "--json"],
        &["tree", "tpipe"],
        &["runs"],
        &["runs", "--json"],
        &["agents"],
        &["tools"],
        &["models"],
        &["run", "--no-store", "--quiet", "go"],
        &["run", "--no-store", "--json", "--quiet", "go"],
        &["replay", "tpipe"],
        &["check-config"],
        &["loadtest", "--fanout", "2", "--depth", "1", "--no-store"],
    ];
    for args in commands {
        // A pipe whose reader is gone before arbor writes: every write fails
        // with EPIPE, as `arbor export T | head` does once head has exited.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_arbor"))
            .args(*args)
            .current_dir(dir.path())
            .env_remove("RUST_LOG")
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "arbor {args:?}: {err}");
        // Nothing about the pipe (the load test's progress lines are its own).
        assert!(
            !["panicked", "Broken pipe", "error"]
                .iter()
                .any(|w| err.contains(w)),
            "arbor {args:?} said: {err}"
        );
    }
}

#[test]
fn run_continue_asks_an_ended_tree_a_follow_up_question_as_its_next_turn() {
    let dir = tempfile::tempdir().unwrap();
    let out = crate::arbor_in(dir.path(), &["run", "--tree-id", "tturn", "--quiet", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = crate::arbor_in(
        dir.path(),
        &[
            "run",
            "--continue",
            "tturn",
            "--quiet",
            "--json",
            "and then?",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["runId"], "tturn/0~1");
    assert_eq!(state["agentId"], "tturn/0");
    let history = state["messageHistory"].to_string();
    assert!(
        history.contains("\"go\"") && history.contains("and then?"),
        "both turns' prompts: {history}"
    );
    let tree = crate::arbor_in(dir.path(), &["tree", "tturn", "--json"]);
    let tree: serde_json::Value = serde_json::from_slice(&tree.stdout).unwrap();
    let roots = tree["nodes"]
        .as_array()
        .or_else(|| tree["runs"].as_array())
        .map(|n| n.iter().filter(|n| n["depth"] == 0).count());
    assert_eq!(roots, Some(2), "{tree}");
    // A replay runs the latest turn again, from its record.
    let replay = crate::arbor_in(dir.path(), &["replay", "tturn"]);
    let said = text(&replay.stdout);
    assert!(
        replay.status.success() && said.contains("match:"),
        "{said}{}",
        text(&replay.stderr)
    );
    // Not a stored tree: a clear error.
    let out = crate::arbor_in(dir.path(), &["run", "--continue", "tnope", "--quiet", "hi"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("tnope"), "{}", text(&out.stderr));
}
