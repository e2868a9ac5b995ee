#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use arbor_actors::lifecycle::HookEvent;

use super::AgentFiles;
use crate::config::{Config, ConfigError};

/// The Claude Code agent files of `tests/fixtures/claude-agents/NAME`.
fn fixtures(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/claude-agents")
        .join(name)
}

/// A config the fixtures load into: a simulated model behind Claude
/// Code's aliases, an Anthropic one by its model id, a configured MCP
/// server, and TOML agents that spawn and are spawned by loaded ones.
const CONFIG: &str = r#"
[limits]
max_depth = 4

[models.sim]
provider = "simulated"

[models.claude]
provider = "anthropic"
model = "claude-sonnet-4-5"
base_url = "http://127.0.0.1:9"

[model_aliases]
sonnet = "sim"
haiku = "sim"
inherit = "sim"

[mcp_servers.github]
command = "github-mcp-server"

[agents.lead]
model = "claude"
spawnable_agents = ["coordinator", "code-reviewer"]

[agents.summarizer]
model = "sim"
"#;

fn load(config: &str, dirs: &[PathBuf]) -> Result<Config, ConfigError> {
    Config::parse_with_agents(
        config,
        "config.toml",
        PathBuf::from("."),
        &AgentFiles {
            dirs: dirs.to_vec(),
            workspace: None,
        },
    )
}

fn template<'c>(config: &'c Config, id: &str) -> &'c arbor_actors::AgentTemplate {
    config
        .templates
        .iter()
        .find(|t| t.id == id)
        .unwrap_or_else(|| panic!("no template {id}"))
}

#[test]
fn the_documented_claude_code_agent_files_load_as_templates() {
    let config = load(CONFIG, &[fixtures("docs")]).unwrap();
    // Claude Code's own example: a tool string, an alias, the body as the prompt.
    let reviewer = template(&config, "code-reviewer");
    assert_eq!(reviewer.model, "sim");
    assert_eq!(reviewer.tools, ["Read", "Glob", "Grep"]);
    assert_eq!(
        reviewer.description.as_deref(),
        Some("Reviews code for quality and best practices")
    );
    assert!(
        reviewer
            .system_prompt
            .starts_with("You are a code reviewer. When invoked")
    );
    assert!(
        reviewer.spawnable_agents.is_empty(),
        "no Agent: no spawning"
    );
    // No model, nothing spawns it: [model_aliases] inherit.
    let researcher = template(&config, "safe-researcher");
    assert_eq!(researcher.tools, ["Read", "Grep", "Glob", "Bash"]);
    assert_eq!(researcher.model, "sim");
    // No tools: every workspace tool and every configured tool, less the
    // disallowed ones.
    let no_writes = template(&config, "no-writes");
    for tool in [
        "Read",
        "MultiEdit",
        "Bash",
        "Grep",
        "Glob",
        "LS",
        "TodoWrite",
        "github/*",
    ] {
        assert!(
            no_writes.tools.iter().any(|t| t == tool),
            "{tool}: {:?}",
            no_writes.tools
        );
    }
    assert!(!no_writes.tools.iter().any(|t| t == "Write" || t == "Edit"));
    // Agent(worker, researcher): those may be spawned; a TOML agent spawns it.
    let coordinator = template(&config, "coordinator");
    assert_eq!(coordinator.spawnable_agents, ["worker", "researcher"]);
    assert_eq!(coordinator.tools, ["Read", "Bash"]);
    assert_eq!(
        coordinator.model, "claude",
        "inherited from lead, which spawns it"
    );
    // A YAML list of tools; inherit through coordinator from lead; maxTurns;
    // acceptEdits asks before Bash only.
    let worker = template(&config, "worker");
    assert_eq!(worker.tools, ["Read", "Edit", "Write", "Bash"]);
    assert_eq!(worker.model, "claude");
    assert_eq!(worker.max_steps, 12);
    assert_eq!(worker.approve, ["Bash"]);
    assert_eq!(
        config.agent_origins["worker"].color.as_deref(),
        Some("green")
    );
    assert!(config.agent_origins["worker"].file.ends_with("worker.md"));
    // A flow list with an MCP tool and a TOML agent to spawn; a full model
    // id naming the [models] entry of that model; effort; initialPrompt.
    let researcher = template(&config, "researcher");
    assert_eq!(researcher.model, "claude");
    assert_eq!(
        researcher.tools,
        ["Read", "Grep", "Glob", "github/search_code"]
    );
    assert_eq!(researcher.spawnable_agents, ["summarizer"]);
    assert_eq!(
        researcher
            .model_options
            .reasoning
            .as_ref()
            .and_then(|r| r.effort),
        Some(arbor_actors::model::ReasoningEffort::High)
    );
    assert_eq!(
        researcher.instructions_prompt.as_deref(),
        Some("Start with the README.")
    );
    // Hooks in the front matter run for db-reader only.
    let hooks = config.hooks.as_ref().unwrap();
    assert!(hooks.wants(HookEvent::PreToolUse, "Bash"));
    // mcpServers: an inline server and a configured one, with their tools.
    let tester = template(&config, "browser-tester");
    assert!(tester.tools.iter().any(|t| t == "playwright/*"));
    assert!(tester.tools.iter().any(|t| t == "github/*"));
    assert!(config.mcp_servers.contains_key("playwright"));
    // Every loaded agent builds into a catalog with the TOML ones.
    config.catalog().unwrap();
}

#[test]
fn a_stored_config_carries_its_agent_files_and_runs_on_them_without_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixtures("docs").join("code-reviewer.md"),
        dir.path().join("code-reviewer.md"),
    )
    .unwrap();
    let config = load(
        "[models.sim]\nprovider = \"simulated\"\n[model_aliases]\nsonnet = \"sim\"\n",
        &[dir.path().to_path_buf()],
    )
    .unwrap();
    let snapshot = config.snapshot();
    assert!(snapshot.contains("[[stored_agent_files]]"), "{snapshot}");
    assert!(config.is_stored_as(&snapshot));
    // The directory is gone: the stored files are what the tree runs on.
    drop(dir);
    let back = Config::from_snapshot(&snapshot, "t", PathBuf::from("."), None).unwrap();
    assert_eq!(
        template(&back, "code-reviewer").tools,
        ["Read", "Glob", "Grep"]
    );
    assert!(back.snapshot().contains("You are a code reviewer"));
}

/// One agent file `x.md` with `front` as its front matter, loaded into
/// `config`: the error it gives, as `check-config` prints it.
fn refused(config: &str, front: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.md");
    std::fs::write(&path, format!("---\n{front}---\n\nYou help.\n")).unwrap();
    let err = load(config, &[dir.path().to_path_buf()]).unwrap_err();
    err.to_string().replace(&path.display().to_string(), "x.md")
}

const SIM: &str = "[models.sim]\nprovider = \"simulated\"\n[model_aliases]\ninherit = \"sim\"\n";

#[test]
fn every_unsupported_field_is_refused_by_name_at_its_line() {
    let err = refused(SIM, "name: a\ndescription: b\nmemory: user\n");
    assert!(err.starts_with("x.md:4: memory: is not supported"), "{err}");
    let err = refused(
        SIM,
        "name: a\ndescription: b\nskills:\n  - api-conventions\n",
    );
    assert!(err.starts_with("x.md:4: skills: "), "{err}");
    let err = refused(SIM, "name: a\ndescription: b\nisolation: container\n");
    assert!(
        err.starts_with("x.md:4: isolation: must be worktree"),
        "{err}"
    );
    let err = refused(SIM, "name: a\ndescription: b\nbackground: true\n");
    assert!(
        err.contains("x.md:4: background: true is not honoured"),
        "{err}"
    );
    let err = refused(SIM, "name: a\ndescription: b\npermissionMode: auto\n");
    assert!(err.starts_with("x.md:4: permissionMode: \"auto\""), "{err}");
    let err = refused(SIM, "name: a\ndescription: b\nfavourite: yes\n");
    assert!(
        err.starts_with("x.md:4: favourite: unknown field `favourite`"),
        "{err}"
    );
    let err = refused(SIM, "name: a\ndescription: b\ntools: Read, WebFetch\n");
    assert!(
        err.starts_with("x.md:4: tools: \"WebFetch\" is a Claude Code tool"),
        "{err}"
    );
    let err = refused(SIM, "name: a\ndescription: b\ntools: Bash(git diff:*)\n");
    assert!(err.contains("permission rule"), "{err}");
    let err = refused(SIM, "name: a\n");
    assert!(err.starts_with("x.md:2: description: missing"), "{err}");
    let err = refused(SIM, "name: a\ndescription: [oops\n");
    assert!(
        err.starts_with("x.md:") && err.contains(": (front matter): not YAML"),
        "{err}"
    );
    let err = refused(
        SIM,
        "name: a\ndescription: b\nhooks:\n  Notification:\n    - hooks:\n        - type: command\n          command: x\n",
    );
    assert!(err.starts_with("x.md:5: hooks.Notification: "), "{err}");
    let err = refused(
        SIM,
        "name: a\ndescription: b\nhooks:\n  PreToolUse:\n    - matcher: Bash\n      hooks:\n        - type: prompt\n          prompt: x\n",
    );
    assert!(
        err.starts_with("x.md:8: hooks.PreToolUse[0].hooks[0]: type \"prompt\""),
        "{err}"
    );
}

#[test]
fn a_problem_the_templates_checks_find_is_reported_at_the_files_field() {
    // maxTurns past the template's range: the TOML check's message, at the
    // file's maxTurns line.
    let err = refused(SIM, "name: a\ndescription: b\nmaxTurns: 200000\n");
    assert!(err.starts_with("x.md:4: maxTurns: "), "{err}");
    assert!(err.contains("100000"), "{err}");
    let err = refused(SIM, "name: a\ndescription: b\nmaxTurns: 0\n");
    assert!(
        err.starts_with("x.md:4: maxTurns: must be a whole number"),
        "{err}"
    );
    // Agent(ghost): not defined anywhere.
    let err = refused(SIM, "name: a\ndescription: b\ntools: Read, Agent(ghost)\n");
    assert!(err.starts_with("x.md:4: tools: spawns \"ghost\""), "{err}");
    // A tool nothing provides: reported when the tools are checked.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("x.md"),
        "---\nname: a\ndescription: b\ntools: Read, Frobnicate\n---\nYou help.\n",
    )
    .unwrap();
    let config = load(SIM, &[dir.path().to_path_buf()]).unwrap();
    let err = config.check_tools(&[]).unwrap_err().to_string();
    assert!(
        err.contains("x.md:4: tools: unknown tool \"Frobnicate\""),
        "{err}"
    );
}

#[test]
fn model_aliases_are_configured_or_refused_naming_the_table() {
    let config = "[models.sim]\nprovider = \"simulated\"\n[models.big]\nprovider = \"simulated\"\n";
    let err = refused(config, "name: a\ndescription: b\nmodel: sonnet\n");
    assert!(
        err.starts_with("x.md:4: model: \"sonnet\" is a Claude Code alias"),
        "{err}"
    );
    assert!(err.contains("[model_aliases] sonnet = "), "{err}");
    // inherit at a root with two models and no [model_aliases] inherit.
    let err = refused(config, "name: a\ndescription: b\n");
    assert!(err.contains("[model_aliases] inherit"), "{err}");
    // An alias to a model that is not configured.
    let err = load(
        "[models.sim]\nprovider = \"simulated\"\n[model_aliases]\nopus = \"nope\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("config.toml:4: model_aliases.opus: "),
        "{err}"
    );
    // inherit from two parents on different models: refused, naming both.
    let two = format!(
        "{config}[agents.p]\nmodel = \"sim\"\nspawnable_agents = [\"a\"]\n[agents.q]\nmodel = \"big\"\nspawnable_agents = [\"a\"]\n"
    );
    let err = refused(&two, "name: a\ndescription: b\nmodel: inherit\n");
    assert!(err.starts_with("x.md:4: model: inherit: "), "{err}");
    assert!(
        err.contains("p on \"sim\"") && err.contains("q on \"big\""),
        "{err}"
    );
}

/// The typed reasons of a refused tool entry or model (issue 35) print
/// the words the text ones did, whole.
#[test]
fn refused_tools_and_models_read_word_for_word() {
    let err = refused(SIM, "name: a\ndescription: b\ntools: Bash(git diff:*)\n");
    assert!(
        err.contains(
            "x.md:4: tools: \"Bash(git diff:*)\" is a Claude Code permission rule (a tool with \
             arguments), which Arbor has no counterpart of here: list the tool (Bash) and use \
             [policy] or hooks to narrow it"
        ),
        "{err}"
    );
    let err = refused(SIM, "name: a\ndescription: b\ntools: mcp__\n");
    assert!(
        err.contains(
            "x.md:4: tools: \"mcp__\" is not an MCP tool's name (mcp__SERVER__TOOL, or \
             mcp__SERVER for all its tools)"
        ),
        "{err}"
    );
    let err = refused(SIM, "name: a\ndescription: b\ntools: WebFetch\n");
    assert!(
        err.contains(
            "x.md:4: tools: \"WebFetch\" is a Claude Code tool Arbor has no counterpart of (it has "
        ) && err.contains(
            ", and Agent to spawn): remove it, or configure a [tools.WebFetch] command tool"
        ),
        "{err}"
    );
    let two = "[models.sim]\nprovider = \"simulated\"\n[models.big]\nprovider = \"simulated\"\n";
    let err = refused(two, "name: a\ndescription: b\nmodel: sonnet\n");
    assert!(
        err.contains(
            "x.md:4: model: \"sonnet\" is a Claude Code alias: say which [models] entry it is \
             with [model_aliases] sonnet = \"<a [models] entry>\" (configured: big, sim)"
        ),
        "{err}"
    );
    let err = refused(two, "name: a\ndescription: b\nmodel: gpt-9\n");
    assert!(
        err.contains(
            "x.md:4: model: \"gpt-9\" is not a [model_aliases] key, a [models] entry, nor the \
             model id of one (configured: big, sim): add [model_aliases] \"gpt-9\" = \"<a [models] entry>\""
        ),
        "{err}"
    );
    let err = refused(two, "name: a\ndescription: b\n");
    assert!(
        err.contains(
            "model: inherit (also what no model means): agent \"a\" is spawned by no agent, so \
             it has no parent's model to take: set [model_aliases] inherit = \"<a [models] \
             entry>\" (the model such a root runs on), or name its model (configured: big, sim)"
        ),
        "{err}"
    );
    let parents = format!(
        "{two}[agents.p]\nmodel = \"sim\"\nspawnable_agents = [\"a\"]\n[agents.q]\nmodel = \"big\"\nspawnable_agents = [\"a\"]\n"
    );
    let err = refused(&parents, "name: a\ndescription: b\nmodel: inherit\n");
    assert!(
        err.contains(
            "x.md:4: model: inherit: agent \"a\" is spawned by agents on different models (p on \
             \"sim\"; q on \"big\"), and Arbor picks an inherited model when the config is read: \
             name its model (model: sonnet, with [model_aliases])"
        ),
        "{err}"
    );
}

/// A Codebuff file's refused `reasoningOptions` (typed, issue 35) reads
/// as it always did.
#[test]
#[cfg(feature = "programs")] // a Codebuff file needs the JavaScript engine
fn refused_reasoning_options_read_word_for_word() {
    let refused = |options: &str| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.ts");
        std::fs::write(
            &path,
            format!("export default {{\n  id: 'x',\n  displayName: 'X',\n  model: 'sim',\n  reasoningOptions: {options},\n}}\n"),
        )
        .unwrap();
        let err = load(SIM, &[dir.path().to_path_buf()]).unwrap_err();
        err.to_string().replace(&path.display().to_string(), "x.ts")
    };
    for (options, said) in [
        (
            "3",
            "must be an object ({ effort } or { max_tokens }), not 3",
        ),
        (
            "{ depth: 1 }",
            "unknown key `depth` (enabled, exclude, effort, max_tokens)",
        ),
        (
            "{ exclude: true }",
            "exclude: true is not supported: Arbor keeps the model's reasoning in the history (remove it)",
        ),
        (
            "{ effort: 'max' }",
            "effort \"max\": minimal, low, medium, high or none",
        ),
    ] {
        let err = refused(options);
        assert!(
            err.contains(&format!("reasoningOptions: {said}")),
            "{options}: {err}"
        );
    }
}

#[test]
fn a_name_defined_twice_names_both_places() {
    let config = "[models.sim]\nprovider = \"simulated\"\n[model_aliases]\nsonnet = \"sim\"\n\n[agents.code-reviewer]\nmodel = \"sim\"\n";
    let err = load(config, &[fixtures("docs").join("code-reviewer.md")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("code-reviewer.md:2: name: agent \"code-reviewer\" is defined twice: here and at config.toml:6"), "{err}");
    let err = load(
        SIM,
        &[
            fixtures("docs").join("code-reviewer.md"),
            fixtures("linting"),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("is defined twice: here and at"), "{err}");
    assert!(err.contains("docs/code-reviewer.md:2"), "{err}");
}

#[test]
fn include_is_the_list_of_agent_files_and_no_agent_may_be_named_so() {
    let err = load(
        "[models.m]\nprovider = \"simulated\"\n\n[agents.include]\nmodel = \"m\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("config.toml:4: agents.include: `include` is the list of agent files"),
        "{err}"
    );
    assert!(err.contains("an agent cannot be named include"), "{err}");
    let err = load("[agents]\ninclude = [\"no/such/dir\"]\n", &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("config.toml:2: agents.include: no/such/dir: no such directory"),
        "{err}"
    );
    // Relative to the config's directory, next to TOML agents.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("agents")).unwrap();
    std::fs::copy(
        fixtures("linting").join("code-reviewer.md"),
        dir.path().join("agents/code-reviewer.md"),
    )
    .unwrap();
    std::fs::copy(
        fixtures("linting").join("README.md"),
        dir.path().join("agents/README.md"),
    )
    .unwrap();
    let config = Config::parse(
        "[models.m]\nprovider = \"simulated\"\n\n[agents]\ninclude = [\"agents\"]\n\n[agents.lead]\nmodel = \"m\"\nspawnable_agents = [\"code-reviewer\"]\n",
        "c.toml",
        dir.path().to_path_buf(),
    )
    .unwrap();
    assert_eq!(
        template(&config, "code-reviewer").model,
        "m",
        "inherited from lead"
    );
    assert_eq!(config.templates.len(), 2, "the README is no agent");
    let hooks = config.hooks.as_ref().unwrap();
    assert!(hooks.wants(HookEvent::PostToolUse, "Edit"));
}

#[test]
#[cfg(feature = "programs")] // a Codebuff file needs the JavaScript engine
fn a_codebuff_file_loads_beside_claude_codes_and_a_module_without_an_agent_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("helper.ts"), "export default {}\n").unwrap();
    std::fs::write(
        dir.path().join("picker.ts"),
        "import type { X } from './types'\nexport default {\n  id: 'picker',\n  displayName: 'Picker',\n  model: 'sim',\n  toolNames: ['read_files', 'set_output'],\n  systemPrompt: 'I am {CODEBUFF_AGENT_NAME}. {CODEBUFF_UNKNOWN}',\n}\n",
    )
    .unwrap();
    let config = load(SIM, &[dir.path().to_path_buf()]).unwrap();
    let picker = template(&config, "picker");
    assert_eq!(picker.display_name, "Picker");
    assert_eq!(picker.tools, ["read_files", "set_output"]);
    assert_eq!(&*picker.system_prompt, "I am Picker. {CODEBUFF_UNKNOWN}");
    assert!(!config.templates.iter().any(|t| t.id == "helper"));
    // In a workspace's default directories too, beside Claude Code's files.
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(ws.path().join(".claude/agents")).unwrap();
    std::fs::create_dir_all(ws.path().join(".agents")).unwrap();
    std::fs::copy(
        dir.path().join("picker.ts"),
        ws.path().join(".agents/picker.ts"),
    )
    .unwrap();
    std::fs::copy(
        fixtures("docs").join("safe-researcher.md"),
        ws.path().join(".claude/agents/safe-researcher.md"),
    )
    .unwrap();
    let config = Config::parse_with_agents(
        SIM,
        "c.toml",
        PathBuf::from("."),
        &AgentFiles {
            dirs: Vec::new(),
            workspace: Some(ws.path().to_path_buf()),
        },
    )
    .unwrap();
    assert_eq!(
        template(&config, "safe-researcher").tools,
        ["Read", "Grep", "Glob", "Bash"]
    );
    assert_eq!(template(&config, "picker").model, "sim");
    // A stored config runs on the stored modules, the directory gone.
    let snapshot = config.snapshot();
    drop(ws);
    let back = Config::from_snapshot(&snapshot, "t", PathBuf::from("."), None).unwrap();
    assert_eq!(
        template(&back, "picker").tools,
        ["read_files", "set_output"]
    );
}

#[test]
#[cfg(feature = "programs")] // a Codebuff file needs the JavaScript engine
fn a_codebuff_agents_mcp_server_secret_is_not_stored_in_clear() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("token.ts"),
        "export const TOKEN = 'sk-module-secret'\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("linear.ts"),
        "import { TOKEN } from './token'\nexport default {\n  id: 'linear',\n  displayName: 'Linear',\n  model: 'sim',\n  mcpServers: {\n    tracker: { command: 'tracker-mcp', env: { TOKEN, OTHER: \"sk-inline-secret\" } },\n  },\n}\n",
    )
    .unwrap();
    let config = load(SIM, &[dir.path().to_path_buf()]).unwrap();
    assert_eq!(template(&config, "linear").tools, ["tracker/*"]);
    let snapshot = config.snapshot();
    for secret in ["sk-module-secret", "sk-inline-secret"] {
        assert!(!snapshot.contains(secret), "{secret} stored: {snapshot}");
    }
    assert!(snapshot.contains("tracker-mcp"), "{snapshot}");
    let back = Config::from_snapshot(&snapshot, "t", PathBuf::from("."), Some(&config)).unwrap();
    assert_eq!(
        format!("{:?}", back.file.mcp_servers),
        format!("{:?}", config.file.mcp_servers)
    );
}

#[test]
fn a_directory_of_agents_that_all_spawn_each_other_loads_at_once() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..40 {
        std::fs::write(
            dir.path().join(format!("a{i:02}.md")),
            format!(
                "---\nname: a{i:02}\ndescription: helper {i}\ntools: Read, Agent\n---\nYou help.\n"
            ),
        )
        .unwrap();
    }
    let started = std::time::Instant::now();
    let config = load(
        &format!("[limits]\nmax_depth = 3\n{SIM}"),
        &[dir.path().to_path_buf()],
    )
    .unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(config.templates.len(), 40);
    for t in &config.templates {
        assert_eq!(t.model, "sim");
        assert_eq!(t.spawnable_agents.len(), 39);
    }
}

#[test]
fn permission_modes_become_approvals_or_fewer_tools() {
    let one = |mode: &str| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("x.md"),
            format!("---\nname: x\ndescription: y\ntools: Read, Edit, Write, Bash\npermissionMode: {mode}\n---\nYou help.\n"),
        )
        .unwrap();
        let config = load(SIM, &[dir.path().to_path_buf()]).unwrap();
        template(&config, "x").clone()
    };
    let default = one("default");
    assert_eq!(default.approve, ["Write", "Edit", "Bash"]);
    assert_eq!(one("acceptEdits").approve, ["Bash"]);
    let plan = one("plan");
    assert_eq!(plan.tools, ["Read"]);
    assert!(plan.approve.is_empty());
    let bypass = one("bypassPermissions");
    assert!(bypass.approve.is_empty());
    assert_eq!(bypass.tools, ["Read", "Edit", "Write", "Bash"]);
    let dont_ask = one("dontAsk\nisolation: worktree");
    assert_eq!(
        dont_ask.isolation,
        arbor_actors::worktree::Isolation::Worktree
    );
    assert_eq!(
        dont_ask.approval_default,
        arbor_actors::approval::ApprovalDefault::Deny
    );
    assert_eq!(
        dont_ask.approval_timeout,
        Some(std::time::Duration::from_millis(1))
    );
}

/// A directory named by mistake costs a bounded walk: a symbolic link to a
/// parent is not followed (it would never end), and the walk stops one
/// file past the cap the loader refuses.
#[test]
fn a_symlink_loop_and_a_huge_directory_end_the_walk() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.md"), "x").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::os::unix::fs::symlink(dir.path(), dir.path().join("sub/loop")).unwrap();
    std::fs::write(dir.path().join("sub/b.md"), "x").unwrap();
    let mut found = Vec::new();
    super::walk(dir.path(), 0, &mut found);
    let names: Vec<String> = found
        .iter()
        .map(|p| p.strip_prefix(dir.path()).unwrap().display().to_string())
        .collect();
    assert_eq!(names, ["a.md", "sub/b.md"]);
    let many = tempfile::tempdir().unwrap();
    for i in 0..super::MAX_FILES + 50 {
        std::fs::write(many.path().join(format!("{i}.md")), "").unwrap();
    }
    let mut found = Vec::new();
    super::walk(many.path(), 0, &mut found);
    assert_eq!(found.len(), super::MAX_FILES + 1);
}

#[test]
fn an_agent_files_mcp_server_secret_is_not_stored_in_clear() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tester.md"),
        "---\nname: tester\ndescription: Tests\nmodel: sonnet\nmcpServers:\n  - local:\n      \
         command: server\n      env:\n        TOKEN: sk-plain-secret\n        QUOTED: \"sk-quoted-secret\"\n        \
         FROM: { env: ARBOR_TEST_VAR }\n  - remote:\n      url: https://bot:pw-inline@mcp.example.com/mcp\n      \
         headers: { X-Key: 'sk-header-secret' }\n---\n\nYou test.\n",
    )
    .unwrap();
    let config = load(
        "[models.sim]\nprovider = \"simulated\"\n[model_aliases]\nsonnet = \"sim\"\n",
        &[dir.path().to_path_buf()],
    )
    .unwrap();
    let snapshot = config.snapshot();
    for secret in [
        "sk-plain-secret",
        "sk-quoted-secret",
        "pw-inline",
        "sk-header-secret",
    ] {
        assert!(!snapshot.contains(secret), "{secret} stored: {snapshot}");
    }
    for kept in [
        "(not stored)",
        "https://bot:***@mcp.example.com/mcp",
        "ARBOR_TEST_VAR",
    ] {
        assert!(snapshot.contains(kept), "{kept}: {snapshot}");
    }
    assert!(config.is_stored_as(&snapshot));
    // Read back with the current config: the secrets come from its servers.
    let back = Config::from_snapshot(&snapshot, "t", PathBuf::from("."), Some(&config)).unwrap();
    assert_eq!(
        format!("{:?}", back.file.mcp_servers),
        format!("{:?}", config.file.mcp_servers)
    );
    // Without it, no placeholder is used as a secret.
    let alone = Config::from_snapshot(&snapshot, "t", PathBuf::from("."), None).unwrap();
    let shown = format!("{:?}", alone.file.mcp_servers);
    assert!(
        !shown.contains("not stored") && !shown.contains("***"),
        "{shown}"
    );
    let local = &alone.file.mcp_servers["local"];
    assert_eq!(
        local.env.as_ref().unwrap().keys().collect::<Vec<_>>(),
        ["FROM"]
    );
}
