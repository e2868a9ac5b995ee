//! Command tools: a `[tools.NAME]` table that runs one program per call.
//!
//! ```toml
//! [tools.rg]
//! description = "Search the repository with ripgrep"
//! command = ["rg", "--json", "--glob={glob}", "--", "{pattern}", "."]
//! timeout = "20s"
//! max_output_bytes = 50000
//! [tools.rg.input_schema]
//! type = "object"
//! required = ["pattern"]
//! properties.pattern = { type = "string" }
//! properties.glob = { type = "string" }
//! ```
//!
//! # Templates
//!
//! `command` (the argv) and `stdin` are templates over the call's input
//! object:
//!
//! - `{name}` is replaced by the input property `name`, which `input_schema`'s
//!   `properties` must define. A string is used as is; a number or a boolean
//!   as its JSON text (`3`, `2.5`, `true`); an array or an object as compact
//!   JSON text. `{{` and `}}` are a literal `{` and `}`; any other lone brace
//!   is an error.
//! - A placeholder lives inside one argv element, and that element becomes
//!   exactly one argument: it is never split on spaces and never seen by a
//!   shell. There is no shell at all: the program is started directly, so
//!   `;`, `$(…)`, backticks, globs, quotes and newlines in a value reach the
//!   program literally. A value starting with `-` is still one argument, but
//!   the program may read it as an option: put `--` before such elements when
//!   the program supports it.
//! - An absent property (or one set to `null`) drops every argv element that
//!   mentions it, whether the element is exactly `{glob}` or embeds it, as in
//!   `--glob={glob}`. So optional flags are written as one element.
//! - `command[0]`, the program, is fixed: it may not contain placeholders. A
//!   bare name is looked up on `PATH` once, when the tool is built (so each
//!   call can be a `posix_spawn`, not a fork); a relative path with a `/` in it
//!   (`./bin/tool`) is relative to the config's directory.
//! - In `stdin`, an absent property is replaced by the empty string.
//!
//! # The process
//!
//! Each call starts the program in a new process group (registered with
//! [`crate::reaper`]; on Linux under a keeper,
//! [`crate::keeper`], so that it and everything it starts, even a
//! `setsid` double fork, die with Arbor, even on SIGKILL), with stdin fed from the `stdin` template (or
//! `/dev/null` without one) and stdout and stderr read concurrently. The
//! environment is empty except `PATH` (Arbor's, so bare names resolve as they
//! do for Arbor) and the variables named in `env` that Arbor's own
//! environment sets; `HOME`, `LANG` and the like must be listed to be passed.
//! The working directory is `cwd` (relative to the config's directory) or else
//! Arbor's own; under `[workspace] sandbox = "bwrap"` it is `cwd` or else
//! the calling agent's workspace (`/` for an agent without one), and the
//! program runs in the sandbox.
//!
//! When the program exits, whatever it left running in its group is killed
//! (SIGKILL), and the output already written is read to its end. The call's
//! result is the first `max_output_bytes` of stdout, as a JSON string (lossy
//! UTF-8, with a note when cut), if the program exited with code 0; otherwise
//! a tool error with the exit code or signal, stderr's last 4 KB and stdout.
//! On `timeout`, or when the call is cancelled (its future dropped), the whole
//! group is killed.
//!
//! A call first takes the call's lock ([`crate::keeper::CallLock`]),
//! held until all its processes have ended: when Arbor was killed during the
//! call and the tree is resumed, the call waits (up to its `timeout`) while
//! the earlier attempt may still be running, and is not started beside it.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use arbor_actors::schema::Schema;
use arbor_actors::tool::{Tool, ToolContext, ToolError, ToolOutput};
use async_trait::async_trait;
use nix::sys::signal::Signal;
use serde::Deserialize;
use serde_json::Value;
use tokio::process::Command;

use crate::keeper::{self, CallLock};

mod template;

use crate::process::output::Tail;
use crate::process::{self as run, NotStarted};
use template::Template;

/// How much of stderr's end a failure shows.
const STDERR_TAIL_BYTES: usize = 4096;

fn default_timeout() -> String {
    "60s".to_owned()
}

fn default_max_output_bytes() -> usize {
    100_000
}

/// How long one call may take: from 1 ms to a day.
pub const TIMEOUT_RANGE: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_secs(86_400));

/// The most output a call may keep (64 MiB): what a model can be sent.
pub const MAX_OUTPUT_BYTES: usize = 64 << 20;

/// A `[tools.NAME]` table of the config: a program run once per call.
/// [`CommandToolSection::build`] checks it and makes the [`CommandTool`].
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandToolSection {
    /// What the model is told the tool does.
    pub description: String,
    /// JSON Schema of the call's input: an object schema whose `properties`
    /// define every placeholder of `command` and `stdin`.
    pub input_schema: Value,
    /// The argv template: the program (no placeholders), then its arguments.
    pub command: Vec<String>,
    /// A template written to the process's stdin; without it stdin is `/dev/null`.
    #[serde(default)]
    pub stdin: Option<String>,
    /// The working directory, relative to the config's directory; without it,
    /// Arbor's own.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Names of variables passed from Arbor's environment (besides `PATH`,
    /// which always is). A listed variable Arbor does not have is not set.
    #[serde(default)]
    pub env: Vec<String>,
    /// How long a call may run before its process group is killed ("60s").
    #[serde(default = "default_timeout")]
    pub timeout: String,
    /// How much of stdout a result keeps (at least 1; 100 000 by default).
    #[serde(default = "default_max_output_bytes")]
    pub max_output_bytes: usize,
}

impl CommandToolSection {
    /// Checks the table and builds the tool `name`; paths (`cwd`, a relative
    /// program path) are relative to `base_dir`. On failure, every problem at
    /// once, each as (key in the table, message).
    pub fn build(&self, name: &str, base_dir: &Path) -> Result<CommandTool, Vec<(String, String)>> {
        let mut problems: Vec<(String, String)> = Vec::new();
        let mut problem = |key: &str, message: String| problems.push((key.to_owned(), message));

        let schema =
            check_schema(&self.input_schema).map_err(|m| problem("input_schema", m.to_string()));
        // The properties placeholders may use; None when the schema is so
        // broken that checking them against it would only add noise.
        let properties = object_properties(&self.input_schema);
        let mut program = None;
        let mut args = Vec::new();
        match self.command.split_first() {
            None => problem(
                "command",
                "is empty: it must name the program, then its arguments".to_owned(),
            ),
            Some((first, rest)) => {
                match Template::parse(first) {
                    Err(e) => problem("command", format!("command[0] ({first:?}): {e}")),
                    Ok(t) if t.fields().next().is_some() => problem(
                        "command",
                        format!(
                            "command[0] ({first:?}) is the program and may not contain placeholders"
                        ),
                    ),
                    Ok(t) => {
                        let text = t.render_or_empty(&Value::Null);
                        if text.is_empty() {
                            problem("command", "command[0] (the program) is empty".to_owned());
                        } else {
                            program = Some(resolve_program(&text, base_dir));
                        }
                    }
                }
                for (i, element) in rest.iter().enumerate() {
                    let what = format!("command[{}] ({element:?})", i + 1);
                    match Template::parse(element) {
                        Err(e) => problem("command", format!("{what}: {e}")),
                        Ok(t) => {
                            for m in undefined_fields(properties.as_ref(), &what, &t) {
                                problem("command", m);
                            }
                            args.push(t);
                        }
                    }
                }
            }
        }

        let stdin = match &self.stdin {
            None => None,
            Some(text) => match Template::parse(text) {
                Err(e) => {
                    problem("stdin", e.to_string());
                    None
                }
                Ok(t) => {
                    for m in undefined_fields(properties.as_ref(), "stdin", &t) {
                        problem("stdin", m);
                    }
                    Some(t)
                }
            },
        };

        let cwd = self.cwd.as_ref().map(|dir| base_dir.join(dir));
        // Absolute, so a sandbox (`bwrap --chdir`) finds it as Arbor does.
        let cwd = cwd.map(|dir| std::path::absolute(&dir).unwrap_or(dir));
        if let Some(dir) = &cwd
            && !dir.is_dir()
        {
            problem("cwd", format!("{} is not a directory", dir.display()));
        }

        for var in &self.env {
            if var.is_empty() || var.contains(['=', '\0']) {
                problem(
                    "env",
                    format!("{var:?} is not a variable name (no '=', no NUL, not empty)"),
                );
            }
        }

        let timeout = match arbor_actors::duration::parse(&self.timeout)
            .map_err(|e| e.to_string())
            .and_then(|d| {
                arbor_actors::duration::within(d, TIMEOUT_RANGE.0, TIMEOUT_RANGE.1)
                    .map_err(|e| e.to_string())
            }) {
            Ok(d) => Some(d),
            Err(e) => {
                problem("timeout", e);
                None
            }
        };

        if !(1..=MAX_OUTPUT_BYTES).contains(&self.max_output_bytes) {
            problem(
                "max_output_bytes",
                format!("must be from 1 to {MAX_OUTPUT_BYTES}"),
            );
        }

        match (schema, program, timeout) {
            (Ok(schema), Some(program), Some(timeout)) if problems.is_empty() => Ok(CommandTool {
                name: name.to_owned(),
                description: self.description.clone(),
                schema,
                spawn: on_path(&program),
                program,
                args,
                stdin,
                cwd,
                env: self.env.clone(),
                timeout,
                timeout_text: self.timeout.trim().to_owned(),
                max_output_bytes: self.max_output_bytes,
                sandbox: None,
            }),
            _ => Err(problems),
        }
    }
}

/// What is wrong with a command tool's input schema.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum SchemaProblem {
    /// Not a table.
    #[error("must be a JSON Schema object (a table with type = \"object\")")]
    NotATable,
    /// Not of an object.
    #[error("must describe an object: type = \"object\"")]
    NotAnObject,
    /// `properties` is not a table.
    #[error("properties must be a table of property schemas")]
    Properties,
    /// The schema does not compile.
    #[error("is not a valid JSON Schema: {0}")]
    Invalid(String),
}

/// Compiles an input schema that must describe an object.
fn check_schema(source: &Value) -> Result<Schema, SchemaProblem> {
    let Some(table) = source.as_object() else {
        return Err(SchemaProblem::NotATable);
    };
    if table.get("type") != Some(&Value::from("object")) {
        return Err(SchemaProblem::NotAnObject);
    }
    if table.get("properties").is_some_and(|p| !p.is_object()) {
        return Err(SchemaProblem::Properties);
    }
    Schema::compile(source.clone()).map_err(|e| SchemaProblem::Invalid(e.to_string()))
}

/// The property names of an object schema, or None if it is not one.
fn object_properties(source: &Value) -> Option<BTreeSet<String>> {
    let table = source.as_object()?;
    if table.get("type") != Some(&Value::from("object")) {
        return None;
    }
    match table.get("properties") {
        None => Some(BTreeSet::new()),
        Some(Value::Object(p)) => Some(p.keys().cloned().collect()),
        Some(_) => None,
    }
}

/// A message for each placeholder of `template` (described as `what`) that
/// `properties` does not define; none when the properties are unknown.
fn undefined_fields(
    properties: Option<&BTreeSet<String>>,
    what: &str,
    template: &Template,
) -> Vec<String> {
    let Some(properties) = properties else {
        return Vec::new();
    };
    let defined = || {
        if properties.is_empty() {
            "input_schema defines no properties".to_owned()
        } else {
            let names: Vec<&str> = properties.iter().map(String::as_str).collect();
            format!("input_schema's properties are: {}", names.join(", "))
        }
    };
    template
        .fields()
        .filter(|field| !properties.contains(*field))
        .map(|field| {
            format!(
                "{what}: placeholder {{{field}}} is not a property of input_schema ({})",
                defined()
            )
        })
        .collect()
}

/// A bare name is looked up on PATH at spawn; a relative path is relative to
/// `base_dir`.
fn resolve_program(text: &str, base_dir: &Path) -> PathBuf {
    let path = Path::new(text);
    if text.contains('/') && path.is_relative() {
        base_dir.join(path)
    } else {
        path.to_path_buf()
    }
}

/// A bare program name's first executable file on this process's `PATH`
/// (the `PATH` each call passes on, so the same program a lookup at spawn
/// would find); a path, or a name not found (the call then says so), as is.
/// Relative `PATH` entries are skipped: they depend on the call's `cwd`.
fn on_path(program: &Path) -> PathBuf {
    if program.components().count() != 1 || !program.is_relative() {
        return program.to_path_buf();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    crate::program::find_on(&path, program).unwrap_or_else(|| program.to_path_buf())
}

/// A command tool, built from a [`CommandToolSection`]: each call renders the
/// argv and stdin from the input and runs the program (see the module docs).
#[derive(Clone, Debug)]
pub struct CommandTool {
    name: String,
    description: String,
    schema: Schema,
    program: PathBuf,
    /// What is spawned: a bare program name found on `PATH` when the tool was
    /// built (so std can `posix_spawn` it; with a changed environment and a
    /// bare name it would fork: measured 1.6–1.8× the cost of a bare spawn
    /// loop, BENCHMARKS.md), else `program` as written.
    spawn: PathBuf,
    args: Vec<Template>,
    stdin: Option<Template>,
    cwd: Option<PathBuf>,
    env: Vec<String>,
    timeout: Duration,
    timeout_text: String,
    max_output_bytes: usize,
    /// The sandbox its calls run in (`[workspace] sandbox`), if any: the
    /// calling agent's workspace writable (unless read-only), the rest of
    /// the file system read-only, a fresh `/tmp`, no network unless allowed.
    sandbox: Option<crate::sandbox::Sandbox>,
}

/// Where a sandboxed call runs: the sandbox, the workspace it may write
/// (or only read) and the directory it starts in.
struct Confined<'a> {
    sandbox: &'a crate::sandbox::Sandbox,
    workspace: Option<(PathBuf, bool)>,
}

impl CommandTool {
    /// The same tool, its calls run in `sandbox` (none: as Arbor's own
    /// processes).
    pub fn with_sandbox(mut self, sandbox: Option<crate::sandbox::Sandbox>) -> Self {
        self.sandbox = sandbox;
        self
    }

    /// The argv a call with `input` runs: the program, then the arguments
    /// (elements mentioning an absent property dropped). Pure.
    pub fn argv(&self, input: &Value) -> Vec<String> {
        let mut argv = Vec::with_capacity(self.args.len() + 1);
        argv.push(self.program.to_string_lossy().into_owned());
        argv.extend(self.args(input));
        argv
    }

    /// The text a call with `input` writes to stdin, or None if stdin is
    /// `/dev/null`. Pure.
    pub fn stdin_text(&self, input: &Value) -> Option<String> {
        self.stdin.as_ref().map(|t| t.render_or_empty(input))
    }

    /// The compiled input schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The program: a bare name (looked up on PATH) or a path.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// How long a call may run.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How much of stdout a result keeps.
    pub fn max_output_bytes(&self) -> usize {
        self.max_output_bytes
    }

    fn args(&self, input: &Value) -> impl Iterator<Item = String> {
        self.args.iter().filter_map(|t| t.render(input))
    }

    /// The command for one call, and whether it runs under a keeper.
    fn command(
        &self,
        args: &[String],
        piped_stdin: bool,
        lock: Option<&CallLock>,
        confined: Option<&Confined<'_>>,
    ) -> (Command, bool) {
        let mut command = match confined {
            Some(Confined { sandbox, workspace }) => {
                let mut argv = Vec::with_capacity(args.len() + 1);
                argv.push(self.spawn.to_string_lossy().into_owned());
                argv.extend(args.iter().cloned());
                let (root, writable) = match workspace {
                    Some((root, writable)) => (root.clone(), *writable),
                    None => (PathBuf::from("/"), false),
                };
                let cwd = self.cwd.clone().unwrap_or_else(|| root.clone());
                let mut command = Command::new(sandbox.program());
                command.args(sandbox.argv_with(&root, writable, &cwd, &argv));
                command
            }
            None => {
                let mut command = Command::new(&self.spawn);
                command.args(args);
                command
            }
        };
        command.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
        for name in &self.env {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        if let (Some(dir), None) = (&self.cwd, confined) {
            command.current_dir(dir);
        }
        command
            .stdin(if piped_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let kept = keeper::install(&mut command, lock);
        (command, kept)
    }

    fn error(&self, message: impl std::fmt::Display) -> ToolError {
        ToolError::new(format!("command {} {message}", self.name))
    }

    /// Runs the program once; the process group is killed on every way out
    /// (including this future being dropped) by the reaper registration.
    async fn run(
        &self,
        args: Vec<String>,
        stdin: Option<String>,
        lock: Option<CallLock>,
        confined: Option<Confined<'_>>,
    ) -> Result<String, ToolError> {
        if let Some(i) = args.iter().position(|a| a.contains('\0')) {
            return Err(self.error(format_args!(
                "could not run: argument {} contains a NUL byte, which no program argument can hold",
                i + 1
            )));
        }
        let (command, kept) =
            self.command(&args, stdin.is_some(), lock.as_ref(), confined.as_ref());
        let limits = (self.max_output_bytes, STDERR_TAIL_BYTES);
        let finished = match run::run(command, kept, stdin, self.timeout, limits, lock).await {
            Ok(finished) => finished,
            Err(NotStarted::Spawn(e)) => {
                let place = self
                    .cwd
                    .as_ref()
                    .map(|d| format!(" in {}", d.display()))
                    .unwrap_or_default();
                return Err(self.error(format_args!(
                    "could not start program {:?}{place}: {e}",
                    self.program.display().to_string()
                )));
            }
            Err(NotStarted::NoPid) => {
                return Err(self.error("could not run: the process has no pid"));
            }
            Err(NotStarted::Wait(e)) => {
                return Err(self.error(format_args!("could not be waited for: {e}")));
            }
        };
        let Some(status) = finished.status else {
            return Err(self.error(format_args!(
                "timed out after {} (process group killed)",
                self.timeout_text
            )));
        };
        let mut text = finished.stdout.text();
        if finished.held_open {
            text.push_str(
                "\n[stopped reading: a process that left the command's process group kept its output open]",
            );
        }
        if status.success() {
            Ok(text)
        } else {
            Err(self.failure(status, &finished.stderr, &text))
        }
    }

    /// The error for a program that ended unsuccessfully.
    fn failure(&self, status: ExitStatus, stderr: &Tail, stdout: &str) -> ToolError {
        let mut message = match (status.code(), status.signal()) {
            (Some(code), _) => format!("command {} exited with code {code}", self.name),
            (None, Some(signal)) => {
                let name = Signal::try_from(signal).map_or("unknown signal", Signal::as_str);
                format!(
                    "command {} was killed by signal {signal} ({name})",
                    self.name
                )
            }
            (None, None) => format!("command {} failed: {status}", self.name),
        };
        let err = stderr.text();
        let err = err.trim_end();
        if err.is_empty() {
            message.push_str("\nstderr: (empty)");
        } else if stderr.total > stderr.kept.len() as u64 {
            let _ = write!(
                message,
                "\nstderr (the last {} of {} bytes):\n{err}",
                stderr.kept.len(),
                stderr.total
            );
        } else {
            let _ = write!(message, "\nstderr:\n{err}");
        }
        let out = stdout.trim_end();
        if !out.is_empty() {
            let _ = write!(message, "\nstdout:\n{out}");
        }
        ToolError::new(message)
    }
}

#[async_trait]
impl Tool for CommandTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn input_schema(&self) -> Value {
        self.schema.source().clone()
    }

    async fn call(&self, input: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: Vec<String> = self.args(&input).collect();
        let stdin = self.stdin_text(&input);
        // An earlier attempt of this very call (an Arbor killed while it
        // ran, now resumed) may still be ending: never run a second copy
        // beside it.
        let run_id = ctx.run_id.to_string();
        let key = [&*ctx.tree_id, &run_id, &ctx.call_id, &self.name];
        let what = format!(
            "command {} (call {} of {})",
            self.name, ctx.call_id, ctx.run_id
        );
        let lock = CallLock::take(&key, &what, self.timeout).await.map_err(|held| {
            let pid = held
                .pid
                .map(|p| format!(" (its keeper is pid {p})"))
                .unwrap_or_default();
            self.error(format_args!(
                "was not started again: an earlier attempt of this call{pid} was still running after {}",
                self.timeout_text
            ))
        })?;
        // Sandboxed (`[workspace] sandbox`): in the calling agent's
        // workspace's sandbox (a worktree's lets git write its repository
        // too), with no writable workspace when the agent has none.
        let workspace = match (&self.sandbox, &ctx.workspace) {
            (Some(_), Some(_)) => Some(crate::workspace::workspace_of(&self.name, &ctx).await?),
            _ => None,
        };
        let confined = self.sandbox.as_ref().map(|config| Confined {
            sandbox: workspace
                .as_ref()
                .and_then(|ws| ws.sandbox.as_ref())
                .unwrap_or(config),
            workspace: workspace.as_ref().map(|ws| {
                (
                    ws.root().to_path_buf(),
                    ws.access() == crate::workspace::Access::ReadWrite,
                )
            }),
        });
        let stdout = self.run(args, stdin, lock, confined).await?;
        Ok(ToolOutput::Json(Value::String(stdout)))
    }
}
