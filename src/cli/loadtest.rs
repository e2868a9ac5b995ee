//! `arbor loadtest`: checks the flags, runs the load-test trees with a
//! progress bar and prints, writes and plots the report.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use arbor::config::StoreLocation;
use arbor::loadtest::BareKind;

use super::args::LoadtestArgs;
use super::{configured_model, load_config};

/// `--baseline-kind`: one bare tree, or all of them. (The variants carry no
/// doc comments: clap would list them one per line and switch `--help` to its
/// long layout; the option's help names them.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BaselineChoice {
    // Actors that share the parent's history by reference (the default).
    Shared,
    // Actors with no history.
    None,
    // Actors that each deep-copy the parent's history.
    Copied,
    // Tokio tasks (no actors) that share the history by reference.
    Tokio,
    // Every kind, one after the other.
    All,
}

impl BaselineChoice {
    fn kinds(self) -> Vec<BareKind> {
        match self {
            BaselineChoice::Shared => vec![BareKind::Shared],
            BaselineChoice::None => vec![BareKind::None],
            BaselineChoice::Copied => vec![BareKind::Copied],
            BaselineChoice::Tokio => vec![BareKind::Tokio],
            BaselineChoice::All => BareKind::ALL.to_vec(),
        }
    }
}

impl LoadtestArgs {
    /// The bare trees to run: none unless a baseline flag is given, `shared`
    /// when no kind is named.
    fn baseline_kinds(&self) -> Vec<BareKind> {
        match self.baseline_kind {
            Some(choice) => choice.kinds(),
            None if self.baseline || self.baseline_only => vec![BareKind::Shared],
            None => Vec::new(),
        }
    }
}

/// The largest tree `arbor loadtest` runs (10⁸ agents; the 1.1 M tree of
/// BENCHMARKS.md takes ~20 s).
const MAX_LOADTEST_AGENTS: u64 = 100_000_000;

pub(super) async fn loadtest(args: LoadtestArgs) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    use std::sync::Arc;

    use arbor::loadtest::{Collector, LoadOptions, run_baseline, run_once, write_plot};
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
    if !args.no_store && !args.baseline_only {
        options.store = Some(
            args.store
                .clone()
                .unwrap_or_else(|| StoreLocation::Sqlite(scratch.clone())),
        );
    }
    let cleanup = RemoveOnDrop(
        (!args.no_store && !args.baseline_only && args.store.is_none()).then_some(scratch),
    );
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
    let arbor_rounds = if args.baseline_only {
        0
    } else {
        options.repeat
    };
    for round in 1..=arbor_rounds {
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
    // Each baseline runs as many times as Arbor's tree; the best of each
    // figure is compared with Arbor's best.
    let kinds = args.baseline_kinds();
    let mut baselines = Vec::new();
    for round in 1..=options.repeat {
        for (i, &kind) in kinds.iter().enumerate() {
            let first = args.baseline_only && round == 1 && i == 0;
            let report = run_baseline(kind, &options, first).await;
            if args.baseline_only {
                outln!(
                    "baseline {kind}{}: {} nodes in {:.3} s",
                    if options.repeat > 1 {
                        format!(" {round}/{}", options.repeat)
                    } else {
                        String::new()
                    },
                    report.nodes,
                    report.wall_secs
                )?;
                out!("{}", report.table())?;
            }
            baselines.push(report);
        }
    }
    if !reports.is_empty() && !kinds.is_empty() {
        let best = |f: fn(&arbor::loadtest::LoadReport) -> f64| {
            reports.iter().map(f).fold(f64::INFINITY, f64::min)
        };
        let arbor = (best(|r| r.us_per_agent), best(|r| r.cpu_us_per_agent));
        outln!(
            "  {:<28} {:.2} µs wall, {:.2} µs CPU per agent (best of {})",
            "Arbor",
            arbor.0,
            arbor.1,
            reports.len()
        )?;
        for &kind in &kinds {
            let runs = baselines.iter().filter(|b| b.kind == kind);
            let Some(mut row) = runs.clone().next().cloned() else {
                continue;
            };
            row.us_per_agent = runs
                .clone()
                .map(|b| b.us_per_agent)
                .fold(f64::INFINITY, f64::min);
            row.cpu_us_per_agent = runs
                .map(|b| b.cpu_us_per_agent)
                .fold(f64::INFINITY, f64::min);
            out!("{}", row.ratio_row(arbor))?;
        }
    }
    if let Some(path) = &args.json {
        let json = if !baselines.is_empty() {
            serde_json::to_string_pretty(
                &serde_json::json!({ "runs": reports, "baselines": baselines }),
            )?
        } else if reports.len() == 1 {
            serde_json::to_string_pretty(&reports[0])?
        } else {
            serde_json::to_string_pretty(&reports)?
        };
        std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let (Some(path), Some(last)) = (&args.plot, reports.last()) {
        write_plot(last, path).map_err(|e| anyhow::anyhow!(e))?;
    }
    let all_completed =
        reports.iter().all(|r| r.completed) && baselines.iter().all(|b| b.nodes == total);
    Ok(if all_completed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn tempfile_path() -> PathBuf {
    std::env::temp_dir().join(format!("arbor-loadtest-{}.db", std::process::id()))
}

/// A store file for one load test, removed (with its WAL) when the test ends.
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
