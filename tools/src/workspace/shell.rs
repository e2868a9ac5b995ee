//! The shell tool's run: `bash -c COMMAND` in a directory of the workspace,
//! started, reaped and killed as command tools are (the `process` module's
//! runner: its own process group under a keeper, registered with the
//! reaper, the whole group killed on timeout, cancellation and exit, and a
//! call lock so a resumed call never runs beside an earlier attempt).
//!
//! The environment is empty but `PATH` and the workspace's allow-list
//! ([`super::DEFAULT_SHELL_ENV`] unless set). The command is *not* confined
//! to the workspace: without a sandbox it can read and write whatever the
//! user can, so a read-only workspace refuses the shell outright (a later
//! sandbox lifts that).

use std::process::Stdio;
use std::time::Duration;

use arbor_actors::ToolContext;
use tokio::process::Command;

use super::confine::{Access, Refusal, Workspace};
use crate::keeper::{self, CallLock};
use crate::process::{self as run, NotStarted};

/// How long a shell command may run when not told: two minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest a shell command may be given: ten minutes.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// How much of stdout a result keeps (Claude Code's 30 000 characters).
pub const MAX_STDOUT: usize = 30_000;

/// How much of stderr's end a result keeps.
pub const MAX_STDERR: usize = 10_000;

/// How a shell command ended.
#[derive(Clone, Debug)]
pub struct Ran {
    /// The working directory, relative to the workspace.
    pub cwd: String,
    /// The exit code (`None`: killed by a signal or timed out).
    pub code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// Whether it timed out (its process group was killed).
    pub timed_out: bool,
    /// stdout's head (with a note when cut).
    pub stdout: String,
    /// stderr's tail.
    pub stderr: String,
}

/// Runs `command` with `bash -c` in `cwd` (default: the workspace) for the
/// call `ctx` of the tool `tool`, for at most `timeout` (capped at
/// [`MAX_TIMEOUT`]).
pub async fn run(
    ws: &Workspace,
    ctx: &ToolContext,
    tool: &str,
    command: &str,
    cwd: Option<&str>,
    timeout: Duration,
) -> Result<Ran, Refusal> {
    let writable = ws.access() == Access::ReadWrite;
    if !writable && ws.sandbox.is_none() {
        return Err(Refusal(format!(
            "the shell is refused: the workspace {} is read-only, and a command could write anywhere without a sandbox",
            ws.root().display()
        )));
    }
    if command.trim().is_empty() {
        return Err(Refusal("the command is empty".to_owned()));
    }
    if command.contains('\0') {
        return Err(Refusal("the command contains a NUL byte".to_owned()));
    }
    let timeout = timeout.min(MAX_TIMEOUT);
    let (rel, _fd) = ws.open_dir(cwd.unwrap_or(""))?;
    let dir = ws.root().join(&rel);

    let tree = ctx.tree_id.to_string();
    let run_id = ctx.run_id.to_string();
    let key = [tree.as_str(), run_id.as_str(), ctx.call_id.as_str(), tool];
    let what = format!("{tool} (call {} of {run_id})", ctx.call_id);
    let lock = CallLock::take(&key, &what, timeout).await.map_err(|held| {
        let pid = held
            .pid
            .map(|p| format!(" (its keeper is pid {p})"))
            .unwrap_or_default();
        Refusal(format!(
            "{tool} was not started again: an earlier attempt of this call{pid} was still running after {timeout:?}"
        ))
    })?;

    // In the sandbox (bwrap), the workspace is the one writable place (or
    // none, read-only); without one, bash runs as Arbor's own process.
    let mut cmd = match &ws.sandbox {
        Some(sandbox) => {
            let mut cmd = Command::new(sandbox.program());
            cmd.args(sandbox.argv_with(
                ws.root(),
                writable,
                &dir,
                &["bash".to_owned(), "-c".to_owned(), command.to_owned()],
            ));
            cmd
        }
        None => {
            let mut cmd = Command::new("bash");
            cmd.arg("-c").arg(command);
            cmd
        }
    };
    cmd.env_clear().current_dir(&dir);
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    for name in &ws.env {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let kept = keeper::install(&mut cmd, lock.as_ref());
    let finished = run::run(cmd, kept, None, timeout, (MAX_STDOUT, MAX_STDERR), lock)
        .await
        .map_err(|e| match e {
            NotStarted::Spawn(e) => Refusal(format!("{tool}: could not start bash: {e}")),
            NotStarted::NoPid => Refusal(format!("{tool}: could not run: no pid")),
            NotStarted::Wait(e) => Refusal(format!("{tool}: could not be waited for: {e}")),
        })?;
    let mut stdout = finished.stdout.text();
    if finished.held_open {
        stdout.push_str(
            "\n[stopped reading: a process that left the command's process group kept its output open]",
        );
    }
    let (code, signal) = match finished.status {
        Some(status) => {
            use std::os::unix::process::ExitStatusExt as _;
            (status.code(), status.signal())
        }
        None => (None, None),
    };
    Ok(Ran {
        cwd: ws.show(&rel, false),
        code,
        signal,
        timed_out: finished.status.is_none(),
        stdout,
        stderr: finished.stderr.text(),
    })
}

impl Ran {
    /// One line on how it ended: `exit code 0`, `killed by signal 9`,
    /// `timed out after 2s (process group killed)`.
    pub fn ending(&self, timeout: Duration) -> String {
        match (self.timed_out, self.code, self.signal) {
            (true, _, _) => format!(
                "timed out after {:?} (process group killed)",
                timeout.min(MAX_TIMEOUT)
            ),
            (_, Some(code), _) => format!("exit code {code}"),
            (_, None, Some(signal)) => format!("killed by signal {signal}"),
            _ => "ended".to_owned(),
        }
    }
}
