//! Codebuff's agent definitions through the binary (issue 37): a project's
//! `.agents` directory (tests/fixtures/codebuff-dot-agents, written as
//! Codebuff's docs show `AgentDefinition` files: plain ones, ones with
//! `handleSteps`, relative imports of constants and helpers, type-only
//! imports, a `.json` one) loads with one command and each agent runs on
//! the scripted model; TOML templates and loaded ones spawn each other; the
//! context-pruner pattern prunes a long conversation before each step; an
//! unsupported field or an unresolvable import is named at its `file:line`.

use std::path::Path;

use arbor_test_support::{call, spawn_call};
use serde_json::{Value, json};

use crate::{arbor_in, fixtures, text};

/// A project: the fixtures as its `.agents`, a config whose models are the
/// scripted one behind Codebuff's OpenRouter-style ids, a TOML `lead` that
/// spawns the loaded `coordinator`, and a TOML `summarizer` it spawns.
fn project(dir: &Path, script: Value) {
    copy_dir(
        &fixtures().join("codebuff-dot-agents"),
        &dir.join(".agents"),
    );
    std::fs::write(
        dir.join("config.toml"),
        r#"
[models.script]
provider = "scripted"
file = "script.json"

[model_aliases]
"anthropic/claude-sonnet-4.5" = "script"
"openai/gpt-5-mini" = "script"

[agents.lead]
model = "script"
spawnable_agents = ["coordinator"]

[agents.summarizer]
model = "script"
description = "Summarises"
"#,
    )
    .unwrap();
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn events(lines: &[u8]) -> Vec<Value> {
    text(lines)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `arbor run` in the project (its `.agents` is looked up there), printing
/// the root's final state and the events.
fn run(dir: &Path, agent: &str, extra: &[&str], prompt: &str) -> (Value, Vec<Value>) {
    let mut args = vec!["run", "--no-store", "--agent", agent, "--json", "--events"];
    args.extend_from_slice(extra);
    args.push(prompt);
    let out = arbor_in(dir, &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: Value = serde_json::from_slice(&out.stdout).expect("the final state as JSON");
    (state, events(&out.stderr))
}

#[test]
fn a_codebuff_agents_directory_loads_with_one_command_and_each_agent_runs() {
    let dir = tempfile::tempdir().unwrap();
    project(
        dir.path(),
        json!({"replies": [
            {"agent": "file-picker", "prompt": "area: auth", "steps": [{"text": "src/auth.rs"}]},
            {"agent": "file-picker", "prompt": "area: storage", "steps": [{"text": "src/db.rs"}]},
            {"agent": "file-picker", "steps": [{"text": "src/main.rs"}]},
            {"agent": "reviewer", "steps": [{"text": "LGTM"}]},
        ]}),
    );
    // `arbor agents` lists them, each from its file; helpers, types and the
    // README are not agents.
    let out = arbor_in(dir.path(), &["agents"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    for agent in [
        "file-picker",
        "file-explorer",
        "coordinator",
        "context-pruner",
        "thinker",
        "reviewer",
        "lead",
    ] {
        assert!(listed.contains(agent), "{agent}: {listed}");
    }
    assert!(listed.contains("file-explorer.ts"), "{listed}");
    assert!(!listed.contains("helpers"), "{listed}");

    // A plain one: its placeholders expanded in the prompt the model gets.
    let (state, _) = run(dir.path(), "file-picker", &[], "find the entry point");
    assert_eq!(state["status"], "completed", "{state}");
    assert_eq!(state["finalText"], "src/main.rs", "{state}");
    let system = state["systemPrompt"].as_str().unwrap();
    assert!(
        system.starts_with("You are Fletcher the File Fetcher, an expert"),
        "{system}"
    );
    assert!(
        system.contains("- find_files: ") && system.contains("- read_files: "),
        "{system}"
    );
    assert!(!system.contains("{CODEBUFF_"), "{system}");

    // One with handleSteps and imports: one picker per param, its output set
    // without a model call of its own.
    let (state, events) = run(
        dir.path(),
        "file-explorer",
        &["--params", r#"{"prompts": ["auth", "storage"]}"#],
        "add login throttling",
    );
    assert_eq!(state["status"], "completed", "{state}");
    let output = state["output"]["results"].to_string();
    assert!(
        output.contains("src/auth.rs") && output.contains("src/db.rs"),
        "{output}"
    );
    let root = state["runId"].clone();
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "modelResponded" && e["runId"] == root),
        "the explorer called the model"
    );

    // A `.json` one.
    let (state, _) = run(dir.path(), "reviewer", &[], "review it");
    assert_eq!(state["finalText"], "LGTM", "{state}");
}

#[test]
fn toml_templates_and_codebuff_agents_spawn_each_other() {
    let dir = tempfile::tempdir().unwrap();
    project(
        dir.path(),
        json!({"replies": [
            {"agent": "lead", "steps": [
                {"toolCalls": [spawn_call(&[("coordinator", "sum it up")])]},
                {"text": "lead done"}
            ]},
            {"agent": "coordinator", "steps": [
                {"toolCalls": [spawn_call(&[("summarizer", "the summary")])]},
                {"toolCalls": [call("end_turn", json!({}))]}
            ]},
            {"agent": "summarizer", "steps": [{"text": "SUMMARY"}]},
        ]}),
    );
    let (state, events) = run(dir.path(), "lead", &[], "go");
    assert_eq!(state["status"], "completed", "{state}");
    let spawned: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "childSpawned")
        .filter_map(|e| e["agentType"].as_str())
        .collect();
    assert_eq!(spawned, ["coordinator", "summarizer"], "{events:?}");
    // The coordinator's prompts: the agents prompt lists the TOML agent it
    // may spawn; the step prompt has its budget.
    let finished = events
        .iter()
        .find(|e| e["type"] == "agentFinished" && e["state"]["agentType"] == "coordinator")
        .expect("the coordinator finished");
    let system = finished["state"]["systemPrompt"].as_str().unwrap();
    assert!(system.starts_with("You are Coordinator."), "{system}");
    assert!(system.contains("- summarizer: Summarises"), "{system}");
    assert!(
        finished["state"]["messageHistory"]
            .to_string()
            .contains("SUMMARY"),
        "{finished}"
    );
}

#[test]
fn the_context_pruner_spawned_inline_before_each_step_keeps_a_long_conversation_short() {
    let dir = tempfile::tempdir().unwrap();
    // Each thought is about 2000 tokens; the pruner keeps the request and
    // the newest call with its result. Steps alternate: the pruner's
    // (a program's tool batch, no model call), then the model's.
    let thought = |tag: &str| format!("{tag} {}", "lorem ipsum ".repeat(700));
    let think =
        |tag: &str| json!({"toolCalls": [call("think_deeply", json!({"thought": thought(tag)}))]});
    let skip = json!({"text": "not a model step"});
    project(
        dir.path(),
        json!({"replies": [
            {"agent": "thinker", "steps": [
                skip, think("FIRST"), skip, think("SECOND"), skip, think("THIRD"), skip,
                {"text": "all thought through"}
            ]},
        ]}),
    );
    let (state, events) = run(dir.path(), "thinker", &[], "think about caching");
    assert_eq!(state["status"], "completed", "{state}");
    assert_eq!(state["finalText"], "all thought through", "{state}");
    // What each pruner left is the history the model's next request is
    // built from: the request and at most the newest thought, never two.
    let left: Vec<String> = events
        .iter()
        .filter(|e| e["type"] == "agentFinished" && e["state"]["agentType"] == "context-pruner")
        .map(|e| e["state"]["messageHistory"].to_string())
        .collect();
    assert_eq!(left.len(), 4, "one pruner before each model step");
    for (i, history) in left.iter().enumerate() {
        assert!(
            history.contains("think about caching"),
            "pruner {i}: {history}"
        );
        let thoughts = ["FIRST", "SECOND", "THIRD"]
            .iter()
            .filter(|t| history.contains(*t))
            .count();
        assert_eq!(
            thoughts,
            i.min(1),
            "pruner {i} left {thoughts} thoughts: {history}"
        );
    }
    assert!(left[3].contains("THIRD"), "{}", left[3]);
    let steps: Vec<u64> = events
        .iter()
        .filter(|e| e["type"] == "modelResponded" && e["runId"] == state["runId"])
        .filter_map(|e| e["step"].as_u64())
        .collect();
    assert_eq!(
        steps,
        [2, 4, 6, 8],
        "the model's steps, each after a pruner's"
    );
    // The history it ends with: the request, the newest call and its
    // result, the answer; neither the pruner's calls nor older thoughts.
    let history = state["messageHistory"].to_string();
    assert!(history.contains("think about caching"), "{history}");
    assert!(history.contains("THIRD"), "{history}");
    for gone in ["FIRST", "SECOND", "spawn_agent_inline", "set_messages"] {
        assert!(!history.contains(gone), "{gone} is still there: {history}");
    }
}

#[test]
fn an_unsupported_field_or_an_unresolvable_import_is_named_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    project(dir.path(), json!({"replies": []}));
    let agents = dir.path().join(".agents");
    std::fs::write(
        agents.join("odd.ts"),
        "import type { AgentDefinition } from './types/agent-definition'\n\nconst definition: AgentDefinition = {\n  id: 'odd',\n  displayName: 'Odd',\n  model: 'openai/gpt-5-mini',\n  toolNames: ['web_search'],\n  maxSteps: 3,\n} as any\n\nexport default definition\n",
    )
    .unwrap();
    std::fs::write(
        agents.join("needs-package.ts"),
        "import { AgentTemplateTypes } from '@codebuff/common/types/session-state'\nimport { MODEL } from './constants'\n\nexport default { id: AgentTemplateTypes.x, displayName: 'X', model: MODEL }\n",
    )
    .unwrap();
    let out = arbor_in(dir.path(), &["check-config", "config.toml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let report = text(&out.stdout) + &text(&out.stderr);
    assert!(
        report.contains(
            "odd.ts:7: toolNames: \"web_search\" is a Codebuff tool Arbor has no counterpart of"
        ),
        "{report}"
    );
    assert!(
        report.contains("odd.ts:8: maxSteps: unknown field `maxSteps`"),
        "{report}"
    );
    assert!(
        report.contains("needs-package.ts:1: (module): import '@codebuff/common/types/session-state': a package import cannot be resolved"),
        "{report}"
    );
}

/// Codebuff's placeholders that describe the project and the run are filled
/// per tree from its workspace: a git repository with a knowledge file, an
/// ignored directory and a change not committed (its `.agents` there, where
/// `arbor run --workspace` finds it);
/// the prompt the model gets names the root, shows the tree (ignored files left out), the git changes
/// and the knowledge, the date and the user's prompt; and a replay of the
/// stored tree fills them the same.
#[test]
fn the_project_placeholders_are_filled_from_the_trees_workspace_and_a_replay_matches() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[models.script]\nprovider = \"scripted\"\nfile = \"script.json\"\n\n\
         [model_aliases]\n\"anthropic/claude-sonnet-4.5\" = \"script\"\n",
    )
    .unwrap();
    let script = json!({"replies": [{"agent": "context-reader", "steps": [{"text": "Read it."}]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let ws = dir.path().join("app");
    std::fs::create_dir_all(ws.join(".agents")).unwrap();
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::create_dir_all(ws.join("target")).unwrap();
    std::fs::write(ws.join("src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(ws.join("target/built.bin"), "x").unwrap();
    std::fs::write(ws.join(".gitignore"), "target/\n").unwrap();
    std::fs::write(
        ws.join("knowledge.md"),
        "Run `make test` before committing.\n",
    )
    .unwrap();
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
            .args(args)
            .current_dir(&ws)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
    };
    // As Codebuff's docs write an agent that reads its project context.
    std::fs::write(
        ws.join(".agents/context-reader.ts"),
        r#"import type { AgentDefinition } from './types/agent-definition'

const definition: AgentDefinition = {
  id: 'context-reader',
  displayName: 'Context Reader',
  model: 'anthropic/claude-sonnet-4.5',
  toolNames: ['read_files', 'end_turn'],
  systemPrompt: `You work in {CODEBUFF_PROJECT_ROOT} on {CODEBUFF_CURRENT_DATE}.

{CODEBUFF_SYSTEM_INFO_PROMPT}

{CODEBUFF_FILE_TREE_PROMPT}

{CODEBUFF_GIT_CHANGES_PROMPT}

{CODEBUFF_KNOWLEDGE_FILES_CONTENTS}

The user asked: {CODEBUFF_USER_INPUT_PROMPT}`,
}

export default definition
"#,
    )
    .unwrap();
    git(&["init", "-q", "-b", "main"]);
    git(&["add", "."]);
    // What an agent could leave to be run or read by the service: a
    // knowledge file linked to the process's environment, and a repository
    // config naming an external diff command.
    std::os::unix::fs::symlink("/proc/self/environ", ws.join("CLAUDE.md")).unwrap();
    let marker = dir.path().join("external-diff-ran");
    let external = dir.path().join("ext.sh");
    std::fs::write(
        &external,
        format!("#!/bin/sh\ntouch '{}'\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(
        &external,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    git(&["add", "CLAUDE.md"]);
    git(&["commit", "-q", "-m", "first commit"]);
    git(&["config", "diff.external", &external.display().to_string()]);
    std::fs::write(ws.join("src/main.rs"), "fn main() { println!(\"hi\"); }\n").unwrap();
    let ws_arg = std::fs::canonicalize(&ws).unwrap().display().to_string();
    let out = arbor_in(
        dir.path(),
        &[
            "run",
            "--store",
            "s.db",
            "--tree-id",
            "ctx",
            "--workspace",
            &ws_arg,
            "--agent",
            "context-reader",
            "--json",
            "explain the build",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    let system = state["systemPrompt"].as_str().unwrap();
    assert!(
        system.starts_with(&format!("You work in {ws_arg} on 20")),
        "{system}"
    );
    assert!(system.contains("Operating System: linux"), "{system}");
    assert!(
        system.contains(
            "<project_file_tree>\nCLAUDE.md\nknowledge.md\nsrc/\n  main.rs\n</project_file_tree>"
        ),
        "{system}"
    );
    assert!(
        !system.contains("built.bin"),
        "an ignored file is shown: {system}"
    );
    assert!(
        system.contains("<git_status>\n M src/main.rs\n</git_status>"),
        "{system}"
    );
    assert!(
        system.contains("+fn main() { println!(\"hi\"); }"),
        "{system}"
    );
    assert!(
        system.contains("<recent_commit_messages>\nfirst commit\n"),
        "{system}"
    );
    assert!(
        system.contains("```knowledge.md\nRun `make test` before committing.\n```"),
        "{system}"
    );
    assert!(!system.contains("{CODEBUFF_"), "{system}");
    assert!(
        !system.contains("PATH="),
        "the environment was read: {system}"
    );
    assert!(!marker.exists(), "the repository's external diff ran");
    assert!(
        system.ends_with("The user asked: explain the build"),
        "{system}"
    );
    let replay = arbor_in(dir.path(), &["replay", "ctx", "--store", "s.db"]);
    assert!(
        replay.status.success() && text(&replay.stdout).contains("match:"),
        "{}{}",
        text(&replay.stdout),
        text(&replay.stderr)
    );
}
