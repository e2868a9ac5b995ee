//! The `arbor` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use arbor::config::{Config, ConfigError};
use arbor::render::{TreeRenderer, final_text};
use arbor::{Error, Runtime};
use arbor_actors::AgentStatus;
use arbor_supervisor::StartRequest;
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
        /// What to ask.
        prompt: String,
    },
    /// List the agent templates of a config.
    Agents {
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// List the models of a config.
    Models {
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Send one tiny request to a model and report latency, usage and any problem in one line.
    Ping {
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(code) => code,
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
            prompt,
        } => {
            let config = load_config(config.as_deref())?;
            let params = params
                .map(|p| serde_json::from_str(&p))
                .transpose()
                .context("--params is not valid JSON")?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            runtime.block_on(run_tree(config, agent, model, params, prompt, json, quiet))
        }
        Command::Agents { config } => {
            let config = load_config(config.as_deref())?;
            for t in &config.templates {
                let spawns = if t.spawnable_agents.is_empty() {
                    "-".to_owned()
                } else {
                    t.spawnable_agents.join(", ")
                };
                println!(
                    "{:<20} model={:<10} steps={:<4} output={:?} spawns: {spawns}",
                    t.id, t.model, t.max_steps, t.output_mode
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Models { config } => {
            let config = load_config(config.as_deref())?;
            for (name, model) in &config.file.models {
                println!("{name:<16} {:<10} {}", model.provider(), model.describe());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Ping { config, model } => {
            let config = load_config(config.as_deref())?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            runtime.block_on(ping(config, model))
        }
        Command::Loadtest(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            runtime.block_on(loadtest(args))
        }
        Command::CheckConfig { file } => {
            let config = load_config(file.as_deref())?;
            config.catalog()?;
            println!(
                "{}: ok ({} models, {} agents)",
                config.source,
                config.file.models.len(),
                config.templates.len()
            );
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
    let latency = Latency::parse(&args.latency).map_err(|e| anyhow::anyhow!("--latency: {e}"))?;
    let model = match &args.model {
        None => None,
        Some(name) => {
            let config = load_config(args.config.as_deref())?;
            let catalog = config.catalog()?;
            let model = catalog.model(name).cloned().with_context(|| {
                let known: Vec<&str> = catalog.model_names().collect();
                format!(
                    "--model: no model named {name:?} (configured: {})",
                    known.join(", ")
                )
            })?;
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
    };
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
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} agents  {msg}  ETA {eta}",
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
        println!(
            "load test{}: {} agents in {:.3} s",
            if options.repeat > 1 {
                format!(" {round}/{}", options.repeat)
            } else {
                String::new()
            },
            report.agents_started,
            report.wall_secs
        );
        print!("{}", report.table(options.model.is_some()));
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
        println!(
            "  {:<28} {bare:.2} µs per agent (Arbor/bare: {:.2}×)",
            "bare ractor tree",
            arbor / bare
        );
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
    let model = catalog.model(&name).cloned().with_context(|| {
        let known: Vec<&str> = catalog.model_names().collect();
        format!("no model named {name:?} (configured: {})", known.join(", "))
    })?;
    let retries = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let retries = retries.clone();
        Arc::new(move |delta: Delta| {
            if let Delta::Retry { reason, .. } = delta {
                if let Ok(mut r) = retries.lock() {
                    r.push(reason);
                }
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
            println!(
                "{name}: ok in {ms}ms, {} in / {} out tokens, cost {:.6}{retried}, reply {reply:?}",
                response.usage.input_tokens, response.usage.output_tokens, response.usage.cost
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            println!("{name}: failed after {ms}ms{retried}: {error}");
            Ok(ExitCode::from(1))
        }
    }
}

async fn run_tree(
    config: Config,
    agent: Option<String>,
    model: Option<String>,
    params: Option<serde_json::Value>,
    prompt: String,
    json: bool,
    quiet: bool,
) -> anyhow::Result<ExitCode> {
    let agent = agent
        .or_else(|| config.default_agent().map(str::to_owned))
        .context("no agent given and the config defines none")?;
    let runtime = Runtime::new(config)?;
    let supervisor = runtime.supervisor();
    let mut events = supervisor.subscribe();
    let printer = tokio::spawn(async move {
        let mut renderer = TreeRenderer::default();
        while let Some(event) = events.recv().await {
            if !quiet {
                if let Some(line) = renderer.line(&event) {
                    eprintln!("{line}");
                }
            }
            let root_ended = event
                .kind
                .final_state()
                .is_some_and(|s| s.parent_id.is_none());
            if root_ended {
                break;
            }
        }
    });
    let handle = supervisor
        .start(StartRequest {
            agent,
            prompt,
            params,
            model,
            ..StartRequest::default()
        })
        .await?;
    let result = handle.wait().await?;
    let _ = printer.await;
    if json {
        println!("{}", serde_json::to_string_pretty(&result.state)?);
    } else {
        println!("{}", final_text(&result.state));
    }
    Ok(match result.state.status {
        AgentStatus::Completed => ExitCode::SUCCESS,
        _ => {
            if !json {
                eprintln!(
                    "error: the root agent {}: {}",
                    result.state.status.as_str(),
                    result.state.error_message().unwrap_or("no detail")
                );
            }
            ExitCode::from(1)
        }
    })
}
