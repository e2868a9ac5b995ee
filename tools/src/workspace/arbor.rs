//! Arbor's own family: `workspace/read`, `workspace/write`, `workspace/edit`,
//! `workspace/list`, `workspace/glob`, `workspace/grep`, `workspace/shell`,
//! `workspace/todos`, `workspace/think`. Paths are relative to the workspace
//! (an absolute path inside it is understood too); results are JSON objects.

use std::sync::Arc;
use std::time::Duration;

use arbor_actors::tool::{ToolContext, ToolError, ToolOutput, parse_input};
use serde::Deserialize;
use serde_json::{Value, json};

use super::confine::{Refusal, Workspace};
use super::notes::{self, Status, Todo};
use super::search::{self, Mode, Query};
use super::tool::{Family, Op, WorkspaceTool, agent, blocking, input_schema};
use super::{files, shell};

/// `workspace/read`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadInput {
    /// The files to read, each with an optional line range.
    files: Vec<ReadFile>,
}

/// One file to read.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadFile {
    /// The file's path, relative to the workspace.
    path: String,
    /// The first line to show (1-based; default 1).
    offset: Option<usize>,
    /// How many lines to show (default 2000).
    limit: Option<usize>,
}

/// `workspace/write`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteInput {
    /// The file's path, relative to the workspace (missing directories are made).
    path: String,
    /// The file's whole new content.
    content: String,
}

/// `workspace/edit`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct EditInput {
    /// The file's path, relative to the workspace.
    path: String,
    /// The replacements, applied in order; all apply or none does.
    edits: Vec<EditPair>,
}

/// One replacement.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct EditPair {
    /// The exact text to replace (whitespace and indentation included);
    /// it must occur exactly once unless `replace_all`.
    old: String,
    /// The text that replaces it.
    new: String,
    /// Replace every occurrence.
    #[serde(default)]
    replace_all: bool,
}

/// `workspace/list`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListInput {
    /// The directory, relative to the workspace (default: the workspace).
    #[serde(default)]
    path: String,
    /// How many levels down to list (default 1).
    depth: Option<usize>,
    /// Globs of names or paths to leave out.
    #[serde(default)]
    ignore: Vec<String>,
}

/// `workspace/glob`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct GlobInput {
    /// The glob, matched against paths below `path` (`*` within a
    /// directory, `**` across directories: `**/*.rs`).
    pattern: String,
    /// The directory to search (default: the workspace).
    #[serde(default)]
    path: String,
}

/// `workspace/grep`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct GrepInput {
    /// The regular expression (ripgrep's syntax).
    pattern: String,
    /// A file or directory to search (default: the workspace).
    path: Option<String>,
    /// Only files matching this glob (`*.rs`, `!*_test.go` excludes).
    glob: Option<String>,
    /// Only files of this ripgrep type (`rust`, `py`, `js`, ...).
    #[serde(rename = "type")]
    file_type: Option<String>,
    /// `content` (matching lines), `files_with_matches` (default) or `count`.
    output_mode: Option<OutputMode>,
    /// Lines of context before each match (content).
    before: Option<usize>,
    /// Lines of context after each match (content).
    after: Option<usize>,
    /// Lines of context before and after each match (content).
    context: Option<usize>,
    /// Case-insensitive.
    #[serde(default)]
    ignore_case: bool,
    /// Patterns may span lines.
    #[serde(default)]
    multiline: bool,
    /// At most this many lines (or files, or counts).
    head_limit: Option<usize>,
    /// Skip this many lines (or files, or counts) first.
    offset: Option<usize>,
}

/// What a grep shows.
#[derive(Clone, Copy, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum OutputMode {
    Content,
    FilesWithMatches,
    Count,
}

impl From<OutputMode> for Mode {
    fn from(m: OutputMode) -> Mode {
        match m {
            OutputMode::Content => Mode::Content,
            OutputMode::FilesWithMatches => Mode::FilesWithMatches,
            OutputMode::Count => Mode::Count,
        }
    }
}

/// `workspace/shell`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ShellInput {
    /// The command, run with `bash -c`.
    command: String,
    /// The working directory, relative to the workspace (default: the workspace).
    cwd: Option<String>,
    /// Seconds before the command's process group is killed (default 120, at most 600).
    timeout_seconds: Option<u64>,
}

/// `workspace/todos`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct TodosInput {
    /// The whole list, in the order the tasks will be done.
    todos: Vec<TodoInput>,
}

/// One task.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct TodoInput {
    /// The task.
    content: String,
    /// `pending`, `in_progress` or `completed`.
    status: Status,
}

/// `workspace/think`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ThinkInput {
    /// The thought: analysis, a plan, trade-offs.
    #[allow(dead_code)] // The journal keeps it, as the call's input.
    thought: String,
}

/// The family's tools.
pub(super) fn tools() -> Vec<WorkspaceTool> {
    let tool = |name, op, description, schema| WorkspaceTool {
        name,
        family: Family::Arbor,
        op,
        description,
        schema,
    };
    vec![
        tool(
            "workspace/read",
            Op::Read,
            "Reads files of the workspace, each whole or a line range, numbered like `cat -n`. Binary files are refused.",
            input_schema::<ReadInput>(),
        ),
        tool(
            "workspace/write",
            Op::Write,
            "Writes a file of the workspace whole (creating it and its directories). An existing file must have been read first and be unchanged since.",
            input_schema::<WriteInput>(),
        ),
        tool(
            "workspace/edit",
            Op::Edit,
            "Replaces exact text in a file of the workspace: one or several edits, each old text occurring exactly once (or replace_all); all apply or none does. Says what changed, with a diff.",
            input_schema::<EditInput>(),
        ),
        tool(
            "workspace/list",
            Op::List,
            "Lists a directory of the workspace (directories end with /), without what .gitignore excludes.",
            input_schema::<ListInput>(),
        ),
        tool(
            "workspace/glob",
            Op::Glob,
            "Finds files of the workspace by glob (`**/*.rs`), newest first, without what .gitignore excludes.",
            input_schema::<GlobInput>(),
        ),
        tool(
            "workspace/grep",
            Op::Grep,
            "Searches file contents of the workspace with a regular expression (ripgrep's), without what .gitignore excludes: matching lines with context, the matching files, or counts.",
            input_schema::<GrepInput>(),
        ),
        tool(
            "workspace/shell",
            Op::Shell,
            "Runs a command with bash -c in the workspace (or a directory of it): exit code, stdout and stderr. Killed with everything it started on timeout.",
            input_schema::<ShellInput>(),
        ),
        tool(
            "workspace/todos",
            Op::Todos,
            "Writes your todo list (the whole list each time): plan multi-step work, mark one task in_progress at a time and each completed when done.",
            input_schema::<TodosInput>(),
        ),
        tool(
            "workspace/think",
            Op::Think,
            "Thinks a problem through step by step before acting; changes nothing.",
            input_schema::<ThinkInput>(),
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
    let out = match tool.op {
        Op::Read => {
            let input: ReadInput = parse_input(input)?;
            blocking(move || {
                let results: Vec<Value> = input
                    .files
                    .iter()
                    .map(
                        |f| match files::read(&ws, &who, &f.path, f.offset, f.limit) {
                            Ok(read) => json!({
                                "path": ws.show(&read.rel, false),
                                "content": read.numbered(),
                                "lines": read.total_lines,
                            }),
                            Err(e) => json!({"path": f.path, "error": e.0}),
                        },
                    )
                    .collect();
                // A call none of whose files could be read failed.
                if results.iter().all(|r| r.get("error").is_some()) {
                    let why: Vec<&str> =
                        results.iter().filter_map(|r| r["error"].as_str()).collect();
                    return Err(Refusal(why.join("\n")));
                }
                Ok(Value::from(results))
            })
            .await?
        }
        Op::Write => {
            let input: WriteInput = parse_input(input)?;
            blocking(move || {
                let w = files::write(&ws, &who, &input.path, &input.content)?;
                Ok(json!({
                    "path": ws.show(&w.rel, false),
                    "created": w.created,
                    "bytes": w.bytes,
                    "diff": w.diff,
                }))
            })
            .await?
        }
        Op::Edit | Op::MultiEdit => {
            let input: EditInput = parse_input(input)?;
            let edits: Vec<files::Edit> = input
                .edits
                .into_iter()
                .map(|e| files::Edit {
                    old: e.old,
                    new: e.new,
                    all: e.replace_all,
                })
                .collect();
            blocking(move || {
                let e = files::edit(&ws, &who, &input.path, &edits)?;
                let shown = ws.show(&e.rel, false);
                Ok(json!({"path": shown, "message": e.summary(&shown), "diff": e.diff}))
            })
            .await?
        }
        Op::List => {
            let input: ListInput = parse_input(input)?;
            blocking(move || {
                let depth = input.depth.unwrap_or(1);
                let (dir, entries, cut) = search::list(&ws, &input.path, depth, &input.ignore)?;
                let names: Vec<String> = entries
                    .iter()
                    .map(|e| {
                        let below = e.rel.strip_prefix(&dir).unwrap_or(&e.rel);
                        let mut name = below.display().to_string();
                        if e.dir {
                            name.push('/');
                        } else if e.link {
                            name.push_str(" (symbolic link)");
                        }
                        name
                    })
                    .collect();
                Ok(json!({"path": ws.show(&dir, false), "entries": names, "cut": cut}))
            })
            .await?
        }
        Op::Glob | Op::FindFiles => {
            let input: GlobInput = parse_input(input)?;
            blocking(move || {
                let found = search::glob(&ws, &input.pattern, &input.path, search::MAX_GLOB)?;
                let files: Vec<String> = found.files.iter().map(|p| ws.show(p, false)).collect();
                Ok(json!({"files": files, "total": found.total}))
            })
            .await?
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
                ignore_case: input.ignore_case,
                line_numbers: true,
                multiline: input.multiline,
                head_limit: input.head_limit,
                offset: input.offset.unwrap_or(0),
                ..Query::default()
            };
            blocking(move || {
                let g = search::grep(&ws, &query)?;
                Ok(json!({
                    "lines": g.lines,
                    "matches": g.matches,
                    "files": g.files,
                    "cut": g.cut,
                }))
            })
            .await?
        }
        Op::Shell => {
            let input: ShellInput = parse_input(input)?;
            let timeout = input
                .timeout_seconds
                .map_or(shell::DEFAULT_TIMEOUT, Duration::from_secs);
            let ran = shell::run(
                &ws,
                &ctx,
                tool.name,
                &input.command,
                input.cwd.as_deref(),
                timeout,
            )
            .await?;
            json!({
                "exit_code": ran.code,
                "signal": ran.signal,
                "timed_out": ran.timed_out,
                "cwd": ran.cwd,
                "stdout": ran.stdout,
                "stderr": ran.stderr,
            })
        }
        Op::Todos => {
            let input: TodosInput = parse_input(input)?;
            let todos: Vec<Todo> = input
                .todos
                .into_iter()
                .map(|t| Todo {
                    content: t.content,
                    status: t.status,
                    active_form: None,
                })
                .collect();
            json!({"todos": todos, "summary": notes::render(&todos)})
        }
        Op::Think => {
            let _: ThinkInput = parse_input(input)?;
            json!({"noted": true})
        }
    };
    Ok(ToolOutput::Json(out))
}
