//! The loop watchdog (semantics §11): the same tool called with
//! the same input and answered with the same result, again and again. Pure:
//! it sees each committed call with its result, in call order across steps.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use crate::event::EventKind;
use crate::failure::{Failure, FailureKind};
use crate::message::{Message, ToolInput, ToolResultPart};
use crate::template::LoopDetection;

/// What the watchdog makes of one more call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not (yet) a loop worth saying anything about.
    Fine,
    /// `warn_after` identical calls in a row: say so.
    Warn(u32),
    /// `fail_after` identical calls in a row: stop the run.
    Fail(u32),
}

/// The last call seen and how many identical ones came in a row.
#[derive(Default)]
pub(crate) struct LoopWatch {
    last: Option<Seen>,
    repeats: u32,
}

/// What the watchdog keeps of the last call: nothing copied. The call's tool
/// and input are kept as a fingerprint (a hash; two different calls share
/// one with odds of about 2^-64), the result as the `Arc` the history holds.
struct Seen {
    call: u64,
    result: Arc<Message>,
}

/// The fingerprint of a call: its tool and input hashed together
/// (`DefaultHasher::new` has fixed keys, so it is the same in every run).
fn fingerprint(tool: &str, input: &ToolInput) -> u64 {
    let mut hasher = DefaultHasher::new();
    tool.hash(&mut hasher);
    input.text().hash(&mut hasher);
    hasher.finish()
}

fn content(message: &Message) -> &[ToolResultPart] {
    match message {
        Message::Tool { content, .. } => content,
        _ => &[],
    }
}

impl LoopWatch {
    /// Sees one call (`tool`, `input`) and its `result`: a call equal to the
    /// one before in tool, input and result content adds one to the run of
    /// repeats; any other starts a new run at 1.
    pub(crate) fn observe(
        &mut self,
        config: LoopDetection,
        tool: &str,
        input: &ToolInput,
        result: &Arc<Message>,
    ) -> Verdict {
        let call = fingerprint(tool, input);
        let same = self.last.as_ref().is_some_and(|seen| {
            seen.call == call
                && (Arc::ptr_eq(&seen.result, result) || content(&seen.result) == content(result))
        });
        if same {
            self.repeats += 1;
        } else {
            self.last = Some(Seen {
                call,
                result: Arc::clone(result),
            });
            self.repeats = 1;
        }
        let n = self.repeats;
        if config.fail_after > 0 && n >= config.fail_after {
            Verdict::Fail(n)
        } else if config.warn_after > 0 && n == config.warn_after {
            Verdict::Warn(n)
        } else {
            Verdict::Fine
        }
    }
}

impl super::StepMachine {
    /// Feeds a committed step's calls to the loop watchdog, in call order:
    /// a `looping` event at `warn_after`, and at `fail_after` the run fails
    /// (the actions returned).
    pub(super) fn watch_loops(
        &mut self,
        step: u32,
        calls: &super::calls::Calls,
        results: &[Arc<Message>],
    ) -> Option<Vec<super::Action>> {
        let config = self.template.loop_detection;
        if config == LoopDetection::OFF {
            return None;
        }
        for (call, result) in calls.iter().zip(results) {
            let (repeats, fatal) =
                match self
                    .loops
                    .observe(config, &call.tool_name, &call.input, result)
                {
                    Verdict::Fine => continue,
                    Verdict::Warn(n) => (n, false),
                    Verdict::Fail(n) => (n, true),
                };
            self.events.push(EventKind::Looping {
                step,
                tool: call.tool_name.clone(),
                repeats,
                fatal,
            });
            if fatal {
                return Some(self.fail(Failure::new(
                    FailureKind::Looping,
                    format!(
                        "loop detection: {} was called {repeats} times in a row with the same \
                         input and the same result (loop_detection.fail_after = {})",
                        call.tool_name, config.fail_after
                    ),
                )));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;
    use serde_json::{Value, json};

    fn result(id: &str, value: Value) -> Arc<Message> {
        let call = ToolCall {
            tool_call_id: id.into(),
            tool_name: "echo".into(),
            input: json!({}).into(),
        };
        Arc::new(Message::tool_result(&call, value))
    }

    const CONFIG: LoopDetection = LoopDetection {
        warn_after: 3,
        fail_after: 5,
    };

    #[test]
    fn identical_calls_warn_once_then_fail() {
        let mut watch = LoopWatch::default();
        let verdicts: Vec<Verdict> = (0..5)
            .map(|i| {
                watch.observe(
                    CONFIG,
                    "echo",
                    &json!({"n": 1}).into(),
                    &result(&format!("c{i}"), json!(1)),
                )
            })
            .collect();
        assert_eq!(
            verdicts,
            [
                Verdict::Fine,
                Verdict::Fine,
                Verdict::Warn(3),
                Verdict::Fine,
                Verdict::Fail(5)
            ]
        );
    }

    #[test]
    fn a_different_input_or_result_starts_the_count_again() {
        let mut watch = LoopWatch::default();
        let same: ToolInput = json!({"n": 1}).into();
        for i in 0..2 {
            watch.observe(CONFIG, "echo", &same, &result(&format!("a{i}"), json!(1)));
        }
        assert_eq!(
            watch.observe(CONFIG, "echo", &same, &result("b", json!(2))),
            Verdict::Fine,
            "another result"
        );
        for i in 0..2 {
            watch.observe(CONFIG, "echo", &same, &result(&format!("c{i}"), json!(2)));
        }
        assert_eq!(watch.repeats, 3);
        watch.observe(
            CONFIG,
            "echo",
            &json!({"n": 2}).into(),
            &result("d", json!(2)),
        );
        assert_eq!(watch.repeats, 1, "another input");
        watch.observe(
            CONFIG,
            "other",
            &json!({"n": 2}).into(),
            &result("e", json!(2)),
        );
        assert_eq!(watch.repeats, 1, "another tool");
    }

    #[test]
    fn the_watchdog_keeps_the_result_shared_not_copied() {
        let mut watch = LoopWatch::default();
        let first = result("a", json!({"big": "body"}));
        watch.observe(CONFIG, "echo", &json!({"n": 1}).into(), &first);
        assert_eq!(Arc::strong_count(&first), 2, "held as the same Arc");
        // The same result again (the same Arc) is a repeat.
        watch.observe(CONFIG, "echo", &json!({"n": 1}).into(), &first);
        assert_eq!(watch.repeats, 2);
        assert_eq!(Arc::strong_count(&first), 2, "a repeat keeps the first");
    }

    #[test]
    fn zero_turns_a_stage_off() {
        let mut watch = LoopWatch::default();
        let off = LoopDetection::OFF;
        for i in 0..50 {
            let v = watch.observe(
                off,
                "echo",
                &json!({}).into(),
                &result(&format!("c{i}"), json!(1)),
            );
            assert_eq!(v, Verdict::Fine);
        }
        let fail_only = LoopDetection {
            warn_after: 0,
            fail_after: 2,
        };
        let mut watch = LoopWatch::default();
        assert_eq!(
            watch.observe(fail_only, "t", &json!({}).into(), &result("a", json!(1))),
            Verdict::Fine
        );
        assert_eq!(
            watch.observe(fail_only, "t", &json!({}).into(), &result("b", json!(1))),
            Verdict::Fail(2)
        );
    }
}
