//! One server's lifecycle, run by a task of its own from its first
//! `prepare` until shutdown: start (connect, `initialize`, `tools/list`,
//! bounded by `startup_timeout`), serve (re-list on `tools/list_changed`,
//! notice the process exit or the session end), and restart with
//! exponential backoff after a failed start or a lost connection.
//!
//! Calls go through [`Server::call`]: a permit of the server's semaphore,
//! the per-call timeout, and an immediate error when the connection ends
//! under them.

use std::collections::HashSet;
use std::io;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arbor_actors::schema::Schema;
use arbor_actors::sync::LockExt as _;
use arbor_actors::{ToolError, ToolOutput};
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::{Peer, RoleClient, ServiceError};
use serde_json::Value;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::bounded;
use super::call::output;
use super::config::{McpSettings, McpTransport, show_duration};
use super::connect::{Connection, Process, Secrets, connect, exit_phrase, transport_error};

/// The first wait before a restart; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest wait before a restart. A connection that lived this long
/// resets the backoff.
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// How long a closing session may take to say goodbye.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// How long a stdio server may take to exit after its stdin closed, at shutdown.
const EXIT_GRACE: Duration = Duration::from_millis(500);
/// How long a call that saw a transport error waits to learn how the
/// connection ended (the process exit usually follows within milliseconds).
const END_REASON_WAIT: Duration = Duration::from_millis(500);

/// A tool as the server listed it (after the allow-list).
#[derive(Clone, Debug)]
pub(super) struct ListedTool {
    pub name: String,
    pub description: String,
    pub schema: Value,
}

/// A server's current tool list.
#[derive(Clone, Debug, Default)]
pub(super) struct Listing {
    /// The allowed tools whose schema compiles: what agents get.
    pub tools: Arc<Vec<ListedTool>>,
    /// Every allowed tool name the server listed (calls to these go through).
    pub names: Arc<HashSet<String>>,
}

#[derive(Clone, Debug, Default)]
enum Phase {
    #[default]
    NotStarted,
    /// The first start is under way.
    Starting,
    Running,
    /// It was up, and its connection ended; restarts are under way.
    Restarting {
        why: String,
        failed: Option<String>,
    },
    /// It never came up; starts are retried.
    Failed(String),
    Stopped,
}

#[derive(Default)]
struct State {
    phase: Phase,
    ever_up: bool,
    listing: Listing,
    live: Option<Arc<Live>>,
}

/// The connection calls use while it is up.
pub(super) struct Live {
    peer: Peer<RoleClient>,
    pid: Option<u32>,
    secrets: Secrets,
    /// `Some(how it ended)` once the connection is gone.
    ended: watch::Sender<Option<String>>,
    /// Calls that saw a transport failure report it here.
    broken: mpsc::Sender<String>,
}

impl Live {
    /// Waits until the connection has ended; says how.
    async fn ended(&self) -> String {
        let mut rx = self.ended.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            Err(_) => "closed the connection".to_owned(),
        }
    }
}

/// One configured server, shared by its tool handles and its task.
pub(super) struct Server {
    pub name: String,
    pub settings: McpSettings,
    permits: Arc<Semaphore>,
    generation: Arc<watch::Sender<u64>>,
    state: Mutex<State>,
    /// Bumped on every change of `state` (for waiters).
    changes: watch::Sender<u64>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Server {
    pub(super) fn new(
        name: String,
        settings: McpSettings,
        generation: Arc<watch::Sender<u64>>,
    ) -> Self {
        Server {
            permits: Arc::new(Semaphore::new(settings.max_concurrent)),
            name,
            settings,
            generation,
            state: Mutex::new(State::default()),
            changes: watch::channel(0).0,
            stop: watch::channel(false).0,
            task: Mutex::new(None),
        }
    }

    fn update<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let result = f(&mut self.state.locked());
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
        result
    }

    /// [`update`](Self::update) with a new tool list: the generation is
    /// bumped before waiters of either hear of it, so whoever sees the new
    /// state also sees the new generation.
    fn update_tools<T>(&self, f: impl FnOnce(&mut State) -> (bool, T)) -> T {
        let (changed, result) = f(&mut self.state.locked());
        if changed {
            self.generation.send_modify(|g| *g += 1);
        }
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
        result
    }

    fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.state.locked())
    }

    /// Starts the server's task unless it runs already or was shut down.
    pub(super) fn ensure_started(self: &Arc<Self>) {
        let mut task = self.task.locked();
        if task.is_some() || *self.stop.borrow() {
            return;
        }
        if !self.settings.enabled {
            self.update(|s| {
                s.phase =
                    Phase::Failed("it is disabled in the config (enabled = false)".to_owned());
            });
            return;
        }
        self.update(|s| s.phase = Phase::Starting);
        *task = Some(tokio::spawn(self.clone().run()));
    }

    /// Starts the server if it never was, and waits (up to a bit more than
    /// its `startup_timeout`) until its first start has succeeded or failed.
    pub(super) async fn prepare(self: &Arc<Self>) {
        self.ensure_started();
        let mut changes = self.changes.subscribe();
        let first_start = async {
            while self.read(|s| matches!(s.phase, Phase::Starting | Phase::NotStarted))
                && !*self.stop.borrow()
            {
                if changes.changed().await.is_err() {
                    break;
                }
            }
        };
        let bound = self.settings.startup_timeout + Duration::from_secs(1);
        let _ = tokio::time::timeout(bound, first_start).await;
    }

    /// Asks the task to stop and takes its handle (to await it).
    pub(super) fn begin_shutdown(&self) -> Option<JoinHandle<()>> {
        self.stop.send_replace(true);
        let task = self.task.locked().take();
        if task.is_none() {
            self.update(|s| s.phase = Phase::Stopped);
        }
        task
    }

    /// The current tool list; `Err` if the server never came up.
    pub(super) fn listing(&self) -> Result<Listing, super::Unlisted> {
        use super::Unlisted;
        let server = || self.name.clone();
        self.read(|s| match &s.phase {
            _ if s.ever_up => Ok(s.listing.clone()),
            Phase::Failed(why) => Err(Unlisted::Failed {
                server: server(),
                reason: why.clone(),
            }),
            Phase::NotStarted => Err(Unlisted::NotStarted(server())),
            Phase::Starting => Err(Unlisted::Starting(server())),
            Phase::Stopped => Err(Unlisted::Stopped(server())),
            Phase::Running | Phase::Restarting { .. } => Ok(s.listing.clone()),
        })
    }

    /// One line: how the server is doing.
    pub(super) fn status(&self) -> String {
        self.read(|s| match &s.phase {
            Phase::NotStarted => "not started".to_owned(),
            Phase::Starting => "starting".to_owned(),
            Phase::Running => {
                let n = s.listing.tools.len();
                let tools = if n == 1 { "tool" } else { "tools" };
                match s.live.as_ref().and_then(|l| l.pid) {
                    Some(pid) => format!("running with {n} {tools} (pid {pid})"),
                    None => format!("running with {n} {tools}"),
                }
            }
            Phase::Restarting { why, failed: None } => format!("restarting after it {why}"),
            Phase::Restarting {
                why,
                failed: Some(failed),
            } => format!("restarting after it {why} (last attempt: {failed})"),
            Phase::Failed(why) => format!("could not start: {why}"),
            Phase::Stopped => "shut down".to_owned(),
        })
    }

    /// The pid of the running stdio process.
    pub(super) fn pid(&self) -> Option<u32> {
        self.read(|s| s.live.as_ref().and_then(|l| l.pid))
    }

    /// The task: start, serve, restart with backoff, until told to stop.
    async fn run(self: Arc<Self>) {
        let mut stop = self.stop.subscribe();
        let mut backoff = BACKOFF_MIN;
        while !*stop.borrow() {
            let mut stage = Stage::Initialize;
            let start = tokio::time::timeout(self.settings.startup_timeout, self.start(&mut stage));
            let outcome = tokio::select! {
                outcome = start => outcome,
                () = stopped(&mut stop) => break,
            };
            match outcome {
                Ok(Ok((connection, listing))) => {
                    let up_since = Instant::now();
                    if !self.serve(connection, listing, &mut stop).await {
                        break;
                    }
                    if up_since.elapsed() >= BACKOFF_MAX {
                        backoff = BACKOFF_MIN;
                    }
                }
                Ok(Err(why)) => self.start_failed(why, backoff),
                Err(_) => self.start_failed(
                    stage.no_answer(&self.settings.transport, self.settings.startup_timeout),
                    backoff,
                ),
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stopped(&mut stop) => break,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
        self.update(|s| {
            s.phase = Phase::Stopped;
            s.live = None;
        });
    }

    /// Connects and lists the tools; `stage` says which step it is at.
    async fn start(&self, stage: &mut Stage) -> Result<(Connection, Listing), String> {
        *stage = Stage::Initialize;
        let connection = connect(&self.name, &self.settings.transport).await?;
        *stage = Stage::List;
        let listing = list_tools(&self.name, &self.settings, connection.service.peer())
            .await
            .map_err(|e| connection.secrets.scrub(&e))?;
        Ok((connection, listing))
    }

    fn start_failed(&self, why: String, backoff: Duration) {
        tracing::warn!(
            server = %self.name,
            "MCP server could not start: {why}; retrying in {}",
            show_duration(backoff)
        );
        self.update(|s| {
            s.phase = match &s.phase {
                Phase::Restarting { why: ended, .. } => Phase::Restarting {
                    why: ended.clone(),
                    failed: Some(why),
                },
                _ if s.ever_up => Phase::Restarting {
                    why: "ended".to_owned(),
                    failed: Some(why),
                },
                _ => Phase::Failed(why),
            };
        });
    }

    /// Serves one connection until it ends (`true`: restart it) or the
    /// server is shut down (`false`).
    async fn serve(
        self: &Arc<Self>,
        connection: Connection,
        listing: Listing,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let Connection {
            service,
            mut process,
            mut relist,
            secrets,
        } = connection;
        let (broken, mut broken_rx) = mpsc::channel(1);
        let live = Arc::new(Live {
            peer: service.peer().clone(),
            pid: process.as_ref().and_then(|p| p.pid),
            secrets,
            ended: watch::channel(None).0,
            broken,
        });
        let count = listing.tools.len();
        self.update_tools(|s| {
            s.phase = Phase::Running;
            s.ever_up = true;
            s.listing = listing;
            s.live = Some(live.clone());
            (true, ())
        });
        tracing::info!(server = %self.name, tools = count, "MCP server is up");

        let cancel = service.cancellation_token();
        let mut done = tokio::spawn(service.waiting());
        let mut done_finished = false;
        let exited = |status: io::Result<ExitStatus>| match status {
            Ok(status) => exit_phrase(status),
            Err(e) => format!("could not be waited for ({e})"),
        };
        // (why, whether the process exit is known)
        let end = loop {
            tokio::select! {
                status = wait_process(&mut process) => break Some((exited(status), true)),
                _ = &mut done, if !done_finished => {
                    done_finished = true;
                    break Some(("closed the connection".to_owned(), false));
                }
                Some(why) = broken_rx.recv() => {
                    break Some((format!("lost the connection ({why})"), false));
                }
                Some(()) = relist.recv() => self.spawn_relist(&live),
                () = stopped(stop) => break None,
            }
        };
        let why = match end {
            Some((why, false)) if process.is_some() => {
                // A closed pipe usually means the process is exiting: say how, if it is.
                match tokio::time::timeout(END_REASON_WAIT, wait_process(&mut process)).await {
                    Ok(status) => Some(exited(status)),
                    Err(_) => Some(why),
                }
            }
            end => end.map(|(why, _)| why),
        };

        // New calls wait for the restart; then calls in flight fail (in this
        // order, so that no call that learns of the end takes this connection
        // again), before the cleanup below.
        let phrase = why.clone().unwrap_or_else(|| SHUT_DOWN.to_owned());
        self.update(|s| {
            s.live = None;
            s.phase = match why {
                Some(_) => Phase::Restarting {
                    why: phrase.clone(),
                    failed: None,
                },
                None => Phase::Stopped,
            };
        });
        live.ended.send_replace(Some(phrase.clone()));
        if why.is_some() {
            tracing::warn!(server = %self.name, "MCP server {phrase}; restarting it");
        }
        cancel.cancel();
        if !done_finished {
            let _ = tokio::time::timeout(CLOSE_GRACE, done).await;
        }
        if let Some(process) = process {
            let grace = if why.is_some() {
                Duration::ZERO
            } else {
                EXIT_GRACE
            };
            process.end(grace).await;
        }
        why.is_some()
    }

    /// Re-lists the tools after `tools/list_changed`, in a task of its own.
    fn spawn_relist(self: &Arc<Self>, live: &Arc<Live>) {
        let server = self.clone();
        let live = live.clone();
        tokio::spawn(async move {
            let listing = tokio::time::timeout(
                server.settings.startup_timeout,
                list_tools(&server.name, &server.settings, &live.peer),
            )
            .await;
            match listing {
                Ok(Ok(listing)) => server.update_tools(|s| {
                    // Only if that connection is still the current one.
                    let current = s.live.as_ref().is_some_and(|l| Arc::ptr_eq(l, &live));
                    if current {
                        s.listing = listing;
                    }
                    (current, ())
                }),
                Ok(Err(e)) => tracing::warn!(
                    server = %server.name,
                    "MCP server's tool list changed; {}",
                    live.secrets.scrub(&e)
                ),
                Err(_) => tracing::warn!(
                    server = %server.name,
                    "MCP server's tool list changed; re-listing timed out"
                ),
            }
        });
    }

    /// Calls the server's tool `tool` (see the module doc of `mcp` for the rules).
    pub(super) async fn call(
        self: &Arc<Self>,
        tool: &str,
        input: Value,
    ) -> Result<ToolOutput, ToolError> {
        let full = format!("{}/{tool}", self.name);
        if !self.settings.allows(tool) {
            return Err(ToolError::new(format!(
                "MCP tool {full} is not allowed (mcp_servers.{}.tools)",
                self.name
            )));
        }
        let arguments = match input {
            Value::Object(arguments) => Some(arguments),
            Value::Null => None,
            _ => {
                return Err(ToolError::new(format!(
                    "MCP tool {full} takes a JSON object as input"
                )));
            }
        };
        let timeout = self.settings.timeout;
        match tokio::time::timeout(timeout, self.call_now(tool, &full, arguments)).await {
            Ok(result) => result,
            Err(_) => {
                let mut message =
                    format!("MCP tool {full} timed out after {}", show_duration(timeout));
                if let Phase::Restarting { why, .. } = self.read(|s| s.phase.clone()) {
                    message.push_str(&format!(" (the server is restarting after it {why})"));
                }
                Err(ToolError::new(message))
            }
        }
    }

    async fn call_now(
        self: &Arc<Self>,
        tool: &str,
        full: &str,
        arguments: Option<JsonObject>,
    ) -> Result<ToolOutput, ToolError> {
        // Held until the call returns or its future is dropped.
        let _permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ToolError::new(format!("MCP server {} was shut down", self.name)))?;
        let live = self.live().await?;
        if !self.read(|s| s.listing.names.contains(tool)) {
            return Err(ToolError::new(format!(
                "MCP server {} has no tool named {tool:?}",
                self.name
            )));
        }
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = arguments;
        let name = &self.name;
        // Dropping `call` (timeout, cancelled agent) makes rmcp send
        // `notifications/cancelled` for the request.
        let call = live.peer.call_tool(params);
        tokio::select! {
            biased;
            why = live.ended() => Err(ToolError::new(ended_during_call(name, &why))),
            result = call => match result {
                Ok(result) => output(result, &live.secrets, self.settings.max_output_bytes),
                Err(error @ (ServiceError::TransportSend(_) | ServiceError::TransportClosed)) => {
                    let error = match &error {
                        ServiceError::TransportSend(e) => transport_error(e),
                        _ => "the transport closed".to_owned(),
                    };
                    let _ = live.broken.try_send(live.secrets.scrub(&error));
                    let why = tokio::time::timeout(END_REASON_WAIT, live.ended())
                        .await
                        .unwrap_or_else(|_| format!("lost the connection ({error})"));
                    Err(ToolError::new(live.secrets.scrub(&ended_during_call(name, &why))))
                }
                Err(ServiceError::McpError(error)) if error.code.0 == bounded::TOO_LARGE => Err(ToolError::new(format!(
                    "MCP tool {full} failed: {}", error.message
                ))),
                Err(ServiceError::McpError(error)) => Err(ToolError::new(live.secrets.scrub(&format!(
                    "MCP tool {full} failed: {} (JSON-RPC error {})",
                    error.message, error.code.0
                )))),
                Err(error) => Err(ToolError::new(live.secrets.scrub(&format!(
                    "MCP tool {full} failed: {error}"
                )))),
            },
        }
    }

    /// The connection to call on. Waits while the server is (re)starting
    /// (the caller bounds the wait); fails at once if it never came up or was
    /// shut down.
    async fn live(self: &Arc<Self>) -> Result<Arc<Live>, ToolError> {
        if self.read(|s| matches!(s.phase, Phase::NotStarted)) {
            self.prepare().await;
        }
        let name = &self.name;
        let mut changes = self.changes.subscribe();
        loop {
            let now = self.read(|s| match (&s.phase, &s.live) {
                (Phase::Running, Some(live)) => Some(Ok(live.clone())),
                (Phase::Failed(why), _) => {
                    Some(Err(format!("MCP server {name} could not start: {why}")))
                }
                (Phase::Stopped, _) => Some(Err(format!("MCP server {name} was shut down"))),
                (Phase::NotStarted, _) if *self.stop.borrow() => {
                    Some(Err(format!("MCP server {name} was shut down")))
                }
                _ => None,
            });
            match now {
                Some(result) => return result.map_err(ToolError::new),
                None => {
                    if changes.changed().await.is_err() {
                        return Err(ToolError::new(format!("MCP server {name} was shut down")));
                    }
                }
            }
        }
    }
}

/// The step a start is at, to say which one got no answer.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// Starting or reaching the server and its `initialize` handshake.
    Initialize,
    /// `tools/list`.
    List,
}

impl Stage {
    /// Why a start that took all of `startup_timeout` failed.
    fn no_answer(self, transport: &McpTransport, within: Duration) -> String {
        let within = show_duration(within);
        match (self, transport) {
            (Stage::Initialize, McpTransport::Stdio { .. }) => format!(
                "it never answered the MCP initialize request within {within} (startup_timeout): \
                 is it an MCP server speaking JSON-RPC over stdio?"
            ),
            (Stage::Initialize, McpTransport::Http { .. }) => format!(
                "it never answered the MCP initialize request within {within} (startup_timeout)"
            ),
            (Stage::List, _) => {
                format!("it never answered tools/list within {within} (startup_timeout)")
            }
        }
    }
}

/// How a connection ended when the server was shut down.
const SHUT_DOWN: &str = "was shut down";

/// The error of a call whose connection ended under it.
fn ended_during_call(server: &str, why: &str) -> String {
    if why == SHUT_DOWN {
        format!("MCP server {server} was shut down during the call")
    } else {
        format!("MCP server {server} {why} during the call; it is being restarted")
    }
}

/// Resolves once `stop` is set (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Waits for the stdio process to exit; never resolves without one.
async fn wait_process(process: &mut Option<Process>) -> io::Result<ExitStatus> {
    match process {
        Some(process) => process.child.wait().await,
        None => std::future::pending().await,
    }
}

/// `tools/list` (every page), through the allow-list; tools whose
/// `inputSchema` does not compile are left out with a warning.
async fn list_tools(
    server: &str,
    settings: &McpSettings,
    peer: &Peer<RoleClient>,
) -> Result<Listing, String> {
    if peer
        .peer_info()
        .is_some_and(|info| info.capabilities.tools.is_none())
    {
        tracing::warn!(server, "MCP server offers no tools");
        return Ok(Listing::default());
    }
    let listed = peer
        .list_all_tools()
        .await
        .map_err(|e| format!("tools/list failed: {e}"))?;
    let mut tools = Vec::new();
    let mut names = HashSet::new();
    for tool in listed {
        if !settings.allows(&tool.name) {
            continue;
        }
        names.insert(tool.name.to_string());
        let schema = Value::Object(tool.input_schema.as_ref().clone());
        if let Err(e) = Schema::compile(schema.clone()) {
            tracing::warn!(
                server,
                tool = %tool.name,
                "MCP tool left out: its inputSchema does not compile: {e}"
            );
            continue;
        }
        let description = tool
            .description
            .map(|d| d.into_owned())
            .or(tool.title)
            .unwrap_or_default();
        tools.push(ListedTool {
            name: tool.name.into_owned(),
            description,
            schema,
        });
    }
    for pattern in settings.tools.iter().flatten() {
        if !pattern.contains('*') && !names.contains(pattern) {
            tracing::warn!(
                server,
                "mcp_servers.{server}.tools names {pattern:?}, which the server does not list"
            );
        }
    }
    Ok(Listing {
        tools: Arc::new(tools),
        names: Arc::new(names),
    })
}
