//! Compaction (issue 37): a template's `compact_at` keeps a long run's
//! history under a size. Before a step's model call, when the run's context
//! reaches the threshold, the tool results older than the last
//! `compact_keep` steps are cut to a stub saying what was cut; if the
//! context is still over, the messages before those steps are summarised by
//! a model call and replaced by one message holding the summary.
//!
//! Every decision here is a plain function of the history (no I/O): what to
//! cut, what to summarise, the summary request's messages and the history
//! that results. The step machine carries them out, and journals each
//! compaction as a `historyCompacted` event ([`Compacted`]) that a resumed
//! or replayed run applies again instead of asking the model again.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::history::History;
use crate::message::{Message, ToolResultPart, json_len};
use crate::model::Usage;

/// The tag of the message that holds a summary of the turns it replaced.
pub const COMPACT_SUMMARY: &str = "COMPACT_SUMMARY";

/// Tool results no longer than this (in characters) are never cut: a stub
/// would save nothing.
pub const CUT_MIN_CHARS: usize = 200;

/// Tools whose results are never cut: a background spawn's result is the
/// record of the children it started (what a restarted run waits for).
/// (`toolbox::SPAWN_AGENTS_ASYNC`, written here as the toolbox imports the
/// templates this module's settings are part of; a test holds them equal.)
pub const NEVER_CUT: [&str; 1] = ["spawn_agents_async"];

/// A summary is made only of turns holding at least 1/`SUMMARY_SHARE` of
/// `compact_at`'s tokens.
pub const SUMMARY_SHARE: u64 = 4;

/// What the summary call asks, after the turns to summarise, unless the
/// template sets `compact_prompt`.
pub const SUMMARY_PROMPT: &str = "Your context is nearly full. Summarise the conversation so far \
for yourself, to go on with the task from the summary alone: the task and every instruction the \
user gave (verbatim where it matters), what you did and found (files, commands, results, \
errors and how they were fixed), decisions made, and what is left to do. Reply with the summary \
as plain text; call no tool.";

/// The head of the message that replaces the summarised turns.
pub const SUMMARY_HEAD: &str =
    "[Summary of the earlier conversation, compacted to fit the context]";

/// A template's compaction settings (`compact_at`, `compact_keep`,
/// `compact_prompt`).
#[derive(Clone, Debug, PartialEq)]
pub struct Compaction {
    /// The context size, in tokens, at which a step compacts first.
    pub at: u64,
    /// The most recent model steps (a reply with its tool results) kept
    /// verbatim.
    pub keep: usize,
    /// What the summary call asks (`None`: [`SUMMARY_PROMPT`]).
    pub prompt: Option<Arc<str>>,
}

impl Compaction {
    /// The model steps kept verbatim unless `compact_keep` says otherwise.
    pub const DEFAULT_KEEP: usize = 4;

    /// Compaction at `at` tokens, keeping the default number of steps.
    pub fn at(at: u64) -> Self {
        Compaction {
            at,
            keep: Self::DEFAULT_KEEP,
            prompt: None,
        }
    }

    /// The summary call's prompt.
    pub fn prompt(&self) -> &str {
        self.prompt.as_deref().unwrap_or(SUMMARY_PROMPT)
    }
}

/// A tool result cut to a stub.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CutResult {
    /// The id of the call it answers (the stub keeps it: pairing holds).
    pub tool_call_id: String,
    /// The tool's wire name.
    pub tool_name: String,
    /// How long the result was, in characters.
    pub chars: usize,
}

/// One compaction as the journal keeps it (`historyCompacted`): what a
/// resumed or replayed run applies again, with no model call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Compacted {
    /// The step it was made before.
    pub step: u32,
    /// The tool results cut, oldest first.
    #[serde(default)]
    pub cut: Vec<CutResult>,
    /// The leading messages replaced by the summary (0: none was made).
    #[serde(default)]
    pub summarized: usize,
    /// The summary's text.
    #[serde(default)]
    pub summary: Option<Arc<str>>,
    /// What the summary call used.
    #[serde(default)]
    pub usage: Usage,
}

/// What a step does to compact: the history with its old tool results cut,
/// and how many leading messages to summarise.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The context's size as measured (tokens).
    pub tokens: u64,
    /// The history, its old tool results cut.
    pub history: History,
    /// The results cut.
    pub cut: Vec<CutResult>,
    /// The size once cut: `tokens` less the estimated tokens the cut saved.
    pub tokens_after_cut: u64,
    /// The leading messages to summarise (0: no summary is needed).
    pub summarize: usize,
}

/// The context's size: the last reply's count, or the history's estimate
/// when it is larger (results added since) or no count is known yet.
pub fn measure(history: &History, context_tokens: u64) -> u64 {
    context_tokens.max(history.estimated_tokens())
}

/// What to do before a step when the context is at or over `compaction.at`;
/// `None` when it is under, or when nothing can be cut or summarised.
/// `pinned`: the first message a summary must keep (the call of a
/// `spawn_agents_async` whose children have not all reported: the history
/// is the record of what a run still waits for, so after a restart it
/// would wait for them no more).
pub fn plan(
    history: &History,
    context_tokens: u64,
    compaction: &Compaction,
    pinned: Option<usize>,
) -> Option<Plan> {
    let tokens = measure(history, context_tokens);
    if tokens < compaction.at {
        return None;
    }
    // The last step is always kept: its results are what the model has
    // not read yet.
    let kept = kept_from(history, compaction.keep.max(1));
    let (cut_history, cut) = cut_results(history, kept, None);
    let kept = pinned.map_or(kept, |pinned| kept.min(pinned));
    let saved = history
        .estimated_tokens()
        .saturating_sub(cut_history.estimated_tokens());
    let tokens_after_cut = tokens.saturating_sub(saved);
    // Only turns with a model reply in them are worth a summary (not one
    // that is already a summary and a prompt), and only when they hold a
    // share of the threshold worth a model call: when the kept steps alone
    // are over it, a summary at every step would summarise the last summary
    // and one small step each time.
    let has_reply = cut_history.iter().take(kept).any(|m| m.is_assistant());
    let old_tokens: u64 = cut_history
        .iter()
        .take(kept)
        .map(|m| m.estimated_tokens())
        .sum();
    let worth = old_tokens.saturating_mul(SUMMARY_SHARE) >= compaction.at;
    let summarize = if tokens_after_cut >= compaction.at && has_reply && worth {
        kept
    } else {
        0
    };
    if cut.is_empty() && summarize == 0 {
        return None;
    }
    Some(Plan {
        tokens,
        history: cut_history,
        cut,
        tokens_after_cut,
        summarize,
    })
}

/// Where the last `keep` model steps start: the index of the `keep`-th
/// assistant message from the end (the history's length for 0); with fewer
/// steps than that, the first assistant message's (nothing before it is a
/// step).
pub fn kept_from(history: &History, keep: usize) -> usize {
    let replies: Vec<usize> = history
        .iter()
        .enumerate()
        .filter(|(_, m)| m.is_assistant())
        .map(|(i, _)| i)
        .collect();
    if keep == 0 {
        return history.len();
    }
    match replies.len().checked_sub(keep) {
        Some(at) => replies.get(at).copied().unwrap_or(history.len()),
        None => replies.first().copied().unwrap_or(history.len()),
    }
}

/// The history with the tool results before `before` that are longer than
/// [`CUT_MIN_CHARS`] cut to a stub (or, with `only`, the results of those
/// call ids), and what was cut. Each stub keeps its call's id and tool name,
/// so every call still has its result.
pub fn cut_results(
    history: &History,
    before: usize,
    only: Option<&[CutResult]>,
) -> (History, Vec<CutResult>) {
    let mut cut = Vec::new();
    let cut_history: History = history
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let Message::Tool {
                tool_call_id,
                tool_name,
                content,
                meta,
            } = &**m
            else {
                return m.clone();
            };
            let chars = result_chars(content);
            let wanted = match only {
                Some(list) => list.iter().any(|c| c.tool_call_id == *tool_call_id),
                None => {
                    i < before && chars > CUT_MIN_CHARS && !NEVER_CUT.contains(&tool_name.as_str())
                }
            };
            if !wanted {
                return m.clone();
            }
            cut.push(CutResult {
                tool_call_id: tool_call_id.clone(),
                tool_name: tool_name.clone(),
                chars,
            });
            Arc::new(Message::Tool {
                tool_call_id: tool_call_id.clone(),
                tool_name: tool_name.clone(),
                content: vec![ToolResultPart::Json {
                    value: Value::String(stub(tool_name, chars)),
                }],
                meta: meta.clone(),
            })
        })
        .collect();
    (cut_history, cut)
}

/// The text a cut result is replaced by.
pub fn stub(tool_name: &str, chars: usize) -> String {
    format!(
        "[tool result of {tool_name} cut: {} chars]",
        thousands(chars)
    )
}

/// `12034` as `12,034`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A result's length in characters (a text result's text, JSON as its text).
fn result_chars(content: &[ToolResultPart]) -> usize {
    content
        .iter()
        .map(|p| match p {
            ToolResultPart::Json {
                value: Value::String(s),
            } => s.chars().count(),
            ToolResultPart::Json { value } => json_len(value),
            ToolResultPart::Media { data, .. } => data.len(),
        })
        .sum()
}

/// The messages of the summary call: the `upto` leading messages of
/// `history` (paired: a call with no result in them is left out), then the
/// prompt asking for the summary.
pub fn summary_messages(history: &History, upto: usize, prompt: &str) -> History {
    let old: History = history.iter().take(upto).cloned().collect();
    let (mut messages, _) = old.request_view();
    messages.push(Message::user(prompt));
    messages
}

/// The history with its `upto` leading messages replaced by one user
/// message holding `summary`.
pub fn summarized(history: &History, upto: usize, summary: &str) -> History {
    let mut message =
        Message::user(format!("{SUMMARY_HEAD}\n\n{summary}")).with_tag(COMPACT_SUMMARY);
    message.meta_mut().keep_during_truncation = Some(true);
    std::iter::once(Arc::new(message))
        .chain(history.iter().skip(upto).cloned())
        .collect()
}

/// A recorded compaction applied again.
#[derive(Clone, Debug)]
pub struct Applied {
    /// The history it leaves.
    pub history: History,
    /// The context's size that set it off, as measured now.
    pub tokens: u64,
    /// The context's size after it (what the run's `contextTokenCount`
    /// becomes): with a summary, the new history's estimate; else the
    /// measured size less what the cut saved.
    pub context_tokens: u64,
}

/// The history a recorded compaction leaves (its results cut and its
/// summary put in place, as the first time), and the context's size.
pub fn apply(history: &History, context_tokens: u64, compacted: &Compacted) -> Applied {
    let tokens = measure(history, context_tokens);
    let (cut, _) = cut_results(history, 0, Some(&compacted.cut));
    match &compacted.summary {
        Some(summary) if compacted.summarized > 0 => {
            let history = summarized(&cut, compacted.summarized, summary);
            let context_tokens = history.estimated_tokens();
            Applied {
                history,
                tokens,
                context_tokens,
            }
        }
        _ => {
            let saved = history
                .estimated_tokens()
                .saturating_sub(cut.estimated_tokens());
            Applied {
                history: cut,
                tokens,
                context_tokens: tokens.saturating_sub(saved),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::history::check_pairing;
    use crate::message::ToolCall;

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall {
            tool_call_id: id.into(),
            tool_name: name.into(),
            input: crate::message::ToolInput::new(&json!({})),
        }
    }

    /// A prompt, then `steps` steps: each a reply calling `Read` and its
    /// result of `size` characters; then a last text reply.
    fn long_run(steps: usize, size: usize) -> History {
        let mut h = History::new();
        h.push(Message::user("Fix the bug."));
        for i in 0..steps {
            let c = call(&format!("c{i}"), "Read");
            h.push(Message::assistant(
                Some(format!("reading {i}")),
                vec![c.clone()],
            ));
            h.push(Message::tool_result(&c, json!("x".repeat(size))));
        }
        h
    }

    fn texts(h: &History) -> Vec<String> {
        h.iter()
            .map(|m| match &**m {
                Message::Tool { content, .. } => match &content[..] {
                    [
                        ToolResultPart::Json {
                            value: Value::String(s),
                        },
                    ] if s.len() < 100 => s.clone(),
                    _ => "big".into(),
                },
                m => m.text(),
            })
            .collect()
    }

    #[test]
    fn under_the_threshold_nothing_is_planned() {
        let h = long_run(6, 1000);
        let c = Compaction::at(h.estimated_tokens() + 1);
        assert!(plan(&h, 0, &c, None).is_none());
        // A reported count over it counts, though the estimate is under.
        assert!(plan(&h, h.estimated_tokens() + 1, &c, None).is_some());
    }

    #[test]
    fn old_results_are_cut_first_and_the_kept_steps_stay_verbatim() {
        let h = long_run(6, 1000);
        let c = Compaction {
            keep: 2,
            ..Compaction::at(100)
        };
        let p = plan(&h, 0, &c, None).unwrap();
        let ids: Vec<&str> = p.cut.iter().map(|c| c.tool_call_id.as_str()).collect();
        assert_eq!(
            ids,
            ["c0", "c1", "c2", "c3"],
            "oldest first, the last 2 steps kept"
        );
        assert_eq!(p.cut[0].chars, 1000);
        let t = texts(&p.history);
        assert_eq!(t[2], "[tool result of Read cut: 1,000 chars]");
        assert_eq!(t[10], "big", "a kept step's result stays");
        assert_eq!(t[12], "big");
        // Every call still has its result, by id.
        assert!(check_pairing(&p.history).is_ok());
        assert!(p.history.is_paired());
        assert!(p.tokens_after_cut < p.tokens);
        // Still over 100 tokens: the 9 messages before the kept steps go.
        assert_eq!(p.summarize, 9);
    }

    /// `keep = 0` (an embedder's template; the config refuses it) still
    /// keeps the last step: the results the model has not read are never cut.
    #[test]
    fn the_last_steps_results_are_never_cut_even_with_keep_0() {
        let h = long_run(6, 1000);
        let c = Compaction {
            keep: 0,
            ..Compaction::at(100)
        };
        let p = plan(&h, 0, &c, None).unwrap();
        let ids: Vec<&str> = p.cut.iter().map(|c| c.tool_call_id.as_str()).collect();
        assert_eq!(ids, ["c0", "c1", "c2", "c3", "c4"]);
        assert_eq!(texts(&p.history)[12], "big", "the last result stays");
    }

    #[test]
    fn a_cut_that_brings_it_under_needs_no_summary() {
        let h = long_run(6, 4000);
        let c = Compaction {
            keep: 1,
            ..Compaction::at(h.estimated_tokens() / 2)
        };
        let p = plan(&h, 0, &c, None).unwrap();
        assert_eq!(p.cut.len(), 5);
        assert!(p.tokens_after_cut < c.at);
        assert_eq!(p.summarize, 0);
    }

    #[test]
    fn small_results_are_not_cut_and_nothing_to_do_plans_nothing() {
        let h = long_run(6, 50);
        let c = Compaction {
            keep: 6,
            ..Compaction::at(10)
        };
        // Every step kept, nothing to cut: nothing to do.
        assert!(plan(&h, 0, &c, None).is_none());
        let c = Compaction { keep: 2, ..c };
        let p = plan(&h, 0, &c, None).unwrap();
        assert!(p.cut.is_empty(), "results of 50 chars stay");
        assert_eq!(p.summarize, 9);
    }

    #[test]
    fn kept_steps_start_at_an_assistant_message() {
        let h = long_run(3, 10);
        assert_eq!(kept_from(&h, 0), 7);
        assert_eq!(kept_from(&h, 1), 5);
        assert_eq!(kept_from(&h, 3), 1);
        assert_eq!(kept_from(&h, 9), 1, "fewer steps: all kept");
        assert_eq!(kept_from(&History::new(), 2), 0);
    }

    #[test]
    fn the_summary_replaces_the_old_turns_and_pairing_holds() {
        let h = long_run(5, 1000);
        let c = Compaction {
            keep: 2,
            ..Compaction::at(10)
        };
        let p = plan(&h, 0, &c, None).unwrap();
        let asked = summary_messages(&p.history, p.summarize, c.prompt());
        assert_eq!(asked.len(), p.summarize + 1);
        assert_eq!(asked.last().unwrap().text(), SUMMARY_PROMPT);
        assert!(check_pairing(&asked).is_ok());
        let after = summarized(&p.history, p.summarize, "did things");
        assert_eq!(after.len(), 1 + 4);
        let first = after.get(0).unwrap();
        assert!(first.has_tag(COMPACT_SUMMARY));
        assert!(first.keep_during_truncation());
        assert!(first.text().ends_with("did things"));
        assert!(after.get(1).unwrap().is_assistant());
        assert!(check_pairing(&after).is_ok());
        // The kept messages are the same ones, shared.
        assert!(Arc::ptr_eq(after.get(4).unwrap(), h.get(10).unwrap()));
    }

    #[test]
    fn a_recorded_compaction_applies_to_the_same_history() {
        let h = long_run(5, 1000);
        let c = Compaction {
            keep: 2,
            ..Compaction::at(10)
        };
        let p = plan(&h, 0, &c, None).unwrap();
        let live = summarized(&p.history, p.summarize, "sum");
        let recorded = Compacted {
            step: 3,
            cut: p.cut.clone(),
            summarized: p.summarize,
            summary: Some("sum".into()),
            usage: Usage::default(),
        };
        let again = apply(&h, 0, &recorded);
        assert_eq!(again.history, live);
        assert_eq!(again.tokens, p.tokens);
        assert_eq!(again.context_tokens, live.estimated_tokens());
        let cut_only = Compacted {
            summarized: 0,
            summary: None,
            ..recorded
        };
        let again = apply(&h, 0, &cut_only);
        assert_eq!(again.history, p.history);
        assert_eq!(again.context_tokens, p.tokens_after_cut);
    }

    #[test]
    fn the_results_never_cut_are_the_background_spawns() {
        assert_eq!(NEVER_CUT, [crate::toolbox::SPAWN_AGENTS_ASYNC]);
    }

    /// A `spawn_agents_async` call and its result naming one started child
    /// `agent`, as the step machine writes them.
    fn background_spawn(h: &mut History, id: &str, agent: &str) {
        let c = ToolCall {
            tool_call_id: id.into(),
            tool_name: crate::toolbox::SPAWN_AGENTS_ASYNC.into(),
            input: crate::message::ToolInput::new(
                &json!({"agents": [{"agent_type": "worker", "prompt": "x".repeat(400)}]}),
            ),
        };
        h.push(Message::assistant(Some("starting".into()), vec![c.clone()]));
        h.push(Message::tool_result(
            &c,
            json!([{"agentId": agent, "agentType": "worker", "note": "y".repeat(400)}]),
        ));
    }

    #[test]
    fn background_children_still_running_survive_a_compaction() {
        let mut h = History::new();
        h.push(Message::user("Fix the bug."));
        background_spawn(&mut h, "bg", "t/0.1");
        let rest = long_run(6, 2000);
        for m in rest.iter().skip(1) {
            h.push_shared(m.clone());
        }
        let before = crate::step::background::outstanding(&h);
        assert_eq!(before.len(), 1);
        let compaction = Compaction {
            at: 100,
            keep: 1,
            prompt: None,
        };
        let pinned = crate::step::background::pinned(&h);
        let plan = plan(&h, 0, &compaction, pinned).unwrap();
        assert!(
            !plan
                .cut
                .iter()
                .any(|c| c.tool_name == crate::toolbox::SPAWN_AGENTS_ASYNC),
            "{:?}",
            plan.cut
        );
        // The summary stops before the spawn: nothing before it is a step,
        // so none is made, and the child is still awaited.
        assert_eq!(plan.summarize, 0);
        assert_eq!(crate::step::background::outstanding(&plan.history).len(), 1);
        // Once it has reported, its spawn may be summarised with the rest.
        let mut reported = h.clone();
        reported.push(
            Message::user(format!("[background]\n{}", json!({"agentId": "t/0.1"})))
                .with_tag(crate::step::background::BACKGROUND_REPORT),
        );
        let c = call("last", "Read");
        reported.push(Message::assistant(Some("again".into()), vec![c.clone()]));
        reported.push(Message::tool_result(&c, json!("z".repeat(2000))));
        assert!(crate::step::background::outstanding(&reported).is_empty());
        let pinned = crate::step::background::pinned(&reported);
        assert_eq!(pinned, None);
        let plan = super::plan(&reported, 0, &compaction, pinned).unwrap();
        assert!(plan.summarize > 2, "{}", plan.summarize);
    }

    /// The symptom: kept steps larger than `compact_at` on their own made a
    /// summary call at every step, each summarising the last summary and
    /// one more small step. A summary is made only of turns holding a
    /// quarter of the threshold.
    #[test]
    fn kept_steps_over_the_threshold_do_not_make_a_summary_every_step() {
        let compaction = Compaction {
            at: 4_000,
            keep: 2,
            prompt: None,
        };
        // Ten steps, each a reply of ~500 tokens of text (nothing to cut):
        // the eight older ones are summarised.
        let step = |h: &mut History, i: usize, chars: usize| {
            let c = call(&format!("s{i}"), "Read");
            h.push(Message::assistant(Some("t".repeat(chars)), vec![c.clone()]));
            h.push(Message::tool_result(&c, json!("ok")));
        };
        let mut h = History::new();
        h.push(Message::user("Fix the bug."));
        for i in 0..10 {
            step(&mut h, i, 2_000);
        }
        let first = plan(&h, 0, &compaction, None).unwrap();
        assert!(first.summarize > 0);
        let mut after = summarized(&first.history, first.summarize, "the summary");
        // A much larger step: the kept two are over the threshold alone,
        // and before them lie only the summary and one small step.
        step(&mut after, 10, 14_000);
        let next = plan(&after, 0, &compaction, None);
        assert!(
            next.as_ref().is_none_or(|p| p.summarize == 0),
            "{:?}",
            next.map(|p| p.summarize)
        );
    }

    #[test]
    fn stubs_say_what_was_cut() {
        assert_eq!(
            stub("Read", 12_034),
            "[tool result of Read cut: 12,034 chars]"
        );
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000_000), "1,000,000");
    }
}
