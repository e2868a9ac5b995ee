//! Looking back at stored runs: the tables of `arbor runs` and `arbor tree`,
//! and the comparison `arbor replay` makes between recorded and replayed states.

use std::fmt::Write as _;
use std::sync::Arc;

use arbor_actors::{AgentState, RunId};
use arbor_supervisor::store::{EventType, JournalEntry, RunNode, TreeSummary};
use serde_json::Value;

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
pub fn timestamp(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn duration(start: u64, end: Option<u64>) -> String {
    match end {
        Some(end) => {
            let ms = end.saturating_sub(start);
            if ms < 10_000 {
                format!("{ms}ms")
            } else {
                format!("{:.1}s", ms as f64 / 1000.0)
            }
        }
        None => "-".into(),
    }
}

/// The runs of a tree paused on a spent budget (semantics §13), from its
/// journal: each run whose last `budgetReached` came after the tree's last
/// `limitsRaised` and that has not ended since, with the budget's key
/// (`max_steps`, `max_tokens`, `max_credits`).
pub fn paused_runs(journal: &[JournalEntry]) -> std::collections::BTreeMap<String, String> {
    let mut paused = std::collections::BTreeMap::new();
    for entry in journal {
        match entry.kind {
            EventType::LimitsRaised => paused.clear(),
            EventType::BudgetReached => {
                let key = match entry.body["limit"]["limit"].as_str() {
                    Some("token_budget") => "max_tokens",
                    Some("cost_budget") => "max_credits",
                    _ => "max_steps",
                };
                paused.insert(entry.run_id.to_string(), key.to_owned());
            }
            EventType::AgentFinished | EventType::AgentFailed | EventType::AgentCancelled => {
                paused.remove(entry.run_id.as_ref());
            }
            _ => {}
        }
    }
    paused
}

/// The worktrees a tree's runs kept (issue 36): one line each, with the
/// run, the branch, where it is and what it holds; nothing when none.
pub fn kept_worktrees(journal: &[JournalEntry]) -> String {
    let mut text = String::new();
    for entry in journal {
        if entry.kind != EventType::WorktreeSealed {
            continue;
        }
        let Ok(report) = serde_json::from_value::<arbor_actors::worktree::WorktreeReport>(
            entry.body["report"].clone(),
        ) else {
            continue;
        };
        let Some(path) = &report.path else {
            continue;
        };
        let commits = report.commits.len();
        text.push_str(&format!(
            "worktree kept: {} at {} ({} {}, {}) by {}\n",
            report.branch,
            path.display(),
            commits,
            if commits == 1 { "commit" } else { "commits" },
            report.error.as_deref().unwrap_or(&report.summary),
            entry.run_id
        ));
    }
    text
}

/// The status a tree is shown with: `paused` for a running (or
/// interrupted) tree with runs paused on a spent budget.
pub fn shown_status(status: arbor_supervisor::TreeStatus, paused: bool) -> String {
    if paused && !status.is_final() {
        "paused".to_owned()
    } else {
        status.to_string()
    }
}

/// The `arbor budget` flag that raises the budget `key` names.
pub fn raise_flag(key: &str) -> &'static str {
    match key {
        "max_tokens" => "--add-tokens",
        "max_credits" => "--add-credits",
        _ => "--add-steps",
    }
}

/// The table `arbor runs` prints. The tree column is as wide as its widest
/// id (a generated one is 33 characters, an older or picked one shorter).
/// `paused` names the trees shown paused (see [`shown_status`]).
pub fn runs_table(
    trees: &[TreeSummary],
    paused: &std::collections::BTreeSet<arbor_actors::TreeId>,
) -> String {
    let tree = trees
        .iter()
        .map(|t| t.tree_id.chars().count())
        .fold(16, usize::max);
    let mut out = format!(
        "{:<tree$} {:<16} {:<11} {:>6} {:>10} {:>9} {:<19} {:>9}\n",
        "TREE", "ROOT", "STATUS", "AGENTS", "TOKENS", "COST", "STARTED (UTC)", "DURATION"
    );
    for t in trees {
        let _ = writeln!(
            out,
            "{:<tree$} {:<16} {:<11} {:>6} {:>10} {:>9.4} {:<19} {:>9}",
            t.tree_id,
            t.agent,
            shown_status(t.status, paused.contains(&t.tree_id)),
            t.agents,
            t.input_tokens + t.output_tokens,
            t.cost,
            timestamp(t.started_ms),
            duration(t.started_ms, t.finished_ms),
        );
    }
    out
}

/// The spawn tree `arbor tree` prints: one line per run, indented under its
/// parent; a run in `paused` ([`paused_runs`]) is shown paused, on the
/// budget it waits for.
pub fn tree_text(nodes: &[RunNode], paused: &std::collections::BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let roots: Vec<&RunNode> = nodes
        .iter()
        .filter(|n| {
            n.parent_run_id
                .as_ref()
                .is_none_or(|p| !nodes.iter().any(|m| &m.run_id == p))
        })
        .collect();
    for root in roots {
        walk(nodes, root, 0, paused, &mut out);
    }
    out
}

/// Sorts sibling runs in spawn order (`RunId::sort_key`: 0.2 before 0.10,
/// attempt 0 before attempt 1), parsing each run id once (not once per
/// comparison); runs with ids that do not parse keep their order, last.
fn sort_siblings(children: &mut [&RunNode]) {
    let mut parsed: Vec<(Option<RunId>, &RunNode)> = children
        .iter()
        .map(|n| (n.run_id.parse().ok(), *n))
        .collect();
    // An id that does not parse after every one that does.
    fn key(id: &Option<RunId>) -> (bool, Option<impl Ord + '_>) {
        (id.is_none(), id.as_ref().map(RunId::sort_key))
    }
    parsed.sort_by(|(a, _), (b, _)| key(a).cmp(&key(b)));
    for (slot, (_, node)) in children.iter_mut().zip(parsed) {
        *slot = node;
    }
}

fn walk(
    nodes: &[RunNode],
    node: &RunNode,
    depth: usize,
    paused: &std::collections::BTreeMap<String, String>,
    out: &mut String,
) {
    let on = paused
        .get(&node.run_id)
        .filter(|_| node.status == "running");
    let mark = match (node.status.as_str(), on) {
        (_, Some(_)) => "‖",
        ("completed", _) => "✓",
        ("failed", _) => "✗",
        ("cancelled", _) => "○",
        _ => "…",
    };
    let status = match on {
        Some(key) => format!("paused on {key}"),
        None => node.status.clone(),
    };
    let _ = write!(
        out,
        "{}{mark} {} {} {}: {}, {}, cost {:.4}, {}",
        "  ".repeat(depth),
        node.agent_type,
        node.run_id,
        status,
        count(node.steps, "step", "steps"),
        count(node.input_tokens + node.output_tokens, "token", "tokens"),
        node.cost,
        duration(node.started_ms, node.finished_ms),
    );
    if let Some(error) = &node.error {
        let _ = write!(out, " ({error})");
    }
    out.push('\n');
    let mut children: Vec<&RunNode> = nodes
        .iter()
        .filter(|n| n.parent_run_id.as_deref() == Some(&node.run_id))
        .collect();
    sort_siblings(&mut children);
    for child in children {
        walk(nodes, child, depth + 1, paused, out);
    }
}

/// Where a replay first differs from the record.
#[derive(Clone, Debug, PartialEq)]
pub struct Divergence {
    /// The run whose replayed final state differs (or that did not finish).
    pub run_id: String,
    /// Its agent type (empty when the record has none).
    pub agent_type: String,
    /// What differs: the first message that does (index, recorded and
    /// replayed, each cut to 160 characters), else the first field, or
    /// `did not finish in the replay`.
    pub detail: String,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "run {} ({}): {}",
            self.run_id, self.agent_type, self.detail
        )
    }
}

fn clip(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 160 {
        format!("{}…", text.chars().take(160).collect::<String>())
    } else {
        text
    }
}

/// Equal JSON, with numbers equal to a relative 1e-9: a parent adds its
/// children's credits in the order they finish, which may differ on replay.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0),
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// Compares recorded final states (in the order they finished) with the replay's.
/// Returns how many runs matched, or the first run (in finish order) that differs.
pub fn compare_replay(
    recorded: &[AgentState],
    replayed: impl Fn(&RunId) -> Option<Arc<AgentState>>,
) -> Result<usize, Divergence> {
    for want in recorded {
        let agent_type = want.agent_type.clone().unwrap_or_default();
        let diverge = |detail: String| Divergence {
            run_id: want.run_id.to_string(),
            agent_type: agent_type.clone(),
            detail,
        };
        let Some(got) = replayed(&want.run_id) else {
            return Err(diverge("did not finish in the replay".into()));
        };
        let want_json = serde_json::to_value(want).unwrap_or(Value::Null);
        let mut got_json = serde_json::to_value(&*got).unwrap_or(Value::Null);
        // A field the recorded state lacks is one a later build added (a
        // failure's `errorKind`): a tree stored before it is compared on what
        // it recorded.
        if let (Value::Object(want), Value::Object(got)) = (&want_json, &mut got_json) {
            got.retain(|key, _| want.contains_key(key));
        }
        if same(&want_json, &got_json) {
            continue;
        }
        let messages = |v: &Value| v["messageHistory"].as_array().cloned().unwrap_or_default();
        let (a, b) = (messages(&want_json), messages(&got_json));
        let differs = |i: &usize| match (a.get(*i), b.get(*i)) {
            (Some(x), Some(y)) => !same(x, y),
            _ => true,
        };
        if let Some(i) = (0..a.len().max(b.len())).find(differs) {
            let show = |m: Option<&Value>| m.map_or_else(|| "(none)".to_owned(), clip);
            return Err(diverge(format!(
                "message {i} differs: recorded {} / replayed {}",
                show(a.get(i)),
                show(b.get(i))
            )));
        }
        let keys = want_json
            .as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>());
        for key in keys.unwrap_or_default() {
            if !same(&want_json[&key], &got_json[&key]) {
                return Err(diverge(format!(
                    "{key} differs: recorded {} / replayed {}",
                    clip(&want_json[&key]),
                    clip(&got_json[&key])
                )));
            }
        }
        return Err(diverge("the states differ".into()));
    }
    Ok(recorded.len())
}

/// `n` and the noun for it: "1 child", "3 children", "0 tokens".
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn credits_added_in_another_order_still_match() {
        assert!(same(&json!(0.1 + 0.2 + 0.3), &json!(0.3 + 0.2 + 0.1)));
        assert!(same(&json!({"a": [1.0, 2]}), &json!({"a": [1.0, 2]})));
        assert!(!same(&json!(0.5), &json!(0.6)));
        assert!(!same(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
    }

    #[test]
    fn siblings_sort_by_spawn_order_not_by_text() {
        let ids = [
            "t/0.10",
            "not an id",
            "t/0.2",
            "t/0.2~1",
            "also not",
            "t/0.1.3",
        ];
        let nodes: Vec<RunNode> = ids
            .iter()
            .map(|id| RunNode {
                run_id: (*id).to_owned(),
                parent_run_id: Some("t/0".into()),
                agent_type: "worker".into(),
                depth: 1,
                status: "completed".into(),
                error: None,
                error_kind: None,
                steps: 1,
                input_tokens: 0,
                output_tokens: 0,
                cost: 0.0,
                started_ms: 0,
                finished_ms: None,
            })
            .collect();
        let mut children: Vec<&RunNode> = nodes.iter().collect();
        sort_siblings(&mut children);
        let sorted: Vec<&str> = children.iter().map(|n| n.run_id.as_str()).collect();
        assert_eq!(
            sorted,
            [
                "t/0.1.3",
                "t/0.2",
                "t/0.2~1",
                "t/0.10",
                "not an id",
                "also not"
            ]
        );
    }

    #[test]
    fn timestamps_are_civil_utc() {
        assert_eq!(timestamp(0), "1970-01-01 00:00:00");
        assert_eq!(timestamp(1_796_083_200_000), "2026-12-01 00:00:00");
    }

    #[test]
    fn a_replay_names_the_first_run_and_message_that_differ() {
        use arbor_actors::Message;
        let mut a = AgentState {
            run_id: "t/0.1".parse().unwrap(),
            agent_type: Some("worker".into()),
            ..AgentState::of_run("t/0".parse().unwrap())
        };
        a.message_history.push(Message::user("hi"));
        a.message_history.push(Message::assistant_text("one"));
        let mut b = a.clone();
        b.message_history = Default::default();
        b.message_history.push(Message::user("hi"));
        b.message_history.push(Message::assistant_text("two"));
        let root = AgentState {
            run_id: "t/0".parse().unwrap(),
            ..AgentState::of_run("t/0".parse().unwrap())
        };
        let recorded = vec![a.clone(), root.clone()];
        assert_eq!(
            compare_replay(&recorded, |id| Some(Arc::new(if id == "t/0" {
                root.clone()
            } else {
                a.clone()
            }))),
            Ok(2)
        );
        let err = compare_replay(&recorded, |id| {
            Some(Arc::new(if id == "t/0" { root.clone() } else { b.clone() }))
        })
        .unwrap_err();
        assert_eq!(err.run_id, "t/0.1");
        assert!(err.detail.starts_with("message 1 differs"), "{err}");
        assert!(err.detail.contains("two"), "{err}");
        let err = compare_replay(&recorded, |_| None).unwrap_err();
        assert_eq!(err.detail, "did not finish in the replay");
    }

    #[test]
    fn a_failed_run_stored_before_error_kinds_still_replays_identically() {
        let old = AgentState {
            run_id: "t/0".parse().unwrap(),
            status: arbor_actors::AgentStatus::Failed,
            output: Some(json!({"errorMessage": "limit max_steps reached"})),
            ..AgentState::of_run("t/0".parse().unwrap())
        };
        let new = AgentState {
            error_kind: Some(arbor_actors::FailureKind::Limit),
            ..old.clone()
        };
        assert_eq!(
            compare_replay(std::slice::from_ref(&old), |_| Some(Arc::new(new.clone()))),
            Ok(1)
        );
        // A kind the record has is compared like any other field.
        let other = AgentState {
            error_kind: Some(arbor_actors::FailureKind::ModelRejected),
            ..old
        };
        let err = compare_replay(&[new], |_| Some(Arc::new(other.clone()))).unwrap_err();
        assert!(err.detail.starts_with("errorKind differs"), "{err}");
    }
}
