//! `arbor run` and `arbor resume`: start or continue a tree and show it until
//! its root ends.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use arbor::{Run, Runtime, TurnRun, Waited};
use arbor_actors::approval::{DecideRefused, Decision};
use arbor_actors::{AgentStatus, EventKind, RunId, TreeId};
use arbor_supervisor::{StartRequest, Supervisor, ToolPolicy, ToolRule, TreeLimits};

use super::args::{RunArgs, Stored};
use super::live::{LiveView, lock};
use super::render::{TreeRenderer, final_text, state_json};
use super::store::tree_config;
use super::{
    agent_files, async_runtime, colour, load_config_with, log_filter, now_ms, store_location,
};

/// `arbor run`'s and `arbor resume`'s logs: warnings to stderr (RUST_LOG
/// says otherwise), and the tree's spans to an OpenTelemetry collector when
/// `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT` or `[service] otlp_endpoint` names
/// one (docs/telemetry.md). Keep the exporter until the command ends:
/// dropping it sends the last spans.
fn command_logs(config: &arbor::Config) -> anyhow::Result<Option<arbor::telemetry::Otlp>> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let otlp = arbor::telemetry::Otlp::from_env(config.service.otlp_endpoint.as_deref())?;
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour(&std::io::stderr()))
        .with_filter(log_filter("warn"));
    let spans = otlp.as_ref().map(|o| {
        o.layer()
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
    });
    tracing_subscriber::registry()
        .with(lines)
        .with(spans)
        .try_init()?;
    Ok(otlp)
}

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
        continue_tree,
        multitask,
        events,
        allow_tools,
        deny_tools,
        workspace,
        read_only,
        agents,
        plain,
        prompt,
    } = args;
    // The workspace: --workspace, else where the command runs (made
    // absolute here; the supervisor checks and keeps it canonical).
    let root = match workspace {
        Some(dir) => {
            std::path::absolute(&dir).with_context(|| format!("--workspace {}", dir.display()))?
        }
        None => std::env::current_dir().context("the current directory")?,
    };
    let config = load_config_with(config.as_deref(), &agent_files(agents, Some(&root)))?;
    // Kept to the end, when dropping it sends the last spans (one trace per tree).
    let _otlp = command_logs(&config)?;
    let rule = ToolRule {
        allow: allow_tools,
        deny: deny_tools,
        ..Default::default()
    };
    // The request asks only what the flags say: the supervisor's limits are
    // the config's, and it checks the rule as it does every caller's (a bad
    // pattern is a config error, exit 2, as in [policy]: see main.rs).
    let limits = Some(TreeLimits {
        tools: ToolPolicy::new(rule),
        workspace: Some(arbor_supervisor::WorkspaceSpec { root, read_only }),
        ..TreeLimits::default()
    });
    let params = params
        .map(|p| serde_json::from_str(&p))
        .transpose()
        .context("--params is not valid JSON")?;
    // --store names the store even when the config's is disabled.
    let store = match (store.no_store, store.store) {
        (true, _) => None,
        (false, Some(location)) => Some(location),
        (false, None) if config.stores() => Some(store_location(&config, None)?),
        (false, None) => None,
    };
    let agent = agent
        .or_else(|| config.default_agent().map(str::to_owned))
        .context("no agent given and the config defines none")?;
    let show = Show {
        json,
        quiet,
        events,
        plain,
    };
    let tokio = async_runtime()?;
    // Built inside the async runtime, so the store can use it.
    let _guard = tokio.enter();
    let runtime = match &store {
        Some(location) => Runtime::builder(config)
            .store_at(location.clone())
            .build()?,
        None => Runtime::new(config)?,
    };
    if let Some(tree) = continue_tree {
        let tree = super::tree_arg(&tree)?;
        anyhow::ensure!(
            store.is_some(),
            "--continue needs the store (a follow-up turn goes on from the stored tree)"
        );
        let request = arbor_supervisor::TurnRequest {
            prompt,
            params,
            multitask,
            webhook: None,
        };
        let started = Started::default();
        return tokio.block_on(until_stopped(&runtime, &started, true, async {
            let run = match runtime.start_turn(&tree, request).await? {
                TurnRun::Started(run) => run,
                TurnRun::Queued(queued) => {
                    match wait_queued(&runtime, queued, show, &started).await? {
                        Waited::Started(run) => run,
                        // Another process ran it: what it ended with.
                        Waited::Ended(state) => return show_result(&state, show),
                    }
                }
            };
            follow_tree(&runtime, run, show, true, &started).await
        }));
    }
    let started = Started::default();
    let stored = store.is_some();
    tokio.block_on(until_stopped(&runtime, &started, stored, async {
        let run = runtime
            .start_with(StartRequest {
                agent,
                prompt,
                params,
                model,
                tree_id,
                origin: runtime.origin(),
                limits,
                ..StartRequest::default()
            })
            .await?;
        follow_tree(&runtime, run, show, stored, &started).await
    }))
}

pub(super) fn resume(
    tree_id: TreeId,
    show: Show,
    agents: arbor::config::AgentFiles,
    restart_programs: bool,
    at: Stored,
) -> anyhow::Result<ExitCode> {
    let Stored { config, store } = at;
    let current = load_config_with(config.as_deref(), &agents)?;
    // Before the tree's config is read: its warnings are logged.
    let _otlp = command_logs(&current)?;
    let location = store_location(&current, store)?;
    let existing = location.open_existing()?;
    let config = tree_config(config, &agents, &*existing, &tree_id)?;
    drop(existing);
    let tokio = async_runtime()?;
    let _guard = tokio.enter();
    let runtime = Runtime::builder(config).store_at(location).build()?;
    let started = Started::default();
    tokio.block_on(until_stopped(&runtime, &started, true, async {
        let run = runtime.resume_with(&tree_id, restart_programs).await?;
        follow_tree(&runtime, run, show, true, &started).await
    }))
}

/// How `run` and `resume` show a tree.
#[derive(Clone, Copy)]
pub(super) struct Show {
    pub(super) json: bool,
    pub(super) quiet: bool,
    pub(super) events: bool,
    /// The line log even on a terminal (no live view).
    pub(super) plain: bool,
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
    arbor::telemetry::flush_before_exit();
    eprintln!("stopped by a signal; tool processes ended");
    std::process::exit(code);
}

/// The tree a command started, once it has: what Ctrl-C cancels; and the
/// turn `--continue` queued, while it waits: what Ctrl-C takes out of the
/// queue (its store id, its tree and its turn number).
#[derive(Default)]
struct Started(
    std::sync::OnceLock<TreeId>,
    std::sync::Mutex<Option<(u64, TreeId, u32)>>,
);

/// How long Ctrl-C waits for the cancelled tree to end and be stored.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `work` (which follows the tree it starts, see [`Started`]) until it
/// ends or the process gets a signal, then exits:
/// - SIGINT (Ctrl-C: a person stopped it): the tree is cancelled and, once
///   it has ended (within [`CANCEL_WAIT`], or a second signal), exits 130.
///   A stored tree is then `cancelled`: no process resumes or adopts it
///   (`arbor run --continue` can still ask it a follow-up turn).
/// - SIGTERM (a shutdown, a supervisor): exits 143 at once, the tree left
///   as a crash leaves it: interrupted, for `arbor resume` or an `arbor
///   serve` on the store to continue.
///
/// Every tool process is ended either way.
async fn until_stopped<T>(
    runtime: &Runtime,
    started: &Started,
    stored: bool,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let mut work = std::pin::pin!(work);
    tokio::select! {
        result = &mut work => return result,
        _ = term.recv() => stop(143, "stopped by SIGTERM; tool processes ended"),
        _ = int.recv() => {}
    }
    let waiting = started.1.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some((id, tree, turn)) = waiting {
        // Out of the queue, so that no process runs the turn a person gave up on.
        let taken = runtime
            .supervisor()
            .read_store(move |store| store.forget_turn(id))
            .await;
        match taken {
            Ok(()) => stop(
                130,
                &format!("stopped: turn {turn} of tree {tree} taken out of its queue"),
            ),
            Err(e) => stop(
                130,
                &format!("stopped; turn {turn} of tree {tree} may still run: {e}"),
            ),
        }
    }
    let Some(tree) = started
        .0
        .get()
        .filter(|tree| runtime.supervisor().cancel_tree(tree))
    else {
        stop(130, "stopped by Ctrl-C; tool processes ended");
    };
    eprintln!("stopping: cancelling tree {tree} (Ctrl-C again to quit at once)");
    let ended = tokio::select! {
        _ = &mut work => true,
        _ = int.recv() => false,
        _ = term.recv() => false,
        () = tokio::time::sleep(CANCEL_WAIT) => false,
    };
    if !ended {
        stop(
            130,
            &format!(
                "stopped before tree {tree} ended; tool processes ended \
                 (it is interrupted: arbor cancel {tree} ends it, arbor resume {tree} goes on)"
            ),
        );
    }
    if stored {
        stop(
            130,
            &format!(
                "stopped: tree {tree} cancelled, and stored so: no process resumes or adopts it \
                 (arbor run --continue {tree} asks it a follow-up)"
            ),
        );
    }
    stop(130, &format!("stopped: tree {tree} cancelled"));
}

/// Ends every tool process, says `why` and exits with `code`.
fn stop(code: i32, why: &str) -> ! {
    arbor::tools::reaper::kill_all();
    arbor::telemetry::flush_before_exit();
    eprintln!("{why}");
    std::process::exit(code);
}

/// Shows a started tree until its root ends (its events end there), then
/// prints the root's output.
async fn follow_tree(
    runtime: &Runtime,
    mut run: Run,
    show: Show,
    stored: bool,
    started: &Started,
) -> anyhow::Result<ExitCode> {
    let tree_id = &run.tree_id;
    let tree = tree_id.clone();
    let _ = started.0.set(tree.clone());
    if !show.quiet && !show.events {
        if stored {
            eprintln!("tree {tree_id} (if interrupted: arbor resume {tree_id})");
        } else {
            eprintln!("tree {tree_id}");
        }
    }
    let mut events = run.take_events();
    // Approval requests go from the printer to the approver, which decides
    // them one at a time (a person answers one question at once).
    let (asks, asked) = tokio::sync::mpsc::unbounded_channel();
    // On a terminal, the live view (issue 38): its keys, and the lines a
    // question's answer is typed on.
    let live = live_view(show);
    let (keys_tx, mut keys) = tokio::sync::mpsc::unbounded_channel();
    let (lines_tx, typed) = tokio::sync::mpsc::unbounded_channel();
    let input = match &live {
        Some(_) if std::io::stdin().is_terminal() => {
            super::live::Input::start(keys_tx, lines_tx).map(Arc::new)
        }
        _ => None,
    };
    let typed = input.as_ref().map(|_| typed);
    // Held back while a person is asked, so no progress line overwrites the question.
    let held = Held {
        live: live.clone().map(|view| (view, input.clone())),
        ..Held::default()
    };
    let printing = held.clone();
    let viewing = live.clone();
    let printer = tokio::spawn(async move {
        let mut renderer = if stored {
            TreeRenderer::default()
        } else {
            TreeRenderer::unstored()
        };
        while let Some(event) = events.recv().await {
            if let EventKind::ApprovalRequested {
                tool_call_id,
                tool,
                input,
                ..
            } = &event.kind
            {
                let _ = asks.send(Ask {
                    tree_id: event.tree_id.clone(),
                    run_id: event.run_id.clone(),
                    call_id: tool_call_id.clone(),
                    tool: tool.clone(),
                    input: input.clone(),
                });
            }
            if show.events {
                if let Ok(line) = serde_json::to_string(&*event) {
                    printing.print(line);
                }
            } else if let Some(view) = &viewing {
                // The live area shows who started; the log keeps the rest.
                let line = renderer.line(&event);
                let mut view = lock(view);
                view.tree.apply(&event);
                if let Some(line) = line
                    && !matches!(event.kind, EventKind::AgentStarted { .. })
                {
                    view.log(line);
                }
            } else if !show.quiet
                && let Some(line) = renderer.line(&event)
            {
                printing.print(line);
            }
        }
    });
    let approver = async {
        approve(runtime.supervisor(), asked, &held, typed).await;
        std::future::pending::<std::convert::Infallible>().await
    };
    // Frames ten times a second, and at once after a key.
    let drawer = async {
        let Some(view) = &live else {
            return std::future::pending().await;
        };
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                Some(key) = keys.recv() => {
                    let cancel = lock(view).tree.on_key(key);
                    if let Some(run) = cancel {
                        cancel_from_view(runtime.supervisor(), &tree, run, view);
                    }
                }
            }
            lock(view).draw(now_ms());
        }
    };
    // What `arbor cancel`, `arbor budget` (or a server) post for this
    // stored tree, taken while it runs; what is not for this command is
    // posted back once it ends.
    let aside = std::sync::Mutex::new(Vec::new());
    let controls = async {
        if stored {
            super::control::take_controls(runtime.supervisor(), &tree, &aside).await
        } else {
            std::future::pending().await
        }
    };
    // The approver and the control loop never end on their own; they are
    // dropped with the tree.
    let result = tokio::select! {
        result = run.result() => result?,
        never = approver => match never {},
        never = controls => match never {},
        never = drawer => match never {},
    };
    let _ = printer.await;
    if let Some(view) = &live {
        lock(view).finish();
    }
    // The terminal back in line mode before anything else is printed.
    drop(held);
    drop(input);
    let aside = std::mem::take(&mut *aside.lock().unwrap_or_else(|e| e.into_inner()));
    super::control::post_back(runtime.supervisor(), &tree, aside).await;
    runtime.supervisor().flush().await?;
    show_result(&result.state, show)
}

/// Prints a root's final state as `run` does (its output, or with --json the
/// state); exit code 1 unless it completed.
fn show_result(state: &arbor_actors::AgentState, show: Show) -> anyhow::Result<ExitCode> {
    let completed = state.status == AgentStatus::Completed;
    if show.json {
        outln!("{}", serde_json::to_string_pretty(&state_json(state)?)?)?;
    } else if completed {
        outln!("{}", final_text(state))?;
    } else if show.quiet || show.events {
        // The tree's last line says why when it is shown; this is the only place otherwise.
        eprintln!(
            "error: the root agent (run {}) {}: {}",
            state.run_id,
            state.status.as_str(),
            state.error_message().unwrap_or("no detail")
        );
    }
    Ok(if completed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Waits for a turn `--continue` queued behind a running one: says so
/// (for `interrupt`, the supervisor has cancelled the running turn where it
/// runs), then waits until this process takes the turn or another one has
/// run it.
async fn wait_queued(
    runtime: &Runtime,
    queued: arbor_supervisor::Queued,
    show: Show,
    started: &Started,
) -> anyhow::Result<Waited> {
    let turn = &queued.turn;
    *started.1.lock().unwrap_or_else(|e| e.into_inner()) =
        Some((turn.id, turn.tree_id.clone(), turn.turn));
    if !show.quiet {
        eprintln!(
            "turn {} of tree {} queued as {} (place {} in line): it starts when the turns before it end",
            turn.turn,
            turn.tree_id,
            turn.run_id(),
            turn.position
        );
    }
    let waited = runtime.wait_queued(turn).await?;
    // Started (or run elsewhere): no longer in the queue.
    *started.1.lock().unwrap_or_else(|e| e.into_inner()) = None;
    Ok(waited)
}

/// A tool call of the tree that waits for a decision (semantics §12).
struct Ask {
    tree_id: TreeId,
    run_id: RunId,
    call_id: String,
    tool: String,
    input: serde_json::Value,
}

/// Why `arbor run` denies every call that needs approval when no one can answer.
const NO_TERMINAL: &str =
    "no one to approve it: arbor run has no terminal (run it in arbor serve and use arbor approve)";

/// Decides the tree's approval requests as they come: asks at the terminal
/// when stdin is one, else denies each at once (a run never waits for nobody).
async fn approve(
    supervisor: &Supervisor,
    mut asked: tokio::sync::mpsc::UnboundedReceiver<Ask>,
    held: &Held,
    typed: Option<tokio::sync::mpsc::UnboundedReceiver<String>>,
) {
    let terminal = std::io::stdin().is_terminal();
    // The live view's input reads the terminal; without it, a thread does.
    let mut lines = typed;
    while let Some(ask) = asked.recv().await {
        // Decided meanwhile (or by a recorded decision): nothing to ask.
        let waiting = supervisor
            .approvals(Some(&ask.tree_id))
            .iter()
            .any(|p| p.tool_call_id == ask.call_id);
        if !waiting {
            continue;
        }
        if !terminal {
            eprintln!(
                "warning: {} call {} of run {} needs approval; denied: {NO_TERMINAL}",
                ask.tool, ask.call_id, ask.run_id
            );
            let deny = Decision::Deny {
                reason: NO_TERMINAL.to_owned(),
            };
            if let Err(e) = supervisor.decide(&ask.tree_id, &ask.call_id, deny).await {
                eprintln!("warning: {e}");
            }
            continue;
        }
        let lines = lines.get_or_insert_with(stdin_lines);
        held.hold();
        ask_at_terminal(supervisor, &ask, lines).await;
        held.release();
    }
}

/// The progress lines `arbor run` prints on stderr, held back while a person
/// is asked about a call (so that none overwrites the question) and printed
/// once they have answered; at most [`HELD_LINES`] of them, then a count.
#[derive(Clone, Default)]
struct Held {
    waiting: Arc<std::sync::Mutex<Option<Waiting>>>,
    /// The live view, paused while a question is up, and the input that
    /// reads the answer's line then.
    live: Option<(SharedView, Option<Arc<super::live::Input>>)>,
}

/// The live view, shared by the printer, the drawer and the questions.
type SharedView = Arc<std::sync::Mutex<LiveView>>;

/// The lines held back, and how many more were dropped past [`HELD_LINES`].
type Waiting = (Vec<String>, usize);

/// The most progress lines held back while a person is asked.
const HELD_LINES: usize = 10_000;

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prints `line` now, or keeps it while a question is up.
    fn print(&self, line: String) {
        match &mut *self.lock() {
            Some((lines, dropped)) if lines.len() >= HELD_LINES => *dropped += 1,
            Some((lines, _)) => lines.push(line),
            None => eprintln!("{line}"),
        }
    }

    /// A question is up: lines wait.
    fn hold(&self) {
        if let Some((view, input)) = &self.live {
            lock(view).pause();
            if let Some(input) = input {
                input.ask(true);
            }
        }
        *self.lock() = Some((Vec::new(), 0));
    }

    /// The question is answered: the lines that waited, then print as they come.
    fn release(&self) {
        if let Some((view, input)) = &self.live {
            if let Some(input) = input {
                input.ask(false);
            }
            lock(view).resume();
        }
        let Some((lines, dropped)) = self.lock().take() else {
            return;
        };
        for line in lines {
            eprintln!("{line}");
        }
        if dropped > 0 {
            eprintln!("… {dropped} more lines while the question was up, not shown");
        }
    }
}

/// Asks the person at the terminal about one call until a decision is taken
/// (an edited input the tool refuses is asked for again).
async fn ask_at_terminal(
    supervisor: &Supervisor,
    ask: &Ask,
    lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let input = serde_json::to_string_pretty(&ask.input).unwrap_or_default();
    eprintln!(
        "\napproval needed: run {} wants to call {} (call {}) with\n{input}",
        ask.run_id, ask.tool, ask.call_id
    );
    loop {
        eprint!(
            "approve? [y]es / [a]lways (every {} call in this tree) / [n]o / [e]dit input: ",
            ask.tool
        );
        let Some(answer) = lines.recv().await else {
            eprintln!();
            let reason = "no answer: stdin closed";
            eprintln!("warning: call {} denied: {reason}", ask.call_id);
            let deny = Decision::Deny {
                reason: reason.to_owned(),
            };
            if let Err(e) = supervisor.decide(&ask.tree_id, &ask.call_id, deny).await {
                eprintln!("warning: {e}");
            }
            return;
        };
        let decision = match answer.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => Decision::Approve { input: None },
            "a" | "always" => {
                // Its other waiting calls are approved with it; later ones
                // are not asked (the tree's progress lines say so).
                if let Err(e) = supervisor.approve_always(&ask.tree_id, &ask.call_id).await {
                    eprintln!("warning: {e}");
                }
                return;
            }
            "n" | "no" => Decision::Deny {
                reason: String::new(),
            },
            "e" | "edit" => {
                eprint!("input (one line of JSON): ");
                let Some(line) = lines.recv().await else {
                    continue;
                };
                match serde_json::from_str(&line) {
                    Ok(input) => Decision::Approve { input: Some(input) },
                    Err(e) => {
                        eprintln!("not valid JSON: {e}");
                        continue;
                    }
                }
            }
            _ => continue,
        };
        match supervisor
            .decide(&ask.tree_id, &ask.call_id, decision)
            .await
        {
            Ok(()) => return,
            Err(arbor_supervisor::Error::DecisionRefused {
                reason: DecideRefused::InvalidInput(why),
                ..
            }) => eprintln!("the tool refuses that input: {why}"),
            Err(e) => {
                eprintln!("warning: {e}");
                return;
            }
        }
    }
}

/// Stdin's lines, read on a thread of their own (never on the async
/// runtime); the channel closes at end of input. A plain thread, not a
/// blocking task, so a read still waiting when the tree ends holds nothing up.
fn stdin_lines() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// The live view when this command draws one: on a terminal (stderr),
/// unless the tree is not shown, shown as events, or `--plain` (or
/// `TERM=dumb`) asks for the line log.
fn live_view(show: Show) -> Option<SharedView> {
    let dumb = std::env::var("TERM").is_ok_and(|t| t == "dumb");
    (!show.quiet && !show.events && !show.plain && !dumb && std::io::stderr().is_terminal())
        .then(|| Arc::new(std::sync::Mutex::new(LiveView::new())))
}

/// Cancels `run` from the view (the whole tree when it is a root), and
/// logs what happened.
fn cancel_from_view(
    supervisor: &Supervisor,
    tree: &TreeId,
    run: RunId,
    view: &std::sync::Mutex<LiveView>,
) {
    let said = if run.parent().is_none() {
        if supervisor.cancel_tree(tree) {
            format!("○ tree {tree} cancelled from the view")
        } else {
            format!("warning: tree {tree} is not running here")
        }
    } else {
        match supervisor.cancel_run(&run) {
            Ok(()) => format!("○ {run} cancelled from the view"),
            Err(e) => format!("warning: cannot cancel {run}: {e}"),
        }
    };
    lock(view).log(said);
}
