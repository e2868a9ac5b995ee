//! The page tests' browser: Debian's Chromium (`ARBOR_CHROMIUM`, else
//! `/usr/bin/chromium`) driven by playwright-core from `tests/browser`
//! (`npm ci --prefix tests/browser`). `.ci/run` installs both; without them a
//! page test fails, it never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Chromium and the driver scripts' directory, both checked to be there.
pub struct Browser {
    chromium: String,
    dir: PathBuf,
}

impl Browser {
    /// Fails the test, saying what to install, when either is missing.
    pub fn new() -> Browser {
        let chromium =
            std::env::var("ARBOR_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        assert!(
            Path::new(&chromium).exists(),
            "no Chromium at {chromium}: install Debian's `chromium` (or set ARBOR_CHROMIUM); .ci/run does"
        );
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
        assert!(
            dir.join("node_modules/playwright-core").is_dir(),
            "run `npm ci --prefix tests/browser` first (.ci/run does)"
        );
        Browser { chromium, dir }
    }

    /// The driver script `name` of `tests/browser`.
    pub fn script(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Runs the driver `script` with `args` and the extra environment `env`
    /// (it gets `ARBOR_CHROMIUM` and `ARBOR_BROWSER_DIR` too), off the async
    /// runtime; the JSON report its last line of output holds. A driver that
    /// fails fails the test with what it printed.
    pub async fn drive(&self, script: &Path, args: &[&str], env: &[(&str, &Path)]) -> Value {
        let mut command = Command::new("node");
        command
            .arg(script)
            .args(args)
            .env("ARBOR_CHROMIUM", &self.chromium)
            .env("ARBOR_BROWSER_DIR", &self.dir);
        for (key, value) in env {
            command.env(key, value);
        }
        let output = tokio::task::spawn_blocking(move || command.output().unwrap())
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "the page test failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let last = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last).unwrap_or_else(|e| {
            panic!("the driver's last line is not its JSON report ({e}): {stdout}")
        })
    }
}
