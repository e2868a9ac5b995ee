//! A sandbox for the commands agents run: bubblewrap (`bwrap`, Debian's
//! `bubblewrap`), the unprivileged sandbox Flatpak is built on.
//!
//! A sandboxed command sees the whole filesystem read-only, its workspace
//! (and any other directory the config names) writable, a fresh `/tmp`, a
//! fresh `/dev` and `/proc`, and no network unless the config allows it. It
//! runs in namespaces of its own (user, pid, ipc, uts, cgroup, net), in a new
//! session (so it cannot push input into Arbor's terminal), and dies with the
//! `bwrap` that started it: killing the call's process group, as a timeout
//! or a cancel does, ends every process inside.
//!
//! A sandbox that was asked for is never skipped: where `bwrap` is missing,
//! or cannot make its namespaces (user namespaces turned off, a container
//! without the capability), [`Sandbox::bwrap`] says so, with `bwrap`'s own
//! words, and nothing is run. `arbor check-config` calls it, so the refusal
//! comes before a tree starts.
//!
//! Why bubblewrap: it is packaged everywhere, needs no daemon and no root,
//! and does one thing; a container runtime would bring an image store and a
//! daemon, and Landlock alone cannot take the network away on older kernels
//! or give a fresh `/tmp`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The sandbox the config asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxKind {
    /// Commands run as Arbor's own processes (in the workspace directory).
    #[default]
    None,
    /// Commands run under bubblewrap.
    Bwrap,
}

/// Why a sandbox that was asked for cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// No `bwrap` on `PATH`.
    #[error(
        "sandbox = \"bwrap\" needs bubblewrap, and no `bwrap` is on PATH (install the \
         `bubblewrap` package); commands are not run unsandboxed"
    )]
    Missing,
    /// `bwrap` is there but could not make its sandbox here.
    #[error(
        "sandbox = \"bwrap\": {program} cannot make a sandbox on this machine ({reason}); \
         user namespaces may be turned off (sysctl kernel.unprivileged_userns_clone or \
         user.max_user_namespaces); commands are not run unsandboxed"
    )]
    Unusable {
        /// The `bwrap` that was tried.
        program: String,
        /// What it said (the last line of its stderr), or why it did not start.
        reason: String,
    },
}

/// A checked bubblewrap sandbox: where `bwrap` is, and what a command in it
/// may reach besides its workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sandbox {
    program: PathBuf,
    network: bool,
    writable: Vec<PathBuf>,
}

impl Sandbox {
    /// The same sandbox with `dir` writable too.
    pub fn with_writable(&self, dir: PathBuf) -> Sandbox {
        let mut sandbox = self.clone();
        if !sandbox.writable.contains(&dir) {
            sandbox.writable.push(dir);
        }
        sandbox
    }

    /// Finds `bwrap` on `PATH` and makes one sandbox with it, to know now
    /// (not at the first call) that it works here.
    pub fn bwrap(network: bool, writable: Vec<PathBuf>) -> Result<Sandbox, SandboxError> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        Self::bwrap_on(&path, network, writable)
    }

    /// [`bwrap`](Self::bwrap), looking on `path` (a `PATH` value).
    pub fn bwrap_on(
        path: &std::ffi::OsStr,
        network: bool,
        writable: Vec<PathBuf>,
    ) -> Result<Sandbox, SandboxError> {
        let program =
            crate::program::find_on(path, Path::new("bwrap")).ok_or(SandboxError::Missing)?;
        let sandbox = Sandbox {
            program,
            network,
            writable,
        };
        sandbox.probe()?;
        Ok(sandbox)
    }

    /// Runs `true` in a sandbox like the ones commands get.
    fn probe(&self) -> Result<(), SandboxError> {
        let here = std::env::temp_dir();
        let argv = self.argv(&here, &here, &["true".to_owned()]);
        let unusable = |reason: String| SandboxError::Unusable {
            program: self.program.display().to_string(),
            reason,
        };
        let output = std::process::Command::new(&self.program)
            .args(&argv)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| unusable(format!("it did not start: {e}")))?;
        if output.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let said = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message")
            .trim()
            .to_owned();
        Err(unusable(format!("{}: {said}", output.status)))
    }

    /// The `bwrap` program.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Whether commands may use the network.
    pub fn network(&self) -> bool {
        self.network
    }

    /// `bwrap`'s arguments to run `command` (the program, then its
    /// arguments) with `workspace` writable, starting in `cwd`. Pure: what
    /// the sandbox allows is all here.
    pub fn argv(&self, workspace: &Path, cwd: &Path, command: &[String]) -> Vec<OsString> {
        self.argv_with(workspace, true, cwd, command)
    }

    /// [`argv`](Self::argv), with the workspace read-only unless `writable`.
    pub fn argv_with(
        &self,
        workspace: &Path,
        writable: bool,
        cwd: &Path,
        command: &[String],
    ) -> Vec<OsString> {
        let mut argv: Vec<OsString> = [
            "--die-with-parent",
            "--unshare-all",
            "--new-session",
            // Everything read-only, then fresh /dev, /proc and /tmp over it.
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        if self.network {
            argv.push("--share-net".into());
        }
        // Writable places last, so that one under /tmp shows through the
        // fresh /tmp.
        // The other writable places first, then the workspace (so one that
        // holds the workspace cannot make a read-only workspace writable),
        // then its `.claude/` read-only: hooks there run outside the sandbox.
        for dir in &self.writable {
            argv.push("--bind".into());
            argv.push(dir.into());
            argv.push(dir.into());
        }
        argv.push(if writable { "--bind" } else { "--ro-bind" }.into());
        argv.push(workspace.into());
        argv.push(workspace.into());
        let hooks = workspace.join(".claude");
        if hooks.is_dir() {
            argv.push("--ro-bind".into());
            argv.push(hooks.clone().into());
            argv.push(hooks.into());
        }
        argv.push("--chdir".into());
        argv.push(cwd.into());
        argv.push("--".into());
        argv.extend(command.iter().map(OsString::from));
        argv
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;
    use std::net::TcpListener;
    use std::process::Command;
    use std::time::Duration;

    use super::*;

    /// The machine's bubblewrap; tests that need one say so when it is
    /// missing (CI installs it: `.ci/run`).
    fn bwrap(network: bool) -> Option<Sandbox> {
        match Sandbox::bwrap(network, Vec::new()) {
            Ok(sandbox) => Some(sandbox),
            Err(error) if std::env::var_os("CI").is_some() => {
                panic!("CI installs bubblewrap: {error}")
            }
            Err(error) => {
                eprintln!("skipped: {error}");
                None
            }
        }
    }

    fn run(sandbox: &Sandbox, workspace: &Path, script: &str) -> std::process::Output {
        let argv = sandbox.argv(
            workspace,
            workspace,
            &["bash".into(), "-c".into(), script.into()],
        );
        Command::new(sandbox.program())
            .args(argv)
            .output()
            .expect("bwrap runs")
    }

    #[test]
    fn the_sandbox_argv_binds_the_workspace_last_and_shares_the_network_only_when_allowed() {
        let sandbox = Sandbox {
            program: "/usr/bin/bwrap".into(),
            network: false,
            writable: vec!["/var/cache/x".into()],
        };
        let argv = sandbox.argv(Path::new("/w"), Path::new("/w/sub"), &["ls".into()]);
        let text: Vec<String> = argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let at = |needle: &str| text.iter().position(|a| a == needle).expect(needle);
        assert!(at("--tmpfs") < at("--bind"), "{text:?}");
        assert!(!text.contains(&"--share-net".to_owned()));
        assert_eq!(
            text[text.len() - 10..],
            [
                "--bind",
                "/var/cache/x",
                "/var/cache/x",
                "--bind",
                "/w",
                "/w",
                "--chdir",
                "/w/sub",
                "--",
                "ls",
            ]
            .map(String::from)[..]
        );
        let open = Sandbox {
            network: true,
            ..sandbox
        };
        assert!(
            open.argv(Path::new("/w"), Path::new("/w"), &[])
                .contains(&OsString::from("--share-net"))
        );
    }

    #[test]
    fn without_bwrap_on_path_the_sandbox_is_refused_and_nothing_runs() {
        let empty = tempfile::tempdir().expect("tempdir");
        let error = Sandbox::bwrap_on(empty.path().as_os_str(), false, Vec::new())
            .expect_err("no bwrap there");
        assert_eq!(error, SandboxError::Missing);
        assert!(error.to_string().contains("bubblewrap"), "{error}");
        assert!(error.to_string().contains("not run unsandboxed"), "{error}");
    }

    #[test]
    fn a_bwrap_that_cannot_make_its_sandbox_is_refused_with_its_own_words() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = dir.path().join("bwrap");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n",
        )
        .expect("write");
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let error =
            Sandbox::bwrap_on(dir.path().as_os_str(), false, Vec::new()).expect_err("unusable");
        let text = error.to_string();
        assert!(
            text.contains("No permissions to creating new namespace"),
            "{text}"
        );
        assert!(text.contains("user namespaces"), "{text}");
    }

    #[test]
    fn a_sandboxed_command_writes_its_workspace_and_nothing_else() {
        let Some(sandbox) = bwrap(false) else { return };
        let workspace = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let target = outside.path().join("escaped.txt");
        let host_tmp = tempfile::NamedTempFile::new().expect("tmp file");
        let script = format!(
            "echo inside > made.txt; echo out > {out}; echo home > \"$HOME/arbor-sandbox-probe\"; \
             test -e {tmp} && echo 'host tmp visible'; exit 0",
            out = target.display(),
            tmp = host_tmp.path().display(),
        );
        let output = run(&sandbox, workspace.path(), &script);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            std::fs::read_to_string(workspace.path().join("made.txt")).ok(),
            Some("inside\n".to_owned())
        );
        assert!(!target.exists(), "wrote outside its workspace: {stderr}");
        assert!(stderr.contains("Read-only file system"), "{stderr}");
        let home = std::env::var_os("HOME").map(PathBuf::from);
        assert!(!home.is_some_and(|h| h.join("arbor-sandbox-probe").exists()));
        assert!(!stdout.contains("host tmp visible"), "{stdout}");
    }

    #[test]
    fn a_sandboxed_command_cannot_open_a_socket_unless_the_network_is_allowed() {
        let Some(closed) = bwrap(false) else { return };
        let workspace = tempfile::tempdir().expect("tempdir");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let script = format!("echo hello > /dev/tcp/127.0.0.1/{port}");
        let output = run(&closed, workspace.path(), &script);
        assert!(!output.status.success());
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            listener.accept().is_err(),
            "the sandboxed command reached the host's loopback"
        );
        // The same command with the network allowed reaches it (so the
        // refusal above is the sandbox's).
        let open = Sandbox {
            network: true,
            ..closed
        };
        let output = run(&open, workspace.path(), &script);
        assert!(output.status.success(), "{output:?}");
        listener.set_nonblocking(false).expect("blocking");
        let (mut peer, _) = listener.accept().expect("a connection");
        let mut said = String::new();
        peer.read_to_string(&mut said).expect("read");
        assert_eq!(said, "hello\n");
    }
}
