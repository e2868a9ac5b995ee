//! Loading Codebuff agent files and running their `handleSteps` in the
//! embedded engine: imports, type-only imports, errors with `file:line`,
//! the yields and what the generator is sent back, and the engine's limits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use arbor_actors::handler::{ProgramCall, Resume, StepHandler, Yield};
use arbor_actors::message::{Message, ToolCall};
use arbor_actors::state::AgentState;
use arbor_programs::{JsHandler, Limits, load_agent_file, load_program_file, program_from_source};
use serde_json::json;

fn dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (name, body) in files {
        let p = d.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }
    d
}

fn state() -> AgentState {
    let mut s = AgentState::of_run("t1/0".parse().unwrap());
    s.steps_remaining = 7;
    s
}

fn fast() -> Limits {
    Limits {
        time: Duration::from_millis(200),
        ..Limits::default()
    }
}

const TYPES: &str = "export interface AgentDefinition { id: string; handleSteps?: (c: any) => Generator<any, void, any> }\nexport type ToolCall = { toolName: string; input: any; includeToolCall?: boolean }\n";

#[test]
fn a_typescript_agent_with_imports_loads_as_json_and_a_program() {
    let d = dir(&[
        ("types/agent-definition.ts", TYPES),
        (
            "constants.ts",
            "export const publisher = 'me'\nexport const MODEL = 'anthropic/claude-4-sonnet-20250522'\n",
        ),
        (
            "lib/prompts.ts",
            "import { publisher } from '../constants'\nexport function intro(name: string): string { return `I am ${name} by ${publisher}` }\n",
        ),
        (
            "reviewer.ts",
            "import type { AgentDefinition, ToolCall } from './types/agent-definition'\nimport { publisher, MODEL } from './constants'\nimport { intro } from './lib/prompts'\n\nconst definition: AgentDefinition = {\n  id: 'reviewer',\n  publisher,\n  model: MODEL,\n  toolNames: ['read_files', 'set_output'] as string[],\n  systemPrompt: intro('reviewer'),\n  handleSteps: function* ({ params }) {\n    const { toolResult } = yield { toolName: 'read_files', input: { paths: params.paths } } satisfies ToolCall\n    yield { toolName: 'set_output', input: { read: toolResult } } satisfies ToolCall\n  },\n}\nexport default definition\n",
        ),
    ]);
    let file = load_agent_file(d.path(), &d.path().join("reviewer.ts"), fast()).unwrap();
    assert_eq!(
        file.definition,
        json!({
            "id": "reviewer",
            "publisher": "me",
            "model": "anthropic/claude-4-sonnet-20250522",
            "toolNames": ["read_files", "set_output"],
            "systemPrompt": "I am reviewer by me",
        })
    );
    let program = file.program.expect("handleSteps kept");
    // type-only imports never reached the bundle.
    let modules: Vec<&str> = program.bundle().modules().collect();
    assert_eq!(modules, ["constants.ts", "lib/prompts.ts", "reviewer.ts"]);
    assert!(
        file.field_lines.contains(&("handleSteps".to_string(), 11)),
        "{:?}",
        file.field_lines
    );
    assert!(
        file.field_lines.contains(&("model".to_string(), 8)),
        "{:?}",
        file.field_lines
    );
}

#[test]
fn a_json_agent_loads_and_a_string_handle_steps_is_a_program() {
    let d = dir(&[(
        "a.json",
        r#"{"id": "a", "model": "m", "handleSteps": "function* () { yield 'STEP_ALL' }"}"#,
    )]);
    let file = load_agent_file(d.path(), &d.path().join("a.json"), fast()).unwrap();
    assert_eq!(file.definition, json!({"id": "a", "model": "m"}));
    let mut run = JsHandler::new(file.program.unwrap(), fast()).start();
    let s = state();
    assert_eq!(
        run.resume(Resume::Start {
            prompt: None,
            params: None,
            state: &s
        }),
        Yield::StepAll
    );
}

#[test]
fn an_error_while_loading_names_the_source_line() {
    let d = dir(&[(
        "bad.ts",
        "type X = { a: number }\n\n\nconst x: X = { a: 1 }\nif (x.a === 1) {\n  throw new Error('no agent for you')\n}\nexport default { id: 'bad' }\n",
    )]);
    let err = load_agent_file(d.path(), &d.path().join("bad.ts"), fast()).unwrap_err();
    assert_eq!(err.line, Some(6), "{err}");
    assert!(
        err.to_string()
            .ends_with("bad.ts:6: Error: no agent for you"),
        "{err}"
    );
}

#[test]
fn a_default_export_that_is_not_a_definition_is_refused_by_name() {
    let d = dir(&[
        ("none.ts", "export const a = 1\n"),
        (
            "fn.ts",
            "export default { id: 'x', instructionsPrompt: () => 'dynamic' }\n",
        ),
    ]);
    let none = load_agent_file(d.path(), &d.path().join("none.ts"), fast()).unwrap_err();
    assert!(none.message.contains("no default export"), "{none}");
    let func = load_agent_file(d.path(), &d.path().join("fn.ts"), fast()).unwrap_err();
    assert!(
        func.message
            .contains("field 'instructionsPrompt' is a function"),
        "{func}"
    );
}

#[test]
fn a_runaway_loop_while_loading_is_stopped_by_the_time_limit() {
    let d = dir(&[(
        "spin.ts",
        "while (true) {}\nexport default { id: 'spin' }\n",
    )]);
    let started = std::time::Instant::now();
    let err = load_agent_file(d.path(), &d.path().join("spin.ts"), fast()).unwrap_err();
    assert!(
        err.message
            .contains("ran longer than its time limit of 200 ms"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_gigabyte_allocation_is_stopped_by_the_memory_limit() {
    let d = dir(&[(
        "big.ts",
        "const big = new Uint8Array(1024 * 1024 * 1024)\nexport default { id: 'big', n: big.length }\n",
    )]);
    let err = load_agent_file(d.path(), &d.path().join("big.ts"), fast()).unwrap_err();
    assert!(
        err.message.contains("exceeded its memory limit of 32 MiB"),
        "{err}"
    );
    // Growing piece by piece hits the same limit.
    let d = dir(&[(
        "grow.ts",
        "const kept: string[] = []\nwhile (true) { kept.push('x'.repeat(1 << 20) + kept.length) }\nexport default { id: 'grow' }\n",
    )]);
    let err = load_agent_file(d.path(), &d.path().join("grow.ts"), fast()).unwrap_err();
    assert!(err.message.contains("exceeded its memory limit"), "{err}");
}

#[test]
fn the_engine_has_no_file_network_or_process_access() {
    let d = dir(&[(
        "probe.ts",
        "const seen = [typeof require, typeof process, typeof fetch, typeof std, typeof os, typeof XMLHttpRequest, typeof Deno, typeof Bun]\nexport default { id: 'probe', seen }\n",
    )]);
    let file = load_agent_file(d.path(), &d.path().join("probe.ts"), fast()).unwrap();
    assert_eq!(file.definition["seen"], json!(vec!["undefined"; 8]));
    // Importing the engine's std module is a package import: refused.
    let d = dir(&[(
        "std.js",
        "import * as std from 'std'\nexport default { id: 'x', f: std.open }\n",
    )]);
    let err = load_agent_file(d.path(), &d.path().join("std.js"), fast()).unwrap_err();
    assert!(err.to_string().contains("std.js:1: import 'std'"), "{err}");
}

fn call(name: &str, id: &str) -> ToolCall {
    ToolCall {
        tool_call_id: id.into(),
        tool_name: name.into(),
        input: json!({}).into(),
    }
}

/// The file-explorer pattern: one spawn of N pickers from params, then
/// `set_output` of the spawn's result, then the end.
#[test]
fn the_file_explorer_program_spawns_from_params_and_sets_its_output() {
    let program = program_from_source(
        "explorer.js",
        r#"function* ({ prompt, params }) {
  const prompts = params?.prompts ?? []
  const { toolResult: spawnResult } = yield {
    toolName: 'spawn_agents',
    input: { agents: prompts.map((p) => ({ agent_type: 'file-picker', prompt: `${prompt}: ${p}` })) },
  }
  yield { toolName: 'set_output', input: { results: spawnResult } }
}"#,
    );
    let mut run = JsHandler::new(program, fast()).start();
    let s = state();
    let params = json!({"prompts": ["auth", "db"]});
    let first = run.resume(Resume::Start {
        prompt: Some("find"),
        params: Some(&params),
        state: &s,
    });
    assert_eq!(
        first,
        Yield::Calls(vec![ProgramCall::new(
            "spawn_agents",
            json!({"agents": [
                {"agent_type": "file-picker", "prompt": "find: auth"},
                {"agent_type": "file-picker", "prompt": "find: db"},
            ]})
        )])
    );
    let spawned = Message::tool_result(
        &call("spawn_agents", "c1"),
        json!([{"agentType": "file-picker", "value": "a.rs"}]),
    );
    let second = run.resume(Resume::ToolResults {
        results: vec![Arc::new(spawned)],
        state: &s,
    });
    assert_eq!(
        second,
        Yield::Calls(vec![ProgramCall::new(
            "set_output",
            json!({"results": [{"type": "json", "value": [{"agentType": "file-picker", "value": "a.rs"}]}]})
        )])
    );
    let ok = Message::tool_result(&call("set_output", "c2"), json!({"ok": true}));
    assert_eq!(
        run.resume(Resume::ToolResults {
            results: vec![Arc::new(ok)],
            state: &s
        }),
        Yield::Done
    );
}

#[test]
fn steps_text_hidden_calls_and_what_the_generator_is_sent() {
    let program = program_from_source(
        "p.js",
        r#"function* ({ agentState }) {
  const first = yield 'STEP'
  yield { type: 'STEP_TEXT', text: 'steps complete: ' + first.stepsComplete + ', toolResult ' + typeof first.toolResult + ', left ' + agentState.stepsRemaining }
  const { agentState: after } = yield 'STEP_ALL'
  yield { toolName: 'set_messages', input: { messages: after.messageHistory }, includeToolCall: false }
}"#,
    );
    let mut run = JsHandler::new(program, fast()).start();
    let mut s = state();
    assert_eq!(
        run.resume(Resume::Start {
            prompt: None,
            params: None,
            state: &s
        }),
        Yield::Step
    );
    assert_eq!(
        run.resume(Resume::StepsDone {
            state: &s,
            turn_ended: false
        }),
        Yield::StepText("steps complete: false, toolResult undefined, left 7".into())
    );
    assert_eq!(
        run.resume(Resume::StepsDone {
            state: &s,
            turn_ended: false
        }),
        Yield::StepAll
    );
    s.message_history.push(Message::user("hi"));
    let Yield::Calls(calls) = run.resume(Resume::StepsDone {
        state: &s,
        turn_ended: true,
    }) else {
        panic!("no call");
    };
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "set_messages");
    assert!(!calls[0].include_in_history);
    assert_eq!(calls[0].input["messages"][0]["role"], "user");
}

#[test]
fn a_program_error_names_its_line_and_a_bad_yield_what_it_was() {
    let d = dir(&[(
        "p.ts",
        "type T = number\n\nexport default {\n  id: 'p',\n  handleSteps: function* () {\n    const n: T = 1\n    yield 'STEP'\n    throw new RangeError('bad step ' + n)\n  },\n}\n",
    )]);
    let file = load_agent_file(d.path(), &d.path().join("p.ts"), fast()).unwrap();
    let mut run = JsHandler::new(file.program.unwrap(), fast()).start();
    let s = state();
    assert_eq!(
        run.resume(Resume::Start {
            prompt: None,
            params: None,
            state: &s
        }),
        Yield::Step
    );
    let Yield::Fail(why) = run.resume(Resume::StepsDone {
        state: &s,
        turn_ended: false,
    }) else {
        panic!("did not fail");
    };
    assert_eq!(why, "handleSteps failed: p.ts:8: RangeError: bad step 1");

    let mut run = JsHandler::new(
        program_from_source("q.js", "function* () { yield 42 }"),
        fast(),
    )
    .start();
    let Yield::Fail(why) = run.resume(Resume::Start {
        prompt: None,
        params: None,
        state: &s,
    }) else {
        panic!("did not fail");
    };
    assert!(
        why.contains("yielded 42, which is not a tool call"),
        "{why}"
    );
}

#[test]
fn a_runaway_program_fails_its_run_within_the_time_limit() {
    let program = program_from_source(
        "spin.js",
        "function* () {\n  yield 'STEP'\n  while (true) {}\n}",
    );
    let mut run = JsHandler::new(program, fast()).start();
    let s = state();
    assert_eq!(
        run.resume(Resume::Start {
            prompt: None,
            params: None,
            state: &s
        }),
        Yield::Step
    );
    let started = std::time::Instant::now();
    let Yield::Fail(why) = run.resume(Resume::StepsDone {
        state: &s,
        turn_ended: false,
    }) else {
        panic!("did not fail");
    };
    assert!(
        why.contains("ran longer than its time limit of 200 ms without yielding"),
        "{why}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let big = program_from_source(
        "big.js",
        "function* () {\n  const a = []\n  for (;;) a.push(new Array(1e6).fill(1))\n}",
    );
    let Yield::Fail(why) = JsHandler::new(big, fast()).start().resume(Resume::Start {
        prompt: None,
        params: None,
        state: &s,
    }) else {
        panic!("did not fail");
    };
    assert!(why.contains("exceeded its memory limit of 32 MiB"), "{why}");
}

#[test]
fn a_program_file_may_export_the_generator_itself() {
    let d = dir(&[
        (
            "helpers.ts",
            "export const fanOut = (n: number) => Array.from({ length: n }, (_, i) => ({ agent_type: 'worker', prompt: `part ${i}` }))\n",
        ),
        (
            "fan-out.ts",
            "import { fanOut } from './helpers'\nexport default function* ({ params }: { params: { n: number } }) {\n  yield { toolName: 'spawn_agents', input: { agents: fanOut(params.n) } }\n}\n",
        ),
    ]);
    let program = load_program_file(d.path(), &d.path().join("fan-out.ts"), fast()).unwrap();
    let s = state();
    let params = json!({"n": 2});
    let Yield::Calls(calls) = JsHandler::new(program, fast())
        .start()
        .resume(Resume::Start {
            prompt: None,
            params: Some(&params),
            state: &s,
        })
    else {
        panic!("no call");
    };
    assert_eq!(calls[0].input["agents"][1]["prompt"], "part 1");
    let none = dir(&[("x.ts", "export const y = 1\n")]);
    let err = load_program_file(none.path(), &none.path().join("x.ts"), fast()).unwrap_err();
    assert!(err.message.contains("exports no handleSteps"), "{err}");
}

/// The program of `draws_are_recorded_and_drawn_again`: random numbers
/// and clock readings at its module's top level and between yields.
const DRAWS: &str = r#"const atLoad = Math.random()
export default function* () {
  const a = Math.random()
  const t = Date.now()
  yield { toolName: 'x', input: { atLoad, a, t, d: new Date().getTime(), isDate: new Date() instanceof Date } }
  yield { toolName: 'y', input: { b: Math.random(), t: Date.now(), parsed: new Date(0).getTime() } }
}
"#;

/// Runs `DRAWS` to its second yield, each resume given what `redraw` holds
/// for it first; its yields and what it drew at each.
fn draws(redraw: &[Option<serde_json::Value>]) -> Vec<(Yield, Option<serde_json::Value>)> {
    let d = dir(&[("draws.js", DRAWS)]);
    let program = load_program_file(d.path(), &d.path().join("draws.js"), fast()).unwrap();
    let mut run = JsHandler::new(program, fast()).start();
    let s = state();
    let mut out = Vec::new();
    for (i, again) in redraw.iter().enumerate() {
        if let Some(again) = again {
            run.redraw(again.clone());
        }
        let y = if i == 0 {
            run.resume(Resume::Start {
                prompt: None,
                params: None,
                state: &s,
            })
        } else {
            run.resume(Resume::ToolResults {
                results: Vec::new(),
                state: &s,
            })
        };
        out.push((y, run.drawn()));
        // Time goes on between the two lives.
        std::thread::sleep(Duration::from_millis(5));
    }
    out
}

#[test]
fn draws_are_recorded_and_drawn_again() {
    let first = draws(&[None, None]);
    let (Yield::Calls(one), Some(drawn)) = &first[0] else {
        panic!("{first:?}");
    };
    // The seed (once) and every clock reading of the resume.
    assert!(drawn["seed"].is_i64(), "{drawn}");
    let clock = drawn["clock"].as_array().unwrap();
    // Date.now(), then two new Date()s.
    assert_eq!(clock.len(), 3, "{drawn}");
    assert_eq!(one[0].input["t"], clock[0]);
    assert_eq!(one[0].input["d"], clock[1]);
    assert_eq!(one[0].input["isDate"], true);
    let second_drawn = first[1].1.clone().unwrap();
    assert!(second_drawn.get("seed").is_none(), "{second_drawn}");
    assert_eq!(second_drawn["clock"].as_array().unwrap().len(), 1);
    // Another life, given back what the first drew: the same yields.
    let again = draws(&[first[0].1.clone(), first[1].1.clone()]);
    assert_eq!(again[0].0, first[0].0);
    assert_eq!(again[1].0, first[1].0);
    // A life of its own draws anew.
    let other = draws(&[None, None]);
    assert_ne!(other[0].0, first[0].0);
    let Yield::Calls(two) = &first[1].0 else {
        panic!("{first:?}");
    };
    assert_eq!(two[0].input["parsed"], 0);
    let b = two[0].input["b"].as_f64().unwrap();
    assert!((0.0..1.0).contains(&b), "{b}");
}
