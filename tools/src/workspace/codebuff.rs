//! Codebuff's family, with Codebuff's input schemas and result shapes
//! (its `common/src/tools/params`): `read_files`, `write_file`,
//! `str_replace`, `run_terminal_command`, `code_search`, `find_files`,
//! `write_todos`, `think_deeply`. Paths are relative to the project root,
//! the workspace.
//!
//! Differences, each said in the tool's description where the model meets
//! it: `find_files` is a model-backed search in Codebuff; here it is a path
//! search (a glob when the prompt is one, else the files whose paths hold
//! the most of the prompt's words). `run_terminal_command` runs `SYNC` only
//! (`BACKGROUND` is refused). `code_search` takes ripgrep's searching flags
//! (`-i -S -s -w -F -U -g -t -T -A -B -C -l -c`) and refuses others.

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

/// `read_files`' input.
#[derive(Deserialize, schemars::JsonSchema)]
struct ReadFilesInput {
    /// File paths to read, relative to the project root.
    paths: Vec<String>,
}

/// `write_file`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct WriteFileInput {
    /// Path to the file relative to the project root.
    path: String,
    /// What the change is intended to do, in one sentence.
    #[allow(dead_code)] // The journal keeps it, as the call's input.
    instructions: String,
    /// The file's whole new content.
    content: String,
}

/// `str_replace`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct StrReplaceInput {
    /// The path to the file to edit.
    path: String,
    /// The replacements to make, in order.
    replacements: Vec<Replacement>,
}

/// A pair of old and new strings.
#[derive(Deserialize, schemars::JsonSchema)]
struct Replacement {
    /// The string to replace: an exact match, whitespace and punctuation included.
    old: String,
    /// What replaces it (empty to delete).
    new: String,
    /// Whether to allow several replacements of the old string.
    #[serde(default, rename = "allowMultiple")]
    allow_multiple: bool,
}

/// `run_terminal_command`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct TerminalInput {
    /// The command (run with bash -c).
    command: String,
    /// `SYNC` (waits, returns output); `BACKGROUND` is not offered here.
    process_type: Option<ProcessType>,
    /// The working directory, relative to the project root (default: the root).
    cwd: Option<String>,
    /// Seconds before the command is killed (default 30; -1 for the longest, 600).
    timeout_seconds: Option<f64>,
}

/// How a command runs.
#[derive(Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
enum ProcessType {
    #[serde(rename = "SYNC")]
    Sync,
    #[serde(rename = "BACKGROUND")]
    Background,
}

/// `code_search`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct CodeSearchInput {
    /// The pattern to search for (a regular expression).
    pattern: String,
    /// ripgrep flags: -i, -S, -s, -w, -F, -U, -g GLOB, -t TYPE, -T TYPE, -A N, -B N, -C N, -l, -c.
    flags: Option<String>,
    /// The directory to search, relative to the project root (default: the root).
    cwd: Option<String>,
    /// At most this many results per file (default 15; 250 in all).
    #[serde(rename = "maxResults")]
    max_results: Option<usize>,
}

/// `find_files`' input.
#[derive(Deserialize, schemars::JsonSchema)]
struct FindFilesInput {
    /// What files to find: a glob (`src/**/*.ts`), or words of their paths.
    prompt: String,
}

/// `write_todos`' input.
#[derive(Deserialize, schemars::JsonSchema)]
struct WriteTodosInput {
    /// Every task with its completion status, in the order they will be done.
    todos: Vec<CodebuffTodo>,
}

/// One task.
#[derive(Deserialize, schemars::JsonSchema)]
struct CodebuffTodo {
    /// Description of the task.
    task: String,
    /// Whether the task is completed.
    completed: bool,
}

/// `think_deeply`'s input.
#[derive(Deserialize, schemars::JsonSchema)]
struct ThinkInput {
    /// Detailed step-by-step analysis.
    #[allow(dead_code)] // The journal keeps it, as the call's input.
    thought: String,
}

/// The most results of a `code_search` in all (Codebuff's global cap).
const GLOBAL_MAX_RESULTS: usize = 250;

/// The family's tools.
pub(super) fn tools() -> Vec<WorkspaceTool> {
    let tool = |name, op, description, schema| WorkspaceTool {
        name,
        family: Family::Codebuff,
        op,
        description,
        schema,
    };
    vec![
        tool(
            "read_files",
            Op::Read,
            "Read several files from disk and return their contents. Paths are relative to the project root.",
            input_schema::<ReadFilesInput>(),
        ),
        tool(
            "write_file",
            Op::Write,
            "Create or overwrite a file with the given content (the whole file). An existing file must have been read first and be unchanged since.",
            input_schema::<WriteFileInput>(),
        ),
        tool(
            "str_replace",
            Op::Edit,
            "Replace strings in a file with new strings: each old string must occur exactly once unless allowMultiple; all replacements apply or none does.",
            input_schema::<StrReplaceInput>(),
        ),
        tool(
            "run_terminal_command",
            Op::Shell,
            "Execute a CLI command (bash) from the project root, or cwd below it, and wait for its output (SYNC only).",
            input_schema::<TerminalInput>(),
        ),
        tool(
            "code_search",
            Op::Grep,
            "Search for a regular expression in the project's files (ripgrep's engine, .gitignore honoured): matching lines as path:line:text.",
            input_schema::<CodeSearchInput>(),
        ),
        tool(
            "find_files",
            Op::FindFiles,
            "Find files by a glob (`src/**/*.ts`) or by words of their paths (here a path search, not a model): returns their paths, newest first.",
            input_schema::<FindFilesInput>(),
        ),
        tool(
            "write_todos",
            Op::Todos,
            "Write a todo list to track tasks for multi-step work: rewrite ALL todos with their current status on each call.",
            input_schema::<WriteTodosInput>(),
        ),
        tool(
            "think_deeply",
            Op::Think,
            "Deeply consider complex tasks by brainstorming approaches and trade-offs step by step; changes nothing.",
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
            let input: ReadFilesInput = parse_input(input)?;
            blocking(move || {
                if input.paths.is_empty() {
                    return Err(Refusal("no paths given".to_owned()));
                }
                let results: Vec<Value> = input
                    .paths
                    .iter()
                    .map(|p| match files::read(&ws, &who, p, None, None) {
                        Ok(read) => json!({"path": p, "content": read.plain()}),
                        Err(e) => json!({"path": p, "content": format!("[ERROR: {}]", e.0)}),
                    })
                    .collect();
                Ok(Value::from(results))
            })
            .await?
        }
        Op::Write => {
            let input: WriteFileInput = parse_input(input)?;
            blocking(move || {
                let w = files::write(&ws, &who, &input.path, &input.content)?;
                let verb = if w.created { "Created" } else { "Updated" };
                Ok(json!({
                    "file": input.path,
                    "message": format!("{verb} {} ({} bytes).", input.path, w.bytes),
                    "unifiedDiff": w.diff,
                }))
            })
            .await?
        }
        Op::Edit | Op::MultiEdit => {
            let input: StrReplaceInput = parse_input(input)?;
            let edits: Vec<files::Edit> = input
                .replacements
                .into_iter()
                .map(|r| files::Edit {
                    old: r.old,
                    new: r.new,
                    all: r.allow_multiple,
                })
                .collect();
            blocking(move || {
                let e = files::edit(&ws, &who, &input.path, &edits)?;
                Ok(json!({
                    "file": input.path,
                    "message": e.summary(&input.path),
                    "unifiedDiff": e.diff,
                }))
            })
            .await?
        }
        Op::Shell => {
            let input: TerminalInput = parse_input(input)?;
            if input.process_type == Some(ProcessType::Background) {
                return Err(ToolError::new(
                    "run_terminal_command: BACKGROUND is not offered here; run it SYNC with a timeout",
                ));
            }
            let timeout = match input.timeout_seconds {
                None => Duration::from_secs(30),
                Some(s) if s < 0.0 => shell::MAX_TIMEOUT,
                Some(s) => Duration::try_from_secs_f64(s).unwrap_or(shell::MAX_TIMEOUT),
            };
            let ran = shell::run(
                &ws,
                &ctx,
                tool.name,
                &input.command,
                input.cwd.as_deref(),
                timeout,
            )
            .await?;
            let mut out = json!({
                "command": input.command,
                "startingCwd": ran.cwd,
                "stdout": ran.stdout,
                "stderr": ran.stderr,
            });
            if let Some(code) = ran.code {
                out["exitCode"] = code.into();
            }
            if ran.timed_out || ran.signal.is_some() {
                out["message"] = ran.ending(timeout).into();
            }
            out
        }
        Op::Grep => {
            let input: CodeSearchInput = parse_input(input)?;
            let mut query = flags(input.flags.as_deref().unwrap_or(""))?;
            query.pattern = input.pattern;
            query.path = input.cwd;
            query.per_file = Some(input.max_results.unwrap_or(15));
            query.head_limit = Some(GLOBAL_MAX_RESULTS);
            query.line_numbers = true;
            blocking(move || {
                let g = search::grep(&ws, &query)?;
                let mut message = format!("Found {} matches in {} files", g.matches, g.files);
                if g.cut {
                    message.push_str(" (output cut; narrow the pattern, cwd or -g globs)");
                }
                Ok(json!({"stdout": g.lines.join("\n"), "message": message}))
            })
            .await?
        }
        Op::FindFiles | Op::Glob | Op::List => {
            let input: FindFilesInput = parse_input(input)?;
            blocking(move || {
                let files = find(&ws, &input.prompt)?;
                let message = if files.is_empty() {
                    format!("No files found for {:?}.", input.prompt)
                } else {
                    format!(
                        "Found {} files for {:?} (a path search): {}. Read them with read_files.",
                        files.len(),
                        input.prompt,
                        files.join(", ")
                    )
                };
                Ok(json!({"message": message, "files": files}))
            })
            .await?
        }
        Op::Todos => {
            let input: WriteTodosInput = parse_input(input)?;
            let todos: Vec<Todo> = input
                .todos
                .iter()
                .map(|t| Todo {
                    content: t.task.clone(),
                    status: if t.completed {
                        Status::Completed
                    } else {
                        Status::Pending
                    },
                    active_form: None,
                })
                .collect();
            let list: Vec<Value> = input
                .todos
                .iter()
                .map(|t| json!({"task": t.task, "completed": t.completed}))
                .collect();
            json!({"message": format!("Todos written:\n{}", notes::render(&todos)), "todos": list})
        }
        Op::Think => {
            let _: ThinkInput = parse_input(input)?;
            json!({"message": "Thought noted."})
        }
    };
    Ok(ToolOutput::Json(out))
}

/// The files `prompt` names: a glob's matches, or else the files whose
/// paths hold the most of its words (at least one), newest first; at most 10.
pub(super) fn find(ws: &Workspace, prompt: &str) -> Result<Vec<String>, Refusal> {
    const MAX: usize = 10;
    let prompt = prompt.trim();
    if prompt.contains(['*', '?', '[']) {
        let found = search::glob(ws, prompt, "", MAX)?;
        return Ok(found.files.iter().map(|p| ws.show(p, false)).collect());
    }
    let words: Vec<String> = prompt
        .split(|c: char| !c.is_alphanumeric() && c != '_' && c != '.')
        .filter(|w| w.len() >= 2)
        .map(str::to_lowercase)
        .collect();
    let all = search::glob(ws, "**", "", usize::MAX)?;
    let mut scored: Vec<(usize, usize, String)> = all
        .files
        .iter()
        .enumerate()
        .filter_map(|(newest, p)| {
            let path = ws.show(p, false);
            let lower = path.to_lowercase();
            let score = words.iter().filter(|w| lower.contains(w.as_str())).count();
            (score > 0).then_some((score, newest, path))
        })
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    Ok(scored.into_iter().take(MAX).map(|(_, _, p)| p).collect())
}

/// A query from `code_search`'s ripgrep flags.
pub(super) fn flags(text: &str) -> Result<Query, ToolError> {
    let mut query = Query {
        mode: Mode::Content,
        ..Query::default()
    };
    let mut words = text.split_whitespace().map(|w| w.trim_matches(['"', '\'']));
    let number = |flag: &str, value: Option<&str>| -> Result<usize, ToolError> {
        value.and_then(|v| v.parse().ok()).ok_or_else(|| {
            ToolError::new(format!("code_search: flag {flag} needs a number of lines"))
        })
    };
    let text_arg = |flag: &str, value: Option<&str>| -> Result<String, ToolError> {
        value
            .map(str::to_owned)
            .ok_or_else(|| ToolError::new(format!("code_search: flag {flag} needs a value")))
    };
    while let Some(word) = words.next() {
        // `-A3` and `--after-context=3` as well as `-A 3`.
        let (flag, attached) = match word.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ if word.len() > 2
                && !word.starts_with("--")
                && word.starts_with('-')
                && word.is_char_boundary(2) =>
            {
                (&word[..2], Some(&word[2..]))
            }
            _ => (word, None),
        };
        let mut value = || attached.or_else(|| words.next());
        match flag {
            "-i" | "--ignore-case" => query.ignore_case = true,
            "-S" | "--smart-case" => query.smart_case = true,
            "-s" | "--case-sensitive" => {}
            "-w" | "--word-regexp" => query.word = true,
            "-F" | "--fixed-strings" => query.fixed = true,
            "-U" | "--multiline" | "--multiline-dotall" => query.multiline = true,
            "-n" | "--line-number" => {}
            "-l" | "--files-with-matches" => query.mode = Mode::FilesWithMatches,
            "-c" | "--count" => query.mode = Mode::Count,
            "-g" | "--glob" => query.globs.push(text_arg(flag, value())?),
            "-t" | "--type" => query.types.push(text_arg(flag, value())?),
            "-T" | "--type-not" => query.types_not.push(text_arg(flag, value())?),
            "-A" | "--after-context" => query.after = number(flag, value())?,
            "-B" | "--before-context" => query.before = number(flag, value())?,
            "-C" | "--context" => {
                let n = number(flag, value())?;
                query.before = n;
                query.after = n;
            }
            other => {
                return Err(ToolError::new(format!(
                    "code_search: flag {other} is not offered; use -i -S -s -w -F -U -g GLOB -t TYPE -T TYPE -A N -B N -C N -l -c"
                )));
            }
        }
    }
    Ok(query)
}
