//! Arbor: an actor-based hierarchical supervisor for trees of LLM agents.
//!
//! This is the embedder's crate: the config and the [`Runtime`] over the
//! crates below it, each re-exported here: the agent runtime
//! [`arbor_actors`] ([`actors`]), tree-wide policy [`arbor_supervisor`]
//! ([`supervisor`]), the model providers over HTTP [`arbor_providers`]
//! ([`providers`]) and the tools from outside the runtime [`arbor_tools`]
//! ([`tools`]). The HTTP service is the `arbor-service` crate over this one,
//! the `arbor` binary the `arbor-cli` crate.
//!
//! Features (none by default): `otel` adds `telemetry` (OTLP traces);
//! `postgres` the shared PostgreSQL store (`[store] url = "postgres://…"`).
//!
//! Embedding: build a [`Runtime`] from a config, [`start`](Runtime::start) a
//! tree, watch its events, cancel it or wait for its final state, and look any
//! run up by id. A tool written in Rust implements [`Tool`] (see [`tool`]: the
//! attribute it needs, its input schema from a Rust type) and is registered
//! with [`RuntimeBuilder::tool`]; [`RunResult::text`] is a run's final text in
//! every output mode; an [`Event`] prints as one line. Every type these touch
//! is re-exported here. A whole program (the config read from a file, a Rust
//! tool, a two-level tree, its events, its final text, a cancel) is
//! `examples/embedding.rs`, shown in README's "Embedding".
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), arbor::Error> {
//! use arbor::actors::EventKind;
//! use arbor::{Config, Runtime};
//!
//! // The built-in config: a research swarm on the simulated model.
//! let runtime = Runtime::new(Config::default_config()?)?;
//! let mut run = runtime
//!     .start("coordinator", "Compare three sorting algorithms", None)
//!     .await?;
//! println!("tree {} started, root run {}", run.tree_id, run.run_id);
//!
//! let mut events = run.take_events();
//! let mut agents = 0;
//! while let Some(event) = events.recv().await {
//!     if let EventKind::AgentStarted { .. } = event.kind {
//!         agents += 1;
//!     }
//! }
//! let result = run.result().await?;
//! assert_eq!(result.state.status.as_str(), "completed");
//! assert_eq!(agents, 1 + result.state.child_run_ids.len() * 4);
//!
//! // Any run of the tree, by id.
//! let child = runtime.state(&result.state.child_run_ids[0]).await?;
//! assert_eq!(child.agent_type.as_deref(), Some("researcher"));
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod config;
#[cfg(feature = "otel")]
pub mod telemetry;

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

// Documented here in full (`cargo doc -p arbor-agents --no-deps`), so every
// type the runtime's API names links to a page of this crate's docs.
#[doc(inline)]
pub use arbor_actors as actors;
/// Real models over HTTP (the `arbor-providers` crate).
#[doc(inline)]
pub use arbor_providers as providers;
#[doc(inline)]
pub use arbor_supervisor as supervisor;
/// Tools from outside the runtime: MCP servers, command tools (the
/// `arbor-tools` crate).
#[doc(inline)]
pub use arbor_tools as tools;
pub use config::{Config, ConfigError};

/// Writing a tool in Rust: the [`Tool`] trait, what it takes and gives, the
/// [`async_trait`](macro@tool::async_trait) attribute its implementations need,
/// and [`schema_for`](tool::schema_for), the input schema of a Rust type.
pub use arbor_actors::tool;
pub use arbor_actors::tool::{Tool, ToolContext, ToolError, ToolOutput};
pub use arbor_actors::{
    AgentId, AgentState, AgentStatus, AgentTemplate, Delta, Event, EventKind, Limit, LimitHit,
    Message, OutputMode, RunId, RunResult, TreeId, Usage,
};
pub use arbor_supervisor::{
    Canceller, Catalog, Multitask, Queued, Retain, StartRequest, Supervisor, ToolRule, TreeLimits,
    TurnRequest,
};

use arbor_actors::sync::LockExt as _;
use arbor_supervisor::{EventStream, TreeHandle};
use serde_json::Value;
use tools::ToolSet;

/// Errors of the runtime, its config and the service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config could not be read or is invalid (every problem it has).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The supervisor refused or failed: an unknown agent, model, run or
    /// tree, input that does not fit the agent, a tree that could not start
    /// or be resumed, a store that cannot be opened, read or written.
    #[error(transparent)]
    Supervisor(#[from] arbor_supervisor::Error),
    /// The service's listening socket could not be bound.
    #[error("cannot listen on {addr}: {reason}")]
    Bind {
        /// The address asked for (`host:port`).
        addr: String,
        /// Why binding failed (the operating system's error).
        reason: String,
    },
    /// The service was asked to listen on a non-loopback address with no API
    /// tokens configured: it would serve anyone who can reach it.
    #[error(
        "refusing to listen on {addr} without API tokens: a non-loopback address needs \
         some; set {env} (the variable [service] tokens_env names) to one or more \
         comma-separated tokens, or give a [service.principals.NAME] its token_env"
    )]
    Insecure {
        /// The address asked for.
        addr: String,
        /// The environment variable the tokens are read from.
        env: String,
    },
    /// The service was started on a runtime without a store (it serves
    /// stored trees: `[store] enabled = true`).
    #[error("the service needs a store: set [store] enabled = true")]
    NoStore,
    /// Another failure of the service or the telemetry exporter, as text
    /// (setting up the OTLP client, reading the listener's address).
    #[error("{0}")]
    Service(String),
}

/// A supervisor built from a config (or from templates, models and tools in
/// code): the library's entry point.
pub struct Runtime {
    config: Option<Config>,
    supervisor: Supervisor,
    /// The config's MCP servers and command tools (one connection per server,
    /// shared by every tree of this runtime).
    tools: Option<ToolSet>,
    /// The catalogs (and tools) of other configs stored trees started with.
    others: Option<Arc<OtherConfigs>>,
}

/// The catalogs built from stored configs, one per distinct text, kept for
/// the runtime's life (their tool processes end with it).
#[derive(Default)]
struct OtherConfigs {
    built: std::sync::Mutex<std::collections::HashMap<Arc<str>, Built>>,
}

/// A stored config's catalog, and the tools it runs.
type Built = (Arc<arbor_supervisor::Catalog>, ToolSet);

/// How to build a [`Runtime`] beyond the defaults.
pub struct RuntimeBuilder {
    source: Source,
    store: Option<config::StoreLocation>,
    retain: Retain,
    tools: Vec<Arc<dyn arbor_actors::Tool>>,
    per_tree_configs: bool,
    confine_workspaces: bool,
}

enum Source {
    Config(Box<Config>),
    Code(Box<arbor_supervisor::Catalog>, arbor_supervisor::TreeLimits),
}

impl RuntimeBuilder {
    /// Stores every tree in this SQLite file (created if missing).
    pub fn store(mut self, path: impl AsRef<Path>) -> Self {
        self.store = Some(config::StoreLocation::Sqlite(path.as_ref().to_path_buf()));
        self
    }

    /// Stores every tree where `location` says: a SQLite file, or a
    /// Postgres database shared with other replicas (created or migrated
    /// as needed).
    pub fn store_at(mut self, location: config::StoreLocation) -> Self {
        self.store = Some(location);
        self
    }

    /// Which finished states stay in memory (runs not kept are read back from
    /// the store). A long-lived process with a store wants [`Retain::None`].
    pub fn retain(mut self, retain: Retain) -> Self {
        self.retain = retain;
        self
    }

    /// Registers a tool written in Rust; the config's templates may list it
    /// by its name (`tools = ["lookup"]`), like the config's own tools.
    pub fn tool(mut self, tool: Arc<dyn arbor_actors::Tool>) -> Self {
        self.tools.push(tool);
        self
    }

    /// Runs every resumed tree on the config it started with (stored with it),
    /// even when it differs from this runtime's: what a service restarted on
    /// an edited file wants. Without it, a tree resumed here runs on this
    /// runtime's config, and that override is recorded with the tree.
    pub fn per_tree_configs(mut self) -> Self {
        self.per_tree_configs = true;
        self
    }

    /// Takes a start request's workspace only inside the config's
    /// `[workspace] roots` (none without roots): for a service, whose
    /// callers are not on this machine. Without it, any directory (the CLI).
    pub fn confine_workspaces(mut self) -> Self {
        self.confine_workspaces = true;
        self
    }

    /// Builds the runtime. Inside a tokio runtime, MCP servers marked
    /// `eager = true` start now; the others start when a tree first needs them.
    pub fn build(self) -> Result<Runtime, Error> {
        let (config, catalog, limits, tools) = match self.source {
            Source::Config(config) => {
                let tools = config.tool_set();
                let catalog = config.catalog_with(&tools, &self.tools)?;
                let limits = config.limits.clone();
                (Some(*config), catalog, limits, Some(tools))
            }
            Source::Code(catalog, limits) => (None, *catalog, limits, None),
        };
        let mut supervisor = Supervisor::with_retention(catalog, limits, self.retain);
        if self.confine_workspaces {
            supervisor = supervisor.confine_workspaces();
        }
        let mut others = None;
        if let Some(config) = &config {
            supervisor = supervisor
                .with_config(config.snapshot())
                .with_steer_limits(config.service.steering)
                .with_turn_queue_limit(config.service.queued_turns);
            if self.per_tree_configs {
                let built = Arc::new(OtherConfigs::default());
                let (current, code_tools) = (config.clone(), self.tools.clone());
                let cache = built.clone();
                supervisor = supervisor.with_catalogs(Box::new(move |text: &str| {
                    cache
                        .catalog(text, &current, &code_tools)
                        .map_err(arbor_supervisor::BoxError::from)
                }));
                others = Some(built);
            }
        }
        if let Some(location) = &self.store {
            if let Some(config) = &config {
                supervisor = supervisor.with_store_fail_after(config.store_fail_after());
            }
            supervisor = supervisor.with_store(location.open()?)?;
        }
        if let (Some(tools), Ok(_)) = (&tools, tokio::runtime::Handle::try_current()) {
            tools.mcp().start_eager();
        }
        Ok(Runtime {
            config,
            supervisor,
            tools,
            others,
        })
    }
}

impl OtherConfigs {
    /// The catalog of a stored config (built once per text).
    fn catalog(
        &self,
        text: &str,
        current: &Config,
        code_tools: &[Arc<dyn arbor_actors::Tool>],
    ) -> Result<Arc<arbor_supervisor::Catalog>, Error> {
        let mut built = self.built.locked();
        if let Some((catalog, _)) = built.get(text) {
            return Ok(catalog.clone());
        }
        let config =
            Config::from_snapshot(text, "resumed", current.base_dir.clone(), Some(current))?;
        let tools = config.tool_set();
        let catalog = Arc::new(config.catalog_with(&tools, code_tools)?);
        tracing::info!("a resumed tree runs on the config it started with, not the current one");
        built.insert(Arc::from(text), (catalog.clone(), tools));
        Ok(catalog)
    }

    fn tool_sets(&self) -> Vec<ToolSet> {
        self.built
            .locked()
            .values()
            .map(|(_, t)| t.clone())
            .collect()
    }
}

impl Runtime {
    /// A runtime that keeps its trees in memory only.
    pub fn new(config: Config) -> Result<Runtime, Error> {
        Self::builder(config).build()
    }

    /// A runtime that stores every tree in the SQLite file at `path` (created if
    /// missing), so its runs can be browsed, resumed after a crash and replayed.
    pub fn with_store(config: Config, path: &Path) -> Result<Runtime, Error> {
        Self::builder(config).store(path).build()
    }

    /// A builder over `config`, to add a store, a retention policy, code
    /// tools or per-tree configs before [`build`](RuntimeBuilder::build).
    pub fn builder(config: Config) -> RuntimeBuilder {
        RuntimeBuilder {
            source: Source::Config(Box::new(config)),
            store: None,
            retain: Retain::All,
            tools: Vec::new(),
            per_tree_configs: false,
            confine_workspaces: false,
        }
    }

    /// A runtime over templates, models and tools built in code
    /// (`Catalog::builder()`), with these tree limits.
    pub fn from_catalog(
        catalog: arbor_supervisor::Catalog,
        limits: arbor_supervisor::TreeLimits,
    ) -> RuntimeBuilder {
        RuntimeBuilder {
            source: Source::Code(Box::new(catalog), limits),
            store: None,
            retain: Retain::All,
            tools: Vec::new(),
            per_tree_configs: false,
            confine_workspaces: false,
        }
    }

    /// The config it was built from (`None` when built in code).
    pub fn config(&self) -> Option<&Config> {
        self.config.as_ref()
    }

    /// Where its templates came from, recorded with each stored tree.
    pub fn origin(&self) -> Option<String> {
        self.config.as_ref().and_then(Config::origin)
    }

    /// The supervisor underneath, for what the runtime does not wrap: the
    /// event bus of every tree, the store, flushing it, tree-wide queries.
    pub fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    /// The config's MCP servers and command tools (`None` when built in code).
    pub fn tools(&self) -> Option<&ToolSet> {
        self.tools.as_ref()
    }

    /// Closes every MCP session and ends every tool process this runtime
    /// started. (Dropping the runtime ends the processes too.)
    pub async fn shutdown_tools(&self) {
        if let Some(tools) = &self.tools {
            tools.mcp().shutdown().await;
        }
        for tools in self.others.iter().flat_map(|o| o.tool_sets()) {
            tools.mcp().shutdown().await;
        }
    }

    /// Starts `agent` on `prompt` (and `params`, checked against the agent's
    /// input schema). Returns once the tree is started (and, with a store,
    /// durable), not when it ends.
    pub async fn start(
        &self,
        agent: &str,
        prompt: &str,
        params: Option<Value>,
    ) -> Result<Run, Error> {
        self.start_with(StartRequest {
            agent: agent.to_owned(),
            prompt: prompt.to_owned(),
            params,
            origin: self.origin(),
            ..StartRequest::default()
        })
        .await
    }

    /// Starts a tree with everything a [`StartRequest`] can say (a model or
    /// limits for this tree, a fixed tree id, a history to start from).
    pub async fn start_with(&self, mut request: StartRequest) -> Result<Run, Error> {
        // Subscribed before the tree exists, so no event is missed.
        let tree_id = request
            .tree_id
            .get_or_insert_with(arbor_supervisor::new_tree_id)
            .clone();
        let events = self.supervisor.events().subscribe_tree(&tree_id);
        let handle = self.supervisor.start(request).await?;
        Ok(Run::new(handle, events))
    }

    /// Resumes a stored tree that was interrupted (see
    /// [`Supervisor::resume`]): its events from the resume on, and its result.
    pub async fn resume(&self, tree_id: &TreeId) -> Result<Run, Error> {
        self.resume_with(tree_id, false).await
    }

    /// [`resume`](Self::resume), with `restart_programs`: the programs of
    /// runs that had not finished start over instead of being held to their
    /// record (see [`Supervisor::resume_with`]).
    pub async fn resume_with(
        &self,
        tree_id: &TreeId,
        restart_programs: bool,
    ) -> Result<Run, Error> {
        // Subscribed before the tree goes on, so no event is missed.
        let events = self.supervisor.events().subscribe_tree(tree_id);
        let handle = self
            .supervisor
            .resume_with(tree_id, restart_programs)
            .await?;
        Ok(Run::new(handle, events))
    }

    /// Asks a stored tree a follow-up turn (see [`Supervisor::start_turn`]):
    /// started here at once when the tree's last turn has ended (the turn's
    /// events and its result), or queued behind the running turn (or refused)
    /// as the request's multitask strategy says. A queued turn starts when
    /// the turns before it have ended, in whichever process takes it; wait
    /// for it with [`wait_queued`](Self::wait_queued).
    pub async fn start_turn(
        &self,
        tree_id: &TreeId,
        request: arbor_supervisor::TurnRequest,
    ) -> Result<TurnRun, Error> {
        // Subscribed before the turn starts, so no event is missed.
        let events = self.supervisor.events().subscribe_tree(tree_id);
        Ok(match self.supervisor.start_turn(tree_id, request).await? {
            arbor_supervisor::TurnStart::Started(handle) => {
                TurnRun::Started(Run::new(handle, events))
            }
            arbor_supervisor::TurnStart::Queued(queued) => TurnRun::Queued(queued),
        })
    }

    /// Waits for a queued turn until it starts here (this process takes it
    /// once the turns before it have ended: its events and its result) or
    /// has ended in another process that took it (its final state). Polls
    /// the store every 200 ms; fails if the turn leaves the queue without
    /// ever starting (it could not start: the tree's log says why).
    pub async fn wait_queued(
        &self,
        turn: &arbor_supervisor::store::QueuedTurn,
    ) -> Result<Waited, Error> {
        /// Polls a turn may be neither queued nor started for (taken, and
        /// starting elsewhere) before it counts as dropped.
        const GONE_FOR: u32 = 50;
        let mut gone = 0;
        loop {
            let events = self.supervisor.events().subscribe_tree(&turn.tree_id);
            if let Some((_, handle)) = self
                .supervisor
                .next_turn(&turn.tree_id, Some(turn.id))
                .await?
            {
                return Ok(Waited::Started(Run::new(handle, events)));
            }
            drop(events);
            let (run_id, tree_id, id) = (turn.run_id(), turn.tree_id.clone(), turn.id);
            /// What the store says of the turn.
            enum Seen {
                /// Queued, or running somewhere.
                Waiting,
                /// Ended, with this final state.
                Ended(Box<AgentState>),
                /// Neither queued nor started.
                Gone,
            }
            let seen = self
                .supervisor
                .read_store(move |store| match store.run(&run_id) {
                    Ok(run) => Ok(match run.state {
                        Some(state) if run.is_final => Seen::Ended(Box::new(state)),
                        _ => Seen::Waiting,
                    }),
                    Err(arbor_supervisor::Error::UnknownRun(_)) => {
                        let queued = store.queued_turns(&tree_id)?.iter().any(|q| q.id == id);
                        Ok(if queued { Seen::Waiting } else { Seen::Gone })
                    }
                    Err(error) => Err(error),
                })
                .await?;
            match seen {
                Seen::Ended(state) => return Ok(Waited::Ended(state)),
                Seen::Gone => {
                    gone += 1;
                    if gone >= GONE_FOR {
                        return Err(Error::Supervisor(arbor_supervisor::Error::NotResumable {
                            tree: turn.tree_id.clone(),
                            reason: format!(
                                "its queued turn {} left the queue without starting",
                                turn.run_id()
                            ),
                        }));
                    }
                }
                Seen::Waiting => gone = 0,
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Runs `agent` on `prompt` to the end.
    pub async fn run(&self, agent: &str, prompt: &str) -> Result<RunResult, Error> {
        self.start(agent, prompt, None).await?.result().await
    }

    /// Any run's state by id: live (its current state), finished in this
    /// process, or (with a store) as stored: final, or its last checkpoint.
    pub async fn state(&self, run_id: &RunId) -> Result<AgentState, Error> {
        match self.supervisor.state(run_id).await {
            Err(arbor_supervisor::Error::UnknownRun(_)) => {}
            found => return Ok(found?),
        }
        if self.supervisor.store().is_none() {
            return Err(arbor_supervisor::Error::UnknownRun(run_id.clone()).into());
        }
        let run = run_id.clone();
        let stored = self
            .supervisor
            .read_store_now(move |store| store.run(&run))
            .await?;
        stored
            .state
            .ok_or_else(|| arbor_supervisor::Error::UnknownRun(run_id.clone()).into())
    }
}

/// A started tree: its ids, its events, a way to cancel it, and its result.
pub struct Run {
    /// The tree's id (the prefix of every run id in it).
    pub tree_id: TreeId,
    /// The root run's id.
    pub run_id: RunId,
    events: Option<Events>,
    handle: TreeHandle,
}

impl Run {
    fn new(handle: TreeHandle, events: EventStream) -> Run {
        let run_id = handle.root_run_id.clone();
        Run {
            tree_id: handle.tree_id.clone(),
            events: Some(Events {
                rx: events,
                root: run_id.clone(),
                done: false,
            }),
            run_id,
            handle,
        }
    }

    /// The tree's events from its start (or its resume). Taken once; later
    /// calls get a stream that has ended.
    pub fn take_events(&mut self) -> Events {
        self.events.take().unwrap_or_else(|| Events {
            rx: tokio::sync::mpsc::unbounded_channel().1,
            root: self.run_id.clone(),
            done: true,
        })
    }

    /// Cancels the whole tree; its result still arrives (status `cancelled`).
    pub fn cancel(&self) {
        self.handle.cancel();
    }

    /// A cancel handle to keep after the `Run` is consumed.
    pub fn canceller(&self) -> Canceller {
        self.handle.canceller()
    }

    /// Waits for the root's final state (and for every agent of the tree to stop).
    pub async fn result(self) -> Result<RunResult, Error> {
        // Events nobody took must not pile up while the tree runs.
        let Run { handle, events, .. } = self;
        drop(events);
        Ok(handle.wait().await?)
    }
}

/// What [`Runtime::start_turn`] did with a follow-up turn.
pub enum TurnRun {
    /// It started here.
    Started(Run),
    /// It waits behind the tree's running turn (see [`Runtime::wait_queued`]).
    Queued(arbor_supervisor::Queued),
}

/// How a queued turn was waited for ([`Runtime::wait_queued`]).
pub enum Waited {
    /// This process took it and it runs here now.
    Started(Run),
    /// Another process took it and it has ended there: its root's final state.
    Ended(Box<AgentState>),
}

/// Every event of one tree, in order; ends after the root's final event.
/// Also a [`futures::Stream`].
pub struct Events {
    rx: EventStream,
    root: RunId,
    done: bool,
}

impl Events {
    /// The next event, waiting for it; `None` once the root's final event
    /// has been returned (or the stream was already taken).
    pub async fn recv(&mut self) -> Option<Arc<Event>> {
        std::future::poll_fn(|cx| self.poll(cx)).await
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Arc<Event>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let polled = self.rx.poll_recv(cx);
        if let Poll::Ready(Some(event)) = &polled {
            self.done = event.run_id == self.root && event.kind.final_state().is_some();
        }
        polled
    }
}

impl futures::Stream for Events {
    type Item = Arc<Event>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Arc<Event>>> {
        self.get_mut().poll(cx)
    }
}
