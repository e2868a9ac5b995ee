//! Helpers shared by the integration tests of Arbor's crates (a
//! dev-dependency only, never published): the echo tool, scripted models and
//! the script entries they replay, and, with the `supervisor` feature (on by
//! default), catalogs, supervisors and tree runners that wait with a bound.
//!
//! Helpers that need the product itself (its binary, config files, HTTP
//! fakes) live in the root package's `tests/it/support`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod script;
mod tools;
#[cfg(feature = "supervisor")]
mod tree;

pub use script::{MODEL, call, scripted, scripted_as, spawn_call, template};
pub use tools::{Echo, echo, with_echo};
#[cfg(feature = "supervisor")]
pub use tree::{
    GUARD, catalog, drain, finish, request, run, run_request, start, supervisor, supervisor_with,
    wait_for, within,
};
