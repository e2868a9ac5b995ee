//! End-to-end tests: the real `arbor` binary in a temp dir, one test binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_files;
mod aimock;
mod anthropic_cache;
mod approvals_budgets;
mod approvals_cli;
mod approvals_restart;
mod approve_always;
mod background_restart;
mod budget_serve;
mod cli;
mod cli_truths;
mod codebuff_agents;
mod codebuff_spellings;
mod command_tools;
mod compaction;
mod config;
mod config_edges;
mod config_fuzz;
mod deltas;
mod durable_programs;
mod embedding;
mod fencing;
mod hands;
mod ids_and_memory;
mod input_bounds;
mod layers;
mod library;
mod live_view;
mod loadtest;
mod loadtest_report;
mod long_running;
mod mcp;
mod mcp_results;
mod openapi_client;
mod otel_export;
mod page_approvals;
mod page_turns;
mod principals;
mod programs;
mod provider_cooldown;
mod provider_faults;
mod provider_limits;
mod provider_options;
mod provider_quirks;
mod provider_secrets;
mod rate_limits;
mod replica_answers;
mod replicas;
mod responses_api;
mod same_errors;
mod secrets;
mod serve;
mod serve_limits;
mod store;
mod store_faults;
mod structured;
mod support;
mod telemetry;
mod tool_processes;
mod tools;
mod tools_e2e;
mod turn_prompts;
mod turn_queue;
mod turns_serve;
mod usage_totals;
mod wait;
mod waiting_children;
mod watch;
mod webhooks;
mod worktrees;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Runs `arbor` with `args` in an empty temp dir (so no ./config.toml is picked up).
pub fn arbor(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(args)
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// Runs `arbor` with `args` in `dir`.
pub fn arbor_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
