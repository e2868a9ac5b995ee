//! The three families' names and input schemas are the documented ones, so
//! that prompts written for Codebuff or Claude Code work unchanged.

use std::collections::BTreeSet;

use arbor_tools::workspace::{Family, tools};
use serde_json::Value;

/// Each tool's name, its properties and its required ones, as documented
/// (Codebuff: `common/src/tools/params/tool/*.ts`; Claude Code: its tools'
/// input schemas).
fn documented(family: Family) -> Vec<(&'static str, Vec<&'static str>, Vec<&'static str>)> {
    match family {
        Family::Arbor => vec![
            ("workspace/read", vec!["files"], vec!["files"]),
            (
                "workspace/write",
                vec!["path", "content"],
                vec!["path", "content"],
            ),
            (
                "workspace/edit",
                vec!["path", "edits"],
                vec!["path", "edits"],
            ),
            ("workspace/list", vec!["path", "depth", "ignore"], vec![]),
            ("workspace/glob", vec!["pattern", "path"], vec!["pattern"]),
            (
                "workspace/grep",
                vec![
                    "pattern",
                    "path",
                    "glob",
                    "type",
                    "output_mode",
                    "before",
                    "after",
                    "context",
                    "ignore_case",
                    "multiline",
                    "head_limit",
                    "offset",
                ],
                vec!["pattern"],
            ),
            (
                "workspace/shell",
                vec!["command", "cwd", "timeout_seconds"],
                vec!["command"],
            ),
            ("workspace/todos", vec!["todos"], vec!["todos"]),
            ("workspace/think", vec!["thought"], vec!["thought"]),
        ],
        Family::Codebuff => vec![
            ("read_files", vec!["paths"], vec!["paths"]),
            (
                "write_file",
                vec!["path", "instructions", "content"],
                vec!["path", "instructions", "content"],
            ),
            (
                "str_replace",
                vec!["path", "replacements"],
                vec!["path", "replacements"],
            ),
            (
                "run_terminal_command",
                vec!["command", "process_type", "cwd", "timeout_seconds"],
                vec!["command"],
            ),
            (
                "code_search",
                vec!["pattern", "flags", "cwd", "maxResults"],
                vec!["pattern"],
            ),
            ("find_files", vec!["prompt"], vec!["prompt"]),
            ("write_todos", vec!["todos"], vec!["todos"]),
            ("think_deeply", vec!["thought"], vec!["thought"]),
        ],
        Family::Claude => vec![
            (
                "Read",
                vec!["file_path", "offset", "limit"],
                vec!["file_path"],
            ),
            (
                "Write",
                vec!["file_path", "content"],
                vec!["file_path", "content"],
            ),
            (
                "Edit",
                vec!["file_path", "old_string", "new_string", "replace_all"],
                vec!["file_path", "old_string", "new_string"],
            ),
            (
                "MultiEdit",
                vec!["file_path", "edits"],
                vec!["file_path", "edits"],
            ),
            (
                "Bash",
                vec!["command", "timeout", "description", "run_in_background"],
                vec!["command"],
            ),
            (
                "Grep",
                vec![
                    "pattern",
                    "path",
                    "glob",
                    "output_mode",
                    "-B",
                    "-A",
                    "-C",
                    "-n",
                    "-i",
                    "type",
                    "head_limit",
                    "offset",
                    "multiline",
                ],
                vec!["pattern"],
            ),
            ("Glob", vec!["pattern", "path"], vec!["pattern"]),
            ("LS", vec!["path", "ignore"], vec!["path"]),
            ("TodoWrite", vec!["todos"], vec!["todos"]),
        ],
    }
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

fn strings(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn each_familys_names_and_schemas_are_the_documented_ones() {
    for family in Family::ALL {
        let tools = tools(family);
        let expected = documented(family);
        let names: Vec<&str> = tools
            .iter()
            .map(|t| arbor_actors::Tool::name(&**t))
            .collect();
        let documented_names: Vec<&str> = expected.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(names, documented_names, "{family:?}");
        for (tool, (name, properties, required)) in tools.iter().zip(&expected) {
            let schema = arbor_actors::Tool::input_schema(&**tool);
            assert_eq!(schema["type"], "object", "{name}");
            assert_eq!(keys(&schema["properties"]), set(properties), "{name}");
            assert_eq!(strings(&schema["required"]), set(required), "{name}");
            assert!(schema.get("$defs").is_none(), "{name}: {schema}");
            // The input type's own name and doc stay out of what the model reads.
            assert!(schema.get("title").is_none(), "{name}: {schema}");
            assert!(schema.get("description").is_none(), "{name}: {schema}");
            assert!(
                !arbor_actors::Tool::description(&**tool).is_empty(),
                "{name}"
            );
        }
    }
}

#[test]
fn nested_inputs_have_the_documented_fields() {
    let schema = |name: &str| {
        Family::ALL
            .iter()
            .flat_map(|f| tools(*f))
            .find(|t| arbor_actors::Tool::name(&**t) == name)
            .map(|t| arbor_actors::Tool::input_schema(&*t))
            .unwrap()
    };
    let todo = &schema("TodoWrite")["properties"]["todos"]["items"];
    assert_eq!(
        keys(&todo["properties"]),
        set(&["content", "status", "activeForm"])
    );
    assert_eq!(
        strings(&todo["properties"]["status"]["enum"]),
        set(&["pending", "in_progress", "completed"])
    );
    let edit = &schema("MultiEdit")["properties"]["edits"]["items"];
    assert_eq!(
        keys(&edit["properties"]),
        set(&["old_string", "new_string", "replace_all"])
    );
    let replacement = &schema("str_replace")["properties"]["replacements"]["items"];
    assert_eq!(
        keys(&replacement["properties"]),
        set(&["old", "new", "allowMultiple"])
    );
    let todo = &schema("write_todos")["properties"]["todos"]["items"];
    assert_eq!(keys(&todo["properties"]), set(&["task", "completed"]));
    let mode = &schema("Grep")["properties"]["output_mode"];
    assert_eq!(
        strings(&mode["enum"]),
        set(&["content", "files_with_matches", "count"]),
        "{mode}"
    );
    let process = &schema("run_terminal_command")["properties"]["process_type"];
    assert!(process.to_string().contains("SYNC"), "{process}");
}
