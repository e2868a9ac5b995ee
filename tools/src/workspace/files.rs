//! Reading, writing and editing one file of a workspace: what every family's
//! read, write and edit tools do, before each shapes the result its agents
//! expect.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::PathBuf;

use super::confine::{Refusal, Workspace};

/// The largest file a read or an edit takes whole (10 MiB); larger ones are
/// refused with a note to search them or read them with the shell.
pub const MAX_FILE_BYTES: u64 = 10 << 20;

/// How many lines a read shows when not told (Claude Code's default).
pub const DEFAULT_LINES: usize = 2000;

/// Longer lines are cut to this many characters.
pub const MAX_LINE_CHARS: usize = 2000;

/// The most text one read shows (256 KiB); the note says where to go on.
pub const MAX_READ_BYTES: usize = 256 << 10;

/// How much of a file's start is looked at for NUL bytes (as ripgrep does)
/// to call it binary.
const BINARY_SNIFF: usize = 8192;

/// The largest diff a write or an edit reports (the rest is cut).
const MAX_DIFF_BYTES: usize = 20_000;

/// What a read shows of a file.
#[derive(Clone, Debug)]
pub struct Read {
    /// The path, relative to the workspace.
    pub rel: PathBuf,
    /// The number of the first line shown (1-based).
    pub first: usize,
    /// The lines shown (each cut to [`MAX_LINE_CHARS`]).
    pub lines: Vec<String>,
    /// How many lines the file has.
    pub total_lines: usize,
    /// Why not everything was shown, and how to read on; or that the file
    /// is empty.
    pub note: Option<String>,
}

impl Read {
    /// The lines numbered as `cat -n` does (and Claude Code's Read): the
    /// number right-aligned in six columns, a tab, the line; the note last.
    pub fn numbered(&self) -> String {
        let mut out = String::new();
        for (i, line) in self.lines.iter().enumerate() {
            let _ = writeln!(out, "{:>6}\t{line}", self.first + i);
        }
        if let Some(note) = &self.note {
            let _ = writeln!(out, "[{note}]");
        }
        out
    }

    /// The lines as they are, joined; the note last.
    pub fn plain(&self) -> String {
        let mut out = self.lines.join("\n");
        if let Some(note) = &self.note {
            if !out.is_empty() {
                out.push('\n');
            }
            let _ = write!(out, "[{note}]");
        }
        out
    }
}

/// Reads `given` for `agent`: lines from `offset` (1-based; default 1), at
/// most `limit` (default [`DEFAULT_LINES`]), and notes what the agent read
/// for the stale-write check. Refused: a binary file, a file over
/// [`MAX_FILE_BYTES`], any path the workspace refuses.
pub fn read(
    ws: &Workspace,
    agent: &str,
    given: &str,
    offset: Option<usize>,
    limit: Option<usize>,
) -> Result<Read, Refusal> {
    let (rel, mut file, stat) = ws.open_read(given)?;
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if size > MAX_FILE_BYTES {
        return Err(Refusal(format!(
            "{given}: the file is {size} bytes, more than a read takes ({MAX_FILE_BYTES}); search it with grep, or show a part of it with the shell"
        )));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| Refusal(format!("{given}: could not read: {e}")))?;
    ws.reads.saw(agent, &rel, &bytes);
    if bytes[..bytes.len().min(BINARY_SNIFF)].contains(&0) {
        return Err(Refusal(format!(
            "{given}: binary file ({} bytes), not shown",
            bytes.len()
        )));
    }
    let text = String::from_utf8_lossy(&bytes);
    let total_lines = text.lines().count();
    let first = offset.unwrap_or(1).max(1);
    let limit = limit.unwrap_or(DEFAULT_LINES).max(1);
    if total_lines == 0 {
        return Ok(Read {
            rel,
            first: 1,
            lines: Vec::new(),
            total_lines,
            note: Some("the file is empty".to_owned()),
        });
    }
    if first > total_lines {
        return Err(Refusal(format!(
            "{given}: the file has {total_lines} lines; offset {first} is past its end"
        )));
    }
    let mut lines = Vec::new();
    let mut shown_bytes = 0;
    let mut cut_lines = false;
    for line in text.lines().skip(first - 1).take(limit) {
        let line = match line.char_indices().nth(MAX_LINE_CHARS) {
            Some((at, _)) => {
                cut_lines = true;
                format!("{}… [line cut at {MAX_LINE_CHARS} characters]", &line[..at])
            }
            None => line.to_owned(),
        };
        shown_bytes += line.len() + 8;
        if shown_bytes > MAX_READ_BYTES && !lines.is_empty() {
            break;
        }
        lines.push(line);
    }
    let last = first + lines.len() - 1;
    let mut notes = Vec::new();
    if last < total_lines {
        notes.push(format!(
            "showed lines {first}-{last} of {total_lines}; read on with offset {}",
            last + 1
        ));
    }
    if cut_lines {
        notes.push("some long lines were cut".to_owned());
    }
    Ok(Read {
        rel,
        first,
        lines,
        total_lines,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

/// What a write did.
#[derive(Clone, Debug)]
pub struct Written {
    /// The path, relative to the workspace.
    pub rel: PathBuf,
    /// Whether the file is new.
    pub created: bool,
    /// Its size now.
    pub bytes: usize,
    /// A unified diff from what was there (empty for no change).
    pub diff: String,
}

/// Writes `content` to `given` for `agent` (creating it and its missing
/// directories): refused in a read-only workspace, over a file the agent has
/// not read, or one changed since it did (see [`super::stale`]).
pub fn write(ws: &Workspace, agent: &str, given: &str, content: &str) -> Result<Written, Refusal> {
    ws.writable(given)?;
    let _writing = ws.reads.writing();
    let target = ws.target(given, true)?;
    let current = target.current(ws, given)?;
    ws.reads
        .check(agent, &target.rel, given, current.as_deref(), true)?;
    target.replace(given, content.as_bytes())?;
    ws.reads.saw(agent, &target.rel, content.as_bytes());
    let old = current
        .as_deref()
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    Ok(Written {
        diff: unified_diff(&ws.show(&target.rel, false), &old, content),
        rel: target.rel,
        created: current.is_none(),
        bytes: content.len(),
    })
}

/// One replacement of an edit.
#[derive(Clone, Debug)]
pub struct Edit {
    /// The exact text to replace.
    pub old: String,
    /// What replaces it.
    pub new: String,
    /// Every occurrence (else the old text must occur exactly once).
    pub all: bool,
}

/// What one replacement of an edit changed.
#[derive(Clone, Debug)]
pub struct Change {
    /// The line (1-based, in the file as it was before this replacement)
    /// of the first occurrence.
    pub line: usize,
    /// How many occurrences were replaced.
    pub count: usize,
}

/// What an edit did.
#[derive(Clone, Debug)]
pub struct Edited {
    /// The path, relative to the workspace.
    pub rel: PathBuf,
    /// Each replacement, in order.
    pub changes: Vec<Change>,
    /// A unified diff of the whole edit.
    pub diff: String,
}

impl Edited {
    /// A line for the model: what changed where.
    pub fn summary(&self, shown: &str) -> String {
        let parts: Vec<String> = self
            .changes
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let times = if c.count == 1 {
                    "1 occurrence".to_owned()
                } else {
                    format!("{} occurrences", c.count)
                };
                if self.changes.len() == 1 {
                    format!("replaced {times} at line {}", c.line)
                } else {
                    format!("edit {}: replaced {times} at line {}", i + 1, c.line)
                }
            })
            .collect();
        format!("Edited {shown}: {}", parts.join("; "))
    }
}

/// Applies `edits`, in order, to `given` for `agent`: each old text must
/// occur exactly once (or `all`); all apply or none does. An edit of a file
/// the agent read that has changed since is refused (see [`super::stale`]).
/// A single edit with an empty old text creates a file that does not exist.
pub fn edit(ws: &Workspace, agent: &str, given: &str, edits: &[Edit]) -> Result<Edited, Refusal> {
    ws.writable(given)?;
    if edits.is_empty() {
        return Err(Refusal(format!("{given}: no edits given")));
    }
    let _writing = ws.reads.writing();
    let creating = edits.len() == 1 && edits[0].old.is_empty();
    let target = ws.target(given, creating)?;
    let current = target.current(ws, given)?;
    let Some(current) = current else {
        if creating {
            target.replace(given, edits[0].new.as_bytes())?;
            ws.reads.saw(agent, &target.rel, edits[0].new.as_bytes());
            return Ok(Edited {
                diff: unified_diff(&ws.show(&target.rel, false), "", &edits[0].new),
                rel: target.rel,
                changes: vec![Change { line: 1, count: 1 }],
            });
        }
        return Err(Refusal(format!(
            "{given}: no such file (write it to create it)"
        )));
    };
    if current.len() as u64 > MAX_FILE_BYTES {
        return Err(Refusal(format!(
            "{given}: the file is {} bytes, more than an edit takes ({MAX_FILE_BYTES})",
            current.len()
        )));
    }
    ws.reads
        .check(agent, &target.rel, given, Some(&current), false)?;
    let Ok(old) = String::from_utf8(current) else {
        return Err(Refusal(format!(
            "{given}: the file is not UTF-8 text; it cannot be edited by exact match"
        )));
    };
    let mut text = old.clone();
    let mut changes = Vec::with_capacity(edits.len());
    let which = |i: usize| {
        if edits.len() == 1 {
            String::new()
        } else {
            format!("edit {}: ", i + 1)
        }
    };
    for (i, e) in edits.iter().enumerate() {
        if e.old.is_empty() {
            return Err(Refusal(format!(
                "{given}: {}the old text is empty (only a new file is created that way); nothing was changed",
                which(i)
            )));
        }
        if e.old == e.new {
            return Err(Refusal(format!(
                "{given}: {}the old and the new text are the same; nothing was changed",
                which(i)
            )));
        }
        let count = text.matches(e.old.as_str()).count();
        let Some(at) = text.find(e.old.as_str()) else {
            return Err(Refusal(format!(
                "{given}: {}the old text was not found (it must match exactly, whitespace and indentation included; read the file again); nothing was changed",
                which(i)
            )));
        };
        if count > 1 && !e.all {
            return Err(Refusal(format!(
                "{given}: {}the old text occurs {count} times; include more of the surrounding text to make it unique, or replace all of them; nothing was changed",
                which(i)
            )));
        }
        changes.push(Change {
            line: text[..at].matches('\n').count() + 1,
            count,
        });
        text = if e.all {
            text.replace(e.old.as_str(), &e.new)
        } else {
            text.replacen(e.old.as_str(), &e.new, 1)
        };
    }
    target.replace(given, text.as_bytes())?;
    ws.reads.saw(agent, &target.rel, text.as_bytes());
    Ok(Edited {
        diff: unified_diff(&ws.show(&target.rel, false), &old, &text),
        rel: target.rel,
        changes,
    })
}

/// A unified diff of `old` to `new` as one hunk (the changed lines between
/// the common first and last lines, with three lines of context), cut to
/// 20 000 bytes; empty when nothing changed.
pub fn unified_diff(path: &str, old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    if a == b {
        return String::new();
    }
    let pre = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let suf = a[pre..]
        .iter()
        .rev()
        .zip(b[pre..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let context = 3;
    let start = pre.saturating_sub(context);
    let a_end = (a.len() - suf + context).min(a.len());
    let b_end = (b.len() - suf + context).min(b.len());
    let at = |len: usize| if len == 0 { start } else { start + 1 };
    let mut out = format!(
        "--- a/{path}\n+++ b/{path}\n@@ -{},{} +{},{} @@\n",
        at(a_end - start),
        a_end - start,
        at(b_end - start),
        b_end - start
    );
    for line in &a[start..pre] {
        let _ = writeln!(out, " {line}");
    }
    for line in &a[pre..a.len() - suf] {
        let _ = writeln!(out, "-{line}");
    }
    for line in &b[pre..b.len() - suf] {
        let _ = writeln!(out, "+{line}");
    }
    for line in &a[a.len() - suf..a_end] {
        let _ = writeln!(out, " {line}");
    }
    if out.len() > MAX_DIFF_BYTES {
        let mut cut = MAX_DIFF_BYTES;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("\n[diff cut]\n");
    }
    out
}
