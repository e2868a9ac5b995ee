//! What each tool does, through one family or another.

use std::path::Path;
use std::time::{Duration, SystemTime};

use arbor_actors::ToolContext;
use arbor_tools::workspace::Access;
use serde_json::json;

use super::{call, ctx, json as value, open, text};

/// A small project: sources, a `.gitignore`d build directory, a binary file.
fn project(dir: &Path) {
    std::fs::create_dir_all(dir.join("src/deep")).unwrap();
    std::fs::create_dir_all(dir.join("target")).unwrap();
    std::fs::write(dir.join(".gitignore"), "target/\n").unwrap();
    std::fs::write(
        dir.join("src/main.rs"),
        "fn main() {\n    let answer = 42;\n    println!(\"{answer}\");\n}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("src/lib.rs"),
        "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n// TODO: more\n",
    )
    .unwrap();
    std::fs::write(dir.join("src/deep/notes.md"), "# Notes\nTODO: write them\n").unwrap();
    std::fs::write(dir.join("target/out.rs"), "// TODO: built\n").unwrap();
    std::fs::write(dir.join("logo.png"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").unwrap();
}

fn setup() -> (tempfile::TempDir, ToolContext) {
    let dir = tempfile::tempdir().unwrap();
    project(dir.path());
    let handle = open(dir.path(), Access::ReadWrite);
    let ctx = ctx(&handle, "agent-1");
    (dir, ctx)
}

#[tokio::test]
async fn read_numbers_lines_takes_ranges_and_refuses_binary_files() {
    let (dir, ctx) = setup();
    let out = call("Read", json!({"file_path": "src/main.rs"}), &ctx)
        .await
        .unwrap();
    assert_eq!(
        text(&out),
        "     1\tfn main() {\n     2\t    let answer = 42;\n     3\t    println!(\"{answer}\");\n     4\t}\n"
    );
    // An absolute path inside the workspace, a range, and where to go on.
    let abs = dir.path().join("src/main.rs").display().to_string();
    let out = call(
        "Read",
        json!({"file_path": abs, "offset": 2, "limit": 1}),
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(
        text(&out),
        "     2\t    let answer = 42;\n[showed lines 2-2 of 4; read on with offset 3]\n"
    );
    let e = call("Read", json!({"file_path": "logo.png"}), &ctx)
        .await
        .unwrap_err();
    assert!(e.message.contains("binary file"), "{e}");
    let e = call("Read", json!({"file_path": "src"}), &ctx)
        .await
        .unwrap_err();
    assert!(e.message.contains("is a directory"), "{e}");
    let e = call(
        "Read",
        json!({"file_path": "src/main.rs", "offset": 9}),
        &ctx,
    )
    .await
    .unwrap_err();
    assert!(e.message.contains("past its end"), "{e}");
    // Long lines are cut.
    std::fs::write(dir.path().join("long.txt"), "x".repeat(5000)).unwrap();
    let out = call("Read", json!({"file_path": "long.txt"}), &ctx)
        .await
        .unwrap();
    assert!(
        text(&out).contains("[line cut at 2000 characters]"),
        "{}",
        text(&out)
    );
    assert!(text(&out).len() < 2100);

    // Several files at once, one missing: Arbor's and Codebuff's shapes.
    let out = call(
        "workspace/read",
        json!({"files": [{"path": "src/lib.rs", "limit": 1}, {"path": "nope.rs"}]}),
        &ctx,
    )
    .await
    .unwrap();
    let v = value(&out);
    assert_eq!(v[0]["path"], "src/lib.rs");
    assert_eq!(v[0]["lines"], 4);
    assert!(
        v[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("     1\tpub fn add")
    );
    assert!(
        v[1]["error"].as_str().unwrap().contains("no such file"),
        "{v}"
    );
    let out = call(
        "read_files",
        json!({"paths": ["src/lib.rs", "logo.png"]}),
        &ctx,
    )
    .await
    .unwrap();
    let v = value(&out);
    assert_eq!(
        v[0],
        json!({"path": "src/lib.rs", "content": "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n// TODO: more"})
    );
    assert!(
        v[1]["content"].as_str().unwrap().contains("binary file"),
        "{v}"
    );
}

#[tokio::test]
async fn write_creates_files_and_directories_and_says_what_changed() {
    let (dir, ctx) = setup();
    let out = call(
        "Write",
        json!({"file_path": "docs/new/guide.md", "content": "hello\n"}),
        &ctx,
    )
    .await
    .unwrap();
    assert!(
        text(&out).starts_with("File created successfully at: /"),
        "{}",
        text(&out)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("docs/new/guide.md")).unwrap(),
        "hello\n"
    );
    // Over a file read first: the diff says what changed.
    call("Read", json!({"file_path": "src/lib.rs"}), &ctx)
        .await
        .unwrap();
    let out = call(
        "write_file",
        json!({"path": "src/lib.rs", "instructions": "shorter", "content": "pub fn add() {}\n"}),
        &ctx,
    )
    .await
    .unwrap();
    let v = value(&out);
    assert_eq!(v["file"], "src/lib.rs");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("Updated src/lib.rs"),
        "{v}"
    );
    let diff = v["unifiedDiff"].as_str().unwrap();
    assert!(
        diff.contains("-pub fn add(a: i32, b: i32) -> i32 {\n"),
        "{diff}"
    );
    assert!(diff.contains("+pub fn add() {}\n"), "{diff}");
    // Permissions are kept over a replaced file.
    use std::os::unix::fs::PermissionsExt as _;
    let script = dir.path().join("run.sh");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    call(
        "workspace/read",
        json!({"files": [{"path": "run.sh"}]}),
        &ctx,
    )
    .await
    .unwrap();
    call(
        "workspace/write",
        json!({"path": "run.sh", "content": "#!/bin/sh\necho\n"}),
        &ctx,
    )
    .await
    .unwrap();
    let mode = std::fs::metadata(&script).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
}

#[tokio::test]
async fn edit_replaces_exact_unique_text_or_all_of_it_and_all_edits_or_none() {
    let (dir, ctx) = setup();
    let lib = dir.path().join("src/lib.rs");
    let out = call(
        "Edit",
        json!({"file_path": "src/lib.rs", "old_string": "a + b", "new_string": "a.wrapping_add(b)"}),
        &ctx,
    )
    .await
    .unwrap();
    assert!(
        text(&out).contains("replaced 1 occurrence at line 2"),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains("+    a.wrapping_add(b)"),
        "{}",
        text(&out)
    );
    assert!(
        std::fs::read_to_string(&lib)
            .unwrap()
            .contains("a.wrapping_add(b)")
    );

    let e = call(
        "Edit",
        json!({"file_path": "src/lib.rs", "old_string": "i32", "new_string": "i64"}),
        &ctx,
    )
    .await
    .unwrap_err();
    assert!(e.message.contains("occurs 3 times"), "{e}");
    let out = call(
        "Edit",
        json!({"file_path": "src/lib.rs", "old_string": "i32", "new_string": "i64", "replace_all": true}),
        &ctx,
    )
    .await
    .unwrap();
    assert!(
        text(&out).contains("replaced 3 occurrences at line 1"),
        "{}",
        text(&out)
    );
    let e = call(
        "Edit",
        json!({"file_path": "src/lib.rs", "old_string": "not there", "new_string": "x"}),
        &ctx,
    )
    .await
    .unwrap_err();
    assert!(e.message.contains("was not found"), "{e}");

    // Several edits in one call: the second fails, so nothing changes.
    let before = std::fs::read_to_string(&lib).unwrap();
    let e = call(
        "MultiEdit",
        json!({"file_path": "src/lib.rs", "edits": [
            {"old_string": "pub fn add", "new_string": "pub fn sum"},
            {"old_string": "missing", "new_string": "x"}
        ]}),
        &ctx,
    )
    .await
    .unwrap_err();
    assert!(
        e.message.contains("edit 2: the old text was not found"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&lib).unwrap(), before);
    // Both applying, in order (the second sees the first's result).
    let out = call(
        "str_replace",
        json!({"path": "src/lib.rs", "replacements": [
            {"old": "pub fn add", "new": "pub fn sum"},
            {"old": "pub fn sum(", "new": "pub fn total("}
        ]}),
        &ctx,
    )
    .await
    .unwrap();
    let v = value(&out);
    assert_eq!(
        v["message"],
        "Edited src/lib.rs: edit 1: replaced 1 occurrence at line 1; edit 2: replaced 1 occurrence at line 1"
    );
    assert!(
        std::fs::read_to_string(&lib)
            .unwrap()
            .starts_with("pub fn total(")
    );
    // An empty old text on a file that does not exist creates it.
    call(
        "Edit",
        json!({"file_path": "fresh.txt", "old_string": "", "new_string": "new\n"}),
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("fresh.txt")).unwrap(),
        "new\n"
    );
}

#[tokio::test]
async fn list_and_glob_leave_out_what_gitignore_excludes_and_glob_sorts_newest_first() {
    let (dir, ctx) = setup();
    let out = call("workspace/list", json!({}), &ctx).await.unwrap();
    assert_eq!(
        value(&out)["entries"],
        json!([".gitignore", "logo.png", "src/"])
    );
    let out = call("workspace/list", json!({"path": "src", "depth": 2}), &ctx)
        .await
        .unwrap();
    assert_eq!(
        value(&out)["entries"],
        json!(["deep/", "deep/notes.md", "lib.rs", "main.rs"])
    );
    let root = dir.path().canonicalize().unwrap();
    let out = call(
        "LS",
        json!({"path": root.display().to_string(), "ignore": ["*.png"]}),
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(
        text(&out),
        format!(
            "- {}/\n  - .gitignore\n  - src/\n    - deep/\n      - notes.md\n    - lib.rs\n    - main.rs\n",
            root.display()
        )
    );

    // Newest first: lib.rs touched last.
    let now = SystemTime::now();
    for (file, age) in [
        ("src/main.rs", 30),
        ("src/lib.rs", 10),
        ("src/deep/notes.md", 20),
    ] {
        let f = std::fs::File::options()
            .write(true)
            .open(dir.path().join(file))
            .unwrap();
        f.set_modified(now - Duration::from_secs(age)).unwrap();
    }
    let out = call("Glob", json!({"pattern": "**/*.rs"}), &ctx)
        .await
        .unwrap();
    let main = root.join("src/main.rs").display().to_string();
    let lib = root.join("src/lib.rs").display().to_string();
    assert_eq!(text(&out), format!("{lib}\n{main}"));
    let out = call(
        "workspace/glob",
        json!({"pattern": "*.rs", "path": "src"}),
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(value(&out)["files"], json!(["src/lib.rs", "src/main.rs"]));
    let out = call("workspace/glob", json!({"pattern": "*.rs"}), &ctx)
        .await
        .unwrap();
    assert_eq!(
        value(&out)["files"],
        json!([]),
        "* stays within a directory"
    );
    let out = call("find_files", json!({"prompt": "notes deep"}), &ctx)
        .await
        .unwrap();
    assert_eq!(value(&out)["files"], json!(["src/deep/notes.md"]));
}

#[tokio::test]
async fn grep_shows_content_with_context_files_or_counts_within_caps() {
    let (dir, ctx) = setup();
    let root = dir.path().canonicalize().unwrap();
    let out = call(
        "Grep",
        json!({"pattern": "todo", "-i": true, "output_mode": "content", "-B": 1}),
        &ctx,
    )
    .await
    .unwrap();
    let notes = root.join("src/deep/notes.md").display().to_string();
    let lib = root.join("src/lib.rs").display().to_string();
    assert_eq!(
        text(&out),
        format!(
            "{notes}-1-# Notes\n{notes}:2:TODO: write them\n--\n{lib}-3-}}\n{lib}:4:// TODO: more"
        )
    );
    // The build directory is ignored; files newest first.
    let out = call("Grep", json!({"pattern": "TODO"}), &ctx)
        .await
        .unwrap();
    assert!(text(&out).starts_with("Found 2 files\n"), "{}", text(&out));
    assert!(!text(&out).contains("target"), "{}", text(&out));
    let out = call(
        "Grep",
        json!({"pattern": "TODO", "output_mode": "count", "glob": "*.rs"}),
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(
        text(&out),
        format!("{lib}:1\n\nFound 1 total occurrences across 1 files.")
    );
    // Types, head_limit and multiline.
    let out = call(
        "workspace/grep",
        json!({"pattern": "TODO", "type": "markdown", "output_mode": "content"}),
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(
        value(&out)["lines"],
        json!(["src/deep/notes.md:2:TODO: write them"])
    );
    let out = call(
        "workspace/grep",
        json!({"pattern": "\\w+", "path": "src/main.rs", "output_mode": "content", "head_limit": 2}),
        &ctx,
    )
    .await
    .unwrap();
    let v = value(&out);
    assert_eq!(v["lines"].as_array().unwrap().len(), 2);
    assert_eq!(v["cut"], true);
    let out = call(
        "Grep",
        json!({"pattern": "main\\(\\) \\{\\s+let", "multiline": true, "output_mode": "content"}),
        &ctx,
    )
    .await
    .unwrap();
    let main = root.join("src/main.rs").display().to_string();
    assert_eq!(
        text(&out),
        format!("{main}:1:fn main() {{\n{main}:2:    let answer = 42;")
    );
    let out = call(
        "code_search",
        json!({"pattern": "answer", "flags": "-g *.rs"}),
        &ctx,
    )
    .await
    .unwrap();
    let v = value(&out);
    assert_eq!(
        v["stdout"],
        "src/main.rs:2:    let answer = 42;\nsrc/main.rs:3:    println!(\"{answer}\");"
    );
    assert_eq!(v["message"], "Found 2 matches in 1 files");
    let e = call("Grep", json!({"pattern": "("}), &ctx)
        .await
        .unwrap_err();
    assert!(e.message.contains("pattern \"(\""), "{e}");
}

#[tokio::test]
async fn todos_come_back_in_the_result_and_think_changes_nothing() {
    let (_dir, ctx) = setup();
    let out = call(
        "TodoWrite",
        json!({"todos": [
            {"content": "Run the tests", "status": "completed", "activeForm": "Running the tests"},
            {"content": "Fix the bug", "status": "in_progress", "activeForm": "Fixing the bug"}
        ]}),
        &ctx,
    )
    .await
    .unwrap();
    assert!(
        text(&out).ends_with("[x] Run the tests\n[>] Fix the bug\n(1/2 done)"),
        "{}",
        text(&out)
    );
    let out = call(
        "write_todos",
        json!({"todos": [{"task": "Edit foo.ts", "completed": false}]}),
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(
        value(&out)["todos"],
        json!([{"task": "Edit foo.ts", "completed": false}])
    );
    let out = call(
        "workspace/todos",
        json!({"todos": [{"content": "Plan", "status": "pending"}]}),
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(
        value(&out)["todos"],
        json!([{"content": "Plan", "status": "pending"}])
    );
    let out = call("think_deeply", json!({"thought": "first, read"}), &ctx)
        .await
        .unwrap();
    assert_eq!(value(&out)["message"], "Thought noted.");
    call("workspace/think", json!({"thought": "hm"}), &ctx)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_read_only_workspace_refuses_write_edit_and_the_shell_but_reads() {
    let dir = tempfile::tempdir().unwrap();
    project(dir.path());
    let handle = open(dir.path(), Access::ReadOnly);
    let ctx = ctx(&handle, "agent-1");
    call("Read", json!({"file_path": "src/lib.rs"}), &ctx)
        .await
        .unwrap();
    for (tool, input) in [
        ("Write", json!({"file_path": "src/lib.rs", "content": "x"})),
        ("Write", json!({"file_path": "new.txt", "content": "x"})),
        (
            "Edit",
            json!({"file_path": "src/lib.rs", "old_string": "a + b", "new_string": "b"}),
        ),
        (
            "str_replace",
            json!({"path": "src/lib.rs", "replacements": [{"old": "a", "new": "b"}]}),
        ),
        ("Bash", json!({"command": "touch made-by-shell"})),
        (
            "run_terminal_command",
            json!({"command": "touch made-by-shell"}),
        ),
        ("workspace/shell", json!({"command": "touch made-by-shell"})),
    ] {
        let e = call(tool, input, &ctx).await.unwrap_err();
        assert!(e.message.contains("read-only"), "{tool}: {e}");
    }
    assert!(!dir.path().join("new.txt").exists());
    assert!(!dir.path().join("made-by-shell").exists());
    assert!(
        std::fs::read_to_string(dir.path().join("src/lib.rs"))
            .unwrap()
            .contains("a + b")
    );
}

#[tokio::test]
async fn a_tool_called_without_a_workspace_says_so() {
    let mut ctx = {
        let dir = tempfile::tempdir().unwrap();
        ctx(&open(dir.path(), Access::ReadWrite), "agent-1")
    };
    ctx.workspace = None;
    let e = call("Read", json!({"file_path": "x"}), &ctx)
        .await
        .unwrap_err();
    assert!(
        e.message.contains("Read: this agent has no workspace"),
        "{e}"
    );
}
