//! MCP servers as tool sources, through the official Rust SDK (`rmcp`).
//!
//! A server is configured as `[mcp_servers.NAME]` ([`McpServerSection`] →
//! [`McpSettings`]): a process spoken to over stdio, or a streamable HTTP
//! endpoint. [`McpServers`] holds one connection per server for the whole
//! runtime, shared by every agent of every tree, and hands out its tools as
//! [`Tool`]s named `SERVER/TOOL`.
//!
//! **Lifecycle.** A server starts on its first [`McpServers::prepare`] (or
//! when the runtime starts, with `eager = true`): spawn or connect,
//! `initialize`, `tools/list`, all within `startup_timeout`. A start that
//! fails is retried with exponential backoff (100 ms doubling to 10 s); so is
//! a server whose process exits or whose session ends. Its tool list is
//! re-read on `notifications/tools/list_changed`, and every new list (first
//! start, change, restart) bumps [`McpServers::generation`].
//!
//! **Calls.** A call waits for one of the server's `max_concurrent` permits,
//! then runs under the server's `timeout` (the wait included). A call made
//! while the server restarts waits for it to come back (within that timeout);
//! a call to a server that never came up, or was shut down, fails at once.
//! When the connection ends under a call, the call fails at once. A call whose
//! future is dropped (its agent was cancelled) or that times out sends
//! `notifications/cancelled` for its request (rmcp does, when the request
//! future is dropped) and releases its permit.
//!
//! **Processes.** A stdio server runs in its own process group, registered
//! with the [reaper](crate::reaper) while it lives; its stderr goes to
//! `debug` logs. It inherits only [`config::INHERITED_ENV`] from Arbor's
//! environment, plus its `env` table.
//!
//! **Secrets.** Values of `env` and `headers` and the bearer token appear in
//! no log, error, status or `Debug` output: literals are redacted, and text
//! from the server or the SDK is scrubbed of the values a connection holds.

mod bounded;
mod call;
pub mod config;
mod connect;
pub mod import;
mod server;
mod sse;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arbor_actors::Tool;
use tokio::sync::watch;

use call::McpTool;
pub use config::{McpServerSection, McpSettings, McpTransport, ValueSource};
use server::Server;

/// How long [`McpServers::shutdown`] waits for one server's task.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// Why an MCP server has no tool list ([`McpServers::tools`]): what a call
/// of one of its tools, and the tool listing, say.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unlisted {
    /// No server of this name is configured.
    #[error("no MCP server named {0} is configured")]
    UnknownServer(String),
    /// The server could not start.
    #[error("MCP server {server} could not start: {reason}")]
    Failed {
        /// The server's name.
        server: String,
        /// Why it could not start.
        reason: String,
    },
    /// The server was not started (it starts on first use).
    #[error("MCP server {0} was not started")]
    NotStarted(String),
    /// The server is starting and has listed nothing yet.
    #[error("MCP server {0} is still starting")]
    Starting(String),
    /// The server was shut down.
    #[error("MCP server {0} was shut down")]
    Stopped(String),
}

/// Every configured MCP server of one runtime (share it as `Arc<McpServers>`).
pub struct McpServers {
    servers: BTreeMap<String, Arc<Server>>,
    generation: Arc<watch::Sender<u64>>,
}

impl fmt::Debug for McpServers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.servers.iter().map(|(name, s)| (name, s.status())))
            .finish()
    }
}

impl McpServers {
    /// The servers, none started yet.
    pub fn new(servers: BTreeMap<String, McpSettings>) -> Arc<McpServers> {
        let generation = Arc::new(watch::channel(0).0);
        let servers = servers
            .into_iter()
            .map(|(name, settings)| {
                let server = Server::new(name.clone(), settings, generation.clone());
                (name, Arc::new(server))
            })
            .collect();
        Arc::new(McpServers {
            servers,
            generation,
        })
    }

    /// The configured server names, in order.
    pub fn names(&self) -> Vec<String> {
        self.servers.keys().cloned().collect()
    }

    /// Starts `server` if it never was, and waits until its first start has
    /// succeeded or failed (bounded by its `startup_timeout`). Never fails:
    /// the outcome shows in [`tools`](Self::tools) and [`status`](Self::status).
    /// Concurrent prepares start a server once. Call within a tokio runtime.
    pub async fn prepare(&self, server: &str) {
        if let Some(server) = self.servers.get(server) {
            server.prepare().await;
        }
    }

    /// Starts every `eager = true` server in the background (call within a
    /// tokio runtime).
    pub fn start_eager(self: &Arc<Self>) {
        for server in self.servers.values().filter(|s| s.settings.eager) {
            server.ensure_started();
        }
    }

    /// The tools `server` lists now (after its allow-list), named
    /// `SERVER/TOOL`. `Err(reason)` if it never came up (or is unknown).
    pub fn tools(&self, server: &str) -> Result<Vec<Arc<dyn Tool>>, Unlisted> {
        let Some(handle) = self.servers.get(server) else {
            return Err(Unlisted::UnknownServer(server.to_owned()));
        };
        let listing = handle.listing()?;
        Ok(listing
            .tools
            .iter()
            .map(|tool| {
                Arc::new(McpTool {
                    server: Some(handle.clone()),
                    tool: tool.name.clone(),
                    name: format!("{server}/{}", tool.name),
                    description: tool.description.clone(),
                    schema: tool.schema.clone(),
                }) as Arc<dyn Tool>
            })
            .collect())
    }

    /// A handle to `server`'s tool `tool`: with its listed description and
    /// schema when known, else a permissive `{"type":"object"}` schema and a
    /// description saying it is unavailable. Calling it while the server is
    /// down, or for a tool the server does not list, gives a `ToolError`.
    pub fn tool(&self, server: &str, tool: &str) -> Arc<dyn Tool> {
        let handle = self.servers.get(server).cloned();
        let listed = handle.as_ref().and_then(|h| {
            let listing = h.listing().ok()?;
            listing.tools.iter().find(|t| t.name == tool).cloned()
        });
        match listed {
            Some(listed) => Arc::new(McpTool {
                server: handle,
                tool: listed.name,
                name: format!("{server}/{tool}"),
                description: listed.description,
                schema: listed.schema,
            }),
            None => Arc::new(McpTool::unlisted(handle, server, tool)),
        }
    }

    /// `SERVER/unavailable`: what an agent offered `SERVER/*` gets while the
    /// server is down, a tool whose description says why (calling it says so
    /// too, or runs nothing while the server is still starting).
    pub fn stand_in(&self, server: &str) -> Arc<dyn Tool> {
        let handle = self.servers.get(server).cloned();
        let why = McpTool::why_unlisted(handle.as_ref(), server);
        let mut tool = McpTool::unlisted(handle, server, "unavailable");
        tool.description = format!(
            "Stands in for the tools of MCP server {server}, which cannot be used now: {why}"
        );
        Arc::new(tool)
    }

    /// Increases whenever a server's tool list may have changed (it came up,
    /// it sent `tools/list_changed`, it restarted).
    pub fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Waits until [`generation`](Self::generation) is past `since`; returns it.
    pub async fn changed(&self, since: u64) -> u64 {
        let mut rx = self.generation.subscribe();
        let seen = rx.wait_for(|g| *g > since).await.map(|g| *g);
        seen.unwrap_or(since)
    }

    /// One line on `server`: `running with N tools`, `restarting after it …`,
    /// `could not start: …`, `not started`, `shut down`.
    pub fn status(&self, server: &str) -> String {
        match self.servers.get(server) {
            Some(s) => s.status(),
            None => "not configured".to_owned(),
        }
    }

    /// The pid of `server`'s process while it runs (stdio servers only).
    pub fn pid(&self, server: &str) -> Option<u32> {
        self.servers.get(server)?.pid()
    }

    /// Closes every session and ends every process (and waits for that);
    /// servers do not start or restart afterwards.
    pub async fn shutdown(&self) {
        let tasks: Vec<_> = self
            .servers
            .values()
            .filter_map(|s| s.begin_shutdown())
            .collect();
        let waits = tasks
            .into_iter()
            .map(|task| tokio::time::timeout(SHUTDOWN_WAIT, task));
        futures::future::join_all(waits).await;
    }
}

impl Drop for McpServers {
    /// Tells every server's task to stop (ending its process); `shutdown`
    /// is the way to also wait for that.
    fn drop(&mut self) {
        for server in self.servers.values() {
            drop(server.begin_shutdown());
        }
    }
}
