//! The escape suite: every way out of the workspace, tried with every tool
//! that takes a path, in every family. Each must be refused, show nothing of
//! the outside file, and leave the outside as it was.

use std::os::unix::fs::symlink;
use std::path::Path;

use arbor_tools::workspace::Access;
use rustix::fs::{FileType, Mode};
use serde_json::{Value, json};

use super::{call, ctx, open, text};

const SECRET: &str = "TOP-SECRET-OUTSIDE";

/// The input of `tool` that names `path` (a file or a directory).
fn input(tool: &str, path: &str) -> Value {
    match tool {
        "workspace/read" => json!({"files": [{"path": path}]}),
        "workspace/write" => json!({"path": path, "content": "overwritten"}),
        "workspace/edit" => json!({"path": path, "edits": [{"old": SECRET, "new": "x"}]}),
        "workspace/list" => json!({"path": path}),
        "workspace/glob" => json!({"pattern": "**/*", "path": path}),
        "workspace/grep" => json!({"pattern": SECRET, "path": path, "output_mode": "content"}),
        "workspace/shell" => json!({"command": "cat secret.txt; pwd", "cwd": path}),
        "read_files" => json!({"paths": [path]}),
        "write_file" => json!({"path": path, "instructions": "i", "content": "overwritten"}),
        "str_replace" => json!({"path": path, "replacements": [{"old": SECRET, "new": "x"}]}),
        "run_terminal_command" => json!({"command": "cat secret.txt; pwd", "cwd": path}),
        "code_search" => json!({"pattern": SECRET, "cwd": path}),
        "Read" => json!({"file_path": path}),
        "Write" => json!({"file_path": path, "content": "overwritten"}),
        "Edit" => json!({"file_path": path, "old_string": SECRET, "new_string": "x"}),
        "MultiEdit" => {
            json!({"file_path": path, "edits": [{"old_string": SECRET, "new_string": "x"}]})
        }
        "Grep" => json!({"pattern": SECRET, "path": path, "output_mode": "content"}),
        "Glob" => json!({"pattern": "**/*", "path": path}),
        "LS" => json!({"path": path}),
        other => panic!("no input for {other}"),
    }
}

/// Every tool that takes a path.
const PATH_TOOLS: &[&str] = &[
    "workspace/read",
    "workspace/write",
    "workspace/edit",
    "workspace/list",
    "workspace/glob",
    "workspace/grep",
    "workspace/shell",
    "read_files",
    "write_file",
    "str_replace",
    "run_terminal_command",
    "code_search",
    "Read",
    "Write",
    "Edit",
    "MultiEdit",
    "Grep",
    "Glob",
    "LS",
];

/// A workspace `ws/` beside `outside/` (with `secret.txt`, and a
/// directory `sub/` with another), and in the workspace every kind of way
/// out made before it is opened.
fn layout(base: &Path) {
    let outside = base.join("outside");
    std::fs::create_dir_all(outside.join("sub")).unwrap();
    std::fs::write(outside.join("secret.txt"), SECRET).unwrap();
    std::fs::write(outside.join("sub/secret.txt"), SECRET).unwrap();
    let ws = base.join("ws");
    std::fs::create_dir_all(ws.join("inner")).unwrap();
    std::fs::write(ws.join("inner/ok.txt"), "inside\n").unwrap();
    symlink("../outside/secret.txt", ws.join("link_out")).unwrap();
    symlink(outside.join("secret.txt"), ws.join("abs_link")).unwrap();
    symlink("../outside", ws.join("dir_link")).unwrap();
    // The process's root directory, seen through /proc (the kernel's
    // path, built from its parts: nothing of this machine).
    let proc_root = Path::new("/proc/self").join("root");
    symlink(&proc_root, ws.join("proc_link")).unwrap();
    symlink("../../outside/sub", ws.join("inner/deep_link")).unwrap();
    std::fs::hard_link(outside.join("secret.txt"), ws.join("hard")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        ws.join("fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    // A device file (like /dev/null), where this user may make one (root).
    let _ = rustix::fs::mknodat(
        rustix::fs::CWD,
        ws.join("device"),
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 3),
    );
}

/// The outside is as `layout` made it.
fn outside_untouched(base: &Path) {
    let outside = base.join("outside");
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        SECRET
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("sub/secret.txt")).unwrap(),
        SECRET
    );
    let mut names: Vec<String> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["secret.txt", "sub"]);
    let sub: Vec<String> = std::fs::read_dir(outside.join("sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(sub, ["secret.txt"]);
}

#[tokio::test]
async fn every_way_out_of_the_workspace_is_refused_by_every_tool_that_takes_a_path() {
    let base = tempfile::tempdir().unwrap();
    let base = base.path().canonicalize().unwrap();
    layout(&base);
    let handle = open(&base.join("ws"), Access::ReadWrite);
    // Made after the workspace was opened: a symbolic link on the way to a
    // file, and one in place of a directory the agent had used.
    symlink("../outside", base.join("ws/late")).unwrap();
    std::fs::remove_dir_all(base.join("ws/inner")).unwrap();
    symlink("../outside/sub", base.join("ws/inner")).unwrap();

    let elsewhere = base.join("outside/secret.txt").display().to_string();
    let escapes: Vec<String> = vec![
        "../outside/secret.txt".into(),
        "inner/../../outside/secret.txt".into(),
        elsewhere,
        "/etc/hostname".into(),
        Path::new("/proc/self")
            .join("root")
            .join("etc/hostname")
            .display()
            .to_string(),
        "/proc/self/environ".into(),
        "link_out".into(),
        "abs_link".into(),
        "dir_link".into(),
        "dir_link/secret.txt".into(),
        "proc_link".into(),
        "proc_link/etc/hostname".into(),
        "late".into(),
        "late/secret.txt".into(),
        "late/new.txt".into(),
        "inner".into(),
        "inner/secret.txt".into(),
        "hard".into(),
        "fifo".into(),
    ];
    let mut escapes = escapes;
    if base.join("ws/device").exists() {
        escapes.push("device".into());
    }
    // Each escape with each tool: refused (an error, or for read_files a
    // per-file error), and never the secret in what the model reads.
    let ctx = ctx(&handle, "agent-1");
    let mut checked = 0;
    for tool in PATH_TOOLS {
        for path in &escapes {
            let out = call(tool, input(tool, path), &ctx).await;
            let what = format!("{tool} {path}");
            match out {
                Err(e) => {
                    assert!(!e.message.contains(SECRET), "{what}: {e}");
                    assert!(!e.message.is_empty(), "{what}");
                }
                Ok(out) => {
                    let shown = text(&out);
                    assert!(!shown.contains(SECRET), "{what}: {shown}");
                    // Only read_files answers per file; everything else fails.
                    assert_eq!(*tool, "read_files", "{what} was not refused: {shown}");
                    assert!(shown.contains("[ERROR: "), "{what}: {shown}");
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, PATH_TOOLS.len() * escapes.len());
    outside_untouched(&base);
}

#[tokio::test]
async fn refusals_say_why_in_words_the_model_reads() {
    let base = tempfile::tempdir().unwrap();
    let base = base.path().canonicalize().unwrap();
    layout(&base);
    let handle = open(&base.join("ws"), Access::ReadWrite);
    let ctx = ctx(&handle, "agent-1");
    let read = |p: &str| json!({"file_path": p});
    let cases = [
        ("../outside/secret.txt", "outside the workspace"),
        ("/etc/hostname", "outside the workspace"),
        ("link_out", "leads outside the workspace"),
        ("dir_link/secret.txt", "leads outside the workspace"),
        ("proc_link/etc/hostname", "leads outside the workspace"),
        ("hard", "hard links"),
        ("fifo", "fifo"),
        ("/dev/null", "outside the workspace"),
        ("missing.txt", "no such file"),
    ];
    for (path, says) in cases {
        let e = call("Read", read(path), &ctx).await.unwrap_err();
        assert!(e.message.contains(says), "{path}: {e}");
    }
    if base.join("ws/device").exists() {
        let e = call("Read", read("device"), &ctx).await.unwrap_err();
        assert!(e.message.contains("device file"), "{e}");
    }
    // A write through a link that stays inside is refused too: it would
    // replace the link.
    symlink("inner/ok.txt", base.join("ws/inside_link")).unwrap();
    let e = call(
        "Write",
        json!({"file_path": "inside_link", "content": "x"}),
        &ctx,
    )
    .await
    .unwrap_err();
    assert!(e.message.contains("symbolic link"), "{e}");
    // Reading through it is fine: it stays inside.
    let out = call("Read", read("inside_link"), &ctx).await.unwrap();
    assert!(text(&out).contains("inside"), "{}", text(&out));
}

#[tokio::test]
async fn walking_the_whole_workspace_finds_nothing_of_the_outside() {
    let base = tempfile::tempdir().unwrap();
    let base = base.path().canonicalize().unwrap();
    layout(&base);
    let handle = open(&base.join("ws"), Access::ReadWrite);
    let ctx = ctx(&handle, "agent-1");
    let grep = call(
        "Grep",
        json!({"pattern": SECRET, "output_mode": "content"}),
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(text(&grep), "No matches found");
    let glob = call("Glob", json!({"pattern": "**/*"}), &ctx)
        .await
        .unwrap();
    assert!(!text(&glob).contains("secret.txt"), "{}", text(&glob));
    assert!(text(&glob).contains("inner/ok.txt"), "{}", text(&glob));
    let found = call("find_files", json!({"prompt": "secret"}), &ctx)
        .await
        .unwrap();
    assert!(!text(&found).contains("secret.txt"), "{}", text(&found));
    let search = call("code_search", json!({"pattern": SECRET}), &ctx)
        .await
        .unwrap();
    assert!(!text(&search).contains(SECRET), "{}", text(&search));
    assert!(
        text(&search).contains("Found 0 matches"),
        "{}",
        text(&search)
    );
}

#[tokio::test]
async fn a_directory_swapped_for_a_link_out_mid_run_is_refused_at_its_next_use() {
    let base = tempfile::tempdir().unwrap();
    let base = base.path().canonicalize().unwrap();
    layout(&base);
    let handle = open(&base.join("ws"), Access::ReadWrite);
    let ctx = ctx(&handle, "agent-1");
    std::fs::write(base.join("ws/inner/secret.txt"), "inside\n").unwrap();
    let read = json!({"file_path": "inner/secret.txt"});
    let out = call("Read", read.clone(), &ctx).await.unwrap();
    assert!(text(&out).contains("inside"));
    // Another process swaps the directory for a link out between two calls.
    std::fs::rename(base.join("ws/inner"), base.join("ws/old_inner")).unwrap();
    symlink("../outside/sub", base.join("ws/inner")).unwrap();
    let e = call("Read", read, &ctx).await.unwrap_err();
    assert!(e.message.contains("leads outside the workspace"), "{e}");
    let e = call(
        "Write",
        json!({"file_path": "inner/secret.txt", "content": "overwritten"}),
        &ctx,
    )
    .await
    .unwrap_err();
    assert!(e.message.contains("leads outside the workspace"), "{e}");
    outside_untouched(&base);
}

#[test]
fn a_link_swapped_in_and_out_while_an_agent_reads_and_writes_never_reaches_the_outside() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use arbor_tools::workspace::{Workspace, files};

    let base = tempfile::tempdir().unwrap();
    let base = base.path().canonicalize().unwrap();
    layout(&base);
    let ws_dir = base.join("ws");
    std::fs::create_dir(ws_dir.join("cur")).unwrap();
    std::fs::write(ws_dir.join("cur/secret.txt"), "inside\n").unwrap();
    symlink("../outside/sub", ws_dir.join("other")).unwrap();
    let ws = Workspace::open(&ws_dir, Access::ReadWrite).unwrap();
    // Another process swaps `cur` (a directory) and `other` (a link out)
    // atomically, over and over, while the agent uses `cur/secret.txt`.
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, dir) = (stop.clone(), ws_dir.clone());
        std::thread::spawn(move || {
            let mut swaps = 0u32;
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    dir.join("cur"),
                    rustix::fs::CWD,
                    dir.join("other"),
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    let (mut read, mut refused) = (0, 0);
    for i in 0..2000 {
        match files::read(&ws, "agent", "cur/secret.txt", None, None) {
            Ok(r) => {
                assert!(r.lines[0].starts_with("inside"), "read {i}: {:?}", r.lines);
                read += 1;
            }
            Err(e) => {
                assert!(!e.0.contains(SECRET), "{e}");
                refused += 1;
            }
        }
        // Writes: through the swapped link they would land outside.
        let (old, new) = if i % 2 == 0 {
            ("inside\n", "inside!\n")
        } else {
            ("inside!\n", "inside\n")
        };
        let edit = files::Edit {
            old: old.into(),
            new: new.into(),
            all: false,
        };
        let _ = files::edit(&ws, "agent", "cur/secret.txt", &[edit]);
        let _ = files::write(&ws, "writer", &format!("cur/new-{i}.txt"), "x");
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 0);
    assert_eq!(read + refused, 2000);
    outside_untouched(&base);
}

/// The escape tests again, in a copy of this test binary whose workspaces
/// resolve paths by walking them one component at a time, as they do where
/// the kernel has no `openat2`.
#[test]
fn without_openat2_the_walk_refuses_every_way_out_too() {
    if std::env::var_os("ARBOR_NO_OPENAT2").is_some() {
        return; // The copy itself.
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["escape::", "--test-threads", "2"])
        .env("ARBOR_NO_OPENAT2", "1")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{shown}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every escape test ran in the copy (this one returned at once there).
    assert!(shown.contains("test result: ok. 6 passed"), "{shown}");
}
