//! Lifecycle hooks: the user's commands at `PreToolUse`, `PostToolUse`,
//! `UserPromptSubmit`, `SubagentStart`, `SubagentStop` and `Stop`, written in
//! the config or in a Claude Code `.claude/settings.json` as it is, matched
//! and run here. What their answers mean is `arbor_actors::lifecycle`.
//!
//! ```toml
//! [[hooks.PreToolUse]]
//! matcher = "Bash|workspace/shell"
//! command = "python3 \"$CLAUDE_PROJECT_DIR\"/.claude/hooks/check_bash.py"
//! timeout = "10s"
//!
//! [hooks]
//! claude_settings = [".claude/settings.json"]
//! ```
//!
//! - `command` is a shell line (run with `bash -c`, as Claude Code runs
//!   hooks) or an argv array (run directly). It gets the event as one JSON
//!   object on stdin, `CLAUDE_PROJECT_DIR` (the tree's workspace, else the
//!   config's directory) and the tree's ids (`ARBOR_TREE_ID`,
//!   `ARBOR_RUN_ID`) in its environment, and runs in its own process
//!   group, killed whole at its timeout (60 s unless given).
//! - `matcher` picks by tool name (`PreToolUse`, `PostToolUse`) or agent
//!   type (`SubagentStart`, `SubagentStop`): a plain name matches exactly,
//!   anything else is a regular expression over the whole name, and an
//!   absent, empty or `*` matcher matches everything. Other events ignore it.
//! - The hooks of one event run at once; a command given twice (the same
//!   line from two files) runs once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use arbor_actors::lifecycle::{HookCall, HookEvent, HookRun, Lifecycle, Verdict, decide};
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::reaper;

/// How long a hook may run unless its entry says (Claude Code's default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The most of a hook's stdout or stderr that is kept (1 MiB each): a hook
/// that writes more is read on and cut, never held whole.
const MAX_OUTPUT: usize = 1 << 20;

/// A hook's command: a shell line or an argv.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(untagged)]
pub enum HookCommand {
    /// Run with `bash -c` (`sh -c` where there is no bash).
    Shell(String),
    /// The program, then its arguments, run directly.
    Argv(Vec<String>),
}

/// One `[[hooks.EVENT]]` table of the config.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookEntry {
    /// Which tools (or agent types) it runs for; all when absent.
    #[serde(default)]
    pub matcher: Option<String>,
    /// What runs.
    pub command: HookCommand,
    /// How long it may run ("10s"); 60 s when absent.
    #[serde(default)]
    pub timeout: Option<String>,
}

/// The config's `[hooks]` section: a list of entries per event, and
/// Claude Code settings files whose `hooks` are loaded as they are.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct HooksSection {
    /// `.claude/settings.json` files (relative to the config's directory).
    #[serde(default)]
    pub claude_settings: Vec<PathBuf>,
    /// `PreToolUse = [...]` and the others, by event name.
    #[serde(flatten)]
    pub events: BTreeMap<String, Vec<HookEntry>>,
}

/// A Claude Code settings file, as far as its hooks go.
#[derive(Deserialize)]
struct ClaudeSettings {
    #[serde(default)]
    hooks: BTreeMap<String, Vec<ClaudeGroup>>,
}

#[derive(Clone, Deserialize)]
struct ClaudeGroup {
    #[serde(default)]
    matcher: Option<String>,
    hooks: Vec<ClaudeHook>,
}

#[derive(Clone, Deserialize)]
struct ClaudeHook {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    command: Option<String>,
    /// Seconds.
    #[serde(default)]
    timeout: Option<f64>,
}

/// What is wrong with a configured hook, or a Claude Code settings file
/// of hooks: a problem of the config, as its check lists it.
#[derive(Debug, thiserror::Error)]
enum HookProblem {
    /// A matcher that is neither a name nor a regular expression.
    #[error("matcher {matcher:?} is not a regular expression: {source}")]
    Matcher {
        matcher: String,
        source: Box<regex::Error>,
    },
    /// A shell command line that is empty.
    #[error("command is empty")]
    EmptyCommand,
    /// A command given as a list, without its program.
    #[error("command is empty: it must name the program, then its arguments")]
    NoProgram,
    /// A timeout of nothing.
    #[error("timeout must be more than 0s")]
    ZeroTimeout,
    /// A timeout that is no duration.
    #[error("timeout {text:?}: {problem}")]
    Timeout { text: String, problem: String },
    /// The settings file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Unreadable {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The settings file is not Claude Code's settings.
    #[error("{} is not a Claude Code settings file: {source}", path.display())]
    NotSettings {
        path: std::path::PathBuf,
        source: serde_json::Error,
    },
    /// A hook of the settings file is wrong (its key, what is wrong).
    #[error("{}: {key}: {problem}", path.display())]
    InSettings {
        path: std::path::PathBuf,
        key: String,
        problem: String,
    },
}

/// Which names a hook runs for.
#[derive(Clone, Debug)]
enum Matcher {
    All,
    Exact(String),
    Pattern(regex::Regex),
}

impl Matcher {
    fn parse(text: Option<&str>) -> Result<Matcher, HookProblem> {
        let text = text.map(str::trim).unwrap_or("");
        if text.is_empty() || text == "*" {
            return Ok(Matcher::All);
        }
        if text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-/".contains(c))
        {
            return Ok(Matcher::Exact(text.to_owned()));
        }
        regex::Regex::new(&format!("^(?:{text})$"))
            .map(Matcher::Pattern)
            .map_err(|e| HookProblem::Matcher {
                matcher: text.to_owned(),
                source: Box::new(e),
            })
    }

    fn matches(&self, name: &str) -> bool {
        match self {
            Matcher::All => true,
            Matcher::Exact(exact) => exact == name,
            Matcher::Pattern(pattern) => pattern.is_match(name),
        }
    }
}

/// One hook, checked.
#[derive(Clone, Debug)]
struct Hook {
    event: HookEvent,
    matcher: Matcher,
    command: HookCommand,
    timeout: Duration,
    /// The agent type it runs for only (an agent file's own hooks); every
    /// agent's when `None`.
    agent: Option<Arc<str>>,
}

impl Hook {
    /// Whether it runs for an agent of type `agent_type` (`None`: unknown,
    /// which only an unscoped hook runs for).
    fn for_agent(&self, agent_type: Option<&str>) -> bool {
        self.agent
            .as_deref()
            .is_none_or(|scope| agent_type == Some(scope))
    }
}

/// Every hook of a runtime, checked: what runs at each event.
#[derive(Clone, Debug, Default)]
pub struct HookSet {
    hooks: Arc<[Hook]>,
    /// `CLAUDE_PROJECT_DIR` when a tree has no workspace.
    project_dir: PathBuf,
    shell: PathBuf,
}

impl HookSet {
    /// The config's hooks: its `[hooks]` entries, then those of each Claude
    /// Code settings file it names (paths relative to `base_dir`). On
    /// failure, every problem at once, as (key, message).
    pub fn from_section(
        section: &HooksSection,
        base_dir: &Path,
    ) -> Result<HookSet, Vec<(String, String)>> {
        let mut problems = Vec::new();
        let mut hooks = Vec::new();
        for (name, entries) in &section.events {
            let Some(event) = HookEvent::from_name(name) else {
                problems.push((
                    format!("hooks.{name}"),
                    format!(
                        "is not a hook event: use one of {}",
                        HookEvent::ALL.map(HookEvent::name).join(", ")
                    ),
                ));
                continue;
            };
            for (i, entry) in entries.iter().enumerate() {
                let key = format!("hooks.{name}[{i}]");
                match check(event, entry) {
                    Ok(hook) => hooks.push(hook),
                    Err(problem) => problems.push((key, problem.to_string())),
                }
            }
        }
        for file in &section.claude_settings {
            let path = base_dir.join(file);
            match claude_hooks(&path) {
                Ok(more) => hooks.extend(more),
                Err(problem) => {
                    problems.push(("hooks.claude_settings".to_owned(), problem.to_string()));
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        // One command given twice for the same event and matcher runs once.
        let mut seen = std::collections::HashSet::new();
        hooks.retain(|h: &Hook| {
            seen.insert((h.event, format!("{:?}", h.matcher), h.command.clone()))
        });
        Ok(HookSet {
            hooks: hooks.into(),
            project_dir: base_dir.to_path_buf(),
            shell: shell(),
        })
    }

    /// The events that have hooks.
    pub fn events(&self) -> std::collections::BTreeSet<HookEvent> {
        self.hooks.iter().map(|h| h.event).collect()
    }

    /// Whether no hook is configured.
    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
    }

    /// Whether any hook runs at `event` for `name` (a tool name or an
    /// agent type; ignored by events without a matcher).
    pub fn wants(&self, event: HookEvent, name: &str) -> bool {
        self.matching(event, name).next().is_some()
    }

    /// The hooks of `event` for `name`. The stop and subagent events are
    /// asked with the agent's type as `name`, so an agent's own hooks are
    /// told apart here; for a tool's events an agent's own hooks are in
    /// (the caller knows no agent) and [`HookSet::run`] leaves out those
    /// of other agents.
    fn matching<'a>(&'a self, event: HookEvent, name: &'a str) -> impl Iterator<Item = &'a Hook> {
        let by_agent = !matches!(event, HookEvent::PreToolUse | HookEvent::PostToolUse);
        self.hooks.iter().filter(move |h| {
            h.event == event
                && (event.matches_by().is_none() || h.matcher.matches(name))
                && (!by_agent || h.for_agent(Some(name)))
        })
    }

    /// Runs the hooks of `event` for `name` at once, each with `input` (the
    /// event's own fields; the common ones are added), and decides.
    pub async fn run(
        &self,
        event: HookEvent,
        name: &str,
        mut input: Map<String, Value>,
        ctx: &HookCall,
    ) -> Verdict {
        let dir = ctx.workspace.as_deref().unwrap_or(&self.project_dir);
        input.insert("session_id".into(), ctx.tree_id.clone().into());
        input.insert("transcript_path".into(), Value::String(String::new()));
        input.insert("cwd".into(), dir.display().to_string().into());
        input.insert("hook_event_name".into(), event.name().into());
        input.insert("permission_mode".into(), "default".into());
        input.insert("arbor_tree_id".into(), ctx.tree_id.clone().into());
        input.insert("arbor_run_id".into(), ctx.run_id.clone().into());
        if let Some(agent_type) = &ctx.agent_type {
            input
                .entry("agent_type")
                .or_insert_with(|| agent_type.clone().into());
        }
        let stdin = Value::Object(input).to_string();
        let runs = futures::future::join_all(
            self.matching(event, name)
                .filter(|hook| hook.for_agent(ctx.agent_type.as_deref()))
                .map(|hook| self.run_one(hook, &stdin, dir, ctx)),
        )
        .await;
        let verdict = decide(event, &runs);
        for error in &verdict.errors {
            tracing::warn!(event = event.name(), tree = %ctx.tree_id, run = %ctx.run_id, "a hook failed: {error}");
        }
        verdict
    }

    async fn run_one(&self, hook: &Hook, stdin: &str, dir: &Path, ctx: &HookCall) -> HookRun {
        let mut command = match &hook.command {
            HookCommand::Shell(line) => {
                let mut c = tokio::process::Command::new(&self.shell);
                c.arg("-c").arg(line);
                c
            }
            HookCommand::Argv(argv) => {
                let (program, args) = argv.split_first().map_or(("", &[][..]), |(p, a)| (p, a));
                let mut c = tokio::process::Command::new(program);
                c.args(args);
                c
            }
        };
        command
            .current_dir(dir)
            .env("CLAUDE_PROJECT_DIR", dir)
            .env("ARBOR_TREE_ID", &ctx.tree_id)
            .env("ARBOR_RUN_ID", &ctx.run_id)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        let failed = |stderr: String| HookRun {
            exit: None,
            stdout: String::new(),
            stderr,
        };
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => return failed(format!("could not start {:?}: {e}", hook.command)),
        };
        // Dropping the registration kills the hook's whole group: its
        // timeout, and this future being dropped (the call cancelled).
        let _group = child.id().map(reaper::register);
        let feed = {
            let pipe = child.stdin.take();
            let text = stdin.as_bytes().to_vec();
            async move {
                if let Some(mut pipe) = pipe {
                    // A hook that does not read its stdin is not an error.
                    let _ = pipe.write_all(&text).await;
                }
            }
        };
        let out = read_capped(child.stdout.take());
        let err = read_capped(child.stderr.take());
        let ran = tokio::time::timeout(hook.timeout, async {
            let ((), stdout, stderr, status) = tokio::join!(feed, out, err, child.wait());
            (stdout, stderr, status)
        })
        .await;
        match ran {
            Ok((stdout, stderr, Ok(status))) => HookRun {
                exit: status.code(),
                stdout,
                stderr,
            },
            Ok((_, _, Err(e))) => failed(format!("could not wait for it: {e}")),
            Err(_) => failed(format!(
                "{:?} did not finish within {:?}: killed",
                hook.command, hook.timeout
            )),
        }
    }
}

/// The hook set as the agents' port: each run clones the set (a few
/// pointers) into its future.
impl Lifecycle for HookSet {
    fn wants(&self, event: HookEvent, name: &str) -> bool {
        HookSet::wants(self, event, name)
    }

    /// Only hooks that run for this agent: another agent's own tool hooks
    /// leave its calls alone (no run, no `hookDecided`).
    fn wants_tool(&self, event: HookEvent, tool: &str, agent_type: &str) -> bool {
        self.matching(event, tool)
            .any(|hook| hook.for_agent(Some(agent_type)))
    }

    fn run(
        &self,
        event: HookEvent,
        name: &str,
        input: Map<String, Value>,
        call: HookCall,
    ) -> BoxFuture<'static, Verdict> {
        let this = self.clone();
        let name = name.to_owned();
        Box::pin(async move { HookSet::run(&this, event, &name, input, &call).await })
    }
}

async fn read_capped(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> String {
    let Some(mut pipe) = pipe else {
        return String::new();
    };
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = MAX_OUTPUT.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

fn check(event: HookEvent, entry: &HookEntry) -> Result<Hook, HookProblem> {
    let matcher = Matcher::parse(entry.matcher.as_deref())?;
    match &entry.command {
        HookCommand::Shell(line) if line.trim().is_empty() => {
            return Err(HookProblem::EmptyCommand);
        }
        HookCommand::Argv(argv) if argv.first().is_none_or(|p| p.is_empty()) => {
            return Err(HookProblem::NoProgram);
        }
        _ => {}
    }
    let timeout = match &entry.timeout {
        None => DEFAULT_TIMEOUT,
        Some(text) => match arbor_actors::duration::parse(text) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => return Err(HookProblem::ZeroTimeout),
            Err(e) => {
                return Err(HookProblem::Timeout {
                    text: text.clone(),
                    problem: e.to_string(),
                });
            }
        },
    };
    Ok(Hook {
        event,
        matcher,
        command: entry.command.clone(),
        timeout,
        agent: None,
    })
}

/// The hooks of a Claude Code settings file.
fn claude_hooks(path: &Path) -> Result<Vec<Hook>, HookProblem> {
    let text = std::fs::read_to_string(path).map_err(|source| HookProblem::Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    let settings: ClaudeSettings =
        serde_json::from_str(&text).map_err(|source| HookProblem::NotSettings {
            path: path.to_path_buf(),
            source,
        })?;
    let mut hooks = Vec::new();
    for (name, groups) in settings.hooks {
        // Events Arbor has no counterpart of (Notification, SessionStart,
        // PreCompact, …) are not run, and said so once.
        let Some(event) = HookEvent::from_name(&name) else {
            tracing::warn!(
                file = %path.display(),
                "{name} hooks are not run: Arbor has no {name} event"
            );
            continue;
        };
        hooks.extend(
            claude_groups(event, &name, groups, None).map_err(|(key, problem)| {
                HookProblem::InSettings {
                    path: path.to_path_buf(),
                    key,
                    problem,
                }
            })?,
        );
    }
    Ok(hooks)
}

/// The hooks of one event in Claude Code's shape (a settings file's or an
/// agent file's), scoped to `agent` when given; `Err` is (key, why).
fn claude_groups(
    event: HookEvent,
    name: &str,
    groups: Vec<ClaudeGroup>,
    agent: Option<&Arc<str>>,
) -> Result<Vec<Hook>, (String, String)> {
    let mut hooks = Vec::new();
    for (g, group) in groups.into_iter().enumerate() {
        let matcher = Matcher::parse(group.matcher.as_deref())
            .map_err(|e| (format!("hooks.{name}[{g}]"), e.to_string()))?;
        for (h, hook) in group.hooks.into_iter().enumerate() {
            let at = || format!("hooks.{name}[{g}].hooks[{h}]");
            if hook.kind != "command" {
                return Err((
                    at(),
                    format!(
                        "type {:?} is not run by Arbor (only \"command\" hooks are)",
                        hook.kind
                    ),
                ));
            }
            let Some(command) = hook.command.filter(|c| !c.trim().is_empty()) else {
                return Err((at(), "a command hook needs a command".to_owned()));
            };
            let timeout = match hook.timeout {
                None => DEFAULT_TIMEOUT,
                Some(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Duration::from_secs_f64(s),
                Some(s) => {
                    return Err((
                        at(),
                        format!("timeout {s} is not a number of seconds from 0 to 86400"),
                    ));
                }
            };
            hooks.push(Hook {
                event,
                matcher: matcher.clone(),
                command: HookCommand::Shell(command),
                timeout,
                agent: agent.cloned(),
            });
        }
    }
    Ok(hooks)
}

/// The events an agent file's `hooks` may name: those Arbor runs (the
/// start events with the agent's own start: `UserPromptSubmit` as a root,
/// `SubagentStart` as a child).
/// `Stop` is the agent's own end, run as `Stop` for a root and as
/// `SubagentStop` for a child (Claude Code turns it into `SubagentStop`).
pub const AGENT_FILE_EVENTS: [&str; 6] = [
    "PreToolUse",
    "PostToolUse",
    "Stop",
    "SubagentStop",
    "UserPromptSubmit",
    "SubagentStart",
];

impl HookSet {
    /// Adds the hooks of an agent file (Claude Code's `hooks` front matter:
    /// `{EVENT: [{matcher, hooks: [{type: command, command, timeout}]}]}`),
    /// run only for agents of type `agent`. An event outside
    /// [`AGENT_FILE_EVENTS`] or a hook Arbor cannot run is refused: `Err`
    /// is (key, why), the key as the front matter spells it
    /// (`hooks.PreToolUse[0].hooks[1]`).
    pub fn add_agent_hooks(&mut self, agent: &str, hooks: &Value) -> Result<(), (String, String)> {
        let by_event: BTreeMap<String, Vec<ClaudeGroup>> =
            serde_json::from_value(hooks.clone()).map_err(|e| {
                (
                    "hooks".to_owned(),
                    format!(
                        "not Claude Code's hooks ({{EVENT: [{{matcher, hooks: [{{type, command}}]}}]}}): {e}"
                    ),
                )
            })?;
        let scope: Arc<str> = Arc::from(agent);
        let mut added = Vec::new();
        for (name, groups) in by_event {
            let event = HookEvent::from_name(&name)
                .filter(|_| AGENT_FILE_EVENTS.contains(&name.as_str()))
                .ok_or_else(|| {
                    (
                        format!("hooks.{name}"),
                        format!(
                            "{name} hooks are not run by Arbor for an agent (only {} are)",
                            AGENT_FILE_EVENTS.join(", ")
                        ),
                    )
                })?;
            let hooks = claude_groups(event, &name, groups.clone(), Some(&scope))?;
            if event == HookEvent::Stop {
                // A child's end is SubagentStop, a root's Stop: both, each
                // for this agent only.
                let mut child =
                    claude_groups(HookEvent::SubagentStop, &name, groups, Some(&scope))?;
                added.append(&mut child);
            }
            added.extend(hooks);
        }
        if self.shell.as_os_str().is_empty() {
            self.shell = shell();
        }
        let mut all = self.hooks.to_vec();
        all.extend(added);
        self.hooks = all.into();
        Ok(())
    }
}

/// bash, as Claude Code runs hooks with; sh where there is none.
fn shell() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    crate::program::find_on(&path, Path::new("bash")).unwrap_or_else(|| PathBuf::from("/bin/sh"))
}

#[cfg(test)]
mod tests;
