//! Built-in models that need no network: `scripted` (replies from a file, for
//! tests and demos) and `simulated` (a procedural tree for demos and load).

pub mod scripted;
mod simulated;

pub use scripted::{ScriptError, ScriptedModel};
pub use simulated::{
    ALIVE_AGENT_BYTES, Latency, SimulatedConfig, SimulatedModel, WAITING_CHILD_BYTES,
};
