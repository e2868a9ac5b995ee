//! `handleSteps` as an Arbor [`StepProgram`]: each run gets its own QuickJS
//! runtime (made at the run's start, dropped with it), evaluates its bundle
//! there and drives the generator, one `next()` per resume.
//!
//! Why in the actor, not on a thread: a program's code between two yields is
//! short (it builds a tool call from the last result), so the generator runs
//! inside [`StepProgram::resume`], under the engine's time limit
//! ([`Limits::time`]): a runaway loop holds its actor's thread for at most
//! that long and then fails the run. A thread per program would cost a stack
//! and two channel hops per yield, and `resume` would still have to wait for
//! the answer, since the step machine takes the next [`Yield`] synchronously.
//! QuickJS' runtime is `Send` here (rquickjs' `parallel` feature: a lock
//! around it), so the program moves with its actor between the runtime's
//! worker threads; it is never shared.

use std::sync::Arc;

use arbor_actors::handler::{ProgramCall, Resume, StepHandler, StepProgram, Yield};
use arbor_actors::message::Message;
use arbor_actors::state::AgentState;
use rquickjs::{Function, Object};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::define::{EXTRACT, Program, namespace};
use crate::engine::{JsError, Limits, Sandbox};

/// The driver: starts the generator and turns each of its yields into JSON
/// the Rust side reads.
const DRIVER: &str = r#"(() => {
  let gen = null;
  const out = (r) => {
    if (r.done) return '{"kind":"done"}';
    const v = r.value;
    if (v === 'STEP') return '{"kind":"step"}';
    if (v === 'STEP_ALL') return '{"kind":"step_all"}';
    if (v !== null && typeof v === 'object') {
      if (v.type === 'STEP_TEXT') {
        if (typeof v.text !== 'string') throw new TypeError("a STEP_TEXT yield needs a string 'text'");
        return JSON.stringify({ kind: 'text', text: v.text });
      }
      if (typeof v.toolName === 'string') {
        return JSON.stringify({ kind: 'tool', name: v.toolName, input: v.input === undefined ? {} : v.input, include: v.includeToolCall !== false });
      }
    }
    let shown;
    try { shown = JSON.stringify(v); } catch (e) { shown = String(v); }
    throw new TypeError('handleSteps yielded ' + shown + ", which is not a tool call ({ toolName, input }), 'STEP', 'STEP_ALL' or { type: 'STEP_TEXT', text }");
  };
  const quiet = () => {};
  return {
    start(fn, context) {
      const ctx = JSON.parse(context);
      ctx.logger = { debug: quiet, info: quiet, warn: quiet, error: quiet };
      gen = fn(ctx);
      if (gen === null || typeof gen !== 'object' || typeof gen.next !== 'function') {
        throw new TypeError('handleSteps did not return a generator (write it as function* ...)');
      }
      return out(gen.next());
    },
    next(input) { return out(gen.next(JSON.parse(input))); },
  };
})()"#;

/// The name the driver is kept under in the program's global object.
const DRIVER_NAME: &str = "__arborDriver";

/// What the driver says a yield was.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Yielded {
    Done,
    Step,
    StepAll,
    Text {
        text: String,
    },
    Tool {
        name: String,
        input: Value,
        include: bool,
    },
}

/// A template's `handleSteps`: each run of the template is a fresh
/// [`JsProgram`] over the same bundle.
#[derive(Clone, Debug)]
pub struct JsHandler {
    program: Program,
    limits: Limits,
}

impl JsHandler {
    /// A handler running `program` under `limits`.
    pub fn new(program: Program, limits: Limits) -> Self {
        Self { program, limits }
    }
}

impl StepHandler for JsHandler {
    fn start(&self) -> Box<dyn StepProgram> {
        Box::new(JsProgram {
            bundle_program: self.program.clone(),
            limits: self.limits,
            sandbox: None,
        })
    }
}

/// One run of a `handleSteps` generator.
pub struct JsProgram {
    bundle_program: Program,
    limits: Limits,
    sandbox: Option<Sandbox>,
}

impl JsProgram {
    fn begin(
        &mut self,
        prompt: Option<&str>,
        params: Option<&Value>,
        state: &AgentState,
    ) -> Result<Yielded, JsError> {
        let sandbox = Sandbox::new(Arc::clone(&self.bundle_program.bundle), self.limits)?;
        let context = json!({
            "agentState": agent_state(state),
            "prompt": prompt,
            "params": params,
        })
        .to_string();
        let bundle = Arc::clone(sandbox.bundle());
        let out = sandbox.run(|ctx| {
            let ns = namespace(ctx, &bundle)?;
            let extract: Function = ctx.eval(EXTRACT)?;
            let handle_steps: Function = extract.call((ns,))?;
            let driver: Object = ctx.eval(DRIVER)?;
            ctx.globals().set(DRIVER_NAME, driver.clone())?;
            let start: Function = driver.get("start")?;
            let out: String = start.call((handle_steps, context))?;
            Ok(out)
        });
        self.sandbox = Some(sandbox);
        decode(out?)
    }

    fn next(&mut self, input: Value) -> Result<Yielded, JsError> {
        let Some(sandbox) = &self.sandbox else {
            return Err(JsError::plain("resumed before it started"));
        };
        let input = input.to_string();
        let out = sandbox.run(|ctx| {
            let driver: Object = ctx.globals().get(DRIVER_NAME)?;
            let next: Function = driver.get("next")?;
            let out: String = next.call((input,))?;
            Ok(out)
        })?;
        decode(out)
    }

    /// The bytes its engine holds (0 before it starts).
    pub fn memory_used(&self) -> i64 {
        self.sandbox.as_ref().map_or(0, Sandbox::memory_used)
    }
}

fn decode(out: String) -> Result<Yielded, JsError> {
    serde_json::from_str(&out).map_err(|e| {
        JsError::plain(format!(
            "internal: the driver's answer is not understood: {e}"
        ))
    })
}

/// The agent's state as a program reads it (Codebuff's `AgentState`:
/// `agentId`, `parentId`, `messageHistory`, `output`, and Arbor's other
/// fields beside them).
fn agent_state(state: &AgentState) -> Value {
    let mut value = serde_json::to_value(state).unwrap_or(Value::Null);
    if let Some(fields) = value.as_object_mut() {
        // Codebuff's name for what is left of the step budget.
        fields.insert("stepsRemaining".into(), json!(state.steps_remaining));
        // The tool definitions and system prompt are the model's, not the program's.
        fields.remove("toolDefinitions");
        fields.remove("systemPrompt");
    }
    value
}

/// The results of a program's tool calls as Codebuff's `toolResult`: the
/// parts of every result (`[{ type: 'json', value }]`), in call order.
fn tool_result(results: &[Arc<Message>]) -> Value {
    let parts: Vec<Value> = results
        .iter()
        .flat_map(|m| match m.as_ref() {
            Message::Tool { content, .. } => content
                .iter()
                .map(|p| serde_json::to_value(p).unwrap_or(Value::Null))
                .collect(),
            other => vec![json!({"type": "json", "value": other.text()})],
        })
        .collect();
    Value::Array(parts)
}

impl StepProgram for JsProgram {
    fn resume(&mut self, input: Resume<'_>) -> Yield {
        let outcome = match input {
            Resume::Start {
                prompt,
                params,
                state,
            } => self.begin(prompt, params, state),
            Resume::ToolResults { results, state } => self.next(json!({
                "agentState": agent_state(state),
                "toolResult": tool_result(&results),
                "stepsComplete": false,
            })),
            Resume::StepsDone { state, turn_ended } => self.next(json!({
                // toolResult absent: `undefined` after a step, as in Codebuff.
                "agentState": agent_state(state),
                "stepsComplete": turn_ended,
            })),
        };
        match outcome {
            Ok(Yielded::Done) => {
                // The engine is freed as soon as the program ends.
                self.sandbox = None;
                Yield::Done
            }
            Ok(Yielded::Step) => Yield::Step,
            Ok(Yielded::StepAll) => Yield::StepAll,
            Ok(Yielded::Text { text }) => Yield::StepText(text),
            Ok(Yielded::Tool {
                name,
                input,
                include,
            }) => Yield::Calls(vec![ProgramCall {
                name,
                input,
                include_in_history: include,
            }]),
            Err(e) => {
                self.sandbox = None;
                let bundle = &self.bundle_program.bundle;
                Yield::Fail(match e.at {
                    Some((key, line)) => {
                        format!("handleSteps failed: {key}:{line}: {}", e.message)
                    }
                    None if bundle.modules.len() == 1 => {
                        format!("handleSteps failed: {}: {}", bundle.entry, e.message)
                    }
                    None => format!("handleSteps failed: {}", e.message),
                })
            }
        }
    }
}
