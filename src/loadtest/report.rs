//! The load-test report: the summary table, the JSON file, the SVG plot.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;

use super::LoadOptions;
use super::bare::{BareKind, BareRun};
use super::collect::{Collector, Measured, TokenFigures};

/// Microseconds in the unit that reads best: `850 µs`, `12.3 ms`, `4.20 s`.
pub fn human_us(us: u64) -> String {
    match us {
        0..1_000 => format!("{us} µs"),
        _ => human_us_f64(us as f64),
    }
}

/// A fraction of microseconds (a per-agent figure) in the unit that reads
/// best, as [`human_us`] (`4.74 µs`, `10.4 ms`, `4.20 s`): under a
/// millisecond with two decimals, since per-agent figures are a few µs.
pub fn human_us_f64(us: f64) -> String {
    if us.is_nan() || us < 1e3 {
        format!("{us:.2} µs")
    } else if us < 1e6 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// What one load-test tree measured: the `--json` file (camelCase, like
/// every other JSON Arbor writes), the printed table and the plot's data.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadReport {
    /// The id of the tree that ran.
    pub tree_id: String,
    /// What ran, in a line: the shape and the parameters (the plot's title).
    pub title: String,
    /// Children per level, as in [`LoadOptions::shape`].
    pub shape: Vec<usize>,
    /// Messages the root started with.
    pub history: usize,
    /// Bytes per inherited message.
    pub msg_bytes: usize,
    /// The live-agent limit the tree ran under (`None`: no limit).
    pub max_live: Option<usize>,
    /// Whether the root completed (not failed or cancelled).
    pub completed: bool,
    /// Agents a whole tree of this shape has.
    pub agents_expected: u64,
    /// Agents that started (fewer than expected when the tree ended early).
    pub agents_started: u64,
    /// Agents that ended with an answer.
    pub agents_finished: u64,
    /// Agents that ended with an error.
    pub agents_failed: u64,
    /// Agents that were cancelled.
    pub agents_cancelled: u64,
    /// Model steps, over all agents.
    pub steps: u64,
    /// Model calls retried.
    pub retries: u64,
    /// Seconds from the start request to the tree's end (and, with a store,
    /// to the last write).
    pub wall_secs: f64,
    /// Agents started per second of `wall_secs`.
    pub agents_per_sec: f64,
    /// Microseconds of `wall_secs` per agent started.
    pub us_per_agent: f64,
    /// CPU seconds (user + system, every thread of the process) from the start
    /// request to the tree's end (and, with a store, to the last write).
    pub cpu_secs: f64,
    /// Microseconds of `cpu_secs` per agent started.
    pub cpu_us_per_agent: f64,
    /// Most agents stepping (holding a live slot) at once.
    pub live_max: i64,
    /// Most agents alive at once (stepping, suspended while children run,
    /// finishing): from their `agentStarted`, sent once an agent's actor
    /// exists (before the runtime first polls it), to their end, as the bare
    /// trees count their nodes.
    pub alive_max: i64,
    /// Peak resident set size of the process, bytes (0 where it cannot be
    /// read: outside Linux). It is the process's peak, so a later tree of
    /// `--repeat` reports at least the earlier ones' peak.
    pub peak_rss_bytes: u64,
    /// Resident set size just before the tree started, bytes (0 outside Linux).
    pub rss_before_bytes: u64,
    /// (peak RSS − RSS before the run) / the most agents alive at once.
    pub bytes_per_live_agent: f64,
    /// Size of the store file (and its WAL) after the run, when it was stored.
    pub store_bytes: Option<u64>,
    /// How long the store took to write what was left after the tree ended
    /// (included in `wall_secs`).
    pub store_tail_secs: Option<f64>,
    /// The latencies, token figures, errors and live-agent samples.
    #[serde(flatten)]
    pub measured: Measured,
}

impl LoadReport {
    pub(super) fn new(
        options: &LoadOptions,
        c: &Collector,
        tree_id: String,
        (wall, cpu): (Duration, Duration),
        completed: bool,
        rss_before: u64,
    ) -> Self {
        let started = c.started.load(Ordering::Acquire);
        let secs = wall.as_secs_f64();
        let peak = peak_rss_bytes().unwrap_or(0);
        let live_max = c.live_max.load(Ordering::Acquire);
        let alive_max = c.alive_max.load(Ordering::Acquire);
        let measured = c.measured(options.model.is_some());
        LoadReport {
            title: title(options),
            tree_id,
            shape: options.shape.clone(),
            history: options.history,
            msg_bytes: options.msg_bytes,
            max_live: options.max_live,
            completed,
            agents_expected: options.agents(),
            agents_started: started,
            agents_finished: c.finished.load(Ordering::Acquire),
            agents_failed: c.failed.load(Ordering::Acquire),
            agents_cancelled: c.cancelled.load(Ordering::Acquire),
            steps: c.steps.load(Ordering::Acquire),
            retries: c.retries.load(Ordering::Acquire),
            wall_secs: secs,
            agents_per_sec: if secs > 0.0 {
                started as f64 / secs
            } else {
                0.0
            },
            us_per_agent: per_agent_us(secs, started),
            cpu_secs: cpu.as_secs_f64(),
            cpu_us_per_agent: per_agent_us(cpu.as_secs_f64(), started),
            live_max,
            alive_max,
            peak_rss_bytes: peak,
            rss_before_bytes: rss_before,
            bytes_per_live_agent: if alive_max > 0 {
                peak.saturating_sub(rss_before) as f64 / alive_max as f64
            } else {
                0.0
            },
            store_bytes: None,
            store_tail_secs: None,
            measured: Measured {
                // Tokens are the endpoint's: a simulated run has none to report.
                tokens: options.model.as_ref().and(measured.tokens),
                ..measured
            },
        }
    }

    /// The summary table `arbor loadtest` prints, one `name value` row a
    /// line; with `endpoint`, the token rows of a run on a real model too.
    pub fn table(&self, endpoint: bool) -> String {
        let mut t = String::new();
        let mut row = |k: &str, v: String| {
            let _ = writeln!(t, "  {k:<28} {v}");
        };
        row("tree", self.tree_id.clone());
        row(
            "shape",
            format!("{:?} ({} agents)", self.shape, self.agents_expected),
        );
        row(
            "agents",
            format!(
                "{} started, {} completed, {} failed, {} cancelled",
                self.agents_started,
                self.agents_finished,
                self.agents_failed,
                self.agents_cancelled
            ),
        );
        row("wall time", format!("{:.3} s", self.wall_secs));
        row("agents/s", format!("{:.0}", self.agents_per_sec));
        row("per agent", human_us_f64(self.us_per_agent));
        row(
            "CPU",
            format!(
                "{:.3} s ({} per agent)",
                self.cpu_secs,
                human_us_f64(self.cpu_us_per_agent)
            ),
        );
        let p = &self.measured.spawn_to_reply_us;
        row(
            "spawn→reply p50/p90/p99/max",
            [p.p50, p.p90, p.p99, p.max].map(human_us).join(" / "),
        );
        row(
            "agents stepping / alive (max)",
            format!("{} / {}", self.live_max, self.alive_max),
        );
        row(
            "peak RSS",
            format!("{:.1} MB", self.peak_rss_bytes as f64 / 1e6),
        );
        row(
            "bytes per live agent",
            format!("{:.0}", self.bytes_per_live_agent),
        );
        row(
            "store",
            match self.store_bytes {
                Some(bytes) => format!(
                    "{:.1} MB written, {:.0} ms of writing after the tree ended",
                    bytes as f64 / 1e6,
                    self.store_tail_secs.unwrap_or(0.0) * 1e3
                ),
                None => "off".into(),
            },
        );
        if let Some(e) = self.measured.endpoint.as_ref().filter(|_| endpoint) {
            let f = &self.measured.ttft_us;
            row(
                "endpoint requests",
                format!(
                    "{} ({} answered, {} failed: {:.1}%)",
                    e.requests,
                    e.answered,
                    e.failed,
                    e.error_rate() * 100.0
                ),
            );
            // The endpoint's answered requests only: not the steps the load
            // generator plans itself, and a failure is counted below, not
            // left out.
            let l = &e.latency_us;
            row(
                "request p50/p90/p99/max",
                if l.count == 0 {
                    "none answered".to_owned()
                } else {
                    [l.p50, l.p90, l.p99, l.max].map(human_us).join(" / ")
                },
            );
            row(
                "request failures",
                if e.failures.is_empty() {
                    "none".to_owned()
                } else {
                    e.failures
                        .iter()
                        .map(|(k, n)| format!("{k}: {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            );
            // Only streamed replies have a first token: nothing to show otherwise.
            if f.count > 0 {
                row(
                    "time to first token p50/p99",
                    format!("{} / {}", human_us(f.p50), human_us(f.p99)),
                );
            }
            if let Some(tokens) = &self.measured.tokens {
                row("output tokens/s", tokens_per_sec(tokens));
            }
        }
        row(
            "retries",
            format!("{} {}", self.retries, kinds(&self.measured.retry_kinds)),
        );
        row("errors", kinds(&self.measured.errors));
        t
    }
}

impl LoadReport {
    /// The figures `--threshold`s read: with an endpoint its requests'
    /// latency and failures, else spawn→reply and the agents that failed.
    pub fn observed(&self) -> super::threshold::Observed {
        let ended = self.agents_finished + self.agents_failed + self.agents_cancelled;
        let throughput = if self.wall_secs > 0.0 {
            ended as f64 / self.wall_secs
        } else {
            0.0
        };
        let (p, error_rate, failures) = match &self.measured.endpoint {
            Some(e) => (&e.latency_us, e.error_rate(), e.failed),
            None => (
                &self.measured.spawn_to_reply_us,
                if ended > 0 {
                    self.agents_failed as f64 / ended as f64
                } else {
                    0.0
                },
                self.agents_failed,
            ),
        };
        super::threshold::Observed {
            latency_us: [p.p50, p.p90, p.p95, p.p99, p.max],
            error_rate,
            failures,
            throughput,
        }
    }
}

/// The report's title: the shape and the parameters the tree ran with.
fn title(o: &LoadOptions) -> String {
    use arbor_actors::models::Latency;
    let shape: Vec<String> = o.shape.iter().map(usize::to_string).collect();
    let mut t = format!("shape {} ({} agents)", shape.join(","), o.agents());
    if let Some(model) = &o.model {
        let _ = write!(t, ", model {}", model.name());
    } else {
        let latency = match o.latency {
            Latency::Fixed(d) => human_us(d.as_micros() as u64),
            Latency::LogNormal { median, sigma } => {
                format!(
                    "lognormal {} σ {sigma}",
                    human_us(median.as_micros() as u64)
                )
            }
        };
        let _ = write!(t, ", latency {latency}, {} reply tokens", o.reply_tokens);
    }
    match o.max_live {
        Some(n) => {
            let _ = write!(t, ", max live {n}");
        }
        None => t.push_str(", no live cap"),
    }
    if o.history > 0 {
        let _ = write!(t, ", history {}×{} B", o.history, o.msg_bytes);
    }
    if let Some(d) = o.duration {
        let _ = write!(t, ", duration {}", human_us(d.as_micros() as u64));
    }
    t
}

/// The spread of one figure over the runs of `--repeat`: the median, the
/// smallest and largest, and the standard deviation (of the sample).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spread {
    /// The median (of an even count, the mean of the middle two).
    pub median: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
    /// The sample standard deviation (0 for one run).
    pub stdev: f64,
    /// How many runs.
    pub runs: usize,
}

impl Spread {
    /// The spread of `values` (`None` when there are none).
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        let mean = v.iter().sum::<f64>() / n as f64;
        let stdev = if n > 1 {
            (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[n - 1],
            stdev,
            runs: n,
        })
    }

    /// `median M (min–max A–B, stdev S)`, each figure written by `unit`.
    pub fn show(&self, unit: impl Fn(f64) -> String) -> String {
        format!(
            "median {} ({}–{}, stdev {})",
            unit(self.median),
            unit(self.min),
            unit(self.max),
            unit(self.stdev)
        )
    }
}

/// Microseconds of `secs` per one of `n` (0 when there are none).
fn per_agent_us(secs: f64, n: u64) -> f64 {
    if n > 0 { secs * 1e6 / n as f64 } else { 0.0 }
}

/// What one bare tree (a baseline, [`BareKind`]) measured: its part of the
/// `--json` file and its rows of the printed report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BaselineReport {
    /// The kind's name (`shared`, `none`, `copied`, `tokio`).
    pub kind: BareKind,
    /// Nodes that ran, the root included.
    pub nodes: u64,
    /// Seconds from the root's spawn to the last node's end.
    pub wall_secs: f64,
    /// Microseconds of `wall_secs` per node.
    pub us_per_agent: f64,
    /// CPU seconds (user + system, the whole process) over the same time.
    pub cpu_secs: f64,
    /// Microseconds of `cpu_secs` per node.
    pub cpu_us_per_agent: f64,
    /// Most nodes alive at once.
    pub alive_max: usize,
    /// Peak RSS, RSS before the tree and (peak − before) ÷ `alive_max`, bytes:
    /// only when the baseline was the first thing its process ran
    /// (`--baseline-only`); after an Arbor tree the peak is Arbor's.
    pub memory: Option<BaselineMemory>,
}

/// A baseline's memory figures (see [`BaselineReport::memory`]).
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BaselineMemory {
    /// Peak resident set size of the process, bytes.
    pub peak_rss_bytes: u64,
    /// Resident set size just before the tree started, bytes.
    pub rss_before_bytes: u64,
    /// (peak RSS − RSS before) ÷ the most nodes alive at once.
    pub bytes_per_live_agent: f64,
}

impl Serialize for BareKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl BaselineReport {
    pub(super) fn new(
        kind: BareKind,
        run: BareRun,
        (wall, cpu): (Duration, Duration),
        rss_before: Option<u64>,
    ) -> Self {
        let memory = rss_before.map(|before| {
            let peak = peak_rss_bytes().unwrap_or(0);
            BaselineMemory {
                peak_rss_bytes: peak,
                rss_before_bytes: before,
                bytes_per_live_agent: if run.alive_max > 0 {
                    peak.saturating_sub(before) as f64 / run.alive_max as f64
                } else {
                    0.0
                },
            }
        });
        BaselineReport {
            kind,
            nodes: run.nodes,
            wall_secs: wall.as_secs_f64(),
            us_per_agent: per_agent_us(wall.as_secs_f64(), run.nodes),
            cpu_secs: cpu.as_secs_f64(),
            cpu_us_per_agent: per_agent_us(cpu.as_secs_f64(), run.nodes),
            alive_max: run.alive_max,
            memory,
        }
    }

    /// The baseline's own rows, as `arbor loadtest --baseline-only` prints
    /// them (the same `  name value` layout as [`LoadReport::table`]).
    pub fn table(&self) -> String {
        let mut t = String::new();
        let mut row = |k: &str, v: String| {
            let _ = writeln!(t, "  {k:<28} {v}");
        };
        row("baseline", format!("{} ({})", self.kind, self.kind.label()));
        row("nodes", self.nodes.to_string());
        row("wall time", format!("{:.3} s", self.wall_secs));
        row("per agent", human_us_f64(self.us_per_agent));
        row(
            "CPU",
            format!(
                "{:.3} s ({} per agent)",
                self.cpu_secs,
                human_us_f64(self.cpu_us_per_agent)
            ),
        );
        row("alive (max)", self.alive_max.to_string());
        if let Some(m) = &self.memory {
            row(
                "peak RSS",
                format!("{:.1} MB", m.peak_rss_bytes as f64 / 1e6),
            );
            row(
                "bytes per live agent",
                format!("{:.0}", m.bytes_per_live_agent),
            );
        }
        t
    }

    /// Its row beside an Arbor run: its wall and CPU time per agent and
    /// Arbor's ratio to each (`arbor` is Arbor's best wall and CPU time per
    /// agent, µs).
    pub fn ratio_row(&self, arbor: (f64, f64)) -> String {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        format!(
            "  {:<28} {} wall, {} CPU per agent (Arbor/it: {:.2}× wall, {:.2}× CPU)\n",
            self.kind.label(),
            human_us_f64(self.us_per_agent),
            human_us_f64(self.cpu_us_per_agent),
            ratio(arbor.0, self.us_per_agent),
            ratio(arbor.1, self.cpu_us_per_agent),
        )
    }

    /// Arbor's row above the baselines' [`ratio_row`](Self::ratio_row)s:
    /// its median wall and CPU time per agent (µs) over `runs` runs.
    pub fn arbor_row(arbor: (f64, f64), runs: usize) -> String {
        format!(
            "  {:<28} {} wall, {} CPU per agent (median of {runs})\n",
            "Arbor",
            human_us_f64(arbor.0),
            human_us_f64(arbor.1),
        )
    }
}

/// CPU time the process has used so far, user and system, all threads
/// (`None` where it cannot be read).
pub fn cpu_time() -> Option<Duration> {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    let micros = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    Some(micros(usage.user_time()) + micros(usage.system_time()))
}

/// The output rate, marked when any count behind it is an estimate, and how
/// many: measured and estimated figures are never mixed silently.
pub fn tokens_per_sec(t: &TokenFigures) -> String {
    let a = &t.answers;
    let rate = t.output_tokens_per_sec;
    let mut text = if a.replies_estimated == 0 {
        format!("{rate:.0}")
    } else if a.replies_estimated == a.replies {
        format!("≈ {rate:.0} (estimated: the endpoint reported no usage)")
    } else {
        format!(
            "≈ {rate:.0} (estimated in part: {} of {} replies reported no usage)",
            a.replies_estimated, a.replies
        )
    };
    if a.replies_unreported > 0 {
        let _ = write!(
            text,
            " ({} of {} replies reported no usage and count as 0)",
            a.replies_unreported, a.replies
        );
    }
    text
}

fn kinds(map: &std::collections::HashMap<String, u64>) -> String {
    if map.is_empty() {
        return "none".into();
    }
    let mut v: Vec<_> = map.iter().collect();
    v.sort();
    v.iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resident set size now (Linux; `None` elsewhere).
pub fn rss_bytes() -> Option<u64> {
    status_kb("VmRSS:")
}

/// Peak resident set size of the process (Linux; `None` elsewhere).
pub fn peak_rss_bytes() -> Option<u64> {
    status_kb("VmHWM:")
}

/// The unit a span of up to `max_us` microseconds reads best in, and its
/// size in µs: `µs` under a millisecond, `ms` under a second, else `s`.
pub fn unit_for(max_us: f64) -> (&'static str, f64) {
    if max_us < 1e3 {
        ("µs", 1.0)
    } else if max_us < 1e6 {
        ("ms", 1e3)
    } else {
        ("s", 1e6)
    }
}

/// Agents ended per second over `timeline`, in up to `windows` equal
/// windows: `(window's end, ms; rate)`.
pub fn throughput(timeline: &[super::collect::Point], windows: usize) -> Vec<(f64, f64)> {
    let Some(last) = timeline.last() else {
        return Vec::new();
    };
    let t_max = last.t_ms.max(1.0);
    let width = t_max / windows.max(1) as f64;
    // Agents ended by time `t`: the last point at or before it.
    let ended_by = |t: f64| {
        let i = timeline.partition_point(|p| p.t_ms <= t);
        if i == 0 { 0 } else { timeline[i - 1].ended }
    };
    (1..=windows.max(1))
        .map(|k| {
            let (from, to) = ((k - 1) as f64 * width, k as f64 * width);
            let ended = ended_by(to).saturating_sub(ended_by(from));
            (to, ended as f64 / (width / 1e3))
        })
        .collect()
}

/// The chart could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw {}: {reason}", path.display())]
pub struct PlotError {
    /// Where it was to be written.
    pub path: std::path::PathBuf,
    /// What the drawing library said.
    pub reason: String,
}

/// Draws, under a title naming the shape and parameters: live agents over
/// time (a point per event, so no peak is missed), agents ended per second
/// over time, and the latency distribution (the endpoint's requests with
/// `--model`, else spawn→reply), each axis in the unit that reads best.
pub fn write_plot(report: &LoadReport, path: &Path) -> Result<(), PlotError> {
    use plotters::prelude::*;

    let err = |e: &dyn std::fmt::Display| PlotError {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let root = SVGBackend::new(path, (1000, 1150)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(
            &format!("arbor loadtest: {}", report.title),
            ("sans-serif", 20),
        )
        .map_err(|e| err(&e))?;
    let areas = root.split_evenly((3, 1));

    let timeline = &report.measured.timeline;
    let t_max_ms = timeline.last().map(|p| p.t_ms).unwrap_or(1.0).max(1.0);
    let (t_unit, t_scale) = unit_for(t_max_ms * 1e3);
    let t_of = |ms: f64| ms * 1e3 / t_scale;
    let t_desc = format!("time since start ({t_unit})");

    // Live agents over time.
    let live_max = timeline.iter().map(|p| p.live).max().unwrap_or(1).max(1);
    let mut chart = ChartBuilder::on(&areas[0])
        .caption("live agents over time", ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_of(t_max_ms), 0i64..live_max + live_max / 10 + 1)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(t_desc.as_str())
        .y_desc("live agents")
        .draw()
        .map_err(|e| err(&e))?;
    // A step line: the count holds until the next point.
    let steps = timeline
        .windows(2)
        .flat_map(|w| [(t_of(w[0].t_ms), w[0].live), (t_of(w[1].t_ms), w[0].live)]);
    let steps: Vec<(f64, i64)> = steps
        .chain(timeline.last().map(|p| (t_of(p.t_ms), p.live)))
        .collect();
    chart
        .draw_series(LineSeries::new(steps, &BLUE))
        .map_err(|e| err(&e))?;

    // Throughput over time.
    let rates = throughput(timeline, 60);
    let rate_max = rates.iter().map(|(_, r)| *r).fold(0.0, f64::max).max(1.0);
    let mut chart = ChartBuilder::on(&areas[1])
        .caption("throughput: agents ended per second", ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_of(t_max_ms), 0f64..rate_max * 1.1)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(t_desc.as_str())
        .y_desc("agents/s")
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(
            rates.iter().map(|(t, r)| (t_of(*t), *r)),
            &RED,
        ))
        .map_err(|e| err(&e))?;

    // The latency distribution.
    let buckets = &report.measured.latency_distribution;
    let what = if report.measured.endpoint.is_some() {
        "request latency"
    } else {
        "spawn→reply latency"
    };
    let top = buckets.last().map(|b| b.0).unwrap_or(1) as f64;
    let (l_unit, l_scale) = unit_for(top);
    let count_max = buckets.iter().map(|b| b.1).max().unwrap_or(1).max(1);
    let n = buckets.len().max(1) as u32;
    let mut chart = ChartBuilder::on(&areas[2])
        .caption(
            format!("{what} distribution ({l_unit})"),
            ("sans-serif", 18),
        )
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (0u32..n).into_segmented(),
            0u64..count_max + count_max / 10 + 1,
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_labels(10)
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => buckets
                .get(*i as usize)
                .map(|b| format!("{:.3}", b.0 as f64 / l_scale))
                .map(|t| {
                    let t = t.trim_end_matches('0').trim_end_matches('.');
                    format!("≤{t}")
                })
                .unwrap_or_default(),
            _ => String::new(),
        })
        .x_desc(format!("{what} ({l_unit})"))
        .y_desc("count")
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(
            Histogram::vertical(&chart)
                .style(BLUE.mix(0.6).filled())
                .margin(2)
                .data(buckets.iter().enumerate().map(|(i, b)| (i as u32, b.1))),
        )
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Bytes of a SQLite store file with its write-ahead log.
pub(super) fn store_bytes(path: &std::path::Path) -> u64 {
    let size = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    size(path) + size(std::path::Path::new(&wal))
}

#[cfg(test)]
mod unit_tests {
    #[test]
    fn the_spread_of_repeated_runs_is_their_median_range_and_stdev() {
        use super::Spread;
        let s = Spread::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.runs), (2.5, 1.0, 10.0, 4));
        assert!((s.stdev - 4.0825).abs() < 1e-3, "{s:?}");
        assert_eq!(
            s.show(|v| format!("{v:.1}")),
            "median 2.5 (1.0–10.0, stdev 4.1)"
        );
        assert_eq!(Spread::of(&[7.0]).unwrap().stdev, 0.0);
        assert!(Spread::of(&[]).is_none());
    }

    #[test]
    fn plot_axes_take_the_unit_that_reads_best() {
        use super::unit_for;
        assert_eq!(unit_for(800.0), ("µs", 1.0));
        // Not µs up to 800,000.
        assert_eq!(unit_for(800_000.0), ("ms", 1e3));
        assert_eq!(unit_for(44_000_000.0), ("s", 1e6));
    }

    #[test]
    fn throughput_over_time_is_agents_ended_per_second_of_each_window() {
        use super::super::collect::Point;
        use super::throughput;
        let p = |t_ms: f64, ended: u64| Point {
            t_ms,
            live: 0,
            ended,
        };
        // 10 ended in the first second, 30 in the second.
        let rates = throughput(&[p(0.0, 0), p(1000.0, 10), p(2000.0, 40)], 2);
        assert_eq!(rates, [(1000.0, 10.0), (2000.0, 30.0)]);
        assert!(throughput(&[], 10).is_empty());
    }

    #[test]
    fn the_timeline_keeps_every_peak_within_its_bound() {
        use super::super::collect::Timeline;
        let mut t = Timeline::default();
        for i in 0..100_000u64 {
            // A peak of 90 once, 1 otherwise.
            let live = if i == 54_321 { 90 } else { 1 };
            t.record(i as f64 * 0.3, live, i);
        }
        assert!(t.points().len() <= Timeline::MOST, "{}", t.points().len());
        assert!(t.points().len() > Timeline::MOST / 4);
        assert_eq!(t.points().iter().map(|p| p.live).max(), Some(90));
        assert_eq!(t.points().last().map(|p| p.ended), Some(99_999));
    }

    use super::super::collect::Answers;
    use super::{TokenFigures, human_us, human_us_f64, tokens_per_sec};

    #[test]
    fn estimated_token_rates_say_so_and_how_many_replies_were_estimated() {
        let figures = |replies, estimated, unreported| TokenFigures {
            output_tokens_per_sec: 1234.4,
            tokens_estimated: estimated > 0,
            answers: Answers {
                replies,
                input_tokens: 100,
                output_tokens: 50,
                replies_estimated: estimated,
                replies_unreported: unreported,
            },
        };
        assert_eq!(tokens_per_sec(&figures(13, 0, 0)), "1234");
        assert_eq!(
            tokens_per_sec(&figures(13, 13, 0)),
            "≈ 1234 (estimated: the endpoint reported no usage)"
        );
        assert_eq!(
            tokens_per_sec(&figures(13, 4, 0)),
            "≈ 1234 (estimated in part: 4 of 13 replies reported no usage)"
        );
        assert_eq!(
            tokens_per_sec(&figures(13, 0, 2)),
            "1234 (2 of 13 replies reported no usage and count as 0)"
        );
        let json = serde_json::to_value(figures(13, 4, 0)).unwrap();
        assert_eq!(json["tokensEstimated"], true);
        assert_eq!(json["repliesEstimated"], 4);
        assert_eq!(json["replies"], 13);
    }

    #[test]
    fn latencies_read_in_human_units() {
        assert_eq!(human_us(850), "850 µs");
        assert_eq!(human_us(12_345), "12.3 ms");
        assert_eq!(human_us(4_200_000), "4.20 s");
    }

    /// Defect 24: the per-agent rows printed raw µs (`10397.32 µs`,
    /// `8700.67 µs per agent`); they read in the percentiles' units now, a
    /// few µs keeping their decimals.
    #[test]
    fn per_agent_figures_read_in_human_units() {
        assert_eq!(human_us_f64(4.744), "4.74 µs");
        assert_eq!(human_us_f64(0.0), "0.00 µs");
        assert_eq!(human_us_f64(10_397.32), "10.4 ms");
        assert_eq!(human_us_f64(8_700.67), "8.7 ms");
        assert_eq!(human_us_f64(4_200_000.0), "4.20 s");
        assert_eq!(human_us_f64(f64::NAN), "NaN µs");
    }

    #[test]
    fn the_per_agent_rows_of_a_report_and_a_baseline_use_human_units() {
        use super::super::bare::{BareKind, BareRun};
        use super::BaselineReport;
        use std::time::Duration;
        let run = BareRun {
            nodes: 1000,
            alive_max: 1000,
        };
        // 10.4 s of wall and 8.7 s of CPU over 1000 nodes.
        let bare = BaselineReport::new(
            BareKind::Shared,
            run,
            (
                Duration::from_micros(10_397_320),
                Duration::from_micros(8_700_670),
            ),
            None,
        );
        let table = bare.table();
        assert!(
            table.contains("per agent                    10.4 ms\n"),
            "{table}"
        );
        assert!(table.contains("(8.7 ms per agent)"), "{table}");
        assert!(!table.contains(" µs"), "{table}");
        let row = bare.ratio_row((20_794.64, 8_700.67));
        assert!(
            row.contains("10.4 ms wall, 8.7 ms CPU per agent (Arbor/it: 2.00× wall, 1.00× CPU)"),
            "{row}"
        );
        let arbor = BaselineReport::arbor_row((4.744, 3.2), 3);
        assert!(
            arbor.contains("4.74 µs wall, 3.20 µs CPU per agent (median of 3)"),
            "{arbor}"
        );
    }
}
