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

pub(super) use draw::{Input, Key, Screen};

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use arbor_actors::{AgentStatus, Event, EventKind, RunId};

/// What an agent is doing now.
#[derive(Clone, Debug, PartialEq)]
enum Doing {
    /// Started, before its first step.
    Starting,
    /// Waiting on the model for step `step`; `streamed` characters of its
    /// reply have arrived (when the stream sends deltas).
    Model { step: u32, streamed: u64 },
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
    children: Vec<RunId>,
    started_ms: u64,
    /// When it began what it is doing now.
    since_ms: u64,
    ended_ms: Option<u64>,
    doing: Doing,
    tokens: u64,
    cost: f64,
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
}

/// A subtree's totals.
#[derive(Clone, Copy, Default)]
struct Totals {
    agents: usize,
    running: usize,
    completed: usize,
    failed: usize,
    cancelled: usize,
    tokens: u64,
    cost: f64,
}

impl LiveTree {
    /// Takes one event of the tree.
    pub fn apply(&mut self, event: &Event) {
        let at = event.at_ms;
        if let EventKind::AgentStarted {
            agent_type,
            parent_run_id,
            depth,
            ..
        } = &event.kind
        {
            self.started_ms.get_or_insert(at);
            let parent = parent_run_id
                .as_ref()
                .filter(|p| self.nodes.contains_key(*p));
            match parent {
                Some(p) => {
                    if let Some(node) = self.nodes.get_mut(p)
                        && !node.children.contains(&event.run_id)
                    {
                        node.children.push(event.run_id.clone());
                    }
                }
                None if !self.roots.contains(&event.run_id) => {
                    self.roots.push(event.run_id.clone());
                }
                None => {}
            }
            self.nodes.insert(
                event.run_id.clone(),
                Node {
                    agent_type: agent_type.clone(),
                    depth: *depth,
                    children: Vec::new(),
                    started_ms: at,
                    since_ms: at,
                    ended_ms: None,
                    doing: Doing::Starting,
                    tokens: 0,
                    cost: 0.0,
                },
            );
            return;
        }
        let Some(node) = self.nodes.get_mut(&event.run_id) else {
            return;
        };
        let doing = match &event.kind {
            EventKind::StepStarted { step } => Some(Doing::Model {
                step: *step,
                streamed: 0,
            }),
            EventKind::ModelDelta { .. } => {
                if let Doing::Model { streamed, .. } = &mut node.doing
                    && let Ok(text) = serde_json::to_string(&event.kind)
                {
                    *streamed += text.len() as u64;
                }
                None
            }
            EventKind::ModelRetrying {
                attempt, reason, ..
            } => Some(Doing::Retrying {
                attempt: *attempt,
                reason: reason.clone(),
            }),
            EventKind::ModelResponded {
                usage,
                tool_calls,
                reply,
                ..
            } => {
                node.tokens += usage.total_tokens();
                node.cost += usage.cost;
                (*tool_calls > 0).then(|| Doing::Tools {
                    names: reply
                        .as_ref()
                        .map(|m| m.tool_calls().map(|c| c.tool_name.clone()).collect())
                        .unwrap_or_default(),
                    left: *tool_calls,
                })
            }
            EventKind::ToolCalled { .. } => {
                if let Doing::Tools { left, .. } = &mut node.doing {
                    *left = left.saturating_sub(1);
                }
                None
            }
            EventKind::Suspended => Some(Doing::Children),
            EventKind::ApprovalRequested { tool, .. } => {
                Some(Doing::Approval { tool: tool.clone() })
            }
            EventKind::BudgetReached { limit } => Some(Doing::Budget {
                limit: limit.to_string(),
            }),
            EventKind::AgentFinished { .. } => Some(Doing::Ended(AgentStatus::Completed)),
            EventKind::AgentFailed { .. } => Some(Doing::Ended(AgentStatus::Failed)),
            EventKind::AgentCancelled { .. } => Some(Doing::Ended(AgentStatus::Cancelled)),
            _ => None,
        };
        if let Some(doing) = doing {
            if matches!(doing, Doing::Ended(_)) {
                node.ended_ms = Some(at);
            }
            // A decided approval or a raised budget goes on as the next
            // event says; until then the line keeps its last words.
            node.doing = doing;
            node.since_ms = at;
        }
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
        node.ended_ms.is_some()
            && node
                .children
                .iter()
                .filter_map(|c| self.nodes.get(c))
                .all(|c| self.subtree_ended(c))
    }

    fn totals(&self, node: &Node) -> Totals {
        let mut t = Totals {
            agents: 1,
            tokens: node.tokens,
            cost: node.cost,
            ..Totals::default()
        };
        match node.doing {
            Doing::Ended(AgentStatus::Completed) => t.completed += 1,
            Doing::Ended(AgentStatus::Failed) => t.failed += 1,
            Doing::Ended(AgentStatus::Cancelled) => t.cancelled += 1,
            _ => t.running += 1,
        }
        for child in node.children.iter().filter_map(|c| self.nodes.get(c)) {
            let c = self.totals(child);
            t.agents += c.agents;
            t.running += c.running;
            t.completed += c.completed;
            t.failed += c.failed;
            t.cancelled += c.cancelled;
            t.tokens += c.tokens;
            t.cost += c.cost;
        }
        t
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
            let t = self.totals(node);
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
            Doing::Model { step, streamed } if *streamed > 0 => {
                format!(
                    "model, step {step}, {} ({} chars so far)",
                    seconds(for_ms),
                    streamed
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
        let mut t = Totals::default();
        for root in self.roots.iter().filter_map(|r| self.nodes.get(r)) {
            let r = self.totals(root);
            t.agents += r.agents;
            t.running += r.running;
            t.completed += r.completed;
            t.failed += r.failed;
            t.cancelled += r.cancelled;
            t.tokens += r.tokens;
            t.cost += r.cost;
        }
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

#[cfg(test)]
mod tests;
