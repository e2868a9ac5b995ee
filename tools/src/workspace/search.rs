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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use ignore::overrides::OverrideBuilder;
use ignore::types::TypesBuilder;
use ignore::{WalkBuilder, WalkState};

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
    // Walked in parallel: the order is made below.
    let found: std::sync::Mutex<Vec<(SystemTime, PathBuf)>> = std::sync::Mutex::default();
    walker(ws, &dir).build_parallel().run(|| {
        let (matcher, base, found) = (&matcher, &base, &found);
        Box::new(move |entry| {
            let Ok(entry) = entry else {
                return WalkState::Continue;
            };
            if !entry.file_type().is_some_and(|k| k.is_file()) {
                return WalkState::Continue;
            }
            let below = entry.path().strip_prefix(base).unwrap_or(entry.path());
            if matcher.is_match(below) {
                let mtime = entry
                    .metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                let rel = relative(ws, entry.path());
                found
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((mtime, rel));
            }
            WalkState::Continue
        })
    });
    let mut found = found
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
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

/// Runs `query` over the workspace: the files are searched in parallel
/// (ripgrep's parallel walker, one searcher a thread), and the output is
/// the same as a search of one file after another in path order would
/// give, caps included.
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
    let content = query.mode == Mode::Content;
    let mut searcher = SearcherBuilder::new();
    searcher
        .line_number(true)
        .before_context(if content { query.before } else { 0 })
        .after_context(if content { query.after } else { 0 })
        .multi_line(query.multiline)
        .binary_detection(BinaryDetection::quit(0));
    let want = query
        .head_limit
        .map_or(MAX_GREP_LINES, |h| h.min(MAX_GREP_LINES))
        .saturating_add(query.offset);
    let found = Hoard::default();

    // A file or a directory.
    match ws.open_dir(given) {
        Ok((dir, _fd)) => {
            let walk = walk_files(ws, &dir, query)?.build_parallel();
            walk.run(|| {
                let mut searcher = searcher.build();
                let matcher = matcher.clone();
                let found = &found;
                Box::new(move |entry| {
                    let Ok(entry) = entry else {
                        return WalkState::Continue;
                    };
                    let rel = relative(ws, entry.path());
                    if found.beyond(&rel) {
                        // Nothing here or below can show.
                        return WalkState::Skip;
                    }
                    if entry.file_type().is_some_and(|k| k.is_file()) {
                        search_one(ws, query, &mut searcher, &matcher, found, &rel, want);
                    }
                    WalkState::Continue
                })
            });
        }
        Err(e) if e.0.ends_with("not a directory") => {
            let (rel, _, _) = ws.open_read(given)?;
            search_one(
                ws,
                query,
                &mut searcher.build(),
                &matcher,
                &found,
                &rel,
                want,
            );
        }
        Err(e) => return Err(e),
    }
    Ok(found.finish(query, want))
}

/// Searches the file `rel` with all the room a file can have, and keeps
/// what it shows in `found`.
fn search_one(
    ws: &Workspace,
    query: &Query,
    searcher: &mut Searcher,
    matcher: &grep_regex::RegexMatcher,
    found: &Hoard,
    rel: &Path,
    want: usize,
) {
    let Ok((file, stat)) = ws.open_walked(rel) else {
        found.refused(rel.to_path_buf());
        return;
    };
    let shown = ws.show(rel, query.absolute);
    let mut sink = Collect {
        path: &shown,
        mode: query.mode,
        numbers: query.line_numbers,
        per_file: query.per_file,
        count: 0,
        lines: Vec::new(),
        marks: Vec::new(),
        // The most a file can show: all of the result when it comes first.
        room_lines: want + 1,
        room_bytes: MAX_GREP_BYTES + 1,
        used_lines: 0,
        used_bytes: 0,
    };
    if searcher.search_file(matcher, &file, &mut sink).is_err() || sink.count == 0 {
        return;
    }
    let mtime = SystemTime::UNIX_EPOCH
        + std::time::Duration::from_secs(u64::try_from(stat.st_mtime).unwrap_or(0));
    let hits = Hits {
        mtime,
        count: sink.count,
        lines: sink.lines,
        marks: sink.marks,
        shown,
    };
    found.add(rel.to_path_buf(), hits, query, want);
}

/// One file's output, as searched with all the room a file can have, and
/// where its search would have stopped with less.
struct Hits {
    /// The path as shown.
    shown: String,
    mtime: SystemTime,
    /// Matching lines in all (up to where the search stopped).
    count: u64,
    /// Its lines (content), context breaks included.
    lines: Vec<String>,
    /// After each match or context line: where the search stood (content).
    marks: Vec<Mark>,
}

/// Where a file's search stood after a match or a context line.
#[derive(Clone, Copy)]
struct Mark {
    /// Lines kept so far, context breaks included.
    lines: usize,
    /// Lines and bytes counted against the room so far.
    used_lines: usize,
    used_bytes: usize,
    /// Matches so far.
    count: u64,
}

impl Hits {
    /// How many of its lines a file shows, and with how many matches, when
    /// the result has `room_lines` and `room_bytes` left: its search stops
    /// after the first match or context line that fills the room, as a
    /// search with that room would.
    fn take(&self, mode: Mode, room_lines: usize, room_bytes: usize) -> (usize, u64) {
        if mode != Mode::Content {
            return (0, self.count);
        }
        self.marks
            .iter()
            .find(|m| m.used_lines >= room_lines || m.used_bytes >= room_bytes)
            .map_or((self.lines.len(), self.count), |m| (m.lines, m.count))
    }

    /// Lines and bytes it holds.
    fn held(&self) -> (usize, usize) {
        let bytes = self.lines.iter().map(|l| l.len() + 1).sum();
        (self.lines.len() + 1, bytes)
    }
}

/// What the search threads found, by path, and the path past which nothing
/// can show any more.
#[derive(Default)]
struct Hoard {
    inner: std::sync::Mutex<HoardInner>,
}

#[derive(Default)]
struct HoardInner {
    files: BTreeMap<PathBuf, Hits>,
    refused: Vec<PathBuf>,
    /// Files after this one (in path order) cannot show: those up to it
    /// already fill the result, and files found later only fill it sooner.
    beyond: Option<PathBuf>,
    /// Lines and bytes held since they were last settled.
    held_lines: usize,
    held_bytes: usize,
}

/// Where a result settled: the file (by its place in path order) where it
/// stopped because more was found than it shows, if it did. Files after
/// that one can never show, whatever is found before it.
struct Settled {
    stop: Option<usize>,
}

impl Hoard {
    fn lock(&self) -> std::sync::MutexGuard<'_, HoardInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `rel` comes after what already fills the result.
    fn beyond(&self, rel: &Path) -> bool {
        self.lock().beyond.as_deref().is_some_and(|b| rel > b)
    }

    fn refused(&self, rel: PathBuf) {
        self.lock().refused.push(rel);
    }

    fn add(&self, rel: PathBuf, hits: Hits, query: &Query, want: usize) {
        let mut inner = self.lock();
        if inner.beyond.as_deref().is_some_and(|b| rel.as_path() > b) {
            return;
        }
        let (lines, bytes) = hits.held();
        inner.held_lines += lines;
        inner.held_bytes += bytes;
        inner.files.insert(rel, hits);
        // Settled again only when twice the result is held, so that each
        // settling is paid for by as many new lines.
        if inner.held_lines > 2 * (want + 1) || inner.held_bytes > 2 * (MAX_GREP_BYTES + 1) {
            let settled = settle(inner.files.values(), query, want, None);
            if let Some(stop) = settled.stop {
                if let Some(next) = inner.files.keys().nth(stop + 1).cloned() {
                    let _ = inner.files.split_off(&next);
                }
                inner.beyond = inner.files.keys().nth(stop).cloned();
            }
            let (mut l, mut b) = (0, 0);
            for h in inner.files.values() {
                let (hl, hb) = h.held();
                l += hl;
                b += hb;
            }
            inner.held_lines = l;
            inner.held_bytes = b;
        }
    }

    /// The result, as a search of one file after another would give it.
    fn finish(self, query: &Query, want: usize) -> Grepped {
        let inner = self
            .inner
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = Grepped::default();
        let mut lines = Vec::new();
        let mut kept: Vec<(SystemTime, String)> = Vec::new();
        let settled = settle(
            inner.files.values(),
            query,
            want,
            Some((&mut out, &mut lines, &mut kept)),
        );
        out.cut = settled.stop.is_some();
        out.refused = match settled.stop.and_then(|i| inner.files.keys().nth(i)) {
            Some(stop) => inner.refused.iter().filter(|r| *r < stop).count(),
            None => inner.refused.len(),
        };
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
        out
    }
}

/// The output's lines (files, for files with matches) and the totals
/// (into `into`, when given) of `files` in path order, taken one after
/// another until the result holds `want` lines or [`MAX_GREP_BYTES`].
#[allow(clippy::type_complexity)]
fn settle<'a>(
    files: impl Iterator<Item = &'a Hits>,
    query: &Query,
    want: usize,
    mut into: Option<(
        &mut Grepped,
        &mut Vec<String>,
        &mut Vec<(SystemTime, String)>,
    )>,
) -> Settled {
    let context = query.before > 0 || query.after > 0;
    let (mut lines, mut kept, mut bytes) = (0usize, 0usize, 0usize);
    for (i, hits) in files.enumerate() {
        let (n, count) = hits.take(
            query.mode,
            want.saturating_sub(lines) + 1,
            MAX_GREP_BYTES.saturating_sub(bytes) + 1,
        );
        if count == 0 {
            // Its first match does not fit any more.
            return Settled { stop: Some(i) };
        }
        let shown = &hits.lines[..n];
        match query.mode {
            Mode::Content => {
                if lines > 0 && context {
                    lines += 1;
                    if let Some((_, out, _)) = &mut into {
                        out.push("--".to_owned());
                    }
                }
                lines += n;
                bytes += shown.iter().map(|l| l.len() + 1).sum::<usize>();
                if let Some((_, out, _)) = &mut into {
                    out.extend(shown.iter().cloned());
                }
            }
            Mode::Count => {
                lines += 1;
                if let Some((_, out, _)) = &mut into {
                    out.push(format!("{}:{count}", hits.shown));
                }
            }
            Mode::FilesWithMatches => {
                kept += 1;
                if let Some((_, _, out)) = &mut into {
                    out.push((hits.mtime, hits.shown.clone()));
                }
            }
        }
        if let Some((g, _, _)) = &mut into {
            g.files += 1;
            g.matches += count;
        }
        if lines > want || kept > want || bytes > MAX_GREP_BYTES {
            return Settled { stop: Some(i) };
        }
    }
    Settled { stop: None }
}

/// The walker of the files under `dir` a query searches.
fn walk_files(ws: &Workspace, dir: &Path, query: &Query) -> Result<WalkBuilder, Refusal> {
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
    Ok(builder)
}

/// A grep-searcher sink that collects one file's output.
struct Collect<'a> {
    path: &'a str,
    mode: Mode,
    numbers: bool,
    per_file: Option<usize>,
    count: u64,
    lines: Vec<String>,
    /// Where the search stood after each match or context line.
    marks: Vec<Mark>,
    /// Lines and bytes the search may keep.
    room_lines: usize,
    room_bytes: usize,
    /// Lines and bytes kept so far, counted against the room.
    used_lines: usize,
    used_bytes: usize,
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
        self.used_lines += 1;
        self.used_bytes += line.len() + 1;
        self.lines.push(line);
    }

    /// Notes where the search stands, and whether there is room for more
    /// lines of this file.
    fn mark(&mut self) -> bool {
        self.marks.push(Mark {
            lines: self.lines.len(),
            used_lines: self.used_lines,
            used_bytes: self.used_bytes,
            count: self.count,
        });
        self.used_lines < self.room_lines && self.used_bytes < self.room_bytes
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
        let room = self.mode != Mode::Content || self.mark();
        Ok(room
            && self
                .per_file
                .is_none_or(|max| self.count < u64::try_from(max).unwrap_or(u64::MAX)))
    }

    fn context(&mut self, _: &Searcher, c: &SinkContext<'_>) -> Result<bool, Self::Error> {
        if self.mode == Mode::Content {
            self.push(c.line_number(), '-', c.bytes());
            return Ok(self.mark());
        }
        Ok(true)
    }

    fn context_break(&mut self, _: &Searcher) -> Result<bool, Self::Error> {
        if self.mode == Mode::Content {
            self.lines.push("--".to_owned());
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::confine::Access;

    /// A workspace of 90 files in nested directories, each with 0 to 6
    /// lines that say `hit` (some long) between lines that do not; all of
    /// one modification time, so that files with matches list in path order.
    fn tree() -> (tempfile::TempDir, Workspace, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let when = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let mut lines_in_order = Vec::new();
        let mut files = Vec::new();
        for i in 0..90 {
            let rel = format!("d{}/e{}/f{i:02}.txt", i % 3, i % 5);
            files.push(rel);
        }
        // Path order, as a search one file after another takes them.
        files.sort_by(|a, b| Path::new(a).cmp(Path::new(b)));
        for (n, rel) in files.iter().enumerate() {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let mut text = String::new();
            for l in 0..(n * 7 % 6) {
                text.push_str("quiet\n");
                let pad = if (n + l) % 3 == 0 {
                    "x".repeat(5000)
                } else {
                    String::new()
                };
                let line = format!("hit {n} {l} {pad}");
                text.push_str(&line);
                text.push('\n');
                lines_in_order.push(format!("{rel}:{}:{line}", 2 * l + 2));
            }
            std::fs::write(&path, text).unwrap();
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(when).unwrap();
        }
        let ws = Workspace::open(dir.path(), Access::ReadOnly).unwrap();
        (dir, ws, lines_in_order)
    }

    fn query(mode: Mode, head_limit: Option<usize>, offset: usize) -> Query {
        Query {
            pattern: "hit".to_owned(),
            mode,
            line_numbers: true,
            head_limit,
            offset,
            ..Query::default()
        }
    }

    #[test]
    fn a_parallel_grep_shows_the_lines_of_a_search_in_path_order_under_every_cap() {
        let (_dir, ws, all) = tree();
        let full = grep(&ws, &query(Mode::Content, None, 0)).unwrap();
        // The long lines make the whole more than the bytes a grep keeps:
        // what shows is a prefix of the lines in path order, cut.
        let bytes: usize = all.iter().map(|l| l.len() + 1).sum();
        assert!(bytes > MAX_GREP_BYTES, "{bytes}");
        assert!(full.cut);
        assert!(full.lines.len() < all.len());
        assert_eq!(full.lines, all[..full.lines.len()]);
        let shown: usize = full.lines.iter().map(|l| l.len() + 1).sum();
        assert!(shown <= MAX_GREP_BYTES + 6 * 5100, "{shown}");

        // Pages of head_limit lines from offset: each a slice of the same order.
        for (limit, offset) in [(1, 0), (7, 0), (7, 7), (10, 33), (25, 5), (3, 60)] {
            for _ in 0..5 {
                let g = grep(&ws, &query(Mode::Content, Some(limit), offset)).unwrap();
                assert_eq!(
                    g.lines,
                    all[offset..offset + limit],
                    "{limit} from {offset}"
                );
                assert!(g.cut, "{limit} from {offset}");
            }
        }
        // Past the end: what is left, not cut.
        let left = grep(&ws, &query(Mode::Content, Some(1000), all.len() - 2));
        assert!(left.is_err() || left.as_ref().is_ok_and(|g| g.lines.len() <= 2));

        // Files with matches and counts: the first files in path order.
        let files: Vec<String> = {
            let mut seen: Vec<String> = Vec::new();
            for l in &all {
                let f = l.split(':').next().unwrap().to_owned();
                if seen.last() != Some(&f) {
                    seen.push(f);
                }
            }
            seen
        };
        let g = grep(&ws, &query(Mode::FilesWithMatches, None, 0)).unwrap();
        assert_eq!(g.lines, files);
        assert!(!g.cut);
        assert_eq!(g.files, files.len());
        assert_eq!(g.matches, files.len() as u64);
        for (limit, offset) in [(1, 0), (4, 2), (9, 30)] {
            let g = grep(&ws, &query(Mode::FilesWithMatches, Some(limit), offset)).unwrap();
            assert_eq!(g.lines, files[offset..offset + limit]);
            assert!(g.cut);
            // The files searched up to the cut: one more than the page's end.
            assert_eq!(g.files, offset + limit + 1);
            let g = grep(&ws, &query(Mode::Count, Some(limit), offset)).unwrap();
            let names: Vec<&str> = g
                .lines
                .iter()
                .map(|l| l.split(':').next().unwrap())
                .collect();
            assert_eq!(names, files[offset..offset + limit]);
        }
    }

    #[test]
    fn a_cut_grep_counts_the_matches_and_files_up_to_where_it_stopped_every_time() {
        let (_dir, ws, all) = tree();
        let mut q = query(Mode::Content, Some(12), 3);
        q.before = 1;
        let first = grep(&ws, &q).unwrap();
        assert!(first.cut);
        assert_eq!(first.lines.len(), 12);
        // Context lines and breaks between files, matches in path order.
        let hits: Vec<&String> = first.lines.iter().filter(|l| l.contains(":hit ")).collect();
        let at = all.iter().position(|l| l == hits[0]).unwrap();
        assert_eq!(hits, all[at..at + hits.len()].iter().collect::<Vec<_>>());
        assert!(first.lines.iter().any(|l| l == "--"));
        assert!(first.lines.iter().any(|l| l.ends_with("-quiet")));
        for _ in 0..10 {
            let again = grep(&ws, &q).unwrap();
            assert_eq!(again.lines, first.lines);
            assert_eq!((again.matches, again.files), (first.matches, first.files));
        }
    }
}
