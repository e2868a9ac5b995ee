//! The `arbor` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use arbor::config::{Config, ConfigError};
use arbor::render::{TreeRenderer, final_text};
use arbor::{Error, Runtime};
use arbor_actors::AgentStatus;
use arbor_supervisor::StartRequest;
use arbor_supervisor::store::{SqliteStore, Store, TreeFilter};
use clap::{Parser, Subcommand};

/// mimalloc measured 2× faster than glibc's allocator on agent trees (BENCHMARKS.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "arbor", version, about = "Run trees of LLM agents")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run an agent tree on a prompt; shows the tree on stderr, prints the root's output.
    Run {
        /// Config file (default: ./config.toml if present, else the built-in one).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Agent to start (default: [run] agent in the config).
        #[arg(long, short)]
        agent: Option<String>,
        /// Run every agent on this model instead of its template's.
        #[arg(long, short)]
        model: Option<String>,
        /// Print the root's final AgentState as JSON instead of its output.
        #[arg(long)]
        json: bool,
        /// Do not show the tree on stderr.
        #[arg(long, short)]
        quiet: bool,
        /// Params for the root agent, as a JSON object.
        #[arg(long)]
        params: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
        /// Use this tree id (every run id derives from it) instead of a random one.
        #[arg(long)]
        tree_id: Option<String>,
        /// Print every event as a JSON line on stderr instead of the tree.
        #[arg(long)]
        events: bool,
        /// Only tools matching one of these patterns (comma-separated, `*`
        /// wildcards, e.g. `fs/read_*,rg`); narrows the config's [policy].
        #[arg(long, value_delimiter = ',', value_name = "PATTERNS")]
        allow_tools: Option<Vec<String>>,
        /// No tool matching one of these patterns (comma-separated).
        #[arg(long, value_delimiter = ',', value_name = "PATTERNS")]
        deny_tools: Vec<String>,
        /// What to ask.
        prompt: String,
    },
    /// Serve the HTTP API, live event streams and the live tree page; resumes
    /// the store's interrupted trees on start.
    Serve {
        /// Config file (default: ./config.toml if present, else the built-in one).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Address to listen on (default: [service] bind, 127.0.0.1:8080).
        #[arg(long)]
        bind: Option<String>,
        /// The store (default: [store] path of the config).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Log lines on stdout as text or JSON.
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
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
        status: Option<String>,
        /// How many trees to list.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Print the trees as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Stored,
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
    },
    /// List every tool an agent could get, with its source (built-in, MCP
    /// server, command) and the agents that list it; starts the config's MCP
    /// servers to ask them for their tools.
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
    },
}

/// Where stored trees are: the config names the store unless `--store` does.
#[derive(clap::Args)]
struct Stored {
    /// Config file (default: ./config.toml if present, else the built-in one).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// The store file (default: [store] path in the config).
    #[arg(long)]
    store: Option<PathBuf>,
}

#[derive(clap::Args, Clone, Default)]
struct StoreArgs {
    /// Store the tree in this SQLite file (default: [store] path in the config).
    #[arg(long)]
    store: Option<PathBuf>,
    /// Do not store the tree.
    #[arg(long, conflicts_with = "store")]
    no_store: bool,
}

#[derive(clap::Args)]
struct LoadtestArgs {
    /// Children per agent.
    #[arg(long, default_value_t = 10)]
    fanout: usize,
    /// Levels below the root.
    #[arg(long, default_value_t = 4)]
    depth: usize,
    /// Children per level instead, e.g. 10,10,5 (overrides --fanout/--depth).
    #[arg(long, value_delimiter = ',')]
    shape: Option<Vec<usize>>,
    /// Messages of history the root starts with; every agent inherits them.
    #[arg(long, default_value_t = 0)]
    history: usize,
    /// Bytes per inherited message.
    #[arg(long, default_value_t = 200)]
    msg_bytes: usize,
    /// Simulated model latency: 0, 50ms, lognormal:200ms,0.5.
    #[arg(long, default_value = "0")]
    latency: String,
    /// Words per simulated reply.
    #[arg(long, default_value_t = 20)]
    reply_tokens: usize,
    /// Agents stepping at once (spawns wait for a slot).
    #[arg(long)]
    max_live: Option<usize>,
    /// Drive this configured model with agent-shaped load instead.
    #[arg(long)]
    model: Option<String>,
    /// Config file for --model (default: ./config.toml if present, else the built-in one).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Run the tree this many times.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Write every figure as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw live agents over time and the latency distribution as SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Also run a bare ractor tree of the same shape and report the ratio.
    #[arg(long)]
    baseline: bool,
    /// Store the trees in this SQLite file and keep it (default: a temporary
    /// file, removed after the run).
    #[arg(long)]
    store: Option<PathBuf>,
    /// Do not store the trees (measures Arbor without its store).
    #[arg(long, conflicts_with = "store")]
    no_store: bool,
}

/// `println!` that returns the write's error instead of panicking: a reader
/// that closes the pipe (`arbor export T | head`) ends the command quietly
/// (see [`closed_pipe`]). Every line the CLI prints on stdout goes through it.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err(StdoutError)
    }};
}

/// `print!` that returns the write's error (see [`outln!`]).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        write!(stdout, $($arg)*).and_then(|()| stdout.flush()).map_err(StdoutError)
    }};
}

/// A failed write to stdout (its own type, so a broken pipe elsewhere, say
/// to a provider, is never taken for a closed stdout).
#[derive(Debug, thiserror::Error)]
#[error("cannot write to stdout: {0}")]
struct StdoutError(#[source] std::io::Error);

/// A duration flag, in the one grammar Arbor reads durations in.
fn duration_arg(text: &str) -> Result<std::time::Duration, String> {
    arbor_actors::duration::parse(text).map_err(|e| e.why)
}

/// Whether `error` comes from writing to a pipe whose reader has gone.
fn closed_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|e| {
        e.downcast_ref::<StdoutError>()
            .is_some_and(|e| e.0.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The exit code of a command whose stdout reader went away: what a shell
/// reports for a process ended by SIGPIPE (128 + 13), as `yes | head` does.
const CLOSED_PIPE_EXIT: u8 = 141;

fn main() -> ExitCode {
    // However `main` ends (a return, a panic unwinding out of it), no MCP
    // server or command-tool process is left behind.
    let _reaper = arbor::tools::reaper::ExitGuard;
    let cli = Cli::parse();
    // A service sets up its own logs once its config is read (serve()).
    if !matches!(cli.command, Command::Serve { .. }) {
        tracing_subscriber::fmt()
            .with_env_filter(log_filter("warn"))
            .with_writer(std::io::stderr)
            .with_ansi(colour(&std::io::stderr()))
            .init();
    }
    match run(cli) {
        Ok(code) => code,
        // Nothing to say: whoever reads stdout has all it wanted.
        Err(error) if closed_pipe(&error) => ExitCode::from(CLOSED_PIPE_EXIT),
        Err(error) => {
            if let Some(config) = config_error(&error) {
                eprintln!("error: invalid config\n{config}");
                return ExitCode::from(2);
            }
            eprintln!("error: {error:#}");
            ExitCode::from(1)
        }
    }
}

fn config_error(error: &anyhow::Error) -> Option<&ConfigError> {
    error.chain().find_map(|e| {
        e.downcast_ref::<ConfigError>()
            .or_else(|| match e.downcast_ref::<Error>() {
                Some(Error::Config(c)) => Some(c),
                _ => None,
            })
    })
}

/// `--config F`, else ./config.toml if it exists, else the built-in config.
fn load_config(path: Option<&Path>) -> Result<Config, ConfigError> {
    match path {
        Some(path) => Config::load(path),
        None if Path::new("config.toml").is_file() => Config::load(Path::new("config.toml")),
        None => Config::default_config(),
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run {
            config,
            agent,
            model,
            json,
            quiet,
            params,
            store,
            tree_id,
            events,
            allow_tools,
            deny_tools,
            prompt,
        } => {
            let config = load_config(config.as_deref())?;
            let rule = arbor_supervisor::ToolRule {
                allow: allow_tools,
                deny: deny_tools,
            };
            if let Some((pattern, why)) = rule.problems().into_iter().next() {
                anyhow::bail!("--allow-tools/--deny-tools: pattern {pattern:?}: {why}");
            }
            let mut limits = config.limits.clone();
            limits.tools = limits.tools.narrowed(rule);
            let params = params
                .map(|p| serde_json::from_str(&p))
                .transpose()
                .context("--params is not valid JSON")?;
            let store = (!store.no_store && config.file.store.enabled)
                .then(|| store_path(&config, store.store));
            let agent = agent
                .or_else(|| config.default_agent().map(str::to_owned))
                .context("no agent given and the config defines none")?;
            let origin = config.origin();
            let show = Show {
                json,
                quiet,
                events,
            };
            let tokio = async_runtime()?;
            // Built inside the async runtime, so the store can use it.
            let _guard = tokio.enter();
            let runtime = match &store {
                Some(path) => Runtime::with_store(config, path)?,
                None => Runtime::new(config)?,
            };
            tokio.block_on(until_signal(async {
                // Subscribed before the start: a root can end at once.
                let events = runtime.supervisor().subscribe();
                let handle = runtime
                    .supervisor()
                    .start(StartRequest {
                        agent,
                        prompt,
                        params,
                        model,
                        tree_id,
                        origin,
                        limits: Some(limits),
                        ..StartRequest::default()
                    })
                    .await?;
                follow_tree(&runtime, handle, events, show, store.is_some()).await
            }))
        }
        Command::Resume {
            tree_id,
            json,
            quiet,
            events,
            at: Stored { config, store },
        } => {
            let path = store_path(&load_config(config.as_deref())?, store);
            let existing = SqliteStore::open_existing(&path)?;
            let config = tree_config(config, &existing, &tree_id)?;
            drop(existing);
            let tokio = async_runtime()?;
            let _guard = tokio.enter();
            let runtime = Runtime::with_store(config, &path)?;
            let show = Show {
                json,
                quiet,
                events,
            };
            tokio.block_on(until_signal(async {
                let events = runtime.supervisor().subscribe();
                let handle = runtime.supervisor().resume(&tree_id).await?;
                follow_tree(&runtime, handle, events, show, true).await
            }))
        }
        Command::Replay {
            tree_id,
            at: Stored { config, store },
        } => {
            let store = open_store_read_only(&load_config(config.as_deref())?, store)?;
            let config = tree_config(config, &store, &tree_id)?;
            async_runtime()?.block_on(replay(config, store, tree_id))
        }
        Command::Runs {
            status,
            limit,
            json,
            at: Stored { config, store },
        } => {
            if let Some(status) = &status {
                anyhow::ensure!(
                    ["running", "interrupted", "completed", "failed", "cancelled"]
                        .contains(&status.as_str()),
                    "--status: {status:?} is not one of running, interrupted, completed, failed, cancelled"
                );
            }
            let config = load_config(config.as_deref())?;
            let store = open_store_read_only(&config, store)?;
            let trees = store.trees(&TreeFilter {
                status,
                limit,
                offset: 0,
            })?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&trees)?)?;
            } else {
                out!("{}", arbor::runs::runs_table(&trees))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Show {
            run_id,
            json,
            at: Stored { config, store },
        } => {
            let config = load_config(config.as_deref())?;
            let store = open_store_read_only(&config, store)?;
            let run = match store.run(&run_id) {
                Err(arbor_supervisor::Error::UnknownRun(_))
                    if !run_id.contains('/') && store.tree(&run_id).is_ok() =>
                {
                    anyhow::bail!(
                        "{run_id} is a tree, not a run: `arbor tree {run_id}` lists its runs \
                         (a run id is TREE/PATH, e.g. {run_id}/0 for its root)"
                    );
                }
                found => found?,
            };
            let Some(state) = run.state else {
                anyhow::bail!("run {run_id} started but has no checkpoint yet");
            };
            if json {
                outln!("{}", serde_json::to_string_pretty(&state)?)?;
            } else {
                let n = &run.node;
                outln!(
                    "{} {} ({}{}): {} steps, {} tokens, cost {:.4}, {} messages, {} children",
                    n.agent_type,
                    n.run_id,
                    n.status,
                    if run.is_final {
                        ""
                    } else {
                        ", last checkpoint"
                    },
                    n.steps,
                    n.input_tokens + n.output_tokens,
                    n.cost,
                    state.message_history.len(),
                    state.child_run_ids.len()
                )?;
                if let Some(error) = &n.error {
                    outln!("error: {error}")?;
                }
                outln!("{}", final_text(&state))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Tree {
            tree_id,
            json,
            at: Stored { config, store },
        } => {
            let config = load_config(config.as_deref())?;
            let store = open_store_read_only(&config, store)?;
            let (_, summary) = store.tree(&tree_id)?;
            let runs = store.runs(&tree_id)?;
            if json {
                outln!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"tree": summary, "runs": runs})
                    )?
                )?;
            } else {
                outln!(
                    "tree {} ({}): {} agents, {} tokens, cost {:.4}",
                    summary.tree_id,
                    summary.status,
                    summary.agents,
                    summary.input_tokens + summary.output_tokens,
                    summary.cost
                )?;
                out!("{}", arbor::runs::tree_text(&runs))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Export {
            tree_id,
            output,
            at: Stored { config, store },
        } => {
            let config = load_config(config.as_deref())?;
            let store = open_store_read_only(&config, store)?;
            let doc = serde_json::to_string_pretty(&store.export(&tree_id)?)?;
            match output {
                Some(path) => std::fs::write(&path, doc + "\n")
                    .with_context(|| format!("cannot write {}", path.display()))?,
                None => outln!("{doc}")?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Gc {
            older_than,
            at: Stored { config, store },
        } => {
            let age = older_than;
            let config = load_config(config.as_deref())?;
            let store = open_store(&config, store)?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let cutoff = now.saturating_sub(age).as_millis() as u64;
            let report = store.gc(cutoff)?;
            outln!(
                "removed {} trees ({} segments)",
                report.trees,
                report.segments
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Agents { config } => {
            let config = load_config(config.as_deref())?;
            let list = |items: &[String]| {
                if items.is_empty() {
                    "-".to_owned()
                } else {
                    items.join(", ")
                }
            };
            for t in &config.templates {
                let output = serde_json::to_value(t.output_mode)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                outln!(
                    "{:<20} model={:<10} steps={:<4} output={output} spawns: {}",
                    t.id,
                    t.model,
                    t.max_steps,
                    list(&t.spawnable_agents)
                )?;
                if let Some(description) = &t.description {
                    outln!("    {description}")?;
                }
                outln!("    tools: {}", list(&t.tools))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Tools { config, json } => {
            let config = load_config(config.as_deref())?;
            let tools = config.tool_set();
            let listing = async_runtime()?.block_on(until_signal(async {
                let listing = arbor::tools::listing(&config, &tools).await;
                tools.mcp().shutdown().await;
                Ok(listing)
            }))?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&listing)?)?;
            } else {
                out!("{}", arbor::tools::listing_table(&listing))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Models { config } => {
            let config = load_config(config.as_deref())?;
            for (name, model) in &config.file.models {
                outln!("{name:<16} {:<10} {}", model.provider(), model.describe())?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve {
            config,
            bind,
            store,
            log_format,
        } => {
            let config = load_config(config.as_deref())?;
            serve(config, bind, store, log_format)
        }
        Command::Ping { config, model } => {
            let config = load_config(config.as_deref())?;
            async_runtime()?.block_on(ping(config, model))
        }
        Command::Loadtest(args) => async_runtime()?.block_on(loadtest(args)),
        Command::CheckConfig { file } => {
            let config = load_config(file.as_deref())?;
            config.catalog()?;
            outln!(
                "{}: ok ({} models, {} agents)",
                config.source,
                config.file.models.len(),
                config.templates.len()
            )?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn loadtest(args: LoadtestArgs) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    use std::sync::Arc;

    use arbor::loadtest::{Collector, LoadOptions, run_bare_tree, run_once, write_plot};
    use arbor_actors::models::Latency;

    let shape = args
        .shape
        .clone()
        .unwrap_or_else(|| vec![args.fanout; args.depth]);
    anyhow::ensure!(
        !shape.is_empty() || args.depth == 0,
        "--shape needs at least one level"
    );
    anyhow::ensure!(args.repeat >= 1, "--repeat must be at least 1");
    anyhow::ensure!(args.max_live != Some(0), "--max-live must be at least 1");
    // The shape is checked against a bound before anything runs (a saturated
    // count once passed, and memory grew without end).
    let agents = shape.iter().try_fold((1u64, 1u64), |(level, total), &f| {
        let level = level.checked_mul(f as u64)?;
        Some((level, total.checked_add(level)?))
    });
    match agents {
        Some((_, total)) if total <= MAX_LOADTEST_AGENTS => {}
        _ => anyhow::bail!(
            "a tree of shape {shape:?} has more than {MAX_LOADTEST_AGENTS} agents \
             (the most a load test runs); use a smaller --fanout, --depth or --shape"
        ),
    }
    // Output files are checked before the run, not after it.
    for (flag, path) in [("--json", &args.json), ("--plot", &args.plot)] {
        if let Some(path) = path {
            std::fs::File::create(path)
                .with_context(|| format!("{flag}: cannot write {}", path.display()))?;
        }
    }
    let latency = Latency::parse(&args.latency).map_err(|e| anyhow::anyhow!("--latency: {e}"))?;
    let model = match &args.model {
        None => None,
        Some(name) => {
            let config = load_config(args.config.as_deref())?;
            let catalog = config.catalog()?;
            let model = configured_model(&catalog, name).context("--model")?;
            Some(model)
        }
    };
    let options = LoadOptions {
        shape,
        history: args.history,
        msg_bytes: args.msg_bytes,
        latency,
        reply_tokens: args.reply_tokens,
        max_live: args.max_live,
        model,
        repeat: args.repeat,
        store: None,
    };
    // A temporary store unless one is named: the run pays for storing, the
    // user's own store is not filled with load-test trees.
    let scratch = tempfile_path();
    let mut options = options;
    if !args.no_store {
        options.store = Some(args.store.clone().unwrap_or_else(|| scratch.clone()));
    }
    let cleanup = RemoveOnDrop((!args.no_store && args.store.is_none()).then_some(scratch));
    // Ctrl-C or SIGTERM mid-run: the scratch store goes too (`until_signal`
    // ends the process without unwinding, so it is removed here first).
    // The handlers are in place (registered here, before the store is made)
    // when the watching task is spawned.
    let remove = cleanup.0.clone();
    let (mut term, mut int) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::terminate()).context("cannot watch SIGTERM")?,
            signal(SignalKind::interrupt()).context("cannot watch SIGINT")?,
        )
    };
    tokio::spawn(async move {
        let code = tokio::select! {
            _ = term.recv() => 143,
            _ = int.recv() => 130,
        };
        drop(RemoveOnDrop(remove));
        eprintln!("stopped by a signal; the scratch store is removed");
        std::process::exit(code);
    });
    let _cleanup = cleanup;
    let total = options.agents();
    let mut reports = Vec::new();
    for round in 1..=options.repeat {
        let supervisor = options.supervisor()?;
        let collector = Arc::new(Collector::default());
        {
            let collector = collector.clone();
            supervisor.events().observe(move |e| collector.observe(e));
        }
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} agents  {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let tty = std::io::stderr().is_terminal();
        let mut last_line = std::time::Instant::now();
        let started = std::time::Instant::now();
        let report = run_once(&options, &supervisor, &collector, |c| {
            use std::sync::atomic::Ordering;
            let done = c.finished.load(Ordering::Relaxed)
                + c.failed.load(Ordering::Relaxed)
                + c.cancelled.load(Ordering::Relaxed);
            let live = c.live.load(Ordering::Relaxed);
            let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-9);
            let msg = format!("{live} live, {rate:.0}/s");
            if tty {
                bar.set_position(done);
                bar.set_message(msg);
            } else if last_line.elapsed() >= std::time::Duration::from_secs(1) || done == total {
                last_line = std::time::Instant::now();
                eprintln!("progress: {done}/{total} agents finished, {msg}");
            }
        })
        .await?;
        bar.finish_and_clear();
        outln!(
            "load test{}: {} agents in {:.3} s",
            if options.repeat > 1 {
                format!(" {round}/{}", options.repeat)
            } else {
                String::new()
            },
            report.agents_started,
            report.wall_secs
        )?;
        out!("{}", report.table(options.model.is_some()))?;
        reports.push(report);
    }
    if args.baseline {
        let start = std::time::Instant::now();
        run_bare_tree(&options.shape, options.history, options.msg_bytes).await;
        let bare = start.elapsed().as_secs_f64() * 1e6 / total as f64;
        let arbor = reports
            .iter()
            .map(|r| r.us_per_agent)
            .fold(f64::INFINITY, f64::min);
        outln!(
            "  {:<28} {bare:.2} µs per agent (Arbor/bare: {:.2}×)",
            "bare ractor tree",
            arbor / bare
        )?;
    }
    if let Some(path) = &args.json {
        let json = if reports.len() == 1 {
            serde_json::to_string_pretty(&reports[0])?
        } else {
            serde_json::to_string_pretty(&reports)?
        };
        std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let (Some(path), Some(last)) = (&args.plot, reports.last()) {
        write_plot(last, path).map_err(|e| anyhow::anyhow!(e))?;
    }
    let all_completed = reports.iter().all(|r| r.completed);
    Ok(if all_completed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

async fn ping(config: Config, name: String) -> anyhow::Result<ExitCode> {
    use std::sync::{Arc, Mutex};

    use arbor_actors::{Delta, Message, ModelRequest, RequestMeta};

    let catalog = config.catalog()?;
    let model = configured_model(&catalog, &name)?;
    let retries = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let retries = retries.clone();
        Arc::new(move |delta: Delta| {
            if let Delta::Retry { reason, .. } = delta
                && let Ok(mut r) = retries.lock()
            {
                r.push(reason);
            }
        })
    };
    let request = ModelRequest {
        system_prompt: Arc::from("You are a health check. Answer with one word."),
        messages: [Message::user("Reply with the single word: pong")]
            .into_iter()
            .collect(),
        tools: Default::default(),
        meta: RequestMeta {
            agent_type: "ping".into(),
            run_id: "ping".into(),
            step: 1,
            ..RequestMeta::default()
        },
    };
    let start = std::time::Instant::now();
    let result = model.complete(request, sink).await;
    let ms = start.elapsed().as_millis();
    let retries = retries.lock().map(|r| r.clone()).unwrap_or_default();
    let retried = if retries.is_empty() {
        String::new()
    } else {
        format!(
            ", {} retries (last: {})",
            retries.len(),
            retries.last().map(String::as_str).unwrap_or("")
        )
    };
    match result {
        Ok(response) => {
            let reply: String = response.message.text().chars().take(60).collect();
            outln!(
                "{name}: ok in {ms}ms, {} in / {} out tokens, cost {:.6}{retried}, reply {reply:?}",
                response.usage.input_tokens,
                response.usage.output_tokens,
                response.usage.cost
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            outln!("{name}: failed after {ms}ms{retried}: {error}")?;
            Ok(ExitCode::from(1))
        }
    }
}

/// A store file for one load test, removed (with its WAL) when the test ends.
/// The largest tree `arbor loadtest` runs (10⁸ agents; the 1.1 M tree of
/// BENCHMARKS.md takes ~20 s).
const MAX_LOADTEST_AGENTS: u64 = 100_000_000;

fn tempfile_path() -> PathBuf {
    std::env::temp_dir().join(format!("arbor-loadtest-{}.db", std::process::id()))
}

struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            for suffix in ["", "-wal", "-shm", "-journal"] {
                let mut p = path.as_os_str().to_owned();
                p.push(suffix);
                let _ = std::fs::remove_file(PathBuf::from(p));
            }
        }
    }
}

/// The model `name` of a catalog, or an error listing the configured ones.
fn configured_model(
    catalog: &arbor_supervisor::Catalog,
    name: &str,
) -> anyhow::Result<std::sync::Arc<dyn arbor_actors::Model>> {
    catalog.model(name).cloned().with_context(|| {
        let known: Vec<&str> = catalog.model_names().collect();
        format!("no model named {name:?} (configured: {})", known.join(", "))
    })
}

fn async_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Whether to colour what goes to `stream`: a terminal, and `NO_COLOR` unset
/// or empty (no-color.org).
fn colour(stream: &impl std::io::IsTerminal) -> bool {
    stream.is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// RUST_LOG, else `default`.
fn log_filter(default: &str) -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
}

/// A service's logs: stdout (where its supervisor collects them), as text or
/// JSON, `info` unless RUST_LOG says otherwise; and spans to an OpenTelemetry
/// collector when `[service] otlp_endpoint` is set.
fn service_logs(
    config: &Config,
    format: LogFormat,
) -> anyhow::Result<Option<arbor::telemetry::Otlp>> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = log_filter("info,rmcp=warn");
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stdout)
        .with_ansi(colour(&std::io::stdout()));
    let lines = match format {
        LogFormat::Text => lines.boxed(),
        LogFormat::Json => lines.json().boxed(),
    };
    let otlp = config
        .file
        .service
        .otlp_endpoint
        .as_deref()
        .map(|endpoint| arbor::telemetry::Otlp::new(endpoint, "arbor"))
        .transpose()?;
    tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .with(otlp.as_ref().map(|o| o.layer()))
        .init();
    Ok(otlp)
}

fn serve(
    config: Config,
    bind: Option<String>,
    store: Option<PathBuf>,
    log_format: LogFormat,
) -> anyhow::Result<ExitCode> {
    use arbor::service::{Service, ServiceOptions};
    let otlp = service_logs(&config, log_format)?;
    let bind = bind.unwrap_or_else(|| config.file.service.bind.clone());
    let addr: std::net::SocketAddr = bind
        .parse()
        .with_context(|| format!("--bind {bind:?} is not an address like 127.0.0.1:8080"))?;
    let options = ServiceOptions::from_config(&config);
    // Checked again by `serve`; here before the store is opened.
    options.check_bind(addr)?;
    if options.tokens.is_empty() {
        let env = &config.file.service.tokens_env;
        let why = match std::env::var_os(env) {
            None => "is unset",
            Some(v) if v.is_empty() => "is empty",
            Some(_) => "holds no token",
        };
        tracing::warn!("no API tokens ({env} {why}): anyone on this machine can call the API");
    }
    if store.is_none() && !config.file.store.enabled {
        return Err(Error::NoStore.into());
    }
    let path = store_path(&config, store);
    let tokio = async_runtime()?;
    let served = tokio.block_on(async {
        // A tree resumed after a restart runs on the config it started with,
        // whatever the file says now.
        let runtime = Runtime::builder(config)
            .store(&path)
            .retain(arbor_supervisor::Retain::None)
            .per_tree_configs()
            .build()?;
        let service = Service::new(runtime, options)?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Error::Bind {
                addr: addr.to_string(),
                reason: e.to_string(),
            })?;
        let local = listener
            .local_addr()
            .context("the listener has no address")?;
        tracing::info!(store = %path.display(), "listening on http://{local}");
        let resuming = service.clone();
        tokio::spawn(async move {
            let resumed = resuming.resume_interrupted().await;
            tracing::info!(trees = resumed.len(), "ready (interrupted trees resumed)");
            // Then trees whose owner crashed out of sight, once they go stale.
            let stale = arbor_supervisor::store::STALE_AFTER_MS;
            resuming
                .adopt_interrupted(std::time::Duration::from_millis(stale + 1000))
                .await;
        });
        service.serve(listener, shutdown_signal()).await?;
        tracing::info!("stopped");
        Ok::<_, anyhow::Error>(())
    });
    // The last spans go out whether or not the server ended well.
    if let Some(otlp) = otlp {
        otlp.shutdown();
    }
    served?;
    Ok(ExitCode::SUCCESS)
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}

/// `--store F`, else the config's `[store] path`.
fn store_path(config: &Config, flag: Option<PathBuf>) -> PathBuf {
    flag.unwrap_or_else(|| config.file.store.path.clone())
}

/// The config to resume or replay a tree with: `--config`, else the file it
/// was started with (if it is still there), else the default.
fn tree_config(
    flag: Option<PathBuf>,
    store: &SqliteStore,
    tree_id: &str,
) -> anyhow::Result<Config> {
    if flag.is_some() {
        // An explicit override: the tree runs on it, and the supervisor
        // records the change with the tree.
        let config = load_config(flag.as_deref())?;
        eprintln!(
            "note: tree {tree_id} runs on {} instead of the config it started with",
            config.source
        );
        return Ok(config);
    }
    let (record, _) = store.tree(tree_id)?;
    let base_dir = record
        .origin
        .as_deref()
        .and_then(|o| Path::new(o).parent())
        .map(Path::to_path_buf)
        .unwrap_or_default();
    match (record.config, record.origin.map(PathBuf::from)) {
        // What the tree started with, whatever the file says now.
        (Some(snapshot), origin) => {
            let current = origin.as_deref().and_then(|p| Config::load(p).ok());
            Ok(Config::from_snapshot(
                &snapshot,
                tree_id,
                base_dir,
                current.as_ref(),
            )?)
        }
        // A tree stored before configs were: its file, as it is now.
        (None, Some(path)) if path.is_file() => Ok(Config::load(&path)?),
        (None, Some(path)) => anyhow::bail!(
            "tree {tree_id} was started with {}, which is gone; pass --config",
            path.display()
        ),
        (None, None) => Ok(load_config(None)?),
    }
}

/// An existing store, for the commands that change one (gc).
fn open_store(config: &Config, flag: Option<PathBuf>) -> anyhow::Result<SqliteStore> {
    Ok(SqliteStore::open_existing(&store_path(config, flag))?)
}

/// An existing store opened read-only, for the commands that only read one:
/// they write nothing to it (no migration either), and read a store on a
/// read-only file or filesystem.
fn open_store_read_only(config: &Config, flag: Option<PathBuf>) -> anyhow::Result<SqliteStore> {
    Ok(SqliteStore::open_read_only(&store_path(config, flag))?)
}

/// How `run` and `resume` show a tree.
#[derive(Clone, Copy)]
struct Show {
    json: bool,
    quiet: bool,
    events: bool,
}

/// Shows a started tree until its root ends, then prints the root's output.
/// Runs `work` until it ends or the process gets SIGTERM/SIGINT; on a signal
/// every tool process is ended and the command exits 143 (SIGTERM) or 130
/// (SIGINT). A stored tree is left as it was: `arbor resume` continues it.
async fn until_signal<T>(
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let code = tokio::select! {
        result = work => return result,
        _ = term.recv() => 143,
        _ = int.recv() => 130,
    };
    arbor::tools::reaper::kill_all();
    eprintln!("stopped by a signal; tool processes ended");
    std::process::exit(code);
}

async fn follow_tree(
    runtime: &Runtime,
    handle: arbor_supervisor::TreeHandle,
    mut events: arbor_supervisor::EventStream,
    show: Show,
    stored: bool,
) -> anyhow::Result<ExitCode> {
    let supervisor = runtime.supervisor();
    let tree_id = handle.tree_id.to_string();
    if !show.quiet && !show.events {
        if stored {
            eprintln!("tree {tree_id} (if interrupted: arbor resume {tree_id})");
        } else {
            eprintln!("tree {tree_id}");
        }
    }
    let root_run = handle.root_run_id.clone();
    let printer = tokio::spawn(async move {
        let mut renderer = TreeRenderer::default();
        while let Some(event) = events.recv().await {
            if *event.tree_id != *tree_id {
                continue;
            }
            if show.events {
                if let Ok(line) = serde_json::to_string(&*event) {
                    eprintln!("{line}");
                }
            } else if !show.quiet
                && let Some(line) = renderer.line(&event)
            {
                eprintln!("{line}");
            }
            let root_ended = event.kind.final_state().is_some() && *event.run_id == *root_run;
            if root_ended {
                break;
            }
        }
    });
    let result = handle.wait().await?;
    let _ = printer.await;
    supervisor.flush().await?;
    let completed = result.state.status == AgentStatus::Completed;
    if show.json {
        outln!("{}", serde_json::to_string_pretty(&result.state)?)?;
    } else if completed {
        outln!("{}", final_text(&result.state))?;
    } else if show.quiet || show.events {
        // The tree's last line says why when it is shown; this is the only place otherwise.
        eprintln!(
            "error: the root agent {}: {}",
            result.state.status.as_str(),
            result.state.error_message().unwrap_or("no detail")
        );
    }
    Ok(if completed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Runs a stored tree again on its recorded replies and compares every final state.
async fn replay(config: Config, store: SqliteStore, tree_id: String) -> anyhow::Result<ExitCode> {
    let (record, summary) = store.tree(&tree_id)?;
    anyhow::ensure!(
        !["running", "interrupted"].contains(&summary.status.as_str()),
        "tree {tree_id} has not finished ({}); resume it first",
        summary.status
    );
    let recorded = store.final_states(&tree_id)?;
    let replies = store.recovery(&tree_id)?.replies;
    let runtime = Runtime::new(config)?;
    let supervisor = runtime.supervisor();
    let handle = supervisor.replay(record.request(), replies).await?;
    handle.wait().await?;
    match arbor::runs::compare_replay(&recorded, |run| supervisor.finished_state(run)) {
        Ok(n) => {
            outln!("match: {n} runs of tree {tree_id} replayed identically from the record")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(divergence) => {
            outln!("mismatch: {divergence}")?;
            Ok(ExitCode::from(1))
        }
    }
}
