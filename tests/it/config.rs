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

/// `check-config` on `text` (written to a temp file): exit code and stderr.
fn check_text(config: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, config).unwrap();
    let out = arbor(&["check-config", path.to_str().unwrap()]);
    (out.status.code(), text(&out.stderr))
}

/// Issue 34: the 10^8-agent tree passed check-config and aborted on
/// allocation; with a live cap it runs in the memory of its cap (its
/// estimate, ~3 GB, fits any machine that runs the tests), without one it is
/// refused.
#[test]
fn the_hundred_million_agent_tree_passes_check_config_only_with_a_live_cap() {
    let sim = "[models.sim]\nprovider = \"simulated\"\nshape = [9999, 9999]\n\n\
               [agents.lead]\nmodel = \"sim\"\n";
    let (code, err) = check_text(&format!("[limits]\nmax_live_agents = 1000\n\n{sim}"));
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = check_text(sim);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("models.sim.shape: makes a tree that holds about ")
            && err.contains("more than the"),
        "{err}"
    );
    // A cap that lets its 10^4 parents all step holds 10^8 waiting children.
    let (code, err) = check_text(&format!("[limits]\nmax_live_agents = 1000000\n\n{sim}"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("1000000 agents stepping at once"), "{err}");
}

#[test]
fn values_that_panicked_aborted_or_hung_at_run_time_are_refused_with_key_and_line() {
    // Each was accepted by check-config and then panicked, aborted on
    // allocation, hung, or silently misbehaved in `arbor run`.
    let cases: &[(&str, &str, &str)] = &[
        (
            "latency = \"lognormal:1s,1000\"",
            "models.sim.latency",
            "sigma",
        ),
        (
            "latency = \"lognormal:1s,nan\"",
            "models.sim.latency",
            "sigma",
        ),
        (
            "latency = \"lognormal:1s,inf\"",
            "models.sim.latency",
            "sigma",
        ),
        (
            "latency = \"lognormal:1ms,50\"",
            "models.sim.latency",
            "sigma must be from 0 to 3",
        ),
        (
            "latency = \"99999999999999999999ms\"",
            "models.sim.latency",
            "too big",
        ),
        ("latency = \"2h\"", "models.sim.latency", "at most 1h"),
        ("fanout = 1000000", "models.sim.fanout", "out of range"),
        // Refused without building the 32 GiB shape it names.
        ("depth = 4294967296", "models.sim.depth", "out of range"),
        (
            "reply_tokens = 100000000",
            "models.sim.reply_tokens",
            "out of range",
        ),
        (
            "reply_tokens = 4294967296",
            "models.sim.reply_tokens",
            "out of range",
        ),
        ("fanout = -3", "models.sim.fanout", "invalid value"),
        (
            "depth = 50\nfanout = 10",
            "models.sim.fanout",
            "agents: at most",
        ),
        // Issue 34: inside the bound of 10^8 agents, and with no live cap
        // every one is alive at once (it aborted on allocation at 8 GB).
        (
            "depth = 2\nfanout = 9999",
            "models.sim.fanout",
            "at its peak (with no live cap every agent is alive at once)",
        ),
    ];
    for (line, key, why) in cases {
        let config = format!(
            "[models.sim]\nprovider = \"simulated\"\n{line}\n\n[agents.lead]\nmodel = \"sim\"\n"
        );
        let (code, err) = check_text(&config);
        assert_eq!(code, Some(2), "{line}: {err}");
        // The tree-size case names fanout, on the line after its depth.
        let wanted_line = if line.contains('\n') { 4 } else { 3 };
        assert!(
            err.contains(&format!("c.toml:{wanted_line}: {key}: ")) && err.contains(why),
            "{line}: {err}"
        );
    }
    let limits: &[(&str, &str)] = &[
        ("max_credits = -1.0", "limits.max_credits"),
        ("max_credits = nan", "limits.max_credits"),
        ("max_agents = 0", "limits.max_agents"),
        ("max_live_agents = 0", "limits.max_live_agents"),
        ("deadline = \"0\"", "limits.deadline"),
    ];
    for (line, key) in limits {
        let config = format!(
            "[limits]\n{line}\n\n[models.sim]\nprovider = \"simulated\"\n\n[agents.lead]\nmodel = \"sim\"\n"
        );
        let (code, err) = check_text(&config);
        assert_eq!(code, Some(2), "{line}: {err}");
        assert!(err.contains(&format!("c.toml:2: {key}: ")), "{line}: {err}");
    }
    let http = "[models.m]\nprovider = \"openai\"\nmodel = \"x\"\nbase_url = \"http://127.0.0.1:9\"\ntimeouts = { connect = \"0\" }\n\n[agents.lead]\nmodel = \"m\"\n";
    let (code, err) = check_text(http);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("c.toml:5: models.m.timeouts.connect: must be at least 1ms"),
        "{err}"
    );
    let store = "[store]\npath = \"\"\n\n[models.sim]\nprovider = \"simulated\"\n\n[agents.lead]\nmodel = \"sim\"\n";
    let (code, err) = check_text(store);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("c.toml:2: store.path: must name a file"),
        "{err}"
    );
}

#[test]
fn check_config_reports_every_wrong_value_of_a_file_in_file_order() {
    let config = "\
[limits]
max_depth = \"deep\"

[models.sim]
provider = \"simulated\"
fanout = -3
depth = \"two\"

[agents.lead]
model = \"sim\"
max_steps = \"many\"
context_window = 10
";
    let (code, err) = check_text(config);
    assert_eq!(code, Some(2), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("c.toml:")).collect();
    let keys: Vec<String> = lines
        .iter()
        .map(|l| l.split(": ").nth(1).unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        keys,
        [
            "limits.max_depth",
            "models.sim.fanout",
            "models.sim.depth",
            "agents.lead.max_steps",
            "agents.lead.context_window",
        ],
        "{err}"
    );
    for (line, n) in lines.iter().zip([2, 6, 7, 11, 12]) {
        assert!(line.contains(&format!("c.toml:{n}: ")), "{err}");
    }
}

#[test]
fn one_duration_grammar_reads_combined_units_and_days_everywhere() {
    // Config keys, the simulated model's latency and `gc --older-than`:
    // combined units, spelled-out units and fractional days (24 hours each).
    let config = "[limits]\ndeadline = \"1.5d\"\n\n[models.sim]\nprovider = \"simulated\"\nlatency = \"0.000001d\"\n\n[agents.lead]\nmodel = \"sim\"\nstep_timeout = \"0.5 days\"\napproval_timeout = \"1h30m\"\nidle_timeout = \"2 minutes\"\n";
    let (code, err) = check_text(config);
    assert_eq!(code, Some(0), "{err}");
    // The latency's range (at most 1h) refuses a day and a half, not the grammar.
    let (code, err) = check_text(&config.replace("0.000001d", "1.5d"));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("c.toml:6: models.sim.latency: ") && err.contains("at most 1h"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let out = crate::arbor_in(dir.path(), &["run", "--quiet", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The tree just ended, so every age of an hour or more keeps it.
    for age in [
        "1.5h", "30 days", "1d12h", "1.5d", "0.5 days", "1.5w", "500ms",
    ] {
        let out = crate::arbor_in(dir.path(), &["gc", "--older-than", age]);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success() && (age == "500ms" || stdout.contains("removed 0 trees")),
            "--older-than {age}: {stdout}{}",
            text(&out.stderr)
        );
    }
    // What the grammar does not know is still refused, with its text.
    let out = crate::arbor_in(dir.path(), &["gc", "--older-than", "1.5 fortnights"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("1.5 fortnights"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_bad_report_share_or_loop_detection_is_refused_by_name() {
    let base = "[models.sim]\nprovider = \"simulated\"\n\n[agents.lead]\nmodel = \"sim\"\n";
    let cases = [
        ("report_share = 0.0", "agents.lead.report_share", "(0, 1]"),
        ("report_share = 1.5", "agents.lead.report_share", "(0, 1]"),
        (
            "loop_detection = { warn_after = 5, fail_after = 3 }",
            "agents.lead.loop_detection",
            "warn_after (5) must be below fail_after (3)",
        ),
        (
            "loop_detection = { fail_after = 100000 }",
            "agents.lead.loop_detection",
            "fail_after: 100000 is out of range",
        ),
        (
            "loop_detection = { warn_afterr = 2 }",
            "warn_afterr",
            "unknown field",
        ),
    ];
    for (line, key, why) in cases {
        let (code, err) = check_text(&format!("{base}{line}\n"));
        assert_eq!(code, Some(2), "{line}: {err}");
        assert!(err.contains(key) && err.contains(why), "{line}: {err}");
        assert!(err.contains("c.toml:6"), "{line}: {err}");
    }
    let fine = "report_share = 1.0\nloop_detection = { warn_after = 0, fail_after = 4 }\n";
    let (code, err) = check_text(&format!("{base}{fine}"));
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_compact_at_share_without_a_context_window_is_refused_naming_the_agent() {
    let base = "[models.sim]\nprovider = \"simulated\"\n\n[agents.lead]\nmodel = \"sim\"\n";
    let cases = [
        ("compact_at = 0.8", "agents.lead.compact_at", "does not set"),
        ("compact_at = 1.5", "agents.lead.compact_at", "(0, 1]"),
        ("compact_at = 100", "agents.lead.compact_at", "out of range"),
        (
            "context_window = 1000\ncompact_at = 5000",
            "agents.lead.compact_at",
            "over context_window (1000)",
        ),
        (
            "compact_keep = 2",
            "agents.lead.compact_keep",
            "only with compact_at",
        ),
        (
            "compact_at = 60000\ncompact_prompt = \" \"",
            "agents.lead.compact_prompt",
            "is empty",
        ),
        (
            "compact_at = 60000\ncompact_keep = 0",
            "agents.lead.compact_keep",
            "out of range",
        ),
    ];
    for (lines, key, why) in cases {
        let (code, err) = check_text(&format!("{base}{lines}\n"));
        assert_eq!(code, Some(2), "{lines}: {err}");
        assert!(err.contains(key) && err.contains(why), "{lines}: {err}");
        assert!(err.contains("c.toml:"), "{lines}: {err}");
    }
    for fine in [
        "context_window = 100000\ncompact_at = 0.8\ncompact_keep = 1\n",
        "compact_at = 60000\ncompact_prompt = \"Sum up.\"\n",
    ] {
        let (code, err) = check_text(&format!("{base}{fine}"));
        assert_eq!(code, Some(0), "{fine}: {err}");
    }
}

#[test]
fn an_idle_timeout_is_a_duration_of_1ms_to_1d_named_with_its_line() {
    let base = "[models.sim]\nprovider = \"simulated\"\n\n[agents.lead]\nmodel = \"sim\"\n";
    for bad in ["\"0s\"", "\"2d\"", "\"soon\"", "30"] {
        let (code, err) = check_text(&format!("{base}idle_timeout = {bad}\n"));
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(err.contains("agents.lead.idle_timeout"), "{bad}: {err}");
        assert!(err.contains("c.toml:6"), "{bad}: {err}");
    }
    let (code, err) = check_text(&format!("{base}idle_timeout = \"30s\"\n"));
    assert_eq!(code, Some(0), "{err}");
}

/// An Anthropic model with extended thinking on, then `rest` (more of its
/// options, and agents on it).
fn thinking_config(model_options: &str, rest: &str) -> String {
    format!(
        "[models.an]\nprovider = \"anthropic\"\nmodel = \"claude-sonnet-4-5\"\nbase_url = \"http://127.0.0.1:9\"\n\
         options = {{ reasoning = {{ budget_tokens = 2048 }}{model_options} }}\n\n\
         [agents.a]\nmodel = \"an\"\n{rest}\n"
    )
}

#[test]
fn settings_anthropic_refuses_with_extended_thinking_are_refused_by_key_and_line() {
    // Each was accepted by check-config and then failed the run's first
    // request with a 400.
    let on_model = "with extended thinking on (models.an.options.reasoning.budget_tokens = 2048)";
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            ", tool_choice = \"required\"",
            "",
            "c.toml:5: models.an.options.tool_choice: \"required\" forces a tool call",
            "Anthropic refuses a forced tool when thinking is on (use \"auto\" or \"none\")",
        ),
        (
            "",
            "model_options = { tool_choice = \"read_file\" }",
            "c.toml:9: agents.a.model_options.tool_choice: \"read_file\" (a tool it must call) forces a tool call",
            "Anthropic refuses a forced tool",
        ),
        (
            ", temperature = 0.5",
            "",
            "c.toml:5: models.an.options.temperature: 0.5",
            "Anthropic accepts only temperature 1 (or none) when thinking is on",
        ),
        (
            "",
            "model_options = { temperature = 0.0 }",
            "c.toml:9: agents.a.model_options.temperature: 0",
            "only temperature 1",
        ),
        (
            ", top_p = 0.9",
            "",
            "c.toml:5: models.an.options.top_p: 0.9",
            "Anthropic accepts top_p only from 0.95 to 1 when thinking is on",
        ),
        (
            ", extra_body = { top_k = 40 }",
            "",
            "c.toml:5: models.an.options.extra_body.top_k: 40",
            "Anthropic refuses top_k when thinking is on",
        ),
        (
            "",
            "model_options = { extra_body = { tool_choice = { type = \"any\" } } }",
            "c.toml:9: agents.a.model_options.extra_body.tool_choice: {\"type\":\"any\"} forces a tool call",
            "refuses a forced tool",
        ),
    ];
    for (model_options, agent, wanted, rule) in cases {
        let (code, err) = check_text(&thinking_config(model_options, agent));
        assert_eq!(code, Some(2), "{model_options}{agent}: {err}");
        assert!(err.contains(wanted), "{model_options}{agent}: {err}");
        assert!(err.contains(on_model), "{model_options}{agent}: {err}");
        assert!(err.contains(rule), "{model_options}{agent}: {err}");
        // One problem, even though the agent runs the model's options too.
        assert_eq!(
            err.lines().filter(|l| l.contains("c.toml:")).count(),
            1,
            "{model_options}{agent}: {err}"
        );
    }
}

#[test]
fn thinking_turned_on_by_an_agent_is_checked_against_its_models_options() {
    let config = "[models.an]\nprovider = \"anthropic\"\nmodel = \"claude-sonnet-4-5\"\nbase_url = \"http://127.0.0.1:9\"\n\
                  options = { temperature = 0.2 }\n\n\
                  [agents.cool]\nmodel = \"an\"\n\n\
                  [agents.thinker]\nmodel = \"an\"\nmodel_options = { reasoning = { budget_tokens = 4096 } }\n";
    let (code, err) = check_text(config);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(
            "c.toml:5: models.an.options.temperature: 0.2 with extended thinking on \
             (agents.thinker.model_options.reasoning.budget_tokens = 4096)"
        ),
        "{err}"
    );
    // The agent without thinking is not the problem.
    assert!(!err.contains("agents.cool"), "{err}");
    // An agent's own temperature 1 makes its combination fine.
    let fixed = config.replace(
        "budget_tokens = 4096 } }",
        "budget_tokens = 4096 }, temperature = 1.0 }",
    );
    let (code, err) = check_text(&fixed);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_valid_extended_thinking_config_is_accepted() {
    // Temperature 1, top_p within 0.95..=1, tool_choice auto or none, a
    // budget above the configured max_tokens (the request raises it), and a
    // native structured output (output_config, not a forced tool).
    let (code, err) = check_text(&thinking_config(
        ", temperature = 1.0, top_p = 0.95, tool_choice = \"auto\"",
        "model_options = { tool_choice = \"none\", reasoning = { budget_tokens = 8000 } }\n\n\
         [agents.judge]\nmodel = \"an\"\noutput_mode = \"structured_output\"\nstructured = \"native\"\n\n\
         [agents.tool_judge]\nmodel = \"an\"\noutput_mode = \"structured_output\"\nstructured = \"tool\"\n\n\
         [agents.plain]\nmodel = \"an\"\nmodel_options = { reasoning = { effort = \"high\" }, temperature = 0.3 }",
    ));
    assert_eq!(code, Some(0), "{err}");
    // The same options without thinking are not checked against its rules.
    let off = "[models.an]\nprovider = \"anthropic\"\nmodel = \"claude-sonnet-4-5\"\nbase_url = \"http://127.0.0.1:9\"\n\
               options = { temperature = 0.2, top_p = 0.5, tool_choice = \"required\", extra_body = { top_k = 5 } }\n\n\
               [agents.a]\nmodel = \"an\"\n";
    let (code, err) = check_text(off);
    assert_eq!(code, Some(0), "{err}");
}
