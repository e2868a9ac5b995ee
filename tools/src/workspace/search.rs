//! Listing, glob and grep over a workspace, with ripgrep's own libraries:
//! the `ignore` walker (`.gitignore`, `.ignore`, `.git/info/exclude` rules,
//! honoured even outside a git repository; hidden files included, `.git`
//! itself skipped; symbolic links never followed), `globset` globs and
//! `grep-regex`/`grep-searcher`.
//!
//! The walker goes by path names; what it yields is only ever listed (names
//! inside the workspace) or opened again through the workspace's handle
//! ([`Workspace::open_read`]), so a file's content is never read from
//! outside it, even when a directory is swapped for a link mid-walk.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use ignore::WalkBuilder;
use ignore::overrides::OverrideBuilder;
use ignore::types::TypesBuilder;

use super::confine::{Refusal, Workspace};

/// The most entries a listing shows.
pub const MAX_LIST: usize = 1000;

/// The most paths a glob shows (Claude Code's cap).
pub const MAX_GLOB: usize = 100;

/// The most output lines (or paths, or counts) a grep keeps, whatever its
/// `head_limit`.
pub const MAX_GREP_LINES: usize = 5000;

/// The most bytes of output a grep keeps.
pub const MAX_GREP_BYTES: usize = 200_000;

/// A walker of `dir` (relative to the workspace) as every search here uses.
fn walker(ws: &Workspace, dir: &Path) -> WalkBuilder {
    let mut builder = WalkBuilder::new(ws.root().join(dir));
    builder
        .hidden(false)
        .require_git(false)
        .follow_links(false)
        .filter_entry(|e| e.file_name() != ".git")
        .sort_by_file_name(|a, b| a.cmp(b));
    builder
}

/// An entry's path relative to the workspace.
fn relative(ws: &Workspace, path: &Path) -> PathBuf {
    path.strip_prefix(ws.root()).unwrap_or(path).to_path_buf()
}

/// One entry of a listing.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The path, relative to the workspace.
    pub rel: PathBuf,
    /// How deep below the listed directory (1: in it).
    pub depth: usize,
    /// Whether it is a directory.
    pub dir: bool,
    /// Whether it is a symbolic link (never followed).
    pub link: bool,
    /// Its size in bytes (files).
    pub size: u64,
}

/// A directory's entries, `depth` levels down (at most [`MAX_LIST`]), by
/// path, without those the ignore files exclude or `ignore` globs match
/// (by name or by path below the directory).
pub fn list(
    ws: &Workspace,
    given: &str,
    depth: usize,
    ignore: &[String],
) -> Result<(PathBuf, Vec<Entry>, bool), Refusal> {
    let (dir, _fd) = ws.open_dir(given)?;
    let skip = globs(ignore)?;
    let mut entries = Vec::new();
    let mut cut = false;
    for entry in walker(ws, &dir).max_depth(Some(depth.max(1))).build() {
        let Ok(entry) = entry else { continue };
        if entry.depth() == 0 {
            continue;
        }
        let rel = relative(ws, entry.path());
        let below = rel.strip_prefix(&dir).unwrap_or(&rel);
        if skip.is_match(entry.file_name()) || skip.is_match(below) {
            continue;
        }
        if entries.len() == MAX_LIST {
            cut = true;
            break;
        }
        let kind = entry.file_type();
        entries.push(Entry {
            depth: entry.depth(),
            dir: kind.is_some_and(|k| k.is_dir()),
            link: kind.is_some_and(|k| k.is_symlink()),
            size: entry.metadata().map(|m| m.len()).unwrap_or(0),
            rel,
        });
    }
    Ok((dir, entries, cut))
}

fn globs(patterns: &[String]) -> Result<GlobSet, Refusal> {
    let mut set = GlobSetBuilder::new();
    for p in patterns {
        let glob = GlobBuilder::new(p)
            .literal_separator(true)
            .build()
            .map_err(|e| Refusal(format!("glob {p:?}: {e}")))?;
        set.add(glob);
    }
    set.build().map_err(|e| Refusal(format!("globs: {e}")))
}

/// What a glob found.
#[derive(Clone, Debug)]
pub struct Found {
    /// The files, relative to the workspace, newest first.
    pub files: Vec<PathBuf>,
    /// How many matched in all (more than shown when cut at `max`).
    pub total: usize,
}

/// The files under `given` (default: the workspace) whose path below it
/// matches `pattern` (`*` stays within a directory, `**` crosses them),
/// newest first (by modification time, as Claude Code's Glob sorts), then
/// by path; at most `max`.
pub fn glob(ws: &Workspace, pattern: &str, given: &str, max: usize) -> Result<Found, Refusal> {
    let (dir, _fd) = ws.open_dir(given)?;
    // A pattern written as an absolute path under the search directory.
    let base = ws.root().join(&dir);
    let base_text = format!("{}/", base.display());
    let pattern = pattern.strip_prefix(&base_text).unwrap_or(pattern);
    if pattern.split('/').any(|p| p == "..") || pattern.starts_with('/') {
        return Err(Refusal(format!(
            "glob {pattern:?}: refused, a pattern matches below the search directory (no .., no absolute path elsewhere)"
        )));
    }
    let matcher = globs(&[pattern.to_owned()])?;
    let mut found: Vec<(SystemTime, PathBuf)> = Vec::new();
    for entry in walker(ws, &dir).build() {
        let Ok(entry) = entry else { continue };
        if !entry.file_type().is_some_and(|k| k.is_file()) {
            continue;
        }
        let below = entry.path().strip_prefix(&base).unwrap_or(entry.path());
        if matcher.is_match(below) {
            let mtime = entry
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            found.push((mtime, relative(ws, entry.path())));
        }
    }
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let total = found.len();
    Ok(Found {
        files: found.into_iter().take(max).map(|(_, p)| p).collect(),
        total,
    })
}

/// What a grep shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Matching lines (with context), `path:line:text`.
    Content,
    /// The paths of matching files, newest first.
    #[default]
    FilesWithMatches,
    /// `path:count` of matching lines per file.
    Count,
}

/// A grep (see the fields); paths in the output are absolute when
/// `absolute` (Claude Code's), else relative to the workspace.
#[derive(Clone, Debug, Default)]
pub struct Query {
    /// The regular expression (Rust's `regex` syntax, as ripgrep's).
    pub pattern: String,
    /// A file or directory (default: the workspace).
    pub path: Option<String>,
    /// ripgrep globs the files must match (`!` excludes).
    pub globs: Vec<String>,
    /// ripgrep file types the files must be of (`rust`, `py`, ...).
    pub types: Vec<String>,
    /// ripgrep file types the files must not be of.
    pub types_not: Vec<String>,
    /// What to show.
    pub mode: Mode,
    /// Lines of context before and after each match (content).
    pub before: usize,
    /// Lines of context after each match (content).
    pub after: usize,
    /// Case-insensitive.
    pub ignore_case: bool,
    /// Case-insensitive unless the pattern has an upper-case letter.
    pub smart_case: bool,
    /// The pattern is a literal string.
    pub fixed: bool,
    /// Matches only whole words.
    pub word: bool,
    /// `path:line:` before each line (content); without, `path:`.
    pub line_numbers: bool,
    /// Patterns may span lines (`.` matches a newline).
    pub multiline: bool,
    /// At most this many output lines (or paths, or counts).
    pub head_limit: Option<usize>,
    /// Skips this many output lines (or paths, or counts) first.
    pub offset: usize,
    /// At most this many matches per file.
    pub per_file: Option<usize>,
    /// Paths shown absolute.
    pub absolute: bool,
}

/// A grep's output.
#[derive(Clone, Debug, Default)]
pub struct Grepped {
    /// The lines (content), paths (files with matches) or `path:count`
    /// lines (count), after `offset` and `head_limit`.
    pub lines: Vec<String>,
    /// Matching lines found in all.
    pub matches: u64,
    /// Files with a match.
    pub files: usize,
    /// Whether more was found than is shown.
    pub cut: bool,
    /// Files skipped because the workspace refuses them (several hard links).
    pub refused: usize,
}

/// Runs `query` over the workspace.
pub fn grep(ws: &Workspace, query: &Query) -> Result<Grepped, Refusal> {
    let given = query.path.as_deref().unwrap_or("");
    let mut builder = RegexMatcherBuilder::new();
    builder
        .case_insensitive(query.ignore_case)
        .case_smart(query.smart_case)
        .fixed_strings(query.fixed)
        .word(query.word);
    if query.multiline {
        builder.multi_line(true).dot_matches_new_line(true);
    } else {
        builder.line_terminator(Some(b'\n'));
    }
    let matcher = builder
        .build(&query.pattern)
        .map_err(|e| Refusal(format!("pattern {:?}: {e}", query.pattern)))?;
    let mut searcher = SearcherBuilder::new()
        .line_number(true)
        .before_context(if query.mode == Mode::Content {
            query.before
        } else {
            0
        })
        .after_context(if query.mode == Mode::Content {
            query.after
        } else {
            0
        })
        .multi_line(query.multiline)
        .binary_detection(BinaryDetection::quit(0))
        .build();

    // A file or a directory.
    let files: Box<dyn Iterator<Item = PathBuf>> = match ws.open_dir(given) {
        Ok((dir, _fd)) => Box::new(walk_files(ws, &dir, query)?),
        Err(e) if e.0.ends_with("not a directory") => {
            let (rel, _, _) = ws.open_read(given)?;
            Box::new(std::iter::once(rel))
        }
        Err(e) => return Err(e),
    };

    let mut out = Grepped::default();
    let mut kept: Vec<(SystemTime, String)> = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    let mut bytes = 0usize;
    let want = query
        .head_limit
        .map_or(MAX_GREP_LINES, |h| h.min(MAX_GREP_LINES))
        .saturating_add(query.offset);
    for rel in files {
        let text = rel.to_string_lossy();
        let Ok((rel, file, stat)) = ws.open_read(&text) else {
            out.refused += 1;
            continue;
        };
        let shown = ws.show(&rel, query.absolute);
        let mut sink = Collect {
            path: &shown,
            mode: query.mode,
            numbers: query.line_numbers,
            per_file: query.per_file,
            count: 0,
            lines: Vec::new(),
            // What the whole search may still keep: one file never holds
            // more than the result can show.
            room_lines: want.saturating_sub(lines.len()) + 1,
            room_bytes: MAX_GREP_BYTES.saturating_sub(bytes) + 1,
        };
        if searcher.search_file(&matcher, &file, &mut sink).is_err() || sink.count == 0 {
            continue;
        }
        out.files += 1;
        out.matches += sink.count;
        match query.mode {
            Mode::Content => {
                if !lines.is_empty() && (query.before > 0 || query.after > 0) {
                    lines.push("--".to_owned());
                }
                for line in sink.lines {
                    bytes += line.len() + 1;
                    lines.push(line);
                }
            }
            Mode::Count => lines.push(format!("{shown}:{}", sink.count)),
            Mode::FilesWithMatches => {
                let mtime = SystemTime::UNIX_EPOCH
                    + std::time::Duration::from_secs(u64::try_from(stat.st_mtime).unwrap_or(0));
                kept.push((mtime, shown));
            }
        }
        if lines.len() > want || kept.len() > want || bytes > MAX_GREP_BYTES {
            out.cut = true;
            break;
        }
    }
    if query.mode == Mode::FilesWithMatches {
        // Newest first, as Claude Code's Grep lists them.
        kept.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        lines = kept.into_iter().map(|(_, p)| p).collect();
    }
    let after_offset: Vec<String> = lines.into_iter().skip(query.offset).collect();
    let limit = query
        .head_limit
        .unwrap_or(MAX_GREP_LINES)
        .min(MAX_GREP_LINES);
    if after_offset.len() > limit {
        out.cut = true;
    }
    out.lines = after_offset.into_iter().take(limit).collect();
    Ok(out)
}

/// The files under `dir` a query searches, by path.
fn walk_files<'a>(
    ws: &'a Workspace,
    dir: &Path,
    query: &Query,
) -> Result<impl Iterator<Item = PathBuf> + 'a, Refusal> {
    let base = ws.root().join(dir);
    let mut builder = walker(ws, dir);
    if !query.globs.is_empty() {
        let mut overrides = OverrideBuilder::new(&base);
        for g in &query.globs {
            overrides
                .add(g)
                .map_err(|e| Refusal(format!("glob {g:?}: {e}")))?;
        }
        builder.overrides(
            overrides
                .build()
                .map_err(|e| Refusal(format!("globs: {e}")))?,
        );
    }
    if !query.types.is_empty() || !query.types_not.is_empty() {
        let mut types = TypesBuilder::new();
        types.add_defaults();
        for t in &query.types {
            types.select(t);
        }
        for t in &query.types_not {
            types.negate(t);
        }
        builder.types(
            types
                .build()
                .map_err(|e| Refusal(format!("file type: {e}")))?,
        );
    }
    Ok(builder.build().filter_map(move |entry| {
        let entry = entry.ok()?;
        entry
            .file_type()
            .is_some_and(|k| k.is_file())
            .then(|| relative(ws, entry.path()))
    }))
}

/// A grep-searcher sink that collects one file's output.
struct Collect<'a> {
    path: &'a str,
    mode: Mode,
    numbers: bool,
    per_file: Option<usize>,
    count: u64,
    lines: Vec<String>,
    /// Lines and bytes the search may still keep.
    room_lines: usize,
    room_bytes: usize,
}

impl Collect<'_> {
    fn push(&mut self, number: Option<u64>, sep: char, bytes: &[u8]) {
        // A line is kept up to what a read shows of one.
        let cut = &bytes[..bytes.len().min(super::files::MAX_LINE_CHARS * 4)];
        let text = String::from_utf8_lossy(cut);
        let text = text.trim_end_matches(['\n', '\r']);
        let line = match (self.numbers, number) {
            (true, Some(n)) => format!("{}{sep}{n}{sep}{text}", self.path),
            _ => format!("{}{sep}{text}", self.path),
        };
        self.room_lines = self.room_lines.saturating_sub(1);
        self.room_bytes = self.room_bytes.saturating_sub(line.len() + 1);
        self.lines.push(line);
    }

    /// Whether there is room for more lines of this file.
    fn room(&self) -> bool {
        self.room_lines > 0 && self.room_bytes > 0
    }
}

impl Sink for Collect<'_> {
    type Error = std::io::Error;

    fn matched(&mut self, _: &Searcher, m: &SinkMatch<'_>) -> Result<bool, Self::Error> {
        self.count += 1;
        match self.mode {
            Mode::FilesWithMatches => return Ok(false),
            Mode::Count => {}
            Mode::Content => {
                let mut number = m.line_number();
                for line in m.lines() {
                    self.push(number, ':', line);
                    number = number.map(|n| n + 1);
                }
            }
        }
        Ok(self.room()
            && self
                .per_file
                .is_none_or(|max| self.count < u64::try_from(max).unwrap_or(u64::MAX)))
    }

    fn context(&mut self, _: &Searcher, c: &SinkContext<'_>) -> Result<bool, Self::Error> {
        if self.mode == Mode::Content {
            self.push(c.line_number(), '-', c.bytes());
        }
        Ok(self.room())
    }

    fn context_break(&mut self, _: &Searcher) -> Result<bool, Self::Error> {
        if self.mode == Mode::Content {
            self.lines.push("--".to_owned());
        }
        Ok(true)
    }
}
