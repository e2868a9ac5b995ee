//! `arbor loadtest`: checks the flags, runs the load-test trees with a
//! progress bar and prints, writes and plots the report.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use arbor::config::StoreLocation;
use arbor_cli::loadtest::{BareKind, LoadOptions};

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

    /// What the flags ask for, every one read in its range (its config key's
    /// where it has one, through [`LoadOptions::problems`]); else each
    /// problem, naming its flag (`--reply-tokens: … out of range …`).
    fn options(&self) -> Result<LoadOptions, Vec<String>> {
        use arbor::config::ranges::{DEPTH, FANOUT};
        use arbor_actors::models::Latency;
        let mut problems = Vec::new();
        // --fanout and --depth first, as a config's `fanout` and `depth` are:
        // the shape they make is only built from values in range.
        let shape = match &self.shape {
            Some(shape) if shape.is_empty() => {
                problems.push("--shape: needs at least one level".to_owned());
                Vec::new()
            }
            Some(shape) => shape.clone(),
            None => {
                for (flag, value, range) in [
                    ("--fanout", self.fanout, FANOUT),
                    ("--depth", self.depth, DEPTH),
                ] {
                    if let Some(why) = arbor_supervisor::out_of_range(value, range) {
                        problems.push(format!("{flag}: {why}"));
                    }
                }
                if problems.is_empty() {
                    vec![self.fanout; self.depth]
                } else {
                    Vec::new()
                }
            }
        };
        let latency = Latency::parse(&self.latency)
            .map_err(|e| problems.push(format!("--latency: {e}")))
            .unwrap_or(Latency::Fixed(std::time::Duration::ZERO));
        let options = LoadOptions {
            shape,
            history: self.history,
            msg_bytes: self.msg_bytes,
            latency,
            reply_tokens: self.reply_tokens,
            max_live: self.max_live,
            model: None,
            repeat: self.repeat,
            store: None,
            duration: self.duration,
        };
        for (option, why) in options.problems() {
            let flag = match option {
                "shape" if self.shape.is_none() => "--fanout/--depth".to_owned(),
                "max_live" => "--max-live".to_owned(),
                option => format!("--{}", option.replace('_', "-")),
            };
            problems.push(format!("{flag}: {why}"));
        }
        problems.extend(
            self.baseline_kinds()
                .into_iter()
                .filter_map(|kind| options.baseline_problem(kind))
                .map(|why| format!("--baseline-kind {why}")),
        );
        if problems.is_empty() {
            Ok(options)
        } else {
            Err(problems)
        }
    }
}

pub(super) async fn loadtest(args: LoadtestArgs) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    use std::sync::Arc;

    use arbor_cli::loadtest::human_us_f64;
    use arbor_cli::loadtest::{
        BaselineReport, Collector, PROGRESS_BAR, Spread, run_baseline, run_once, threshold,
        write_plot,
    };

    // Every flag is checked before anything runs, as a usage error is.
    let mut options = match args.options() {
        Ok(options) => options,
        Err(problems) => {
            for problem in problems {
                eprintln!("error: {problem}");
            }
            return Ok(ExitCode::from(2));
        }
    };
    // Output files are checked before the run, not after it.
    for (flag, path) in [("--json", &args.json), ("--plot", &args.plot)] {
        if let Some(path) = path {
            std::fs::File::create(path)
                .with_context(|| format!("{flag}: cannot write {}", path.display()))?;
        }
    }
    let model = match &args.model {
        None => None,
        Some(name) => {
            let config = load_config(args.config.as_deref())?;
            let catalog = config.catalog()?;
            let model = configured_model(&catalog, name).context("--model")?;
            Some(model)
        }
    };
    options.model = model;
    // A temporary store unless one is named: the run pays for storing, the
    // user's own store is not filled with load-test trees.
    let scratch = tempfile_path();
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
    let mut crossed = false;
    for round in 1..=arbor_rounds {
        let collector = Arc::new(Collector::default());
        let supervisor = options.supervisor_recording(collector.endpoint.clone())?;
        {
            let collector = collector.clone();
            supervisor.events().observe(move |e| collector.observe(e));
        }
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(PROGRESS_BAR)
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
        for verdict in threshold::evaluate(&args.thresholds, &report.observed()) {
            crossed |= !verdict.passed;
            outln!("  {:<28} {verdict}", "threshold")?;
        }
        reports.push(report);
    }
    // The spread of the runs, not the best of them.
    if reports.len() > 1 {
        let spread = |f: fn(&arbor_cli::loadtest::LoadReport) -> f64| {
            Spread::of(&reports.iter().map(f).collect::<Vec<_>>())
        };
        outln!("over {} runs:", reports.len())?;
        let rows: [SpreadRow; 4] = [
            ("wall time", |r| r.wall_secs * 1e6, human_us_f64),
            ("per agent", |r| r.us_per_agent, human_us_f64),
            ("CPU per agent", |r| r.cpu_us_per_agent, human_us_f64),
            ("agents/s", |r| r.agents_per_sec, |v| format!("{v:.0}")),
        ];
        for (name, figure, unit) in rows {
            if let Some(s) = spread(figure) {
                outln!("  {name:<28} {}", s.show(unit))?;
            }
        }
    }
    // Each baseline runs as many times as Arbor's tree; the median of each
    // figure is compared with Arbor's median.
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
        let median = |f: fn(&arbor_cli::loadtest::LoadReport) -> f64| {
            Spread::of(&reports.iter().map(f).collect::<Vec<_>>()).map_or(f64::NAN, |s| s.median)
        };
        let arbor = (median(|r| r.us_per_agent), median(|r| r.cpu_us_per_agent));
        out!("{}", BaselineReport::arbor_row(arbor, reports.len()))?;
        for &kind in &kinds {
            let runs = baselines.iter().filter(|b| b.kind == kind);
            let Some(mut row) = runs.clone().next().cloned() else {
                continue;
            };
            let median = |values: Vec<f64>| Spread::of(&values).map_or(f64::NAN, |s| s.median);
            row.us_per_agent = median(runs.clone().map(|b| b.us_per_agent).collect());
            row.cpu_us_per_agent = median(runs.map(|b| b.cpu_us_per_agent).collect());
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
    Ok(if crossed {
        // A crossed threshold, as k6 exits.
        ExitCode::from(THRESHOLD_CROSSED)
    } else if all_completed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// A row of the spread of `--repeat`: its name, the figure of one run, and
/// how a figure is written.
type SpreadRow = (
    &'static str,
    fn(&arbor_cli::loadtest::LoadReport) -> f64,
    fn(f64) -> String,
);

/// The exit status of a run that crossed a `--threshold` (k6's).
const THRESHOLD_CROSSED: u8 = 99;

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
