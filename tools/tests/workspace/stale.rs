//! Two agents editing one file do not silently overwrite each other.

use arbor_tools::workspace::Access;
use serde_json::json;

use super::{call, ctx, open, text};

#[tokio::test]
async fn an_edit_based_on_content_a_sibling_changed_since_is_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plan.md");
    std::fs::write(&file, "step one\nstep two\n").unwrap();
    let handle = open(dir.path(), Access::ReadWrite);
    let (a, b) = (ctx(&handle, "tree/a"), ctx(&handle, "tree/b"));
    let read = json!({"file_path": "plan.md"});
    call("Read", read.clone(), &a).await.unwrap();
    call("Read", read.clone(), &b).await.unwrap();
    // B changes the file; A's edit and write are based on what it read before.
    call(
        "Edit",
        json!({"file_path": "plan.md", "old_string": "step two", "new_string": "step 2"}),
        &b,
    )
    .await
    .unwrap();
    let e = call(
        "Edit",
        json!({"file_path": "plan.md", "old_string": "step one", "new_string": "step 1"}),
        &a,
    )
    .await
    .unwrap_err();
    assert!(
        e.message
            .contains("conflict, the file changed since you last read it"),
        "{e}"
    );
    let e = call(
        "Write",
        json!({"file_path": "plan.md", "content": "mine\n"}),
        &a,
    )
    .await
    .unwrap_err();
    assert!(e.message.contains("conflict"), "{e}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "step one\nstep 2\n"
    );
    // B's own later edit is fine: it wrote what is there.
    call(
        "MultiEdit",
        json!({"file_path": "plan.md", "edits": [{"old_string": "step 2", "new_string": "step two"}]}),
        &b,
    )
    .await
    .unwrap();
    // A reads again and redoes its change.
    let out = call("Read", read, &a).await.unwrap();
    assert!(text(&out).contains("step two"));
    call(
        "Edit",
        json!({"file_path": "plan.md", "old_string": "step one", "new_string": "step 1"}),
        &a,
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "step 1\nstep two\n"
    );
}

#[tokio::test]
async fn a_write_over_a_file_never_read_is_refused_and_a_change_by_a_command_counts() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    std::fs::write(&file, "a = 1\n").unwrap();
    let handle = open(dir.path(), Access::ReadWrite);
    let a = ctx(&handle, "tree/a");
    let e = call(
        "write_file",
        json!({"path": "config.toml", "instructions": "i", "content": "a = 2\n"}),
        &a,
    )
    .await
    .unwrap_err();
    assert!(e.message.contains("you have not read it"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "a = 1\n");
    // An edit of a file never read is judged by its exact match alone.
    call(
        "str_replace",
        json!({"path": "config.toml", "replacements": [{"old": "a = 1", "new": "a = 3"}]}),
        &a,
    )
    .await
    .unwrap();
    // Changed behind the agent's back (by a command, say): a conflict.
    std::fs::write(&file, "a = 4\n").unwrap();
    let e = call(
        "workspace/edit",
        json!({"path": "config.toml", "edits": [{"old": "a = 4", "new": "a = 5"}]}),
        &a,
    )
    .await
    .unwrap_err();
    assert!(e.message.contains("conflict"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "a = 4\n");
}
