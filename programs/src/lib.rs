//! Programmatic agents in JavaScript and TypeScript for Arbor.
//!
//! - [`load_agent_file`] reads a Codebuff agent file (`.ts`, `.js`, `.json`):
//!   TypeScript's types are stripped with oxc, the module is evaluated in an
//!   embedded QuickJS engine with its relative imports resolved inside the
//!   agents directory (type-only imports dropped, a package import an error
//!   naming it and its `file:line`), and its default export comes out as
//!   JSON plus its `handleSteps`, kept as a [`Program`].
//! - [`JsHandler`] runs a [`Program`] as an Arbor [`StepHandler`]
//!   (semantics §4.5): the generator gets `{ agentState, prompt, params }`,
//!   yields tool calls (`{ toolName, input, includeToolCall }`), `'STEP'`,
//!   `'STEP_ALL'` or `{ type: 'STEP_TEXT', text }`, and is sent
//!   `{ agentState, toolResult, stepsComplete }`.
//!
//! The engine has no file, network or process access (no `std` or `os`
//! module), and each program has [`Limits`]: memory, stack and the time from
//! one yield to the next.
//!
//! [`StepHandler`]: arbor_actors::handler::StepHandler
#![deny(missing_docs)]

mod define;
mod engine;
mod load;
mod program;
mod redact;
mod strip;

pub use define::{
    AgentFile, Program, load_agent_bundle, load_agent_file, load_program_file, program_from_source,
};
pub use engine::Limits;
pub use load::{Bundle, LoadError, MAX_FILE_BYTES, MAX_MODULES, bundle, bundle_from};
pub use program::{JsHandler, JsProgram};
pub use redact::replace_strings;
