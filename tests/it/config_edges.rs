//! Issue 34 (14): config edges. What passes `check-config` runs; a key out
//! of its range is refused with the range; the file a tree started with is
//! not taken for another config.

use crate::{arbor, arbor_in, text};

const AGENT: &str = "[models.sim]\nprovider = \"simulated\"\n\n[agents.lead]\nmodel = \"sim\"\n";

fn check(config: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edges.toml");
    std::fs::write(&file, config).unwrap();
    arbor(&["check-config", file.to_str().unwrap()])
}

#[test]
fn loop_detection_of_one_is_refused_instead_of_failing_every_agent_on_its_first_tool_call() {
    for line in [
        "loop_detection = { warn_after = 0, fail_after = 1 }",
        "loop_detection = { warn_after = 1, fail_after = 5 }",
    ] {
        let out = check(&format!("{AGENT}{line}\n"));
        let said = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{line} passed: {said}");
        assert!(
            said.contains("agents.lead.loop_detection") && said.contains("2 or more"),
            "{line}: {said}"
        );
    }
    // 2 (the smallest loop) and 0 (off) stay accepted.
    let out = check(&format!(
        "{AGENT}loop_detection = {{ warn_after = 0, fail_after = 2 }}\n"
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn a_huge_shutdown_timeout_is_refused_with_its_range_not_the_parsers_overflow_text() {
    for value in [
        "99999999999h",
        "1000000000000000000000s",
        "9999999999999999999d",
    ] {
        let out = check(&format!(
            "[service]\nshutdown_timeout = \"{value}\"\n\n{AGENT}"
        ));
        let said = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value}: {said}");
        assert!(
            said.contains("service.shutdown_timeout") && said.contains("must be at most 1h"),
            "{value}: {said}"
        );
        for raw in ["failed to set", "too big", "64-bit"] {
            assert!(!said.contains(raw), "{value}: jiff's text: {said}");
        }
    }
    // A malformed one still says what is wrong with its form.
    let out = check(&format!(
        "[service]\nshutdown_timeout = \"10 parsecs\"\n\n{AGENT}"
    ));
    assert!(
        !text(&out.stderr).contains("must be at most"),
        "{}",
        text(&out.stderr)
    );
}

/// A tree stored by an Arbor that kept its config's secrets (before stored
/// configs were redacted): resuming or replaying it with the very file it
/// started with compares like with like.
#[test]
fn the_very_file_a_tree_started_with_is_not_another_config_when_its_stored_copy_holds_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let file = format!(
        "[models.o]\nprovider = \"openai\"\nbase_url = \"http://u:pw@127.0.0.1:9/v1\"\n\
         model = \"x\"\nheaders = {{ \"X-Key\" = \"secret\" }}\n\n{AGENT}"
    );
    std::fs::write(dir.path().join("config.toml"), &file).unwrap();
    let out = arbor_in(dir.path(), &["run", "--tree-id", "t1", "--quiet", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // As an older Arbor stored it: the file's text, secrets and all.
    let db = rusqlite::Connection::open(dir.path().join("arbor.db")).unwrap();
    let changed = db.execute("UPDATE configs SET text = ?1", [&file]).unwrap();
    assert_eq!(changed, 1);
    drop(db);
    let out = arbor_in(dir.path(), &["replay", "--config", "config.toml", "t1"]);
    let said = text(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        !said.contains("instead of the config it started with"),
        "the same file taken for another config: {said}"
    );
    // Another file still is another config.
    std::fs::write(
        dir.path().join("other.toml"),
        format!("{file}max_steps = 7\n"),
    )
    .unwrap();
    let out = arbor_in(dir.path(), &["replay", "--config", "other.toml", "t1"]);
    assert!(
        text(&out.stderr).contains("runs on other.toml instead of the config it started with"),
        "{}",
        text(&out.stderr)
    );
}
