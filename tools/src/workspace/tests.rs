//! Unit tests of the workspace tools' pure parts; the tools themselves are
//! tested through their families in `tools/tests/workspace/`.

use super::search::Mode;
use super::*;

#[test]
fn a_diff_shows_the_changed_lines_with_three_lines_of_context() {
    let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
    let new = "a\nb\nc\nd\nE\nf\ng\nh\n";
    let diff = files::unified_diff("x.txt", old, new);
    assert_eq!(
        diff,
        "--- a/x.txt\n+++ b/x.txt\n@@ -2,7 +2,7 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n"
    );
    assert_eq!(files::unified_diff("x", "same\n", "same\n"), "");
    let created = files::unified_diff("n", "", "one\ntwo\n");
    assert!(
        created.contains("@@ -0,0 +1,2 @@\n+one\n+two\n"),
        "{created}"
    );
}

#[test]
fn code_search_flags_become_a_query_and_unknown_flags_are_refused() {
    let q = codebuff::flags("-i -g *.rs -A 3 -B2 --type=rust -T md -l").unwrap();
    assert!(q.ignore_case);
    assert_eq!(q.globs, vec!["*.rs"]);
    assert_eq!((q.before, q.after), (2, 3));
    assert_eq!(q.types, vec!["rust"]);
    assert_eq!(q.types_not, vec!["md"]);
    assert_eq!(q.mode, Mode::FilesWithMatches);
    let q = codebuff::flags("-C 4 -w -F").unwrap();
    assert_eq!((q.before, q.after, q.word, q.fixed), (4, 4, true, true));
    assert_eq!(q.mode, Mode::Content);
    let refused = codebuff::flags("--exec rm").unwrap_err();
    assert!(
        refused.message.contains("--exec is not offered"),
        "{refused}"
    );
    assert!(codebuff::flags("-A").is_err());
}

#[test]
fn workspace_entries_expand_to_the_tools_of_each_family() {
    let all = expand("workspace/*", Family::Claude).unwrap();
    assert_eq!(
        all,
        [
            "Read",
            "Write",
            "Edit",
            "MultiEdit",
            "Bash",
            "Grep",
            "Glob",
            "LS",
            "TodoWrite"
        ]
    );
    assert_eq!(
        expand("workspace/*", Family::Arbor).unwrap(),
        names(Family::Arbor)
    );
    assert_eq!(
        expand("workspace/edit", Family::Claude).unwrap(),
        ["Edit", "MultiEdit"]
    );
    assert_eq!(
        expand("workspace/glob", Family::Codebuff).unwrap(),
        ["find_files"]
    );
    assert_eq!(
        expand("workspace/list", Family::Codebuff).unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(
        expand("workspace/think", Family::Codebuff).unwrap(),
        ["think_deeply"]
    );
    assert_eq!(expand("fs/*", Family::Claude), None);
}

#[test]
fn the_walk_resolves_links_inside_and_refuses_every_way_out() {
    use std::os::unix::fs::symlink;

    use rustix::fs::{Mode, OFlags};
    use rustix::io::Errno;

    let base = tempfile::tempdir().unwrap();
    let ws = base.path().join("ws");
    std::fs::create_dir_all(ws.join("a/b")).unwrap();
    std::fs::write(ws.join("a/b/file.txt"), "inside").unwrap();
    std::fs::write(base.path().join("secret.txt"), "outside").unwrap();
    symlink("a/b", ws.join("to_b")).unwrap();
    symlink("../../to_b/file.txt", ws.join("a/b/loop_back")).unwrap();
    symlink("../secret.txt", ws.join("out")).unwrap();
    symlink(base.path().join("secret.txt"), ws.join("abs")).unwrap();
    symlink("self", ws.join("self")).unwrap();
    let dir = rustix::fs::open(&ws, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
    let read = |path: &str| -> Result<String, Errno> {
        let fd = beneath::walk(
            &dir,
            std::path::Path::new(path),
            OFlags::RDONLY,
            Mode::empty(),
        )?;
        Ok(std::io::read_to_string(std::fs::File::from(fd)).unwrap())
    };
    assert_eq!(read("a/b/file.txt").unwrap(), "inside");
    assert_eq!(read("to_b/file.txt").unwrap(), "inside");
    assert_eq!(read("a/../to_b/./file.txt").unwrap(), "inside");
    assert_eq!(read("a/b/loop_back").unwrap(), "inside");
    assert_eq!(read("out"), Err(Errno::XDEV));
    assert_eq!(read("abs"), Err(Errno::XDEV));
    assert_eq!(read("../secret.txt"), Err(Errno::XDEV));
    assert_eq!(read("a/../../secret.txt"), Err(Errno::XDEV));
    assert_eq!(read("self"), Err(Errno::LOOP));
    assert_eq!(read("missing"), Err(Errno::NOENT));
    // The directory itself, reached by `..`.
    let fd = beneath::walk(
        &dir,
        std::path::Path::new("a/.."),
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    );
    assert!(fd.is_ok());
}
