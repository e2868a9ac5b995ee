//! The commands of the `arbor` binary: the clap types (`args`), one module
//! per command family, and the helpers they share.

mod approvals;
mod args;
mod config;
mod control;
mod live;
mod loadtest;
mod render;
mod run;
mod runs;
mod service;
mod store;
mod watch;

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use arbor::config::{AgentFiles, Config, ConfigError};
use arbor_actors::{IdError, TreeId};
use arbor_supervisor::Target;

pub(crate) use args::{Cli, Command};

/// Runs the command `cli` names.
pub(crate) fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Resume {
            tree_id,
            json,
            quiet,
            events,
            plain,
            agents,
            restart_programs,
            at,
        } => run::resume(
            tree_arg(&tree_id)?,
            run::Show {
                json,
                quiet,
                events,
                plain,
            },
            agent_files(agents, None),
            restart_programs,
            at,
        ),
        Command::Replay { tree_id, at } => store::replay(tree_arg(&tree_id)?, at),
        Command::Runs {
            status,
            limit,
            json,
            at,
        } => store::runs(status, limit, json, at),
        Command::Show { run_id, json, at } => store::show(target_arg(&run_id)?, json, at),
        Command::Budget {
            tree_id,
            add_credits,
            add_tokens,
            add_steps,
            max_credits,
            max_tokens,
            max_steps,
            server,
            at,
        } => {
            let raise = control::Raise {
                set: arbor_supervisor::Raised {
                    max_steps,
                    max_tokens,
                    max_credits,
                },
                add: arbor_supervisor::Raised {
                    max_steps: add_steps,
                    max_tokens: add_tokens,
                    max_credits: add_credits,
                },
            };
            if !server.given() {
                return control::budget_on_store(tree_arg(&tree_id)?, raise, at);
            }
            let api = service::Api::new(server)?;
            async_runtime()?.block_on(control::budget_on_server(&api, &tree_id, raise))
        }
        Command::Cancel { id, server, at } => {
            if !server.given() {
                return control::cancel_on_store(target_arg(&id)?, at);
            }
            let api = service::Api::new(server)?;
            async_runtime()?.block_on(control::cancel_on_server(&api, &id))
        }
        Command::Watch {
            id,
            plain,
            server,
            at,
        } => watch::watch(&id, plain, server, at),
        Command::Completions { shell } => {
            use clap::CommandFactory as _;
            let mut command = Cli::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "arbor", &mut script);
            out!("{}", String::from_utf8_lossy(&script))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Say {
            run_id,
            text,
            server,
        } => {
            let api = service::Api::new(server)?;
            async_runtime()?.block_on(service::say(&api, &run_id, &text))
        }
        Command::Approvals {
            tree_id,
            json,
            server,
        } => {
            let api = service::Api::new(server)?;
            async_runtime()?.block_on(approvals::list(&api, tree_id.as_deref(), json))
        }
        Command::Approve {
            tree_id,
            call_id,
            input,
            always,
            server,
        } => {
            let decision = approvals::approval(input.as_deref())?;
            let api = service::Api::new(server)?;
            let runtime = async_runtime()?;
            if always {
                return runtime.block_on(approvals::approve_always(&api, &tree_id, &call_id));
            }
            runtime.block_on(approvals::decide(&api, &tree_id, &call_id, decision))
        }
        Command::Deny {
            tree_id,
            call_id,
            reason,
            server,
        } => {
            let decision = arbor_actors::approval::Decision::Deny {
                reason: reason.unwrap_or_default(),
            };
            let api = service::Api::new(server)?;
            async_runtime()?.block_on(approvals::decide(&api, &tree_id, &call_id, decision))
        }
        Command::Tree { tree_id, json, at } => store::tree(target_arg(&tree_id)?, json, at),
        Command::Export {
            tree_id,
            output,
            at,
        } => store::export(tree_arg(&tree_id)?, output, at),
        Command::Gc { older_than, at } => store::gc(older_than, at),
        Command::Migrate { at } => store::migrate(at),
        Command::Store(args::StoreCommand::Copy { from, to, tree }) => {
            store::copy(from, to, tree.as_deref().map(tree_arg).transpose()?)
        }
        Command::Mcp(args::McpCommand::Import { file }) => config::mcp_import(&file),
        Command::Agents { config, agents } => config::agents(config, agent_files(agents, None)),
        Command::Tools { config, json } => config::tools(config, json),
        Command::Models { config } => config::models(config),
        Command::Serve {
            config,
            bind,
            store,
            log_format,
            agents,
        } => {
            let config = load_config_with(config.as_deref(), &agent_files(agents, None))?;
            service::serve(config, bind, store, log_format)
        }
        Command::Ping { config, model } => {
            let config = load_config(config.as_deref())?;
            async_runtime()?.block_on(config::ping(config, model))
        }
        Command::Loadtest(args) => async_runtime()?.block_on(loadtest::loadtest(args)),
        Command::CheckConfig { file, agents } => {
            config::check_config(file, agent_files(agents, None))
        }
    }
}

/// A tree id given on the command line, read once here: one that is no
/// tree id names no stored tree (the store's error for a tree it does not
/// have, as before ids were read here).
pub(super) fn tree_arg(id: &str) -> Result<TreeId, arbor_supervisor::Error> {
    id.parse().map_err(arbor_supervisor::Error::NoSuchId)
}

/// A tree id or a run id (`TREE/PATH`) given on the command line, read once
/// here: one that is neither names no stored tree or run.
fn target_arg(id: &str) -> Result<Target, arbor_supervisor::Error> {
    id.parse().map_err(|error| {
        arbor_supervisor::Error::NoSuchId(match error {
            IdError::Tree(_) => IdError::Tree(id.to_owned()),
            IdError::Run(_) => IdError::Run(id.to_owned()),
        })
    })
}

/// `--config F`, else ./config.toml if it exists, else the built-in config;
/// with the current directory's `.claude/agents` when it has one, so that
/// every command in a project reads the config `arbor run` does there.
fn load_config(path: Option<&Path>) -> Result<Config, ConfigError> {
    load_config_with(path, &agent_files(Vec::new(), None))
}

/// [`load_config`] with the agent files of `agents` (`--agents`, the
/// workspace's `.claude/agents` and `.agents`).
fn load_config_with(path: Option<&Path>, agents: &AgentFiles) -> Result<Config, ConfigError> {
    match path {
        Some(path) => Config::load_with(path, agents),
        None if Path::new("config.toml").is_file() => {
            Config::load_with(Path::new("config.toml"), agents)
        }
        None => Config::default_config_with(agents),
    }
}

/// The agent files a command loads: its `--agents` directories, and the
/// `.claude/agents` and `.agents` of `workspace` (else of the current
/// directory) when it has them.
fn agent_files(dirs: Vec<std::path::PathBuf>, workspace: Option<&Path>) -> AgentFiles {
    AgentFiles {
        dirs,
        workspace: workspace
            .map(Path::to_path_buf)
            .or_else(|| std::env::current_dir().ok()),
    }
}

/// `--store`, else the config's `[store] url` or `path`.
fn store_location(
    config: &Config,
    flag: Option<arbor::config::StoreLocation>,
) -> anyhow::Result<arbor::config::StoreLocation> {
    match flag {
        Some(location) => Ok(location),
        None => config
            .store_location()
            .with_context(|| format!("{}: [store]", config.source)),
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

/// The most threads a command's runtime runs blocking work on (the store's
/// reads, DNS lookups); more waits in tokio's queue, on no thread. With
/// tokio's default (512), 300 tree reads at once (`GET /v1/trees/{id}` on
/// `arbor serve`) started ~250 threads, and each kept the allocator memory
/// of its read: 470-690 MB idle from 38 MB (issue 33, BENCHMARKS.md). SQLite
/// reads take turns on one connection and Postgres reads share 8 pooled
/// ones, so more threads would read no faster.
const BLOCKING_THREADS: usize = 8;

/// The runtime of every command: a worker per core, at most
/// [`BLOCKING_THREADS`] blocking threads, and freed memory given back when
/// the process is idle ([`crate::idle`]).
fn async_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
        .on_thread_park(crate::idle::on_park)
        .build()
        .context("cannot start the async runtime")?;
    // Once the process falls idle, each worker gives its freed memory back
    // (src/idle.rs): the watcher wakes them so that they park again.
    let handle = runtime.handle().clone();
    let workers = handle.metrics().num_workers();
    crate::idle::watch(move || {
        for _ in 0..workers {
            drop(handle.spawn(async {}));
        }
    });
    Ok(runtime)
}

/// Whether to colour what goes to `stream`: a terminal, and `NO_COLOR` unset
/// or empty (no-color.org).
pub(crate) fn colour(stream: &impl std::io::IsTerminal) -> bool {
    colour_for(
        stream.is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

/// [`colour`]'s decision: a terminal, and `no_color` (the `NO_COLOR`
/// variable) unset or empty.
fn colour_for(is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// RUST_LOG, else `default`.
pub(crate) fn log_filter(default: &str) -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
}

/// Wall-clock milliseconds since the Unix epoch (as the store and events
/// keep time).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::colour_for;

    #[test]
    fn a_terminal_gets_colour_unless_no_color_is_set_and_not_empty() {
        // A terminal: colour, unless NO_COLOR has a value (any, even "0").
        assert!(colour_for(true, None));
        assert!(colour_for(true, Some(OsStr::new(""))));
        assert!(!colour_for(true, Some(OsStr::new("1"))));
        assert!(!colour_for(true, Some(OsStr::new("0"))));
        // Not a terminal (a pipe, a file): never colour.
        assert!(!colour_for(false, None));
        assert!(!colour_for(false, Some(OsStr::new(""))));
        assert!(!colour_for(false, Some(OsStr::new("1"))));
    }
}
