//! The values of Codebuff's placeholders that describe where and when a
//! tree runs (in Codebuff, its client's project context): filled once per
//! tree when it starts (`arbor_supervisor::PromptContext`), from its
//! workspace, its first start time and its prompt, so a resume and a replay
//! on the same files fill them the same. A tree without a workspace (a
//! service's) shows no project: those placeholders are empty. The whole
//! takes at most `BUDGET` (the walk and git's commands run at once): a
//! claimed tree must start well within its store's lease.
//!
//! | placeholder | value |
//! |---|---|
//! | `PROJECT_ROOT`, `USER_CWD` | the workspace's directory (empty without one) |
//! | `CURRENT_DATE` | the day the tree first started (UTC, `YYYY-MM-DD`) |
//! | `SYSTEM_INFO_PROMPT` | the operating system, shell and CPU count |
//! | `FILE_TREE_PROMPT` (`_SMALL`, `_LARGE`) | the workspace's files as a tree, ignored files left out, at most 1,000 (200, 5,000) entries |
//! | `GIT_CHANGES_PROMPT` | `git status`, the diffs (unstaged and staged; no external diff or textconv driver) and the last commits' subjects, each cut at 16 KB |
//! | `KNOWLEDGE_FILES_CONTENTS` | every regular `knowledge.md` (or `*.knowledge.md`), `AGENTS.md` and `CLAUDE.md` of the workspace, each cut at 16 KB, 64 KB in all |
//! | `USER_INPUT_PROMPT`, `INITIAL_AGENT_PROMPT` | the tree's prompt (this turn's) |

use std::path::{Path, PathBuf};
use std::time::Duration;

use arbor_supervisor::{PromptContext, PromptScene};
use async_trait::async_trait;

/// The placeholders filled here (without `{CODEBUFF_` and `}`).
pub(super) const FILLED: [&str; 11] = [
    "PROJECT_ROOT",
    "USER_CWD",
    "CURRENT_DATE",
    "SYSTEM_INFO_PROMPT",
    "FILE_TREE_PROMPT",
    "FILE_TREE_PROMPT_SMALL",
    "FILE_TREE_PROMPT_LARGE",
    "GIT_CHANGES_PROMPT",
    "KNOWLEDGE_FILES_CONTENTS",
    "USER_INPUT_PROMPT",
    "INITIAL_AGENT_PROMPT",
];

/// How much of each git output and knowledge file is kept.
const PART_BYTES: usize = 16 * 1024;
/// How much knowledge is kept in all.
const KNOWLEDGE_BYTES: usize = 64 * 1024;
/// How long the walk and each git command may take (they run at once).
const BUDGET: Duration = Duration::from_secs(2);

/// Codebuff's tree-dependent placeholders (see the module doc).
pub struct CodebuffScene;

#[async_trait]
impl PromptContext for CodebuffScene {
    fn wanted(&self, text: &str) -> bool {
        text.contains("{CODEBUFF_")
            && FILLED
                .iter()
                .any(|name| text.contains(&format!("{{CODEBUFF_{name}}}")))
    }

    async fn values(&self, scene: PromptScene) -> Vec<(String, String)> {
        let (walked, git, shown) = match &scene.workspace {
            Some(root) => {
                let walk = {
                    let root = root.clone();
                    tokio::task::spawn_blocking(move || walk(&root, 5_000))
                };
                let (walked, git) =
                    tokio::join!(tokio::time::timeout(BUDGET, walk), git_changes(root));
                let walked = walked.ok().and_then(Result::ok).unwrap_or_default();
                (walked, git, root.display().to_string())
            }
            None => (Walked::default(), String::new(), String::new()),
        };
        let values = [
            ("PROJECT_ROOT", shown.clone()),
            ("USER_CWD", shown),
            ("CURRENT_DATE", date(scene.started_ms)),
            ("SYSTEM_INFO_PROMPT", system_info()),
            ("FILE_TREE_PROMPT", file_tree(&walked.files, 1_000)),
            ("FILE_TREE_PROMPT_SMALL", file_tree(&walked.files, 200)),
            ("FILE_TREE_PROMPT_LARGE", file_tree(&walked.files, 5_000)),
            // (Each empty for a tree without a workspace: `file_tree` of no
            // files says so.)
            ("GIT_CHANGES_PROMPT", git),
            ("KNOWLEDGE_FILES_CONTENTS", walked.knowledge),
            ("USER_INPUT_PROMPT", scene.prompt.clone()),
            ("INITIAL_AGENT_PROMPT", scene.prompt),
        ];
        values
            .into_iter()
            .map(|(name, value)| (format!("{{CODEBUFF_{name}}}"), value))
            .collect()
    }
}

/// The day of `ms` (since the Unix epoch), UTC, as `YYYY-MM-DD`.
fn date(ms: u64) -> String {
    // Days to a civil date (Howard Hinnant's `civil_from_days`).
    let days = (ms / 86_400_000) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

fn system_info() -> String {
    let shell = std::env::var("SHELL")
        .ok()
        .and_then(|s| {
            Path::new(&s)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "sh".to_owned());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "# System Info\n\nOperating System: {}\nArchitecture: {}\nShell: {shell}\nCPUs: {cpus}",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// What one walk of the workspace finds.
#[derive(Default)]
struct Walked {
    /// Relative paths, sorted; directories end with `/`.
    files: Vec<String>,
    /// The knowledge files' contents, as Codebuff shows them.
    knowledge: String,
}

/// Walks `root` (ignored files left out, as git and ripgrep leave them), at
/// most `max` entries.
fn walk(root: &Path, max: usize) -> Walked {
    let mut walked = Walked::default();
    let mut knowledge: Vec<PathBuf> = Vec::new();
    let walker = ignore::WalkBuilder::new(root)
        .hidden(true)
        .sort_by_file_name(|a, b| a.cmp(b))
        .build();
    for entry in walker.flatten().skip(1) {
        if walked.files.len() >= max {
            break;
        }
        let Ok(rel) = entry.path().strip_prefix(root) else {
            continue;
        };
        let is_dir = entry.file_type().is_some_and(|t| t.is_dir());
        let is_file = entry.file_type().is_some_and(|t| t.is_file());
        let mut shown = rel.to_string_lossy().into_owned();
        if is_dir {
            shown.push('/');
        } else if is_file && is_knowledge(rel) {
            // Regular files only (the walk follows no link): a link to
            // /proc/self/environ or a fifo is no knowledge.
            knowledge.push(entry.path().to_path_buf());
        }
        walked.files.push(shown);
    }
    let mut left = KNOWLEDGE_BYTES;
    let mut parts = Vec::new();
    for path in knowledge {
        if left == 0 {
            break;
        }
        let Some(text) = read_at_most(&path, PART_BYTES.min(left)) else {
            continue;
        };
        let whole = String::from_utf8_lossy(&text);
        let text = cut(&whole, PART_BYTES.min(left));
        left = left.saturating_sub(text.len());
        let rel = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .display()
            .to_string();
        parts.push(format!("```{rel}\n{}\n```", text.trim_end()));
    }
    if !parts.is_empty() {
        walked.knowledge = format!("# Knowledge files\n\n{}", parts.join("\n\n"));
    }
    walked
}

/// At most `max` bytes of the regular file `path`, opened without
/// following a link (one swapped in since the walk) and without blocking
/// (a fifo swapped in); `None` for anything else.
fn read_at_most(path: &Path, max: usize) -> Option<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut out = Vec::new();
    file.take(max as u64).read_to_end(&mut out).ok()?;
    Some(out)
}

fn is_knowledge(rel: &Path) -> bool {
    let name = rel
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    name == "knowledge.md"
        || name.ends_with(".knowledge.md")
        || name == "agents.md"
        || name == "claude.md"
}

/// The first `max` entries of `files` as an indented tree.
fn file_tree(files: &[String], max: usize) -> String {
    let mut lines = Vec::new();
    for path in files.iter().take(max) {
        let trimmed = path.trim_end_matches('/');
        let depth = trimmed.matches('/').count();
        let name = trimmed.rsplit('/').next().unwrap_or(trimmed);
        let slash = if path.ends_with('/') { "/" } else { "" };
        lines.push(format!("{}{name}{slash}", "  ".repeat(depth)));
    }
    if files.len() > max {
        lines.push(format!("… ({} more not shown)", files.len() - max));
    }
    format!(
        "# Project file tree\n\n<project_file_tree>\n{}\n</project_file_tree>",
        lines.join("\n")
    )
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Git's view of the workspace's changes, as Codebuff shows them; empty
/// outside a repository or without git.
async fn git_changes(root: &Path) -> String {
    // No external diff or textconv driver: a repository's own config may
    // name commands (an agent can write it), and none runs here.
    let (status, diff, staged, log) = tokio::join!(
        git(root, &["status", "--short"]),
        git(root, &["diff", "--no-ext-diff", "--no-textconv"]),
        git(
            root,
            &["diff", "--staged", "--no-ext-diff", "--no-textconv"]
        ),
        git(
            root,
            &["log", "-n", "10", "--format=%s", "--no-show-signature"]
        ),
    );
    let Some(status) = status else {
        return String::new();
    };
    let (diff, staged, log) = (
        diff.unwrap_or_default(),
        staged.unwrap_or_default(),
        log.unwrap_or_default(),
    );
    format!(
        "# Git changes\n\n<git_status>\n{status}</git_status>\n<git_diff>\n{diff}</git_diff>\n\
         <git_diff_staged>\n{staged}</git_diff_staged>\n<recent_commit_messages>\n{log}</recent_commit_messages>"
    )
}

/// What `git ARGS` printed in `dir` (cut at `PART_BYTES`), without its hooks,
/// fsmonitor or pager; `None` when it failed or took longer than `BUDGET`.
async fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let run = tokio::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.pager=cat",
        ])
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("GIT_PAGER", "cat")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(BUDGET, run).await.ok()?.ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Some(cut(&text, PART_BYTES).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_days_date_is_its_utc_civil_date() {
        assert_eq!(date(0), "1970-01-01");
        // 2026-12-07T20:11:28Z.
        assert_eq!(date(1_796_674_288_000), "2026-12-07");
        assert_eq!(date(951_782_400_000), "2000-02-29");
    }

    #[test]
    fn the_file_tree_indents_by_depth_and_says_what_it_left_out() {
        let files: Vec<String> = ["a.txt", "src/", "src/lib.rs", "z.md"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let tree = file_tree(&files, 3);
        assert!(
            tree.contains("a.txt\nsrc/\n  lib.rs\n… (1 more not shown)"),
            "{tree}"
        );
    }

    #[test]
    fn only_its_own_placeholders_are_wanted() {
        assert!(CodebuffScene.wanted("at {CODEBUFF_PROJECT_ROOT}"));
        assert!(!CodebuffScene.wanted("{CODEBUFF_AGENT_NAME} {CODEBUFF_UNKNOWN}"));
    }
}
