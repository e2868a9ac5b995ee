//! Claude Code's family, with its documented input schemas: `Read`,
//! `Write`, `Edit`, `MultiEdit`, `Bash`, `Grep`, `Glob`, `LS`, `TodoWrite`.
//! Paths are absolute (a path relative to the workspace is understood too);
//! results are text, as Claude Code's are: `Read` numbered like `cat -n`,
//! `Glob` and `Grep`'s `files_with_matches` newest first, a failed `Bash`
//! command (non-zero exit, timeout) an error result with its output.
//!
//! Differences: `Bash`'s `run_in_background` is refused; `LS` lists the
//! whole tree below the path (at most 1000 entries), without what
//! `.gitignore` excludes.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use arbor_actors::tool::{ToolContext, ToolError, ToolOutput, parse_input};
use serde::Deserialize;
use serde_json::Value;

use super::arbor::OutputMode;
use super::confine::Workspace;
use super::notes::{self, Status, Todo};
use super::search::{self, Mode, Query};
use super::tool::{Family, Op, WorkspaceTool, agent, blocking, input_schema};
use super::{files, shell};

/// `Read`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct ReadInput {
    /// The absolute path to the file to read.
    file_path: String,
    /// The line number to start reading from.
    offset: Option<usize>,
    /// The number of lines to read.
    limit: Option<usize>,
}

/// `Write`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct WriteInput {
    /// The absolute path to the file to write.
    file_path: String,
    /// The content to write to the file.
    content: String,
}

/// `Edit`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct EditInput {
    /// The absolute path to the file to modify.
    file_path: String,
    /// The text to replace.
    old_string: String,
    /// The text to replace it with (must be different from old_string).
    new_string: String,
    /// Replace all occurrences of old_string (default false).
    #[serde(default)]
    replace_all: bool,
}

/// `MultiEdit`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct MultiEditInput {
    /// The absolute path to the file to modify.
    file_path: String,
    /// Edits to perform in order; all apply or none does.
    edits: Vec<OneEdit>,
}

/// One edit of a `MultiEdit`.
#[derive(Deserialize, schemars::JsonSchema)]
struct OneEdit {
    /// The text to replace.
    old_string: String,
    /// The text to replace it with.
    new_string: String,
    /// Replace all occurrences of old_string (default false).
    #[serde(default)]
    replace_all: bool,
}

/// `Bash`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct BashInput {
    /// The command to execute.
    command: String,
    /// Optional timeout in milliseconds (max 600000).
    timeout: Option<u64>,
    /// A clear, concise description of what this command does, in 5-10 words.
    description: Option<String>,
    /// Run the command in the background (not offered here).
    run_in_background: Option<bool>,
}

/// `Grep`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct GrepInput {
    /// The regular expression pattern to search for in file contents.
    pattern: String,
    /// File or directory to search in (default: the workspace).
    path: Option<String>,
    /// Glob pattern to filter files (e.g. "*.js", "*.{ts,tsx}").
    glob: Option<String>,
    /// Output mode: "content", "files_with_matches" (default) or "count".
    output_mode: Option<OutputMode>,
    /// Number of lines to show before each match (content mode).
    #[serde(rename = "-B")]
    before: Option<usize>,
    /// Number of lines to show after each match (content mode).
    #[serde(rename = "-A")]
    after: Option<usize>,
    /// Number of lines to show before and after each match (content mode).
    #[serde(rename = "-C")]
    context: Option<usize>,
    /// Show line numbers in output (content mode; default true).
    #[serde(rename = "-n")]
    line_numbers: Option<bool>,
    /// Case insensitive search.
    #[serde(rename = "-i")]
    ignore_case: Option<bool>,
    /// File type to search (rg --type: js, py, rust, go, ...).
    #[serde(rename = "type")]
    file_type: Option<String>,
    /// Limit output to the first N lines or entries.
    head_limit: Option<usize>,
    /// Skip the first N lines or entries.
    offset: Option<usize>,
    /// Enable multiline mode where . matches newlines and patterns can span lines.
    multiline: Option<bool>,
}

/// `Glob`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct GlobInput {
    /// The glob pattern to match files against.
    pattern: String,
    /// The directory to search in (default: the workspace).
    path: Option<String>,
}

/// `LS`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct LsInput {
    /// The absolute path to the directory to list.
    path: String,
    /// Glob patterns to ignore.
    ignore: Option<Vec<String>>,
}

/// `TodoWrite`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct TodoWriteInput {
    /// The updated todo list.
    todos: Vec<TodoItem>,
}

/// One task of `TodoWrite`.
#[derive(Deserialize, schemars::JsonSchema)]
struct TodoItem {
    /// The task, in the imperative ("Run the tests").
    content: String,
    /// pending, in_progress or completed.
    status: Status,
    /// The task in the present continuous ("Running the tests").
    #[serde(rename = "activeForm")]
    active_form: String,
}

/// The family's tools.
pub(super) fn tools() -> Vec<WorkspaceTool> {
    let tool = |name, op, description, schema| WorkspaceTool {
        name,
        family: Family::Claude,
        op,
        description,
        schema,
    };
    vec![
        tool(
            "Read",
            Op::Read,
            "Reads a file of the workspace, numbered like cat -n (up to 2000 lines by default; offset and limit for a range). Binary files are refused.",
            input_schema::<ReadInput>(),
        ),
        tool(
            "Write",
            Op::Write,
            "Writes a file of the workspace whole. An existing file must have been read first with Read and be unchanged since.",
            input_schema::<WriteInput>(),
        ),
        tool(
            "Edit",
            Op::Edit,
            "Replaces exact text in a file: old_string must occur exactly once unless replace_all. A file read with Read must be unchanged since.",
            input_schema::<EditInput>(),
        ),
        tool(
            "MultiEdit",
            Op::MultiEdit,
            "Several exact-text replacements in one file, in order; all apply or none does.",
            input_schema::<MultiEditInput>(),
        ),
        tool(
            "Bash",
            Op::Shell,
            "Runs a bash command in the workspace, with a timeout (default 2 minutes, at most 10); stdout and stderr are returned.",
            input_schema::<BashInput>(),
        ),
        tool(
            "Grep",
            Op::Grep,
            "Searches file contents with a regular expression (ripgrep's engine, .gitignore honoured); output_mode content, files_with_matches (default, newest first) or count.",
            input_schema::<GrepInput>(),
        ),
        tool(
            "Glob",
            Op::Glob,
            "Finds files by glob pattern (\"**/*.js\", \"src/**/*.ts\"), newest first.",
            input_schema::<GlobInput>(),
        ),
        tool(
            "LS",
            Op::List,
            "Lists the files and directories below a path, as a tree, without what .gitignore excludes.",
            input_schema::<LsInput>(),
        ),
        tool(
            "TodoWrite",
            Op::Todos,
            "Writes your todo list (the whole list each time) to plan and track multi-step work: one task in_progress at a time.",
            input_schema::<TodoWriteInput>(),
        ),
    ]
}

/// Runs one of the family's tools.
pub(super) async fn call(
    tool: &WorkspaceTool,
    ws: Arc<Workspace>,
    input: Value,
    ctx: ToolContext,
) -> Result<ToolOutput, ToolError> {
    let who = agent(&ctx);
    let text = match tool.op {
        Op::Read => {
            let input: ReadInput = parse_input(input)?;
            blocking(move || {
                let read = files::read(&ws, &who, &input.file_path, input.offset, input.limit)?;
                Ok(read.numbered())
            })
            .await?
        }
        Op::Write => {
            let input: WriteInput = parse_input(input)?;
            blocking(move || {
                let w = files::write(&ws, &who, &input.file_path, &input.content)?;
                let shown = ws.show(&w.rel, true);
                Ok(if w.created {
                    format!("File created successfully at: {shown}")
                } else {
                    format!("The file {shown} has been updated.\n{}", w.diff)
                })
            })
            .await?
        }
        Op::Edit | Op::MultiEdit => {
            let (path, edits) = if tool.op == Op::Edit {
                let input: EditInput = parse_input(input)?;
                let edit = files::Edit {
                    old: input.old_string,
                    new: input.new_string,
                    all: input.replace_all,
                };
                (input.file_path, vec![edit])
            } else {
                let input: MultiEditInput = parse_input(input)?;
                let edits = input
                    .edits
                    .into_iter()
                    .map(|e| files::Edit {
                        old: e.old_string,
                        new: e.new_string,
                        all: e.replace_all,
                    })
                    .collect();
                (input.file_path, edits)
            };
            blocking(move || {
                let e = files::edit(&ws, &who, &path, &edits)?;
                let shown = ws.show(&e.rel, true);
                Ok(format!("{}.\n{}", e.summary(&shown), e.diff))
            })
            .await?
        }
        Op::Shell => {
            let input: BashInput = parse_input(input)?;
            let _ = input.description;
            if input.run_in_background == Some(true) {
                return Err(ToolError::new(
                    "Bash: run_in_background is not offered here; run the command with a timeout",
                ));
            }
            let timeout = input
                .timeout
                .map_or(shell::DEFAULT_TIMEOUT, Duration::from_millis);
            let ran = shell::run(&ws, &ctx, tool.name, &input.command, None, timeout).await?;
            let mut out = ran.stdout.trim_end().to_owned();
            let err = ran.stderr.trim_end();
            if !err.is_empty() {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(err);
            }
            if ran.code != Some(0) {
                let _ = write!(out, "\n{}", ran.ending(timeout));
                return Err(ToolError::new(out.trim_start().to_owned()));
            }
            out
        }
        Op::Grep => {
            let input: GrepInput = parse_input(input)?;
            let context = input.context.unwrap_or(0);
            let query = Query {
                pattern: input.pattern,
                path: input.path,
                globs: input.glob.into_iter().collect(),
                types: input.file_type.into_iter().collect(),
                mode: input.output_mode.map(Mode::from).unwrap_or_default(),
                before: input.before.unwrap_or(context),
                after: input.after.unwrap_or(context),
                ignore_case: input.ignore_case.unwrap_or(false),
                line_numbers: input.line_numbers.unwrap_or(true),
                multiline: input.multiline.unwrap_or(false),
                head_limit: input.head_limit,
                offset: input.offset.unwrap_or(0),
                absolute: true,
                ..Query::default()
            };
            blocking(move || {
                let g = search::grep(&ws, &query)?;
                Ok(grep_text(&query, &g))
            })
            .await?
        }
        Op::Glob | Op::FindFiles => {
            let input: GlobInput = parse_input(input)?;
            blocking(move || {
                let path = input.path.unwrap_or_default();
                let found = search::glob(&ws, &input.pattern, &path, search::MAX_GLOB)?;
                if found.files.is_empty() {
                    return Ok("No files found".to_owned());
                }
                let mut out: Vec<String> = found.files.iter().map(|p| ws.show(p, true)).collect();
                if found.total > found.files.len() {
                    out.push(
                        "(Results are truncated. Consider using a more specific path or pattern.)"
                            .to_owned(),
                    );
                }
                Ok(out.join("\n"))
            })
            .await?
        }
        Op::List => {
            let input: LsInput = parse_input(input)?;
            blocking(move || {
                let ignore = input.ignore.unwrap_or_default();
                let (dir, entries, cut) = search::list(&ws, &input.path, usize::MAX, &ignore)?;
                let mut out = format!("- {}/\n", ws.show(&dir, true));
                for e in &entries {
                    let name = e
                        .rel
                        .file_name()
                        .map(|n| n.to_string_lossy())
                        .unwrap_or_default();
                    let slash = if e.dir { "/" } else { "" };
                    let _ = writeln!(out, "{}- {name}{slash}", "  ".repeat(e.depth));
                }
                if cut {
                    let _ = writeln!(
                        out,
                        "[more than {} entries; list a directory below this one]",
                        search::MAX_LIST
                    );
                }
                Ok(out)
            })
            .await?
        }
        Op::Todos => {
            let input: TodoWriteInput = parse_input(input)?;
            let todos: Vec<Todo> = input
                .todos
                .into_iter()
                .map(|t| Todo {
                    content: t.content,
                    status: t.status,
                    active_form: Some(t.active_form),
                })
                .collect();
            format!(
                "Todos have been modified successfully. Keep using the todo list to track your progress.\n{}",
                notes::render(&todos)
            )
        }
        Op::Think => String::new(),
    };
    Ok(ToolOutput::Json(Value::String(text)))
}

/// Grep's output as Claude Code's Grep gives it.
fn grep_text(query: &Query, g: &search::Grepped) -> String {
    let mut out = match query.mode {
        Mode::FilesWithMatches if g.lines.is_empty() => "No files found".to_owned(),
        Mode::FilesWithMatches => {
            format!("Found {} files\n{}", g.files, g.lines.join("\n"))
        }
        _ if g.lines.is_empty() => "No matches found".to_owned(),
        Mode::Content => g.lines.join("\n"),
        Mode::Count => format!(
            "{}\n\nFound {} total occurrences across {} files.",
            g.lines.join("\n"),
            g.matches,
            g.files
        ),
    };
    if g.cut {
        out.push_str("\n[output cut: use head_limit and offset, or narrow path, glob or type]");
    }
    out
}
