//! Discovery: which agent files a config loads (`[agents] include`,
//! `--agents`, a workspace's default directories), each once, walked in
//! name order to a bounded depth and count.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::super::read::Source;
use super::super::{ConfigFile, Problem};
use super::{AgentFiles, MAX_DEPTH, MAX_FILES, WORKSPACE_DIRS, file_problem};

/// A file found by discovery.
pub(super) struct Found {
    pub(super) path: PathBuf,
    /// The directory it was found in (itself, named alone, its own
    /// directory): where a Codebuff file's imports stay.
    pub(super) root: PathBuf,
}

/// Every agent file named by `[agents] include` (relative to the config),
/// `--agents` and the workspace's default directories, each once.
pub(super) fn discover(
    file: &ConfigFile,
    base_dir: &Path,
    sources: &AgentFiles,
    text: &Source<'_>,
    problems: &mut Vec<Problem>,
) -> Vec<Found> {
    let mut roots: Vec<(PathBuf, Option<Problem>)> = Vec::new();
    for (i, entry) in file.agent_include.iter().enumerate() {
        let missing = Problem {
            file: None,
            line: text
                .line(&["agents", "include", &i.to_string()])
                .or_else(|| text.line(&["agents", "include"])),
            key: "agents.include".into(),
            message: format!(
                "{}: no such directory or file (relative to the config's directory)",
                entry.display()
            ),
        };
        roots.push((base_dir.join(entry), Some(missing)));
    }
    for dir in &sources.dirs {
        roots.push((dir.clone(), None));
    }
    if let Some(workspace) = &sources.workspace {
        for dir in WORKSPACE_DIRS {
            let dir = workspace.join(dir);
            if dir.is_dir() {
                roots.push((dir, None));
            }
        }
    }
    let mut seen_roots = HashSet::new();
    let mut seen_files = HashSet::new();
    let mut found = Vec::new();
    for (root, missing) in roots {
        let Ok(canonical) = std::fs::canonicalize(&root) else {
            problems.push(missing.unwrap_or_else(|| Problem {
                file: Some(root.display().to_string()),
                line: None,
                key: "--agents".into(),
                message: "no such directory or file".into(),
            }));
            continue;
        };
        if !seen_roots.insert(canonical) {
            continue;
        }
        let mut files = Vec::new();
        let dir = if root.is_dir() {
            walk(&root, 0, &mut files);
            root.clone()
        } else {
            files.push(root.clone());
            root.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
        };
        for path in files {
            if found.len() >= MAX_FILES {
                problems.push(file_problem(
                    &path.display().to_string(),
                    format!("more than {MAX_FILES} agent files: name a smaller directory"),
                ));
                return found;
            }
            let key = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
            if seen_files.insert(key) {
                found.push(Found {
                    path,
                    root: dir.clone(),
                });
            }
        }
    }
    found
}

/// The files under `dir`, in name order, directories' files after the
/// directory's own; hidden entries, `node_modules` and symbolic links to
/// directories left out (a link to a parent would never end), and no more than one past
/// `MAX_FILES` in all (the caller refuses that many), so a directory named
/// by mistake (`--agents ~`) costs a bounded walk.
pub(super) fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<(PathBuf, bool)> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| !n.starts_with('.') && n != "node_modules")
        })
        .map(|e| {
            // The entry's own type: a symbolic link is not followed here.
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            (e.path(), is_dir)
        })
        .collect();
    entries.sort();
    let (dirs, files): (Vec<_>, Vec<_>) = entries.into_iter().partition(|(_, is_dir)| *is_dir);
    for (path, _) in files {
        if out.len() > MAX_FILES {
            return;
        }
        if path.is_file() {
            out.push(path);
        }
    }
    if depth < MAX_DEPTH {
        for (d, _) in dirs {
            if out.len() > MAX_FILES {
                return;
            }
            walk(&d, depth + 1, out);
        }
    }
}
