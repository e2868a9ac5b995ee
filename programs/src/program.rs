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
  // What differs from run to run is drawn here and recorded (issue 37): the
  // seed of Math.random, drawn once, and every clock reading (Date.now(),
  // new Date()); a resumed run is given them back (redraw) and reads the
  // same.
  const RealDate = Date;
  const realNow = RealDate.now;
  let seed = 0;
  let seedDrawn = false;
  let readings = [];
  let replayed = [];
  const now = () => {
    const v = replayed.length > 0 ? replayed.shift() : realNow();
    readings.push(v);
    return v;
  };
  let state = 0;
  const random = () => {
    state = (state + 0x6D2B79F5) | 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  function ArborDate(...args) {
    if (!new.target) return new RealDate(now()).toString();
    return args.length === 0 ? new RealDate(now()) : new RealDate(...args);
  }
  ArborDate.prototype = RealDate.prototype;
  ArborDate.now = now;
  ArborDate.parse = RealDate.parse;
  ArborDate.UTC = RealDate.UTC;
  const redraw = (text) => {
    const r = text ? JSON.parse(text) : null;
    replayed = r !== null && Array.isArray(r.clock) ? r.clock.slice() : [];
    return r;
  };
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
    install(fresh, redrawn) {
      const r = redraw(redrawn);
      seed = r !== null && typeof r.seed === 'number' ? r.seed : fresh;
      seedDrawn = true;
      state = seed | 0;
      Math.random = random;
      globalThis.Date = ArborDate;
    },
    redraw,
    drawn() {
      const d = {};
      if (seedDrawn) { d.seed = seed; seedDrawn = false; }
      if (readings.length > 0) { d.clock = readings; readings = []; }
      replayed = [];
      return Object.keys(d).length > 0 ? JSON.stringify(d) : '';
    },
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
            redrawn: None,
            drawn: None,
        })
    }
}

/// One run of a `handleSteps` generator.
pub struct JsProgram {
    bundle_program: Program,
    limits: Limits,
    sandbox: Option<Sandbox>,
    /// What the next resume draws again (a resumed or replayed run).
    redrawn: Option<String>,
    /// What the last resume drew.
    drawn: Option<Value>,
}

/// A seed for `Math.random` that differs from run to run (it is recorded,
/// so a resumed or replayed run draws the same numbers).
fn fresh_seed() -> i32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};
    static RUNS: AtomicU32 = AtomicU32::new(0);
    let time = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    time.wrapping_add(run.wrapping_mul(0x9E37_79B9)) as i32
}

/// What the driver says was drawn ('' for nothing).
fn drawn_value(text: &str) -> Option<Value> {
    (!text.is_empty())
        .then(|| serde_json::from_str(text).ok())
        .flatten()
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
        let redrawn = self.redrawn.take().unwrap_or_default();
        let out = sandbox.run(|ctx| {
            // Installed before the module runs: its top level may draw too.
            let driver: Object = ctx.eval(DRIVER)?;
            ctx.globals().set(DRIVER_NAME, driver.clone())?;
            let install: Function = driver.get("install")?;
            install.call::<_, ()>((fresh_seed(), redrawn))?;
            let ns = namespace(ctx, &bundle)?;
            let extract: Function = ctx.eval(EXTRACT)?;
            let handle_steps: Function = extract.call((ns,))?;
            let start: Function = driver.get("start")?;
            let out: String = start.call((handle_steps, context))?;
            let drawn: Function = driver.get("drawn")?;
            let drawn: String = drawn.call(())?;
            Ok((out, drawn))
        });
        self.sandbox = Some(sandbox);
        let (out, drawn) = out?;
        self.drawn = drawn_value(&drawn);
        decode(out)
    }

    fn next(&mut self, input: Value) -> Result<Yielded, JsError> {
        let Some(sandbox) = &self.sandbox else {
            return Err(JsError::plain("resumed before it started"));
        };
        let input = input.to_string();
        let redrawn = self.redrawn.take();
        let (out, drawn) = sandbox.run(|ctx| {
            let driver: Object = ctx.globals().get(DRIVER_NAME)?;
            if let Some(redrawn) = redrawn {
                let redraw: Function = driver.get("redraw")?;
                redraw.call::<_, ()>((redrawn,))?;
            }
            let next: Function = driver.get("next")?;
            let out: String = next.call((input,))?;
            let drawn: Function = driver.get("drawn")?;
            let drawn: String = drawn.call(())?;
            Ok((out, drawn))
        })?;
        self.drawn = drawn_value(&drawn);
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
    fn drawn(&mut self) -> Option<Value> {
        self.drawn.take()
    }

    fn redraw(&mut self, drawn: Value) {
        self.redrawn = Some(drawn.to_string());
    }

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
