//! The clap types: the commands and their flags. Their doc comments are the
//! `--help` texts.

use std::path::PathBuf;

use arbor::config::StoreLocation;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "arbor", version, about = "Run trees of LLM agents")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Run an agent tree on a prompt; shows the tree on stderr, prints the root's output.
    Run(RunArgs),
    /// Serve the HTTP API, live event streams and the live tree page; resumes
    /// the store's interrupted trees on start.
    Serve {
        /// Config file (default: ./config.toml if present, else the built-in one).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Address to listen on (default: [service] bind, 127.0.0.1:8080).
        #[arg(long)]
        bind: Option<String>,
        /// The store: a SQLite file or a postgres:// URL shared with other
        /// replicas (default: [store] url or path of the config).
        #[arg(long)]
        store: Option<StoreLocation>,
        /// Log lines on stdout as text or JSON.
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
        /// Load the agent files of this directory (or file) too: Claude
        /// Code's `.md` sub-agents, Codebuff's `.ts`/`.js`/`.json`
        /// definitions. Repeatable. The workspace's `.claude/agents` and
        /// `.agents` are loaded when present.
        #[arg(long = "agents", value_name = "DIR")]
        agents: Vec<PathBuf>,
    },
    /// Continue an interrupted tree from the store: finished runs are merged,
    /// cut-short runs go on from their last checkpoint.
    Resume {
        /// The tree to continue (its id, as `arbor runs` lists it).
        tree_id: String,
        /// Print the root's final AgentState as JSON instead of its output.
        #[arg(long)]
        json: bool,
        /// Do not show the tree on stderr.
        #[arg(long, short)]
        quiet: bool,
        /// Print every event as a JSON line on stderr instead of the tree.
        #[arg(long)]
        events: bool,
        /// Print the tree as lines even on a terminal (no live view).
        #[arg(long)]
        plain: bool,
        /// With --config: load the agent files of this directory too
        /// (repeatable); without it the tree runs on the agents it
        /// started with, stored with it.
        #[arg(long = "agents", value_name = "DIR")]
        agents: Vec<PathBuf>,
        /// Start the programs (handleSteps) of runs that had not finished
        /// over, running their tools again, instead of holding each to what
        /// it did (a program whose file was edited since fails otherwise).
        #[arg(long)]
        restart_programs: bool,
        #[command(flatten)]
        at: Stored,
    },
    /// Run a finished tree again on its recorded model replies (no network) and
    /// check that every final state matches.
    Replay {
        /// The finished tree to replay.
        tree_id: String,
        #[command(flatten)]
        at: Stored,
    },
    /// List stored trees, newest first.
    Runs {
        /// running, interrupted, completed, failed or cancelled.
        #[arg(long)]
        status: Option<arbor_supervisor::TreeStatus>,
        /// How many trees to list.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Print the trees as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Stored,
    },
    /// Send a running agent a message through `arbor serve` (semantics §9): it
    /// joins the agent's history at its next step boundary.
    Say {
        /// The run to tell: TREE/PATH, e.g. t3f0c.../0.2.
        run_id: String,
        /// What to tell it.
        text: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Show a tree's budgets in force, or raise a running tree's (semantics
    /// §13): agents paused on a spent budget go on. On the store (the process
    /// that runs the tree, `arbor run` or `arbor serve`, applies the raise),
    /// or through `arbor serve` with --server or $ARBOR_SERVER.
    Budget {
        /// The tree (its id, as `arbor runs` lists it).
        tree_id: String,
        /// Credits to add to the tree's budget in force.
        #[arg(long)]
        add_credits: Option<f64>,
        /// Tokens to add to the tree's budget in force.
        #[arg(long)]
        add_tokens: Option<u64>,
        /// Model steps to add to the tree's budget in force.
        #[arg(long)]
        add_steps: Option<u64>,
        /// Set the tree's credit budget to this.
        #[arg(long)]
        max_credits: Option<f64>,
        /// Set the tree's token budget to this.
        #[arg(long)]
        max_tokens: Option<u64>,
        /// Set the tree's step budget to this.
        #[arg(long)]
        max_steps: Option<u64>,
        #[command(flatten)]
        server: ServerArgs,
        #[command(flatten)]
        at: Stored,
    },
    /// Cancel a tree (its latest turn) or one run and its subtree, wherever
    /// it runs: on the store (the process that runs it, `arbor run` or `arbor
    /// serve`, ends it; a tree nobody runs is stored as cancelled, so no
    /// process resumes or adopts it), or through `arbor serve` with --server
    /// or $ARBOR_SERVER.
    Cancel {
        /// A tree id (as `arbor runs` lists it) or a run id TREE/PATH.
        id: String,
        #[command(flatten)]
        server: ServerArgs,
        #[command(flatten)]
        at: Stored,
    },
    /// Watch a tree run elsewhere, live, until it ends: by an `arbor serve`
    /// (with --server or $ARBOR_SERVER: its event stream, with the model's
    /// text as it streams in, followed again after a dropped connection or
    /// a restart) or by another process on the store (its journal). On a
    /// terminal, the view `arbor run` draws (↑/↓, enter, `c` cancels the
    /// selected run); off one, or with --plain, the line log. Exits 0 when
    /// the tree (or the run) completed.
    Watch {
        /// A tree id (as `arbor runs` lists it) or a run id TREE/PATH (its
        /// subtree).
        id: String,
        /// The line log even on a terminal.
        #[arg(long)]
        plain: bool,
        #[command(flatten)]
        server: ServerArgs,
        #[command(flatten)]
        at: Stored,
    },
    /// Print a shell completion script: `arbor completions bash >
    /// ~/.local/share/bash-completion/completions/arbor` (zsh: a `_arbor`
    /// file on $fpath; fish: ~/.config/fish/completions/arbor.fish).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// List the tool calls that wait for a person's decision on `arbor serve`
    /// (semantics §12), oldest first.
    Approvals {
        /// Only this tree's calls (default: every tree's).
        tree_id: Option<String>,
        /// Print the list as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Approve a waiting tool call through `arbor serve`: it runs, with the
    /// model's input or the one --input gives.
    Approve {
        /// The tree the call is in (its id, as `arbor approvals` lists it).
        tree_id: String,
        /// The tool call's id (the CALL column of `arbor approvals`).
        call_id: String,
        /// Run it with this input instead of the model's: a JSON value,
        /// checked against the tool's input schema.
        #[arg(long, value_name = "JSON", conflicts_with = "always")]
        input: Option<String>,
        /// Always allow its tool in this tree: its other waiting calls are
        /// approved too, and its later calls (any agent, any depth, later
        /// turns) run without asking. With `all`: every waiting call's tool.
        #[arg(long)]
        always: bool,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Deny a waiting tool call through `arbor serve`: it does not run, and
    /// the model reads an error result with the reason.
    Deny {
        /// The tree the call is in (its id, as `arbor approvals` lists it).
        tree_id: String,
        /// The tool call's id (the CALL column of `arbor approvals`).
        call_id: String,
        /// Why, for the model to read.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Show one stored run's state.
    Show {
        /// The run: TREE/PATH, e.g. t3f0c.../0.2 (`arbor tree TREE` lists them).
        run_id: String,
        /// Print the run's whole AgentState as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Stored,
    },
    /// Show a stored tree: every run with its status, steps, tokens and cost.
    Tree {
        /// The tree (its id, as `arbor runs` lists it).
        tree_id: String,
        /// Print the tree and its runs as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Stored,
    },
    /// Everything stored of a tree as one JSON document.
    Export {
        /// The tree to export.
        tree_id: String,
        /// Write here instead of stdout.
        #[arg(long, short)]
        output: Option<PathBuf>,
        #[command(flatten)]
        at: Stored,
    },
    /// Bring a store to this build's schema (a Postgres database is created
    /// empty by its administrator; this makes Arbor's tables in it); prints
    /// the schema version before and after.
    Migrate {
        #[command(flatten)]
        at: Stored,
    },
    /// Work on whole stores.
    #[command(subcommand)]
    Store(StoreCommand),
    /// MCP servers configured for other clients.
    #[command(subcommand)]
    Mcp(McpCommand),
    /// Delete trees that ended longer ago than --older-than.
    Gc {
        /// An age: 30d, 12h, 1h30m, 500ms, "30 days" (the duration grammar
        /// of every key and flag, see README).
        #[arg(long, value_parser = duration_arg)]
        older_than: std::time::Duration,
        #[command(flatten)]
        at: Stored,
    },
    /// List the agent templates of a config: what each is for, its model,
    /// tools and the agents it may spawn.
    Agents {
        /// Config file (default: ./config.toml if present, else the built-in one).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Load the agent files of this directory (or file) too: Claude
        /// Code's `.md` sub-agents, Codebuff's `.ts`/`.js`/`.json`
        /// definitions. Repeatable. The workspace's `.claude/agents` and
        /// `.agents` are loaded when present.
        #[arg(long = "agents", value_name = "DIR")]
        agents: Vec<PathBuf>,
    },
    /// List every tool with its source (built-in, MCP server, command) and
    /// the agents that are offered it (under [policy]; spawn tools only to
    /// agents that may spawn); starts the config's MCP servers to ask them
    /// for their tools.
    Tools {
        /// Config file (default: ./config.toml if present, else the built-in one).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Print every tool with its input schema as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the models of a config.
    Models {
        /// Config file (default: ./config.toml if present, else the built-in one).
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Send one tiny request to a model and report latency, usage and any problem in one line.
    Ping {
        /// Config file (default: ./config.toml if present, else the built-in one).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// The model's name under [models].
        model: String,
    },
    /// Run a load-test tree on the simulated model (or agent-shaped load on a real
    /// model) and report throughput, latency percentiles and memory.
    Loadtest(LoadtestArgs),
    /// Validate a config file and report every problem with its location.
    CheckConfig {
        /// The file (default: ./config.toml if present, else the built-in one).
        file: Option<PathBuf>,
        /// Load the agent files of this directory (or file) too: Claude
        /// Code's `.md` sub-agents, Codebuff's `.ts`/`.js`/`.json`
        /// definitions. Repeatable. The workspace's `.claude/agents` and
        /// `.agents` are loaded when present.
        #[arg(long = "agents", value_name = "DIR")]
        agents: Vec<PathBuf>,
    },
}

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// Config file (default: ./config.toml if present, else the built-in one).
    #[arg(long, short)]
    pub(crate) config: Option<PathBuf>,
    /// Agent to start (default: [run] agent in the config).
    #[arg(long, short)]
    pub(crate) agent: Option<String>,
    /// Run every agent on this model instead of its template's.
    #[arg(long, short)]
    pub(crate) model: Option<String>,
    /// Print the root's final AgentState as JSON instead of its output.
    #[arg(long)]
    pub(crate) json: bool,
    /// Do not show the tree on stderr.
    #[arg(long, short)]
    pub(crate) quiet: bool,
    /// Print the tree as lines even on a terminal (no live view).
    #[arg(long)]
    pub(crate) plain: bool,
    /// Params for the root agent, as a JSON object.
    #[arg(long)]
    pub(crate) params: Option<String>,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Use this tree id (every run id derives from it) instead of a random
    /// one: 1 to 128 letters, digits, '-', '_', '.' or ':'.
    #[arg(long)]
    pub(crate) tree_id: Option<arbor_actors::TreeId>,
    /// Ask a stored tree a follow-up question: its root goes on from its
    /// final state with PROMPT, as the tree's next turn (semantics §14).
    /// While a turn of it runs, --multitask says what to do.
    #[arg(long = "continue", value_name = "TREE", conflicts_with_all = ["tree_id", "agent", "model", "allow_tools", "deny_tools", "workspace", "read_only"])]
    pub(crate) continue_tree: Option<String>,
    /// With --continue, when the tree is running a turn: `enqueue` (wait in
    /// its queue, then run and show the turn), `reject` (refuse, exit 1) or
    /// `interrupt` (cancel the running turn, then the same as enqueue).
    #[arg(
        long,
        value_name = "STRATEGY",
        default_value = "enqueue",
        requires = "continue_tree"
    )]
    pub(crate) multitask: arbor_supervisor::Multitask,
    /// Print every event as a JSON line on stderr instead of the tree.
    #[arg(long)]
    pub(crate) events: bool,
    /// Only tools matching one of these patterns (comma-separated, `*`
    /// wildcards, e.g. `fs/read_*,rg`); narrows the config's [policy].
    #[arg(long, value_delimiter = ',', value_name = "PATTERNS")]
    pub(crate) allow_tools: Option<Vec<String>>,
    /// No tool matching one of these patterns (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "PATTERNS")]
    pub(crate) deny_tools: Vec<String>,
    /// The directory the tree's agents work in: every path the workspace
    /// tools (read, edit, grep, shell, …) take is resolved in it and cannot
    /// leave it. Default: the current directory.
    #[arg(long, value_name = "DIR")]
    pub(crate) workspace: Option<PathBuf>,
    /// The tree's agents may only read their workspace (write, edit and an
    /// unsandboxed shell are refused).
    #[arg(long)]
    pub(crate) read_only: bool,
    /// Load the agent files of this directory (or file) too: Claude Code's
    /// `.md` sub-agents, Codebuff's `.ts`/`.js`/`.json` definitions.
    /// Repeatable. The workspace's `.claude/agents` and `.agents` are
    /// loaded when present.
    #[arg(long = "agents", value_name = "DIR")]
    pub(crate) agents: Vec<PathBuf>,
    /// What to ask.
    pub(crate) prompt: String,
}

/// Which `arbor serve` a command talks to, and how it proves who it is.
#[derive(clap::Args)]
pub(crate) struct ServerArgs {
    /// The server (default: $ARBOR_SERVER, else http://127.0.0.1:8080).
    #[arg(long)]
    pub(crate) server: Option<String>,
    /// A bearer token of the server (default: $ARBOR_API_TOKEN).
    #[arg(long)]
    pub(crate) token: Option<String>,
    /// How long to wait for the server's whole answer, the connection
    /// included (at most 10s of it): 30s, 2m, 500ms.
    #[arg(long, value_parser = duration_arg, default_value = "30s")]
    pub(crate) timeout: std::time::Duration,
}

impl ServerArgs {
    /// Whether the command goes through a server rather than the store
    /// (`arbor budget`, `arbor cancel`): `--server`, `--token` or
    /// `$ARBOR_SERVER` given.
    pub(crate) fn given(&self) -> bool {
        self.server.is_some()
            || self.token.is_some()
            || std::env::var_os("ARBOR_SERVER").is_some_and(|v| !v.is_empty())
    }

    /// The server's URL and the token: the flags, else the environment.
    pub(crate) fn resolve(self) -> (String, Option<String>) {
        let server = self
            .server
            .or_else(|| std::env::var("ARBOR_SERVER").ok())
            .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
        let token = self.token.or_else(|| std::env::var("ARBOR_API_TOKEN").ok());
        (server, token)
    }
}

/// `arbor store …`.
#[derive(Subcommand)]
pub(crate) enum StoreCommand {
    /// Copy every tree (or one) from one store to another, unchanged: SQLite
    /// to Postgres and back, to move a deployment. A tree the target has
    /// already is left as it is there (and named).
    Copy {
        /// The store to copy from (a SQLite file or a postgres:// URL).
        from: StoreLocation,
        /// The store to copy to (created or migrated as needed).
        to: StoreLocation,
        /// Only this tree.
        #[arg(long)]
        tree: Option<String>,
    },
}

/// `arbor mcp …`.
#[derive(Subcommand)]
pub(crate) enum McpCommand {
    /// Print the `[mcp_servers.NAME]` tables of the servers in another
    /// client's MCP config: Claude Code's `.mcp.json`, Claude Desktop's and
    /// Cursor's (`mcpServers`), VS Code's (`servers`). Append them to a
    /// config: `arbor mcp import .mcp.json >> config.toml`. An entry Arbor
    /// would refuse is named with its key and why, and nothing is printed.
    Import {
        /// The JSON file.
        file: PathBuf,
    },
}

/// Where stored trees are: the config names the store unless `--store` does.
#[derive(clap::Args)]
pub(crate) struct Stored {
    /// Config file (default: ./config.toml if present, else the built-in one).
    #[arg(long, short)]
    pub(crate) config: Option<PathBuf>,
    /// The store: a SQLite file or a postgres:// URL (default: [store] url
    /// or path in the config).
    #[arg(long)]
    pub(crate) store: Option<StoreLocation>,
}

#[derive(clap::Args, Clone, Default)]
pub(crate) struct StoreArgs {
    /// Store the tree here: a SQLite file or a postgres:// URL (default:
    /// [store] url or path in the config).
    #[arg(long)]
    pub(crate) store: Option<StoreLocation>,
    /// Do not store the tree.
    #[arg(long, conflicts_with = "store")]
    pub(crate) no_store: bool,
}

#[derive(clap::Args)]
pub(crate) struct LoadtestArgs {
    /// Children per agent (0 to 10000; the whole tree at most 100000000
    /// agents).
    #[arg(long, default_value_t = 10)]
    pub(crate) fanout: usize,
    /// Levels below the root (0 to 100).
    #[arg(long, default_value_t = 4)]
    pub(crate) depth: usize,
    /// Children per level instead, e.g. 10,10,5 (overrides --fanout/--depth;
    /// at most 100 levels of 0 to 10000).
    #[arg(long, value_delimiter = ',')]
    pub(crate) shape: Option<Vec<usize>>,
    /// Messages of history the root starts with; every agent inherits them
    /// (0 to 100000; with --msg-bytes at most 100000000 bytes in all).
    #[arg(long, default_value_t = 0)]
    pub(crate) history: usize,
    /// Bytes per inherited message (0 to 10000000).
    #[arg(long, default_value_t = 200)]
    pub(crate) msg_bytes: usize,
    /// Simulated model latency: 0, 50ms, lognormal:200ms,0.5 (at most 1h,
    /// a sigma from 0 to 3); a bare tree's steps wait it too.
    #[arg(long, default_value = "0")]
    pub(crate) latency: String,
    /// Words per simulated reply (0 to 100000).
    #[arg(long, default_value_t = 20)]
    pub(crate) reply_tokens: usize,
    /// Agents stepping at once (spawns wait for a slot; 1 to 1000000); a
    /// bare tree's nodes too.
    #[arg(long)]
    pub(crate) max_live: Option<usize>,
    /// Drive this configured model with agent-shaped load instead.
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// Config file for --model (default: ./config.toml if present, else the built-in one).
    #[arg(long, short)]
    pub(crate) config: Option<PathBuf>,
    /// Stop the tree after this long (its deadline, e.g. 30s): a tree too
    /// large to finish runs to it and reports what it did.
    #[arg(long, value_parser = duration_arg)]
    pub(crate) duration: Option<std::time::Duration>,
    /// Run the tree this many times (1 to 1000).
    #[arg(long, default_value_t = 1)]
    pub(crate) repeat: usize,
    /// Write every figure as JSON.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Draw live agents and throughput over time and the latency
    /// distribution as SVG, titled with the shape and parameters.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
    /// Pass/fail criterion, as k6's: exit 99 when a figure crosses it (e.g.
    /// 'p99<2s', 'error_rate<1%', 'throughput>50'; repeatable). Metrics:
    /// p50 p90 p95 p99 max (latency of the endpoint's requests, else
    /// spawn→reply), error_rate, failures, throughput (agents ended/s).
    #[arg(long = "threshold", value_name = "METRIC<VALUE", value_parser = threshold_arg)]
    pub(crate) thresholds: Vec<arbor_cli::loadtest::threshold::Threshold>,
    /// Also run a bare tree of the same shape (--baseline-kind) and report
    /// Arbor's ratio to it.
    #[arg(long)]
    pub(crate) baseline: bool,
    /// Which bare tree --baseline runs (giving it implies --baseline): shared
    /// (actors sharing the history by reference, the default), none (no
    /// history), copied (a deep copy per actor: at most 4000000000 bytes of
    /// copies), tokio (tasks, no actors), all.
    #[arg(long, value_enum)]
    pub(crate) baseline_kind: Option<super::loadtest::BaselineChoice>,
    /// Run only the baseline, not Arbor's tree: the process then measures the
    /// bare tree alone (whole-process CPU and RSS).
    #[arg(long, conflicts_with_all = ["model", "plot", "store"])]
    pub(crate) baseline_only: bool,
    /// Store the trees in this SQLite file or postgres:// database and keep
    /// them (default: a temporary file, removed after the run).
    #[arg(long)]
    pub(crate) store: Option<StoreLocation>,
    /// Do not store the trees (measures Arbor without its store).
    #[arg(long, conflicts_with = "store")]
    pub(crate) no_store: bool,
}

/// A `--threshold` ([`arbor_cli::loadtest::threshold`]).
fn threshold_arg(
    text: &str,
) -> Result<arbor_cli::loadtest::threshold::Threshold, arbor_cli::loadtest::threshold::ThresholdError>
{
    text.parse()
}

/// A duration flag, in the one grammar Arbor reads durations in.
fn duration_arg(text: &str) -> Result<std::time::Duration, String> {
    arbor_actors::duration::parse(text).map_err(|e| e.why)
}
