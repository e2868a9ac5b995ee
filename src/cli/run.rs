//! `arbor run` and `arbor resume`: start or continue a tree and show it until
//! its root ends.

use std::process::ExitCode;

use anyhow::Context;
use arbor::render::{TreeRenderer, final_text};
use arbor::{Run, Runtime};
use arbor_actors::AgentStatus;
use arbor_supervisor::StartRequest;
use arbor_supervisor::store::SqliteStore;

use super::args::{RunArgs, Stored};
use super::store::tree_config;
use super::{async_runtime, load_config, store_path};

pub(super) fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let RunArgs {
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
    } = args;
    let config = load_config(config.as_deref())?;
    let rule = arbor_supervisor::ToolRule {
        allow: allow_tools,
        deny: deny_tools,
        ..Default::default()
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
    let store =
        (!store.no_store && config.file.store.enabled).then(|| store_path(&config, store.store));
    let agent = agent
        .or_else(|| config.default_agent().map(str::to_owned))
        .context("no agent given and the config defines none")?;
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
        let run = runtime
            .start_with(StartRequest {
                agent,
                prompt,
                params,
                model,
                tree_id,
                origin: runtime.origin(),
                limits: Some(limits),
                ..StartRequest::default()
            })
            .await?;
        follow_tree(&runtime, run, show, store.is_some()).await
    }))
}

pub(super) fn resume(
    tree_id: String,
    json: bool,
    quiet: bool,
    events: bool,
    at: Stored,
) -> anyhow::Result<ExitCode> {
    let Stored { config, store } = at;
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
        let run = runtime.resume(&tree_id).await?;
        follow_tree(&runtime, run, show, true).await
    }))
}

/// How `run` and `resume` show a tree.
#[derive(Clone, Copy)]
struct Show {
    json: bool,
    quiet: bool,
    events: bool,
}

/// Runs `work` until it ends or the process gets SIGTERM/SIGINT; on a signal
/// every tool process is ended and the command exits 143 (SIGTERM) or 130
/// (SIGINT). A stored tree is left as it was: `arbor resume` continues it.
pub(super) async fn until_signal<T>(
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

/// Shows a started tree until its root ends (its events end there), then
/// prints the root's output.
async fn follow_tree(
    runtime: &Runtime,
    mut run: Run,
    show: Show,
    stored: bool,
) -> anyhow::Result<ExitCode> {
    let tree_id = &run.tree_id;
    if !show.quiet && !show.events {
        if stored {
            eprintln!("tree {tree_id} (if interrupted: arbor resume {tree_id})");
        } else {
            eprintln!("tree {tree_id}");
        }
    }
    let mut events = run.take_events();
    let printer = tokio::spawn(async move {
        let mut renderer = TreeRenderer::default();
        while let Some(event) = events.recv().await {
            if show.events {
                if let Ok(line) = serde_json::to_string(&*event) {
                    eprintln!("{line}");
                }
            } else if !show.quiet
                && let Some(line) = renderer.line(&event)
            {
                eprintln!("{line}");
            }
        }
    });
    let result = run.result().await?;
    let _ = printer.await;
    runtime.supervisor().flush().await?;
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
