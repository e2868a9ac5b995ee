//! `arbor watch TREE|RUN` (issue 38): the live view of a tree this process
//! does not run. One that an `arbor serve` runs is followed on its event
//! stream (with the model's streamed text), reconnecting with
//! `Last-Event-ID` when the connection drops or the server restarts, so
//! nothing is shown twice or missed; one that another process on the same
//! store runs (`arbor run`, a replica) is followed on its journal as it
//! grows. On a terminal it is the view `arbor run` draws (keys included:
//! `c` cancels the selected run); off one, or with `--plain`, the line log
//! and its `Finished` line.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use arbor_actors::{AgentStatus, RunId, TreeId};
use arbor_supervisor::Target;
use arbor_supervisor::store::{EventType, JournalEntry};
use serde_json::{Map, Value};

use super::args::{ServerArgs, Stored};
use super::live::{Input, LiveTree, LiveView, lock};
use super::now_ms;
use super::render::clip;
use super::service::Api;

/// How often the journal is read for a tree followed on the store.
const POLL: Duration = Duration::from_millis(200);
/// A stream that sends nothing for this long (the server's keep-alives
/// included, every 15 s at most) is taken for lost, and opened again.
const QUIET: Duration = Duration::from_secs(45);
/// The longest wait between two attempts to reach the server again.
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How long the server may stay unreachable before `watch` gives up.
const GIVE_UP: Duration = Duration::from_secs(120);

/// The view or the line log, and the tree both are drawn from.
struct Watcher {
    /// On a terminal: the live view (its tree is the one kept).
    view: Option<Arc<Mutex<LiveView>>>,
    /// Off a terminal: the tree, for the log's lines and the summary.
    tree: LiveTree,
    tree_id: TreeId,
    /// The run whose end ends the watch (`None`: the tree's status does).
    run: Option<RunId>,
    /// How the watched run ended, once it has.
    ended: Option<AgentStatus>,
    /// When the last event happened (the summary's end).
    last_ms: u64,
    /// Whether the tree was last seen with no process running it.
    orphaned: bool,
}

impl Watcher {
    fn new(tree_id: TreeId, run: Option<RunId>, plain: bool) -> Watcher {
        let dumb = std::env::var("TERM").is_ok_and(|t| t == "dumb");
        let view = (!plain && !dumb && std::io::stderr().is_terminal())
            .then(|| Arc::new(Mutex::new(LiveView::new())));
        Watcher {
            view,
            tree: LiveTree::default(),
            tree_id,
            run,
            ended: None,
            last_ms: 0,
            orphaned: false,
        }
    }

    fn with_tree<R>(&mut self, f: impl FnOnce(&mut LiveTree) -> R) -> R {
        match &self.view {
            Some(view) => f(&mut lock(view).tree),
            None => f(&mut self.tree),
        }
    }

    /// Whether an entry's run is watched (the run's subtree, or the tree).
    fn in_scope(&self, run: &RunId) -> bool {
        self.run
            .as_ref()
            .is_none_or(|watched| run.is_within(watched))
    }

    /// Takes one journal entry; true once the watched run has ended.
    fn take(&mut self, entry: &JournalEntry) -> bool {
        let Ok(run) = entry.run_id.parse::<RunId>() else {
            return false;
        };
        if !self.in_scope(&run) {
            return false;
        }
        self.last_ms = self.last_ms.max(entry.at_ms);
        let line = self.with_tree(|tree| {
            // A run started again (its tree resumed after a crash): said
            // so, not shown as a new start.
            let again = entry.kind == EventType::AgentStarted && tree.knows(&run);
            tree.apply_entry(entry);
            if again {
                return Some(format!("  ↻ {} resumed", run.path_text()));
            }
            line_for(tree, &run, entry)
        });
        if let Some(line) = line {
            match &self.view {
                // The live area shows who started; the log keeps the rest.
                Some(view) if entry.kind != EventType::AgentStarted => lock(view).log(line),
                Some(_) => {}
                None => eprintln!("{line}"),
            }
        }
        if self.run.as_ref() == Some(&run) && entry.is_final() {
            self.ended = self.with_tree(|tree| tree.ended(&run));
            return true;
        }
        false
    }

    /// A piece of a run's reply, from a server's stream.
    fn streamed(&mut self, data: &Map<String, Value>) {
        let Some(run) = data
            .get("runId")
            .and_then(Value::as_str)
            .and_then(|r| r.parse::<RunId>().ok())
        else {
            return;
        };
        let text = data
            .get("delta")
            .and_then(|d| d.get("text"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        if self.in_scope(&run) {
            self.with_tree(|tree| tree.apply_streamed(&run, text));
        }
    }

    /// Says once that the tree is interrupted, no process running it (`how`:
    /// what goes on with it), and once that it runs again when it is taken
    /// up.
    fn interrupted(&mut self, interrupted: bool, how: &str) {
        let tree_id = &self.tree_id;
        if interrupted && !self.orphaned {
            self.say(format!(
                "  ⏸ tree {tree_id} is interrupted: no process runs it; {how} (Ctrl-C stops watching)"
            ));
        } else if !interrupted && self.orphaned {
            self.say(format!("  ↻ tree {tree_id} runs again"));
        }
        self.orphaned = interrupted;
    }

    /// A line for the log (above the view, or alone off a terminal).
    fn say(&self, line: String) {
        match &self.view {
            Some(view) => lock(view).log(line),
            None => eprintln!("{line}"),
        }
    }

    /// The end: the view goes, the summary stays; the exit code is how the
    /// watched run (or the tree) ended.
    fn finish(mut self, tree_ended: Option<bool>) -> ExitCode {
        if let Some(view) = &self.view {
            lock(view).finish();
        }
        let (tree_id, last) = (self.tree_id.clone(), self.last_ms);
        let summary = self.with_tree(|tree| tree.summary(&tree_id, last));
        eprintln!("{summary}");
        let completed = match (self.ended, tree_ended) {
            (Some(status), _) => status == AgentStatus::Completed,
            (None, Some(completed)) => completed,
            (None, None) => false,
        };
        if completed {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}

/// The log line for an entry, as `arbor run`'s line log has it: every line
/// names its run (and a child's its parent), so it reads right in any order.
fn line_for(tree: &LiveTree, run: &RunId, entry: &JournalEntry) -> Option<String> {
    let text = |field: &str| entry.get(field).and_then(Value::as_str);
    let path = run.path_text();
    match entry.kind {
        EventType::AgentStarted => {
            let agent = text("agentType").unwrap_or("agent");
            let depth = entry.get("depth").and_then(Value::as_u64).unwrap_or(0);
            Some(
                match text("parentRunId").and_then(|p| p.parse::<RunId>().ok()) {
                    Some(parent) if depth > 0 => format!(
                        "{}▸ {agent} {path} (parent {})",
                        "  ".repeat(
                            usize::try_from(depth.min(super::live::MAX_INDENT)).unwrap_or(0)
                        ),
                        parent.path_text()
                    ),
                    _ => format!("▸ {agent} {run} (tree {})", run.tree()),
                },
            )
        }
        EventType::AgentFinished | EventType::AgentCancelled => tree.ended_line(run, None),
        EventType::AgentFailed => tree.ended_line(run, text("error")),
        EventType::ApprovalRequested => Some(format!(
            "  ? {path} waits for approval: {} (call {}; arbor approve|deny)",
            text("tool").unwrap_or("a tool"),
            text("toolCallId").unwrap_or("?")
        )),
        EventType::BudgetReached => Some(format!(
            "  ‖ {path} paused: its budget is spent (arbor budget {} raises it)",
            run.tree()
        )),
        EventType::Steered => Some(format!(
            "  » {path} told: {}",
            clip(text("text").unwrap_or_default(), 61)
        )),
        _ => None,
    }
}

/// What the keys asked for: a run to cancel.
type Cancels = tokio::sync::mpsc::UnboundedSender<RunId>;

/// Draws the view ten times a second (and at once after a key) and reads
/// the keys; never ends on its own. Off a terminal, waits forever.
async fn draw(view: Option<Arc<Mutex<LiveView>>>, cancels: Cancels) -> std::convert::Infallible {
    let Some(view) = view else {
        return std::future::pending().await;
    };
    let (keys_tx, mut keys) = tokio::sync::mpsc::unbounded_channel();
    let (lines_tx, _lines) = tokio::sync::mpsc::unbounded_channel();
    let _input = std::io::stdin()
        .is_terminal()
        .then(|| Input::start(keys_tx, lines_tx))
        .flatten();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            Some(key) = keys.recv() => {
                if let Some(run) = lock(&view).tree.on_key(key) {
                    let _ = cancels.send(run);
                }
            }
        }
        lock(&view).draw(now_ms());
    }
}

/// `arbor watch ID`: through the server `--server`/`$ARBOR_SERVER` names
/// (or `--token` is given for), else on the store.
pub(super) fn watch(
    id: &str,
    plain: bool,
    server: ServerArgs,
    at: Stored,
) -> anyhow::Result<ExitCode> {
    let target = super::target_arg(id)?;
    let (tree_id, run) = match &target {
        Target::Tree(tree) => (tree.clone(), None),
        Target::Run(run) => (run.tree().clone(), Some(run.clone())),
    };
    if server.given() {
        let api = Api::new(server)?;
        return super::async_runtime()?.block_on(on_server(&api, tree_id, run, plain));
    }
    let (tokio, runtime) = super::control::store_runtime(at)?;
    tokio.block_on(on_store(&runtime, &target, tree_id, run, plain))
}

/// Follows the tree's journal in the store until the watched run ends (or,
/// for a tree, until the store lists it as ended and every event is read).
async fn on_store(
    runtime: &arbor::Runtime,
    target: &Target,
    tree_id: TreeId,
    run: Option<RunId>,
    plain: bool,
) -> anyhow::Result<ExitCode> {
    let supervisor = runtime.supervisor();
    let mut watcher = Watcher::new(tree_id.clone(), run, plain);
    let (cancels, mut cancelled) = tokio::sync::mpsc::unbounded_channel();
    let drawer = draw(watcher.view.clone(), cancels);
    let follow = async {
        let mut after = 0;
        loop {
            // The status first: a tree it lists as ended has every event
            // stored, so the read after it is the last.
            let tree = tree_id.clone();
            let status = supervisor
                .read_store_now(move |store| store.status(&tree))
                .await?;
            let tree = tree_id.clone();
            let entries = supervisor
                .read_store_now(move |store| store.events(&tree, after))
                .await?;
            for entry in &entries {
                after = after.max(entry.seq);
                if watcher.take(entry) {
                    return anyhow::Ok(None);
                }
            }
            if status.is_final() {
                return Ok(Some(status == arbor_supervisor::TreeStatus::Completed));
            }
            // Nobody runs it now: say so (and what goes on with it), and
            // keep following for the process that takes it up.
            watcher.interrupted(
                status == arbor_supervisor::TreeStatus::Interrupted,
                &format!(
                    "`arbor resume {tree_id}` (or an `arbor serve` on this store) goes on with it; \
                     waiting for one"
                ),
            );
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                Some(run) = cancelled.recv() => {
                    let target = if run.parent().is_none() && target.tree() == run.tree() {
                        Target::Tree(run.tree().clone())
                    } else {
                        Target::Run(run)
                    };
                    let said = match supervisor.cancel_stored(&target).await {
                        Ok(_) => format!("○ cancel of {target} sent from the view"),
                        Err(e) => format!("warning: cannot cancel {target}: {e}"),
                    };
                    watcher.say(said);
                }
            }
        }
    };
    let ended = tokio::select! {
        ended = follow => ended?,
        never = drawer => match never {},
    };
    Ok(watcher.finish(ended))
}

/// One server-sent event: its id (none for a `modelDelta`), type and data.
struct Sent {
    id: Option<u64>,
    event: String,
    data: String,
}

/// The most a stream may send without ending an event before it is taken
/// for broken (and opened again).
const MAX_EVENT: usize = 16 << 20;

/// Splits complete events off the front of `buffer` (bytes: a character
/// may be split across two reads; a whole event is whole text).
fn sent_events(buffer: &mut Vec<u8>) -> Vec<Sent> {
    let mut out = Vec::new();
    while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
        let bytes: Vec<u8> = buffer.drain(..end + 2).collect();
        let block = String::from_utf8_lossy(&bytes);
        let mut sent = Sent {
            id: None,
            event: String::new(),
            data: String::new(),
        };
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id:") {
                sent.id = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("event:") {
                sent.event = v.trim().to_owned();
            } else if let Some(v) = line.strip_prefix("data:") {
                sent.data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if !sent.data.is_empty() {
            out.push(sent);
        }
    }
    out
}

/// How one connection to the stream ended.
enum Connection {
    /// The watched run's final event came.
    Ended,
    /// The stream closed, or went quiet, before it: ask again.
    Closed,
}

/// Follows the run's stream on the server (the root's for a tree), opened
/// again after `last` whenever it drops, until the run's final event, or
/// until the server says the tree is no longer running.
async fn on_server(
    api: &Api,
    tree_id: TreeId,
    run: Option<RunId>,
    plain: bool,
) -> anyhow::Result<ExitCode> {
    let root = match &run {
        Some(run) => run.clone(),
        None => root_of(api, &tree_id).await?,
    };
    let mut watcher = Watcher::new(tree_id.clone(), Some(root.clone()), plain);
    let (cancels, mut cancelled) = tokio::sync::mpsc::unbounded_channel();
    let drawer = draw(watcher.view.clone(), cancels);
    let follow = async {
        let mut last = 0;
        let mut since_ok = tokio::time::Instant::now();
        let mut failures = 0u32;
        loop {
            let opened = api.open_stream(&root.to_string(), last).await;
            let connection = match opened {
                Ok(response) => {
                    if failures > 0 {
                        watcher.say(format!(
                            "  ↻ reconnected to {} after event {last}",
                            api.server
                        ));
                    }
                    failures = 0;
                    since_ok = tokio::time::Instant::now();
                    read_stream(response, &mut watcher, &mut last, &mut cancelled, api).await
                }
                Err(Refused::Final(e)) => return Err(e),
                Err(Refused::Retry(e)) => {
                    if since_ok.elapsed() > GIVE_UP {
                        return Err(e.context(format!(
                            "gave up following {root} after {}s",
                            GIVE_UP.as_secs()
                        )));
                    }
                    if failures == 1 {
                        watcher.say(format!("  ↻ {e:#}; trying again…"));
                    }
                    Connection::Closed
                }
            };
            if let Connection::Ended = connection {
                return anyhow::Ok(None);
            }
            if failures == 0 {
                watcher.say(format!(
                    "  ↻ the stream from {} closed after event {last}; reconnecting…",
                    api.server
                ));
            }
            // Closed before the run's end: does the tree still run?
            if let Ok((status, body)) = api
                .send(
                    reqwest::Method::GET,
                    &["v1", "trees", tree_id.as_str()],
                    None,
                )
                .await
                && status.is_success()
                && let Some(state) = body["tree"]["status"].as_str()
            {
                if state != "running" && state != "interrupted" {
                    return Ok(Some(state == "completed"));
                }
                // Nobody runs it now (a server adopts it when it can): said
                // once, and followed again when it is taken up.
                watcher.interrupted(
                    state == "interrupted",
                    &format!("waiting for the server to adopt it, or `arbor resume {tree_id}`"),
                );
            }
            failures += 1;
            let wait = Duration::from_millis(250 * u64::from(failures.min(20))).min(RETRY_MAX);
            tokio::time::sleep(wait).await;
        }
    };
    let ended = tokio::select! {
        ended = follow => ended?,
        never = drawer => match never {},
    };
    Ok(watcher.finish(ended))
}

/// Reads one connection's events into the watcher; cancels asked for from
/// the view are sent meanwhile.
async fn read_stream(
    response: reqwest::Response,
    watcher: &mut Watcher,
    last: &mut u64,
    cancelled: &mut tokio::sync::mpsc::UnboundedReceiver<RunId>,
    api: &Api,
) -> Connection {
    use futures::StreamExt as _;
    let mut body = response.bytes_stream();
    let mut buffer = Vec::new();
    loop {
        let chunk = tokio::select! {
            chunk = tokio::time::timeout(QUIET, body.next()) => chunk,
            Some(run) = cancelled.recv() => {
                let said = match api
                    .send(reqwest::Method::POST, &["v1", "runs", &run.to_string(), "cancel"], None)
                    .await
                {
                    Ok((status, _)) if status.is_success() => format!("○ {run} cancelled from the view"),
                    Ok((status, body)) => format!("warning: cannot cancel {run}: {}", api.refusal(status, &body)),
                    Err(e) => format!("warning: cannot cancel {run}: {e:#}"),
                };
                watcher.say(said);
                continue;
            }
        };
        let Ok(Some(Ok(bytes))) = chunk else {
            return Connection::Closed;
        };
        buffer.extend_from_slice(&bytes);
        let sent = sent_events(&mut buffer);
        if buffer.len() > MAX_EVENT {
            return Connection::Closed;
        }
        for sent in sent {
            let Ok(Value::Object(data)) = serde_json::from_str::<Value>(&sent.data) else {
                continue;
            };
            if sent.event == "modelDelta" {
                watcher.streamed(&data);
                continue;
            }
            let Some(entry) = JournalEntry::from_stream(data) else {
                continue;
            };
            // Sent again after a reconnect: shown once.
            if sent.id.is_some_and(|id| id <= *last) {
                continue;
            }
            *last = entry.seq;
            if watcher.take(&entry) {
                return Connection::Ended;
            }
        }
    }
}

/// Why a stream could not be opened.
pub(super) enum Refused {
    /// For good (an unknown run, a refused token): said and the watch ends.
    Final(anyhow::Error),
    /// For now (no answer, a restart, too many streams): tried again.
    Retry(anyhow::Error),
}

/// The root run of a tree's latest turn, as the server has it.
async fn root_of(api: &Api, tree_id: &TreeId) -> anyhow::Result<RunId> {
    let (status, body) = api
        .send(
            reqwest::Method::GET,
            &["v1", "trees", tree_id.as_str()],
            None,
        )
        .await?;
    if !status.is_success() {
        anyhow::bail!(
            "cannot watch tree {tree_id}: the server refused ({status}): {}",
            api.refusal(status, &body)
        );
    }
    let root = body["tree"]["rootRunId"]
        .as_str()
        .map_or_else(|| format!("{tree_id}/0"), str::to_owned);
    root.parse()
        .with_context(|| format!("the server named {root:?} as tree {tree_id}'s root"))
}

#[cfg(test)]
mod tests {
    use super::sent_events;

    /// A character split between two reads of the stream arrives whole, and
    /// an event without an id (a `modelDelta`) is kept.
    #[test]
    fn a_character_split_across_two_reads_arrives_whole() {
        let event = "event: modelDelta\ndata: {\"text\":\"é\"}\n\n".as_bytes();
        let split = event.iter().position(|b| *b >= 0x80).unwrap() + 1;
        let mut buffer = event[..split].to_vec();
        assert!(sent_events(&mut buffer).is_empty());
        buffer.extend_from_slice(&event[split..]);
        let sent = sent_events(&mut buffer);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].id, None);
        assert_eq!(sent[0].event, "modelDelta");
        assert_eq!(sent[0].data, "{\"text\":\"é\"}");
        assert!(buffer.is_empty());
    }
}
