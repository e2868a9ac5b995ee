//! The commands on stored trees: `runs`, `tree`, `show`, `export`, `replay`
//! and `gc`, and how they open the store and find a tree's config.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use super::render::{final_text, state_json};
use super::runs::count;
use anyhow::Context;
use arbor::Runtime;
use arbor::config::Config;
use arbor::config::StoreLocation;
use arbor_actors::{IdError, TreeId};
use arbor_supervisor::Target;
use arbor_supervisor::store::{Store, TreeFilter};

use super::args::Stored;
use super::{async_runtime, load_config, store_location};

pub(super) fn runs(
    status: Option<arbor_supervisor::TreeStatus>,
    limit: usize,
    json: bool,
    at: Stored,
) -> anyhow::Result<ExitCode> {
    let Stored { config, store } = at;
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
        // A tree that has not ended may be paused on its budget: its journal says.
        let mut paused = std::collections::BTreeSet::new();
        for tree in trees.iter().filter(|t| !t.status.is_final()) {
            if !super::runs::paused_runs(&store.events(&tree.tree_id, 0)?).is_empty() {
                paused.insert(tree.tree_id.clone());
            }
        }
        out!("{}", super::runs::runs_table(&trees, &paused))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `arbor tree ID`: `id` is read as a tree id or a run id, so that a run id
/// given for a tree is named as one.
pub(super) fn tree(id: Target, json: bool, at: Stored) -> anyhow::Result<ExitCode> {
    let Stored { config, store } = at;
    let config = load_config(config.as_deref())?;
    let store = open_store_read_only(&config, store)?;
    let tree_id = match id {
        Target::Tree(tree_id) => tree_id,
        Target::Run(run) => {
            store
                .run(&run)
                .map_err(|_| arbor_supervisor::Error::NoSuchId(IdError::Tree(run.to_string())))?;
            let tree = run.tree();
            anyhow::bail!(
                "{run} is a run id, not a tree id: `arbor show {run}` shows the run, \
                 `arbor tree {tree}` its tree"
            );
        }
    };
    let (_, summary) = store.tree(&tree_id)?;
    let runs = store.runs(&tree_id)?;
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"tree": summary, "runs": runs}))?
        )?;
    } else {
        let journal = store.events(&tree_id, 0)?;
        let paused = if summary.status.is_final() {
            Default::default()
        } else {
            super::runs::paused_runs(&journal)
        };
        outln!(
            "tree {} ({}): {}, {}, cost {:.4}",
            summary.tree_id,
            super::runs::shown_status(summary.status, !paused.is_empty()),
            count(summary.agents, "agent", "agents"),
            count(
                summary.input_tokens + summary.output_tokens,
                "token",
                "tokens"
            ),
            summary.cost
        )?;
        if let Some(key) = paused.values().next() {
            outln!(
                "paused on its {key} budget: arbor budget {} {} N raises it",
                summary.tree_id,
                super::runs::raise_flag(key)
            )?;
        }
        out!("{}", super::runs::tree_text(&runs, &paused))?;
        out!("{}", super::runs::kept_worktrees(&journal))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `arbor show ID`: `id` is read as a run id or a tree id, so that a tree
/// id given for a run is named as one.
pub(super) fn show(id: Target, json: bool, at: Stored) -> anyhow::Result<ExitCode> {
    let Stored { config, store } = at;
    let config = load_config(config.as_deref())?;
    let store = open_store_read_only(&config, store)?;
    let run_id = match id {
        Target::Run(run_id) => run_id,
        Target::Tree(tree) => {
            store
                .tree(&tree)
                .map_err(|_| arbor_supervisor::Error::NoSuchId(IdError::Run(tree.to_string())))?;
            anyhow::bail!(
                "{tree} is a tree, not a run: `arbor tree {tree}` lists its runs \
                 (a run id is TREE/PATH, e.g. {tree}/0 for its root)"
            );
        }
    };
    let run = store.run(&run_id)?;
    let Some(state) = run.state else {
        anyhow::bail!("run {run_id} started but has no checkpoint yet");
    };
    if json {
        outln!("{}", serde_json::to_string_pretty(&state_json(&state)?)?)?;
    } else {
        let n = &run.node;
        outln!(
            "{} {} ({}{}): {}, {}, cost {:.4}, {}, {}",
            n.agent_type,
            n.run_id,
            n.status,
            if run.is_final {
                ""
            } else {
                ", last checkpoint"
            },
            count(n.steps, "step", "steps"),
            count(n.input_tokens + n.output_tokens, "token", "tokens"),
            n.cost,
            count(state.message_history.len() as u64, "message", "messages"),
            count(state.child_run_ids.len() as u64, "child", "children")
        )?;
        if let Some(error) = &n.error {
            outln!("error: {error}")?;
        }
        if let Some(todos) = arbor::tools::workspace::notes::latest(&state.message_history) {
            outln!("todos:\n{}", arbor::tools::workspace::notes::render(&todos))?;
        }
        if let Some(worktree) = &state.worktree {
            outln!(
                "worktree: {} ({}){}",
                worktree.branch,
                worktree.summary,
                worktree
                    .path
                    .as_ref()
                    .map(|p| format!(", kept at {}", p.display()))
                    .unwrap_or_default()
            )?;
        }
        outln!("{}", final_text(&state))?;
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn export(
    tree_id: TreeId,
    output: Option<PathBuf>,
    at: Stored,
) -> anyhow::Result<ExitCode> {
    let Stored { config, store } = at;
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

pub(super) fn replay(tree_id: TreeId, at: Stored) -> anyhow::Result<ExitCode> {
    let Stored { config, store } = at;
    let store = open_store_read_only(&load_config(config.as_deref())?, store)?;
    let config = tree_config(config, &Default::default(), &*store, &tree_id)?;
    async_runtime()?.block_on(replay_tree(config, store, tree_id))
}

/// Runs a stored tree again on its recorded replies and compares every final state.
async fn replay_tree(
    config: Config,
    store: Arc<dyn Store>,
    tree_id: TreeId,
) -> anyhow::Result<ExitCode> {
    let (record, summary) = store.tree(&tree_id)?;
    anyhow::ensure!(
        summary.status.is_final(),
        "tree {tree_id} has not finished ({}); resume it first",
        summary.status
    );
    // The record starts the tree's latest turn: its runs are what a replay
    // runs again (an earlier turn's are its history, not re-run).
    let recorded: Vec<_> = store
        .final_states(&tree_id)?
        .into_iter()
        .filter(|s| s.run_id.is_within(&record.root_run_id))
        .collect();
    let recovery = store.recovery(&tree_id)?;
    let runtime = Runtime::new(config)?;
    let supervisor = runtime.supervisor();
    let root_run_id = record.root_run_id.clone();
    let handle = supervisor.replay(record.request()?, recovery).await?;
    handle.wait().await?;
    // Which turn was replayed, when the tree has had more than one.
    let turn = root_run_id.attempt();
    let which = if turn > 0 {
        format!(
            "turn {turn} (run {root_run_id}, its latest; earlier turns are its history) of tree {tree_id}"
        )
    } else {
        format!("tree {tree_id}")
    };
    match super::runs::compare_replay(&recorded, |run| supervisor.finished_state(run)) {
        Ok(n) => {
            outln!(
                "match: {} of {which} replayed identically from the record",
                count(n as u64, "run", "runs")
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Err(divergence) => {
            outln!("mismatch: {divergence} (replaying {which})")?;
            Ok(ExitCode::from(1))
        }
    }
}

pub(super) fn gc(older_than: std::time::Duration, at: Stored) -> anyhow::Result<ExitCode> {
    let Stored { config, store } = at;
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

/// The config to resume or replay a tree with: `--config`, else the file it
/// was started with (if it is still there), else the default.
pub(super) fn tree_config(
    flag: Option<PathBuf>,
    agents: &arbor::config::AgentFiles,
    store: &dyn Store,
    tree_id: &TreeId,
) -> anyhow::Result<Config> {
    if flag.is_some() {
        // An explicit override: the tree runs on it, and the supervisor
        // records the change with the tree. The file it started with is not
        // another config: both are compared without their secrets (the
        // stored one has none), and it runs on the values of the file given.
        let config = super::load_config_with(flag.as_deref(), agents)?;
        let stored = store
            .tree(tree_id)
            .ok()
            .and_then(|(record, _)| record.config);
        if !stored.is_some_and(|text| config.is_stored_as(&text)) {
            eprintln!(
                "note: tree {tree_id} runs on {} instead of the config it started with",
                config.source
            );
        }
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
fn open_store(config: &Config, flag: Option<StoreLocation>) -> anyhow::Result<Arc<dyn Store>> {
    Ok(store_location(config, flag)?.open_existing()?)
}

/// An existing store opened read-only, for the commands that only read one:
/// they write nothing to it (no migration either), and read a store on a
/// read-only file or filesystem.
fn open_store_read_only(
    config: &Config,
    flag: Option<StoreLocation>,
) -> anyhow::Result<Arc<dyn Store>> {
    Ok(store_location(config, flag)?.open_read_only()?)
}

/// `arbor migrate`: the store at this build's schema; prints the version
/// before and after (a SQLite file says none: it is migrated when opened).
pub(super) fn migrate(at: Stored) -> anyhow::Result<ExitCode> {
    let Stored { config, store } = at;
    let location = store_location(&load_config(config.as_deref())?, store)?;
    let migrated = location.migrate()?;
    match (migrated.from, migrated.to) {
        (Some(from), Some(to)) if from == to => {
            outln!("{location}: schema version {to}, up to date")?
        }
        (Some(from), Some(to)) => outln!("{location}: schema version {from} -> {to}")?,
        _ => outln!("{location}: at this build's schema")?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `arbor store copy FROM TO [--tree ID]`: every tree (or one) dumped from
/// one store and loaded into the other unchanged. A tree the target has
/// already is skipped and named; any other failure stops the copy.
pub(super) fn copy(
    from: StoreLocation,
    to: StoreLocation,
    tree: Option<TreeId>,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(from != to, "{from} is both the source and the target");
    if let StoreLocation::Sqlite(path) = &from
        && !path.is_file()
    {
        anyhow::bail!(
            "no store at {from} to copy from (FROM is a SQLite file or a postgres:// URL)"
        );
    }
    let source = from.open_read_only()?;
    let target = to.open()?;
    let trees = match tree {
        Some(tree) => vec![tree],
        None => source
            .trees(&TreeFilter {
                status: None,
                limit: 0,
                offset: 0,
            })?
            .into_iter()
            .map(|t| t.tree_id)
            .collect(),
    };
    let (mut copied, mut skipped) = (0usize, 0usize);
    for tree_id in trees {
        let dump = source
            .dump(&tree_id)
            .with_context(|| format!("cannot read tree {tree_id} from {from}"))?;
        match target.load(&dump) {
            Ok(()) => copied += 1,
            Err(arbor_supervisor::Error::TreeStored(_)) => {
                eprintln!("skipped {tree_id}: {to} has a tree of that id already");
                skipped += 1;
            }
            Err(error) => {
                return Err(anyhow::Error::new(error)
                    .context(format!("cannot write tree {tree_id} to {to}")));
            }
        }
    }
    // A tree already there is copied already: running the copy again is
    // not a failure.
    outln!(
        "copied {} from {from} to {to} ({skipped} skipped: already there)",
        count(copied as u64, "tree", "trees")
    )?;
    Ok(ExitCode::SUCCESS)
}
