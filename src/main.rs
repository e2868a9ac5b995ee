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
    /// Validate a config file and report every problem with its location.
    CheckConfig {
        /// The file (default: ./config.toml if present, else the built-in one).
        file: Option<PathBuf>,
    },
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
        messages: vec![Arc::new(Message::user("Reply with the single word: pong"))],
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
