//! One run of a tool process in its own process group, shared by command
//! tools and the workspace's shell tool: spawn, register with the reaper,
//! read stdout's head and stderr's tail concurrently, and kill the group on
//! exit, timeout or cancellation (the future dropped).

use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio::time::Instant;

pub(crate) mod output;

use crate::keeper::CallLock;
use crate::reaper;
use output::{Head, Tail};

/// How long, after the program exited and its group was killed, the output
/// pipes may stay open (held by a process that left the group) before the
/// call stops reading them.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Stands in for a timeout too long to add to the clock (about 30 years).
const FOREVER: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// How long a killed group's leader gets to be reaped after a timeout.
const REAP_WAIT: Duration = Duration::from_secs(1);

/// How a run ended, with what it wrote.
pub(crate) struct Finished {
    /// The exit status; `None`: the run timed out and its group was killed.
    pub(crate) status: Option<ExitStatus>,
    /// A process that left the group kept the output pipes open after the
    /// program exited: reading stopped.
    pub(crate) held_open: bool,
    /// stdout's head.
    pub(crate) stdout: Head,
    /// stderr's tail.
    pub(crate) stderr: Tail,
}

/// Why a run could not start.
pub(crate) enum NotStarted {
    /// `spawn` failed.
    Spawn(std::io::Error),
    /// The child had no pid (cannot happen before it is reaped).
    NoPid,
    /// Waiting for the started child failed.
    Wait(std::io::Error),
}

/// Spawns `command` (already set up with piped stdout and stderr, its own
/// process group and, where `kept`, a keeper), feeds it `stdin`, and waits up
/// to `timeout`; the group is killed on every way out, including this future
/// being dropped.
pub(crate) async fn run(
    mut command: Command,
    kept: bool,
    stdin: Option<String>,
    timeout: Duration,
    limits: (usize, usize),
    lock: Option<CallLock>,
) -> Result<Finished, NotStarted> {
    let mut child = command.spawn().map_err(NotStarted::Spawn)?;
    // Dropping `group` (any return, or the call being cancelled) kills the
    // whole group.
    let Some(pid) = child.id() else {
        return Err(NotStarted::NoPid);
    };
    let mut group = if kept {
        reaper::register_keeper(pid)
    } else {
        reaper::register(pid)
    };
    if let Some(lock) = &lock {
        lock.note_pid(pid);
    }

    let mut stdout = Head::new(limits.0);
    let mut stderr = Tail::new(limits.1);
    let ended = {
        let feed = feed(child.stdin.take(), stdin);
        let out_pipe = child.stdout.take();
        let err_pipe = child.stderr.take();
        let drain = async {
            tokio::join!(feed, stdout.fill(out_pipe), stderr.fill(err_pipe));
        };
        tokio::pin!(drain);
        // A timeout too long for the clock is as good as none.
        let mut deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + FOREVER);
        let mut status = None;
        let mut drained = false;
        loop {
            tokio::select! {
                exit = child.wait(), if status.is_none() => {
                    // The program is done: end what it left behind (its
                    // keeper did already), so the pipes close once read
                    // to their end.
                    group.exited();
                    let exit = exit.map_err(NotStarted::Wait)?;
                    status = Some(exit);
                    deadline = deadline.min(Instant::now() + DRAIN_GRACE);
                }
                () = &mut drain, if !drained => drained = true,
                () = tokio::time::sleep_until(deadline) => {
                    break match status {
                        // A process outside the group holds the pipes open.
                        Some(exit) => (Some(exit), true),
                        None => (None, false),
                    };
                }
            }
            if drained && let Some(exit) = status {
                break (Some(exit), false);
            }
        }
    };

    match ended {
        (None, _) => {
            group.kill();
            // Reap the killed leader (it dies at once); the reaper would
            // otherwise leave that to tokio's orphan queue. A keeper that
            // exited has ended every process of the call.
            if let Ok(Ok(_)) = tokio::time::timeout(REAP_WAIT, child.wait()).await
                && let Some(lock) = lock
            {
                lock.release();
            }
        }
        (Some(_), _) => {
            if let Some(lock) = lock {
                lock.release();
            }
        }
    }
    Ok(Finished {
        status: ended.0,
        held_open: ended.1,
        stdout,
        stderr,
    })
}

/// Writes `text` to the process's stdin, then closes it. A program that exits
/// without reading it all is not an error (the write fails with EPIPE).
async fn feed(pipe: Option<tokio::process::ChildStdin>, text: Option<String>) {
    if let (Some(mut pipe), Some(text)) = (pipe, text) {
        let _ = pipe.write_all(text.as_bytes()).await;
        let _ = pipe.shutdown().await;
    }
}
