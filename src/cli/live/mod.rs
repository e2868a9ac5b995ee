//! The live tree `arbor run` and `arbor resume` draw on a terminal (issue
//! 38): one line per live agent saying what it is doing now, finished
//! subtrees folded to one line, a footer with the tree's totals. This
//! module is the pure part: [`LiveTree`] takes the tree's events and
//! renders lines for a width and a moment, with no I/O, so every case is
//! unit-tested; `draw.rs` puts the lines on the terminal and reads keys.
//!
//! The terminal is drawn by hand (cursor up, clear, lines cut to the
//! width), not with a TUI framework: the view is an inline area under the
//! scrolling log, a few dozen lines of escape codes, and `console` (already
//! here for the load test's bar) measures and cuts text that holds wide
//! characters and colours.

mod draw;
mod seen;

pub(super) use draw::{Input, Key, Screen};

/// The deepest indent a line gets (a journal or a server may say anything).
pub(super) const MAX_INDENT: u64 = 64;
use seen::Seen;

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use arbor_actors::{AgentStatus, Event, RunId, TreeId};
use arbor_supervisor::store::JournalEntry;

use super::runs::count;

/// What an agent is doing now.
#[derive(Clone, Debug, PartialEq)]
enum Doing {
    /// Started, before its first step.
    Starting,
    /// Waiting on the model for step `step`; `streamed` characters of its
    /// reply have arrived (when the stream sends deltas), the last of them
    /// in `tail`.
    Model {
        step: u32,
        streamed: u64,
        tail: String,
    },
    /// Asked again after a failed model call.
    Retrying { attempt: u32, reason: String },
    /// Running the tools of the last reply, `left` of them not done.
    Tools { names: Vec<String>, left: usize },
    /// Given its slot back while its children run.
    Children,
    /// A call waits for a person's decision.
    Approval { tool: String },
    /// Paused on a spent budget.
    Budget { limit: String },
    /// Ended.
    Ended(AgentStatus),
}

/// One run of the tree.
#[derive(Debug)]
struct Node {
    agent_type: String,
    depth: usize,
    /// Its parent in the view (`None` for a line at the top).
    parent: Option<RunId>,
    children: Vec<RunId>,
    started_ms: u64,
    /// When it began what it is doing now.
    since_ms: u64,
    ended_ms: Option<u64>,
    doing: Doing,
    tokens: u64,
    cost: f64,
    /// Its subtree's totals, itself included, kept as events arrive.
    below: Totals,
}

/// The tree as its events tell it, for the live view.
#[derive(Debug, Default)]
pub struct LiveTree {
    nodes: HashMap<RunId, Node>,
    /// The runs with no parent in the view (a tree's root, each turn's).
    roots: Vec<RunId>,
    started_ms: Option<u64>,
    /// Finished runs whose subtree is shown unfolded.
    expanded: HashSet<RunId>,
    /// The line the keys act on.
    selected: Option<RunId>,
    /// Every run's totals, for the footer.
    all: Totals,
}

/// A subtree's totals.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    agents: usize,
    running: usize,
    completed: usize,
    failed: usize,
    cancelled: usize,
    tokens: u64,
    cost: f64,
}

impl Totals {
    fn add(&mut self, o: &Totals) {
        self.agents += o.agents;
        self.running += o.running;
        self.completed += o.completed;
        self.failed += o.failed;
        self.cancelled += o.cancelled;
        self.tokens += o.tokens;
        self.cost += o.cost;
    }

    fn take(&mut self, o: &Totals) {
        self.agents = self.agents.saturating_sub(o.agents);
        self.running = self.running.saturating_sub(o.running);
    }
}

impl LiveTree {
    /// Takes one event of the tree.
    pub fn apply(&mut self, event: &Event) {
        self.take(&event.run_id, event.at_ms, Seen::of_event(&event.kind));
    }

    /// Takes one journal entry of the tree (`arbor watch`); an entry whose
    /// run id does not parse is left out.
    pub fn apply_entry(&mut self, entry: &JournalEntry) {
        if let Ok(run) = entry.run_id.parse::<RunId>() {
            self.take(&run, entry.at_ms, Seen::of_entry(entry));
        }
    }

    fn take(&mut self, run: &RunId, at: u64, seen: Seen) {
        let Some(node) = self.nodes.get_mut(run) else {
            if let Seen::Started {
                agent_type,
                parent,
                depth,
            } = seen
            {
                self.start(run, at, agent_type, parent, depth);
            }
            return;
        };
        let doing = match seen {
            Seen::Step(step) => Doing::Model {
                step,
                streamed: 0,
                tail: String::new(),
            },
            Seen::Streamed(text) => {
                if let Doing::Model { streamed, tail, .. } = &mut node.doing {
                    *streamed += text.chars().count() as u64;
                    keep_tail(tail, &text);
                }
                return;
            }
            Seen::Retrying { attempt, reason } => Doing::Retrying { attempt, reason },
            Seen::Responded {
                tokens,
                cost,
                calls,
                tools,
            } => {
                node.tokens += tokens;
                node.cost += cost;
                if calls > 0 {
                    node.doing = Doing::Tools {
                        names: tools,
                        left: calls,
                    };
                    node.since_ms = at;
                }
                let used = Totals {
                    tokens,
                    cost,
                    ..Totals::default()
                };
                self.add_up(run, &used, &Totals::default());
                return;
            }
            Seen::ToolDone => {
                if let Doing::Tools { left, .. } = &mut node.doing {
                    *left = left.saturating_sub(1);
                }
                return;
            }
            Seen::Suspended => Doing::Children,
            Seen::Approval(tool) => Doing::Approval { tool },
            Seen::Budget(limit) => Doing::Budget { limit },
            Seen::Ended(status) => {
                if node.ended_ms.is_some() {
                    // Ended already (an entry read twice): counted once.
                    return;
                }
                node.ended_ms = Some(at);
                node.doing = Doing::Ended(status);
                node.since_ms = at;
                let mut ended = Totals::default();
                match status {
                    AgentStatus::Completed => ended.completed = 1,
                    AgentStatus::Failed => ended.failed = 1,
                    _ => ended.cancelled = 1,
                }
                let running = Totals {
                    running: 1,
                    ..Totals::default()
                };
                self.add_up(run, &ended, &running);
                return;
            }
            // Started again (its tree resumed after a crash): what it was
            // doing then is over; it starts again from its checkpoint.
            Seen::Started { .. } if node.ended_ms.is_none() => Doing::Starting,
            Seen::Started { .. } | Seen::Other => return,
        };
        // A decided approval or a raised budget goes on as the next event
        // says; until then the line keeps its last words.
        node.doing = doing;
        node.since_ms = at;
    }

    fn start(
        &mut self,
        run: &RunId,
        at: u64,
        agent_type: String,
        parent: Option<RunId>,
        depth: usize,
    ) {
        if self.nodes.contains_key(run) {
            return;
        }
        self.started_ms.get_or_insert(at);
        let parent = parent.filter(|p| self.nodes.contains_key(p));
        match &parent {
            Some(p) => {
                if let Some(node) = self.nodes.get_mut(p) {
                    node.children.push(run.clone());
                }
            }
            None => self.roots.push(run.clone()),
        }
        self.nodes.insert(
            run.clone(),
            Node {
                agent_type,
                depth,
                parent,
                children: Vec::new(),
                started_ms: at,
                since_ms: at,
                ended_ms: None,
                doing: Doing::Starting,
                tokens: 0,
                cost: 0.0,
                below: Totals::default(),
            },
        );
        let one = Totals {
            agents: 1,
            running: 1,
            ..Totals::default()
        };
        self.add_up(run, &one, &Totals::default());
    }

    /// Adds `plus` to, and takes `minus` from, the totals of `run` and of
    /// every run above it: O(depth) an event, so a frame never sums a
    /// subtree.
    fn add_up(&mut self, run: &RunId, plus: &Totals, minus: &Totals) {
        let mut at = Some(run.clone());
        while let Some(id) = at {
            let Some(node) = self.nodes.get_mut(&id) else {
                break;
            };
            node.below.add(plus);
            node.below.take(minus);
            at = node.parent.clone();
        }
        // The tree's, for the footer.
        self.all.add(plus);
        self.all.take(minus);
    }

    /// A piece of `run`'s reply streamed in (a server's `modelDelta`, which
    /// no journal has).
    pub fn apply_streamed(&mut self, run: &RunId, text: &str) {
        self.take(run, 0, Seen::Streamed(text.to_owned()));
    }

    /// Whether `run` has started in the view.
    pub fn knows(&self, run: &RunId) -> bool {
        self.nodes.contains_key(run)
    }

    /// How `run` ended, once it has.
    pub fn ended(&self, run: &RunId) -> Option<AgentStatus> {
        match self.nodes.get(run)?.doing {
            Doing::Ended(status) => Some(status),
            _ => None,
        }
    }

    /// The log line of a run that has just ended, as `arbor run`'s line
    /// log has it (`error`: why it failed).
    pub fn ended_line(&self, run: &RunId, error: Option<&str>) -> Option<String> {
        let node = self.nodes.get(run)?;
        let Doing::Ended(status) = node.doing else {
            return None;
        };
        let (mark, what) = match status {
            AgentStatus::Completed => ("✓", "completed".to_owned()),
            AgentStatus::Failed => (
                "✗",
                format!("failed: {}", error.unwrap_or("no reason given")),
            ),
            _ => ("○", "cancelled".to_owned()),
        };
        let ms = node
            .ended_ms
            .unwrap_or(node.since_ms)
            .saturating_sub(node.started_ms);
        let children = node.children.len() as u64;
        Some(format!(
            "{}{mark} {} {} {what} in {ms}ms ({}, {})",
            "  ".repeat(node.depth),
            if node.agent_type.is_empty() {
                "agent"
            } else {
                &node.agent_type
            },
            run.path_text(),
            count(children, "child", "children"),
            count(node.tokens, "token", "tokens"),
        ))
    }

    /// The last line, as `arbor run`'s (cargo's `Finished`): how long the
    /// tree ran up to `end_ms`, its agents by how they ended, its tokens.
    pub fn summary(&self, tree: &TreeId, end_ms: u64) -> String {
        let t = &self.all;
        let ms = end_ms.saturating_sub(self.started_ms.unwrap_or(end_ms));
        format!(
            "Finished tree {tree} in {ms}ms: {} ({}), {} in all",
            count(
                (t.completed + t.failed + t.cancelled) as u64,
                "agent",
                "agents"
            ),
            ended_words(t),
            count(t.tokens, "token", "tokens"),
        )
    }

    /// The run the keys act on.
    pub fn selected(&self) -> Option<&RunId> {
        self.selected.as_ref()
    }

    /// Moves the selection `by` lines (up when negative) among the lines
    /// shown.
    pub fn select(&mut self, by: isize) {
        let shown = self.shown();
        if shown.is_empty() {
            return;
        }
        let at = self
            .selected
            .as_ref()
            .and_then(|s| shown.iter().position(|r| r == s));
        let next = match at {
            None => 0,
            Some(i) => i
                .saturating_add_signed(by)
                .min(shown.len().saturating_sub(1)),
        };
        self.selected = shown.get(next).cloned();
    }

    /// Unfolds the selected finished subtree, or folds it again.
    pub fn toggle(&mut self) {
        if let Some(run) = self.selected.clone()
            && !self.expanded.remove(&run)
        {
            self.expanded.insert(run);
        }
    }

    /// The runs shown, in the order of their lines.
    fn shown(&self) -> Vec<RunId> {
        let mut out = Vec::new();
        for root in &self.roots {
            self.walk(root, &mut out);
        }
        out
    }

    fn walk(&self, run: &RunId, out: &mut Vec<RunId>) {
        let Some(node) = self.nodes.get(run) else {
            return;
        };
        out.push(run.clone());
        if self.folded(run, node) {
            return;
        }
        for child in &node.children {
            self.walk(child, out);
        }
    }

    /// A subtree that has wholly ended is one line, unless unfolded.
    fn folded(&self, run: &RunId, node: &Node) -> bool {
        !node.children.is_empty() && !self.expanded.contains(run) && self.subtree_ended(node)
    }

    fn subtree_ended(&self, node: &Node) -> bool {
        node.below.running == 0
    }

    /// The view at `now_ms` for a terminal `width` columns wide and at most
    /// `height` lines tall: the tree's lines, then the footer. Lines are
    /// not cut here (the screen cuts them to its width, colours and wide
    /// characters counted); `width` decides how much a line says.
    pub fn render(&self, now_ms: u64, width: usize, height: usize, color: bool) -> Vec<String> {
        let shown = self.shown();
        let room = height.saturating_sub(2).max(1);
        let mut lines = Vec::new();
        // The lines around the selection when they do not all fit.
        let first = match self
            .selected
            .as_ref()
            .and_then(|s| shown.iter().position(|r| r == s))
        {
            Some(i) if shown.len() > room && i >= room => i + 1 - room,
            _ => 0,
        };
        let last = shown.len().min(first + room);
        for run in &shown[first..last] {
            if let Some(node) = self.nodes.get(run) {
                lines.push(self.line(run, node, now_ms, width, color));
            }
        }
        if shown.len() > last || first > 0 {
            lines.push(format!(
                "  … {} more line(s) (↑/↓ to scroll)",
                shown.len() - (last - first)
            ));
        }
        lines.push(self.footer(now_ms, width, color));
        lines
    }

    fn line(&self, run: &RunId, node: &Node, now_ms: u64, width: usize, color: bool) -> String {
        let mark = if self.selected.as_ref() == Some(run) {
            "›"
        } else {
            " "
        };
        let mut line = format!(
            "{mark}{}{} {} {}",
            "  ".repeat(node.depth),
            status_mark(&node.doing, color),
            node.agent_type,
            run.path_text()
        );
        if self.folded(run, node) {
            let t = node.below;
            let took = node
                .ended_ms
                .unwrap_or(now_ms)
                .saturating_sub(node.started_ms);
            let _ = write!(
                line,
                "  {} agents ({}), {}, {} ▸",
                t.agents,
                ended_words(&t),
                tokens_and_cost(t.tokens, t.cost),
                seconds(took)
            );
            return line;
        }
        let for_ms = now_ms.saturating_sub(node.since_ms);
        let what = match &node.doing {
            Doing::Starting => "starting".to_owned(),
            Doing::Model {
                step,
                streamed,
                tail,
            } if *streamed > 0 => {
                format!(
                    "model, step {step}, {}, writing: {}",
                    seconds(for_ms),
                    tail.trim()
                )
            }
            Doing::Model { step, .. } => format!("model, step {step}, {}", seconds(for_ms)),
            Doing::Retrying { attempt, reason } => {
                format!("retrying the model (attempt {attempt}): {reason}")
            }
            Doing::Tools { names, left } => {
                let names = if names.is_empty() {
                    "tools".to_owned()
                } else {
                    names.join(", ")
                };
                format!("running {names} ({left} left), {}", seconds(for_ms))
            }
            Doing::Children => {
                let live = node
                    .children
                    .iter()
                    .filter_map(|c| self.nodes.get(c))
                    .filter(|c| c.ended_ms.is_none())
                    .count();
                format!("waiting for {live} child(ren), {}", seconds(for_ms))
            }
            Doing::Approval { tool } => format!("waits for approval: {tool}"),
            Doing::Budget { limit } => format!("paused: {limit}"),
            Doing::Ended(status) => {
                let took = node
                    .ended_ms
                    .unwrap_or(now_ms)
                    .saturating_sub(node.started_ms);
                format!("{} in {}", status.as_str(), seconds(took))
            }
        };
        let _ = write!(line, "  {what}");
        // The numbers go last: on a narrow terminal they are what is cut.
        if width >= 60 {
            let _ = write!(line, " · {}", tokens_and_cost(node.tokens, node.cost));
        }
        line
    }

    /// The sticky last line: agents by state, the tree's tokens and cost,
    /// the time since the tree started, and the keys.
    fn footer(&self, now_ms: u64, width: usize, color: bool) -> String {
        let t = self.all;
        let elapsed = now_ms.saturating_sub(self.started_ms.unwrap_or(now_ms));
        let mut line = format!(
            "{} running · {} done · {} failed · {} cancelled │ {} │ {}",
            t.running,
            t.completed,
            t.failed,
            t.cancelled,
            tokens_and_cost(t.tokens, t.cost),
            seconds(elapsed)
        );
        if width >= 100 {
            line.push_str(" │ ↑↓ select · enter fold/unfold · c cancel");
        }
        if color {
            format!("\x1b[7m{line}\x1b[0m")
        } else {
            line
        }
    }
}

/// The view, locked: a panic while one thread held it leaves nothing a
/// later frame needs half-done, so a poisoned lock is taken as it is.
pub(super) fn lock(view: &std::sync::Mutex<LiveView>) -> std::sync::MutexGuard<'_, LiveView> {
    view.lock().unwrap_or_else(|e| e.into_inner())
}

impl LiveTree {
    /// What a key does to the tree's lines; the run to cancel for `c`.
    pub fn on_key(&mut self, key: Key) -> Option<RunId> {
        match key {
            Key::Up => self.select(-1),
            Key::Down => self.select(1),
            Key::Toggle => self.toggle(),
            Key::Cancel => return self.selected().cloned(),
        }
        None
    }
}

/// The view as `arbor run` keeps it: the tree, the log lines not yet
/// printed, and the screen. One lock around the three, so that a question
/// asked at the terminal ([`LiveView::pause`]) never has a frame drawn over
/// it.
pub struct LiveView {
    /// The tree.
    pub tree: LiveTree,
    log: Vec<String>,
    dropped: usize,
    screen: Screen,
    paused: bool,
}

/// The most log lines kept while the view is paused.
const KEPT_LINES: usize = 10_000;

impl LiveView {
    /// A view drawn on stderr.
    pub fn new() -> Self {
        LiveView {
            tree: LiveTree::default(),
            log: Vec::new(),
            dropped: 0,
            screen: Screen::new(),
            paused: false,
        }
    }

    /// A line that stays (printed above the live area at the next frame).
    pub fn log(&mut self, line: String) {
        if self.log.len() >= KEPT_LINES {
            self.dropped += 1;
        } else {
            self.log.push(line);
        }
    }

    /// Draws a frame at `now_ms`, unless a question is up.
    pub fn draw(&mut self, now_ms: u64) {
        if self.paused {
            return;
        }
        let (rows, cols) = Screen::size();
        let live = self.tree.render(now_ms, cols, rows, self.screen.color);
        let mut log = std::mem::take(&mut self.log);
        if self.dropped > 0 {
            log.push(format!("… {} more lines, not shown", self.dropped));
            self.dropped = 0;
        }
        self.screen.frame(&log, &live, cols);
    }

    /// A question is about to be asked: the live area goes, and nothing
    /// is drawn until [`resume`](Self::resume).
    pub fn pause(&mut self) {
        self.screen.clear();
        self.paused = true;
    }

    /// The question was answered: frames again.
    pub fn resume(&mut self) {
        self.paused = false;
    }

    /// The tree ended: the live area goes and the lines left are printed.
    pub fn finish(&mut self) {
        self.paused = false;
        let log = std::mem::take(&mut self.log);
        self.screen.frame(&log, &[], 80);
    }
}

fn status_mark(doing: &Doing, color: bool) -> &'static str {
    match (doing, color) {
        (Doing::Ended(AgentStatus::Completed), false) => "✓",
        (Doing::Ended(AgentStatus::Completed), true) => "\x1b[32m✓\x1b[0m",
        (Doing::Ended(AgentStatus::Failed), false) => "✗",
        (Doing::Ended(AgentStatus::Failed), true) => "\x1b[31m✗\x1b[0m",
        (Doing::Ended(_), _) => "○",
        (Doing::Approval { .. } | Doing::Budget { .. }, false) => "?",
        (Doing::Approval { .. } | Doing::Budget { .. }, true) => "\x1b[33m?\x1b[0m",
        (_, false) => "▸",
        (_, true) => "\x1b[36m▸\x1b[0m",
    }
}

fn ended_words(t: &Totals) -> String {
    let mut words = vec![format!("{} completed", t.completed)];
    if t.failed > 0 {
        words.push(format!("{} failed", t.failed));
    }
    if t.cancelled > 0 {
        words.push(format!("{} cancelled", t.cancelled));
    }
    words.join(", ")
}

fn tokens_and_cost(tokens: u64, cost: f64) -> String {
    if cost > 0.0 {
        format!("{tokens} tokens, cost {cost:.4}")
    } else {
        format!("{tokens} tokens")
    }
}

fn seconds(ms: u64) -> String {
    format!("{}.{}s", ms / 1000, (ms % 1000) / 100)
}

/// How much of a streamed reply a line shows: its last characters.
const TAIL_CHARS: usize = 48;

/// Adds `text` to `tail`, its whitespace as single spaces, keeping the last
/// [`TAIL_CHARS`] characters (after a `…` once some are left out).
fn keep_tail(tail: &mut String, text: &str) {
    for c in text.chars() {
        let c = if c.is_whitespace() { ' ' } else { c };
        if c == ' ' && (tail.is_empty() || tail.ends_with(' ')) {
            continue;
        }
        tail.push(c);
    }
    let count = tail.chars().count();
    if count > TAIL_CHARS
        && let Some((at, _)) = tail.char_indices().nth(count - (TAIL_CHARS - 1))
    {
        let kept = tail[at..].trim_start_matches('…').to_owned();
        *tail = format!("…{kept}");
    }
}

#[cfg(test)]
mod tests;
