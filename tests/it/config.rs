//! `arbor check-config`: every problem with its file, line and key; exit code 2.

use crate::{arbor, fixtures, text};

fn check(file: &str) -> (Option<i32>, String) {
    let path = fixtures().join("bad").join(file);
    let out = arbor(&["check-config", path.to_str().unwrap()]);
    (out.status.code(), text(&out.stderr))
}

#[test]
fn the_shipped_config_is_valid() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml");
    let out = arbor(&["check-config", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("ok (1 models, 3 agents)"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn a_wrong_type_names_file_line_key_and_problem() {
    let (code, err) = check("wrong_type.toml");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("wrong_type.toml:6: agents.lead.max_steps: invalid type: string \"many\""),
        "{err}"
    );
}

#[test]
fn an_unknown_model_is_named() {
    let (code, err) = check("unknown_model.toml");
    assert_eq!(code, Some(2));
    assert!(
        err.contains(
            "unknown_model.toml:5: agents.lead.model: unknown model \"gpt-9\" (configured: sim)"
        ),
        "{err}"
    );
}

#[test]
fn spawning_a_missing_agent_is_named() {
    let (code, err) = check("missing_spawn.toml");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("missing_spawn.toml:6: agents.lead.spawnable_agents: spawns \"ghost\""),
        "{err}"
    );
}

#[test]
fn a_cycle_without_max_depth_is_refused() {
    let (code, err) = check("cycle.toml");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("spawn cycle a -> b -> a with no limits.max_depth"),
        "{err}"
    );
}

#[test]
fn a_syntax_error_names_the_line() {
    let (code, err) = check("syntax.toml");
    assert_eq!(code, Some(2));
    assert!(err.contains("syntax.toml:1: (syntax):"), "{err}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let (code, err) = check("many.toml");
    assert_eq!(code, Some(2));
    for needle in [
        "many.toml:2: limits.deadline: duration \"soon\"",
        "many.toml:6: models.sim.latency",
        "many.toml:9: agents.lead.model: unknown model \"nope\"",
        "many.toml:10: agents.lead.failure: unknown policy \"shrug\"",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let out = arbor(&["check-config", "does-not-exist.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("does-not-exist.toml: (file): cannot read"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn every_bad_service_key_is_named_with_its_line() {
    let (code, err) = check("service.toml");
    assert_eq!(code, Some(2));
    for line in [
        "service.toml:3: service.bind: \"localhost\" is not an address like 127.0.0.1:8080",
        "service.toml:4: service.body_limit: must be at least 1024 bytes",
        "service.toml:5: service.shutdown_timeout: duration \"soon\"",
        "service.toml:6: service.max_running_trees: must be at least 1",
        "service.toml:7: service.otlp_endpoint: \"collector:4318\" is not an http(s) URL",
        "service.toml:8: service.tokens_env: must name an environment variable",
    ] {
        assert!(err.contains(line), "{line}\n{err}");
    }
}

#[test]
fn a_problem_under_a_quoted_table_header_has_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quoted.toml");
    std::fs::write(
        &path,
        "[models.m]\nprovider = \"simulated\"\n\n[agents.\"acme/writer@1.2\"]\nmodel = \"gpt-9\"\n",
    )
    .unwrap();
    let out = arbor(&["check-config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("quoted.toml:5: agents.acme/writer@1.2.model: unknown model \"gpt-9\""),
        "{err}"
    );
}
