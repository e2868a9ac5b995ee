//! A worktree per parallel writer (issue 36; the runtime's side is
//! `arbor_actors::worktree`): the workspace of a run whose template says
//! `isolation = "worktree"`, a `git worktree` of the repository its parent
//! works in, on a branch of its own.
//!
//! - **Made when first used**, by the first workspace tool the agent calls
//!   (`git worktree add -b BRANCH DIR BASE`, with `BASE` its parent's
//!   `HEAD`), never in an actor's handler; an agent that never touches its
//!   workspace leaves no trace.
//! - **Where:** `GIT_COMMON_DIR/arbor-worktrees/TYPE-RUN`, inside the
//!   repository's git directory, so the main checkout sees nothing (no
//!   untracked directory) and the parent's tools never walk into it. The
//!   branch is `arbor/TYPE-RUN`; both follow from the run id, so a resumed
//!   run finds its worktree again and goes on in it.
//! - **Sealed when the run completes:** what the agent left uncommitted is
//!   committed on its branch (as the user's git identity, or Arbor's when
//!   git has none; dated as its base commit, so that the same work sealed
//!   again, as a replay does, is the same commit), and the report names the branch, its commits and the
//!   files changed. A branch with no commits is removed with its worktree;
//!   one with commits is kept for the parent to merge (`git merge` in the
//!   shell), and `git worktree list` shows it.
//!
//! Git is run as a program (`git` on `PATH`, `tokio::process`): its
//! worktree and merge logic is what users trust and read about, and no
//! library reimplements worktrees.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arbor_actors::id::RunId;
use arbor_actors::tool::SealFuture;
use arbor_actors::worktree::{FileChange, WorktreeCommit, WorktreeReport};

use super::{Access, Workspace};

/// The repository a worktree is made in, as found from its parent's
/// workspace without running git (a walk up to `.git`).
#[derive(Clone, Debug)]
struct Repo {
    /// The repository's git directory shared by all its worktrees.
    common: PathBuf,
}

/// Why a run's worktree cannot be made or sealed: what the model reads
/// of a workspace tool's call, and a sealed report's `error`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WorktreeError {
    /// The workspace is in no git repository.
    #[error(
        "isolation = \"worktree\" needs a git repository, and the workspace {} is in none",
        .0.display()
    )]
    NoRepository(PathBuf),
    /// A worktree's `.git` file could not be read.
    #[error("{} could not be read: {reason}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The system's error.
        reason: String,
    },
    /// A `.git` file that is not a worktree's (`gitdir: …`).
    #[error("{} is not a worktree's .git file", .0.display())]
    NotAWorktreeFile(PathBuf),
    /// No `git` on `PATH`.
    #[error("isolation = \"worktree\" needs git, and none is on PATH")]
    NoGit,
    /// `git` could not be run.
    #[error("git could not be run: {0}")]
    GitNotRun(String),
    /// A git command failed.
    #[error("git {args} failed in {}: {stderr}", dir.display())]
    GitFailed {
        /// Its arguments, joined by spaces.
        args: String,
        /// The directory it ran in.
        dir: PathBuf,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// The file keeping the branch's base could not be written.
    #[error("{} could not be written: {reason}", path.display())]
    Unwritable {
        /// The file.
        path: PathBuf,
        /// The system's error.
        reason: String,
    },
    /// The worktree was made but cannot be opened as a workspace.
    #[error("the worktree {} could not be opened: {reason}", path.display())]
    NotOpened {
        /// The workspace's directory in the worktree.
        path: PathBuf,
        /// Why not.
        reason: String,
    },
}

/// An isolated run's workspace (see the module docs).
pub struct Worktree {
    /// Where the run's parent works: the base of the branch, and what the
    /// workspace's access, shell environment and sandbox come from.
    parent: Arc<dyn arbor_actors::tool::Workspace>,
    /// The repository, or why there is none.
    repo: Result<Repo, WorktreeError>,
    /// The worktree's directory.
    path: PathBuf,
    /// The workspace's directory in it (the parent's place in its checkout).
    root: PathBuf,
    /// The parent's workspace directory relative to its checkout's top.
    sub: PathBuf,
    branch: String,
    run: String,
    agent_type: String,
    access: Access,
    /// The workspace, once the worktree is made.
    opened: tokio::sync::OnceCell<Arc<Workspace>>,
}

impl fmt::Debug for Worktree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worktree")
            .field("path", &self.path)
            .field("branch", &self.branch)
            .finish_non_exhaustive()
    }
}

impl arbor_actors::tool::Workspace for Worktree {
    fn root(&self) -> &Path {
        &self.root
    }

    fn read_only(&self) -> bool {
        self.access == Access::ReadOnly
    }

    fn isolate(
        self: Arc<Self>,
        run: &RunId,
        agent_type: &str,
    ) -> Option<Arc<dyn arbor_actors::tool::Workspace>> {
        let access = self.access;
        let repo = self.repo.clone();
        let sub = self.sub.clone();
        Some(Arc::new(Worktree::new(
            self, repo, sub, run, agent_type, access,
        )))
    }

    fn seal(self: Arc<Self>) -> Option<SealFuture> {
        Some(Box::pin(async move { self.sealed().await }))
    }
}

/// The lock of the repository whose git directory is `common`: one git
/// command sequence of Arbor's at a time changes it (making a worktree,
/// sealing one), so siblings made or sealed at once never race on git's
/// own lock files.
fn repo_lock(common: &Path) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: std::sync::LazyLock<
        std::sync::Mutex<std::collections::HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
    > = std::sync::LazyLock::new(Default::default);
    let mut locks = LOCKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    locks.entry(common.to_path_buf()).or_default().clone()
}

/// `parent`'s workspace isolated for `run` (see [`Workspace`]'s
/// `isolate`).
pub(super) fn isolate(
    parent: Arc<Workspace>,
    run: &RunId,
    agent_type: &str,
) -> Arc<dyn arbor_actors::tool::Workspace> {
    let found = find_repo(parent.root());
    let access = parent.access();
    let (repo, sub) = match found {
        Ok((repo, top)) => {
            let sub = parent
                .root()
                .strip_prefix(&top)
                .map(Path::to_path_buf)
                .unwrap_or_default();
            (Ok(repo), sub)
        }
        Err(e) => (Err(e), PathBuf::new()),
    };
    Arc::new(Worktree::new(parent, repo, sub, run, agent_type, access))
}

impl Worktree {
    fn new(
        parent: Arc<dyn arbor_actors::tool::Workspace>,
        repo: Result<Repo, WorktreeError>,
        sub: PathBuf,
        run: &RunId,
        agent_type: &str,
        access: Access,
    ) -> Self {
        let name = worktree_name(agent_type, &run.to_string());
        let path = match &repo {
            Ok(repo) => repo.common.join("arbor-worktrees").join(&name),
            Err(_) => parent.root().to_path_buf(),
        };
        let root = path.join(&sub);
        Worktree {
            parent,
            repo,
            path,
            root,
            sub,
            branch: format!("arbor/{name}"),
            run: run.to_string(),
            agent_type: agent_type.to_owned(),
            access,
            opened: tokio::sync::OnceCell::new(),
        }
    }

    /// The worktree's branch.
    pub fn branch(&self) -> &str {
        &self.branch
    }

    /// Where the branch's base commit is kept, beside the worktree (not in
    /// git's config, which siblings would lock against each other).
    fn base_file(&self) -> PathBuf {
        self.path.with_extension("base")
    }

    /// The workspace in the worktree, made (or found again) the first time.
    pub fn open(
        &self,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Arc<Workspace>, WorktreeError>> + Send + '_>,
    > {
        // Boxed: a worktree's parent may be a worktree, made first.
        Box::pin(async move {
            self.opened
                .get_or_try_init(|| async { self.make().await })
                .await
                .cloned()
        })
    }

    /// The base commit: the parent's `HEAD` (made first if it is a worktree
    /// too), and the directory git runs in for it.
    async fn parent_checkout(&self) -> Result<(PathBuf, Option<Arc<Workspace>>), WorktreeError> {
        let any: Arc<dyn std::any::Any + Send + Sync> = self.parent.clone();
        match any.downcast::<Worktree>() {
            Ok(parent) => {
                let opened = parent.open().await?;
                Ok((parent.path.clone(), Some(opened)))
            }
            Err(any) => match any.downcast::<Workspace>() {
                Ok(parent) => Ok((parent.root().to_path_buf(), Some(parent))),
                Err(_) => Ok((self.parent.root().to_path_buf(), None)),
            },
        }
    }

    async fn make(&self) -> Result<Arc<Workspace>, WorktreeError> {
        let repo = self.repo.as_ref().map_err(Clone::clone)?;
        let (checkout, parent) = self.parent_checkout().await?;
        // Siblings made at once would race on the repository's locks.
        let lock = repo_lock(&repo.common);
        let _held = lock.lock().await;
        if !self.path.join(".git").exists() {
            let branch_ref = format!("refs/heads/{}", self.branch);
            let exists = git(
                &checkout,
                &["rev-parse", "--verify", "--quiet", &branch_ref],
            )
            .await
            .is_ok();
            let path = self.path.to_string_lossy().into_owned();
            // A worktree whose directory went (removed by hand, a crash
            // mid-way) is forgotten before it is made again.
            let _ = git(&checkout, &["worktree", "prune"]).await;
            if exists {
                git(
                    &checkout,
                    &["worktree", "add", "--quiet", &path, &self.branch],
                )
                .await?;
            } else {
                let base = git(&checkout, &["rev-parse", "HEAD"]).await?;
                let base = base.trim();
                git(
                    &checkout,
                    &[
                        "worktree",
                        "add",
                        "--quiet",
                        "-b",
                        &self.branch,
                        &path,
                        base,
                    ],
                )
                .await?;
                std::fs::write(self.base_file(), base).map_err(|e| WorktreeError::Unwritable {
                    path: self.base_file(),
                    reason: e.to_string(),
                })?;
            }
        }
        let mut ws =
            Workspace::open(&self.root, self.access).map_err(|e| WorktreeError::NotOpened {
                path: self.root.clone(),
                reason: e.to_string(),
            })?;
        if let Some(parent) = parent {
            ws.env = parent.env.clone();
            // Git writes the worktree's commits in the repository's shared
            // directory: the sandbox lets it write there only what a commit
            // on an `arbor/` branch needs (objects, those branches and their
            // logs, this worktree's own git directory), never the config,
            // the hooks or another branch; nothing for a read-only agent.
            ws.sandbox = parent.sandbox.as_ref().map(|sandbox| {
                if self.access == Access::ReadOnly {
                    return sandbox.clone();
                }
                let own = std::fs::read_to_string(self.path.join(".git"))
                    .ok()
                    .and_then(|t| t.strip_prefix("gitdir:").map(|d| PathBuf::from(d.trim())));
                [
                    Some(repo.common.join("objects")),
                    Some(repo.common.join("refs/heads/arbor")),
                    Some(repo.common.join("logs/refs/heads/arbor")),
                    own,
                ]
                .into_iter()
                .flatten()
                .filter(|dir| dir.is_dir())
                .fold(sandbox.clone(), |s, dir| s.with_writable(dir))
            });
        }
        Ok(Arc::new(ws))
    }

    /// Seals the worktree (see the module docs); `None` when it was never
    /// made.
    async fn sealed(&self) -> Option<WorktreeReport> {
        if self.repo.is_err() {
            return None;
        }
        let made = self.path.join(".git").exists();
        let common = self.repo.as_ref().ok()?.common.clone();
        // Never made (no worktree, no branch): nothing to seal, and nothing
        // made now (not even a worktree parent's, as asking for the parent's
        // checkout would).
        let branch_ref = format!("refs/heads/{}", self.branch);
        if !made
            && git_in_repo(&common, &["rev-parse", "--verify", "--quiet", &branch_ref])
                .await
                .is_err()
        {
            return None;
        }
        let (checkout, _) = match self.parent_checkout().await {
            Ok(found) => found,
            Err(error) => return Some(self.failed(error)),
        };
        let lock = repo_lock(&common);
        let _held = lock.lock().await;
        match self.seal_in(&checkout, made).await {
            Ok(report) => Some(report),
            Err(error) => Some(self.failed(error)),
        }
    }

    fn failed(&self, error: WorktreeError) -> WorktreeReport {
        WorktreeReport {
            branch: self.branch.clone(),
            path: Some(self.path.clone()),
            summary: "not sealed".to_owned(),
            error: Some(error.to_string()),
            ..WorktreeReport::default()
        }
    }

    async fn seal_in(&self, checkout: &Path, made: bool) -> Result<WorktreeReport, WorktreeError> {
        let base = match std::fs::read_to_string(self.base_file()) {
            Ok(base) => base.trim().to_owned(),
            Err(_) => git(checkout, &["merge-base", &self.branch, "HEAD"])
                .await?
                .trim()
                .to_owned(),
        };
        if made {
            git(&self.path, &["add", "--all"]).await?;
            if git(&self.path, &["diff", "--cached", "--quiet"])
                .await
                .is_err()
            {
                let message = format!("{}: work of run {}", self.agent_type, self.run);
                let mut args: Vec<&str> = Vec::new();
                // Git refuses to commit without an identity: Arbor's, only
                // where the user has none.
                let anonymous = git(&self.path, &["var", "GIT_COMMITTER_IDENT"])
                    .await
                    .is_err();
                if anonymous {
                    args.extend(["-c", "user.name=Arbor", "-c", "user.email=arbor@localhost"]);
                }
                args.extend(["commit", "--quiet", "--no-verify", "-m", &message]);
                // Dated as its base, so that sealing the same work on the
                // same base again (a replay) makes the very same commit.
                let date = git(checkout, &["log", "-1", "--format=%cI", &base]).await?;
                let date = date.trim();
                git_with(
                    &self.path,
                    &args,
                    &[("GIT_AUTHOR_DATE", date), ("GIT_COMMITTER_DATE", date)],
                )
                .await?;
            }
        }
        let range = format!("{base}..{}", self.branch);
        let log = git(checkout, &["log", "--reverse", "--format=%H%x09%s", &range]).await?;
        let commits: Vec<WorktreeCommit> = log
            .lines()
            .filter_map(|line| line.split_once('\t'))
            .map(|(sha, subject)| WorktreeCommit {
                sha: sha.to_owned(),
                subject: subject.to_owned(),
            })
            .collect();
        let numstat = git(checkout, &["diff", "--numstat", &base, &self.branch]).await?;
        let files: Vec<FileChange> = numstat.lines().filter_map(file_change).collect();
        let summary = git(checkout, &["diff", "--shortstat", &base, &self.branch]).await?;
        let summary = match summary.trim() {
            "" => "no changes".to_owned(),
            s => s.to_owned(),
        };
        let path = if commits.is_empty() {
            if made {
                let path = self.path.to_string_lossy().into_owned();
                git(checkout, &["worktree", "remove", "--force", &path]).await?;
            }
            git(checkout, &["branch", "--quiet", "-D", &self.branch]).await?;
            let _ = std::fs::remove_file(self.base_file());
            None
        } else {
            Some(self.path.clone())
        };
        Ok(WorktreeReport {
            branch: self.branch.clone(),
            base,
            path,
            commits,
            files,
            summary,
            error: None,
        })
    }
}

/// One line of `git diff --numstat`: added, removed (`-` for a binary
/// file), path.
fn file_change(line: &str) -> Option<FileChange> {
    let mut parts = line.splitn(3, '\t');
    let added = parts.next()?.parse().ok();
    let removed = parts.next()?.parse().ok();
    let path = parts.next()?.to_owned();
    Some(FileChange {
        path,
        added,
        removed,
    })
}

/// A name git takes as a branch and a directory: letters, digits, `-` and
/// `_` kept, anything else `-`.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The repository `dir` is in, and its checkout's top directory, found by
/// walking up to `.git` (a directory, or a worktree's `gitdir:` file).
fn find_repo(dir: &Path) -> Result<(Repo, PathBuf), WorktreeError> {
    let mut at = Some(dir);
    while let Some(here) = at {
        let dot = here.join(".git");
        if dot.is_dir() {
            return Ok((Repo { common: dot }, here.to_path_buf()));
        }
        if dot.is_file() {
            let text = std::fs::read_to_string(&dot).map_err(|e| WorktreeError::Unreadable {
                path: dot.clone(),
                reason: e.to_string(),
            })?;
            let gitdir = text
                .strip_prefix("gitdir:")
                .map(str::trim)
                .ok_or_else(|| WorktreeError::NotAWorktreeFile(dot.clone()))?;
            let gitdir = here.join(gitdir);
            let common = match std::fs::read_to_string(gitdir.join("commondir")) {
                Ok(common) => gitdir.join(common.trim()),
                Err(_) => gitdir,
            };
            let common = std::fs::canonicalize(&common).unwrap_or(common);
            return Ok((Repo { common }, here.to_path_buf()));
        }
        at = here.parent();
    }
    Err(WorktreeError::NoRepository(dir.to_path_buf()))
}

/// Runs `git --git-dir=COMMON ARGS` (questions of the repository's refs,
/// asked without a checkout).
async fn git_in_repo(common: &Path, args: &[&str]) -> Result<String, WorktreeError> {
    let dir = format!("--git-dir={}", common.display());
    let mut all = vec![dir.as_str()];
    all.extend_from_slice(args);
    git(common, &all).await
}

/// The worktree's directory and branch name of run `run` (an agent of type
/// `agent_type`): both cleaned for git, and a hash of the run id as it is,
/// since `T/0.2~1` (a retry) and `T/0.2.1` (a grandchild) clean alike.
fn worktree_name(agent_type: &str, run: &str) -> String {
    format!("{}-{}-{:08x}", clean(agent_type), clean(run), fnv32(run))
}

/// FNV-1a over `text`: a short, stable tag that tells apart names `clean`
/// makes alike.
fn fnv32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Runs `git -C dir ARGS`; its standard output, or an error with its
/// standard error. Git's hooks and file-system monitor are off: what an
/// agent wrote in the repository never runs as Arbor.
async fn git(dir: &Path, args: &[&str]) -> Result<String, WorktreeError> {
    git_with(dir, args, &[]).await
}

/// [`git`] with `env` set.
async fn git_with(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<String, WorktreeError> {
    let program = crate::program::find_on(
        &std::env::var_os("PATH").unwrap_or_default(),
        Path::new("git"),
    )
    .ok_or(WorktreeError::NoGit)?;
    let out = tokio::process::Command::new(program)
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
        ])
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| WorktreeError::GitNotRun(e.to_string()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(WorktreeError::GitFailed {
            args: args.join(" "),
            dir: dir.to_path_buf(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_and_a_grandchild_whose_ids_clean_alike_get_worktrees_of_their_own() {
        let retry = worktree_name("worker", "T/0.2~1");
        let grandchild = worktree_name("worker", "T/0.2.1");
        assert!(retry.starts_with("worker-T-0-2-1-"), "{retry}");
        assert!(grandchild.starts_with("worker-T-0-2-1-"), "{grandchild}");
        assert_ne!(retry, grandchild);
        assert_eq!(
            retry,
            worktree_name("worker", "T/0.2~1"),
            "stable across runs"
        );
        // Nothing git refuses in a branch name: no `..`, `~`, `:` or `/`.
        let odd = worktree_name("a/b", "t:x/0~1");
        assert!(
            odd.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "{odd}"
        );
    }
}
