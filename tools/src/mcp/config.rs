//! The `[mcp_servers.NAME]` table ([`McpServerSection`]) and the settings
//! checked from it ([`McpSettings`]).
//!
//! Values of `env` and `headers` and the bearer token are secrets: a literal
//! is kept in a [`ValueSource`] whose `Debug` is redacted, and a
//! `{ env = "VAR" }` is read only when the server starts (an unset variable is
//! that start's failure, naming the variable).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

/// Per-call timeout when `timeout` is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a start (spawn or connect, initialize, `tools/list`) may take
/// when `startup_timeout` is not set.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Calls in flight per server when `max_concurrent` is not set.
pub const DEFAULT_MAX_CONCURRENT: usize = 8;

/// `timeout` and `startup_timeout`: from 1 ms to a day.
pub const TIMEOUT_RANGE: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_secs(86_400));

/// Calls in flight to one server, at most.
pub const MAX_CONCURRENT: usize = 1024;

/// How much of a result the model gets when `max_output_bytes` is not set
/// (as for command tools).
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 100_000;

/// The largest `max_output_bytes` (64 MiB, as for command tools).
pub const MAX_OUTPUT_BYTES: usize = crate::command::MAX_OUTPUT_BYTES;

/// The largest message read from a stdio server (16 MiB, the SDK's own
/// bound): a longer one is not read, and the call it answers fails at once
/// with "result too large (N bytes)".
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// One `[mcp_servers.NAME]` table as written. A server is either a process
/// spoken to over stdio (`command`, `args`, `env`, `cwd`) or a streamable
/// HTTP endpoint (`url`, `headers`, `bearer_token_env`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerSection {
    /// The program to run (found on `PATH` unless it is a path).
    pub command: Option<String>,
    /// The program's arguments, passed as they are (no shell, no expansion).
    pub args: Option<Vec<String>>,
    /// Variables for the process, on top of a minimal inherited set
    /// ([`INHERITED_ENV`]); Arbor's other variables are not passed.
    pub env: Option<BTreeMap<String, ValueSource>>,
    /// Working directory of the process; relative to the config's directory.
    pub cwd: Option<PathBuf>,
    /// The streamable HTTP endpoint (`http://` or `https://`).
    pub url: Option<String>,
    /// How a `url` is spoken to: `"streamable_http"` (also `"http"`), `"sse"`
    /// (the legacy HTTP+SSE transport), or, when not set, streamable HTTP
    /// and then HTTP+SSE if the server refuses it. `"stdio"` is accepted
    /// beside a `command`. (`type` is the same key, as other clients write it.)
    #[serde(alias = "type")]
    pub transport: Option<String>,
    /// Headers sent with every request (Codex: `http_headers`).
    #[serde(alias = "http_headers")]
    pub headers: Option<BTreeMap<String, ValueSource>>,
    /// The variable holding a bearer token (sent as `Authorization: Bearer …`;
    /// Codex: `bearer_token_env_var`).
    #[serde(alias = "bearer_token_env_var")]
    pub bearer_token_env: Option<String>,
    /// Per-call timeout, e.g. `"60s"`.
    pub timeout: Option<String>,
    /// Calls in flight at once (all agents of all trees share them).
    pub max_concurrent: Option<usize>,
    /// How long starting the server may take, e.g. `"30s"`.
    pub startup_timeout: Option<String>,
    /// The server's tools that may be used (`*` matches any run of characters);
    /// all of them when not set (Codex: `enabled_tools`).
    #[serde(alias = "enabled_tools")]
    pub tools: Option<Vec<String>>,
    /// The server's tools that may not be used (patterns as in `tools`).
    pub disabled_tools: Option<Vec<String>>,
    /// `false`: the server is declared but not started; its tools say so.
    pub enabled: Option<bool>,
    /// Codex's spellings, read as `startup_timeout` and `timeout` (seconds
    /// or milliseconds as numbers), `headers` whose values come from
    /// variables (`{ HEADER = "VAR" }`) and variables passed on as they are
    /// (`env_vars = ["VAR"]`), so a Codex `[mcp_servers.NAME]` block works
    /// as pasted.
    pub startup_timeout_sec: Option<f64>,
    /// See `startup_timeout_sec`.
    pub startup_timeout_ms: Option<u64>,
    /// See `startup_timeout_sec`.
    pub tool_timeout_sec: Option<f64>,
    /// See `startup_timeout_sec`.
    pub env_http_headers: Option<BTreeMap<String, String>>,
    /// See `startup_timeout_sec`.
    pub env_vars: Option<Vec<String>>,
    /// Start the server when the runtime starts instead of on first use.
    #[serde(default)]
    pub eager: bool,
    /// How much of a result the model gets (its text and media, in bytes;
    /// 100 000 by default); the rest is cut with a note.
    pub max_output_bytes: Option<usize>,
}

/// Variables a stdio server inherits from Arbor's environment; everything
/// else it gets comes from its `env` table.
pub const INHERITED_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LC_ALL", "TMPDIR", "TZ",
];

/// A configured value: written in the config, or taken from Arbor's
/// environment when the server starts. `Debug` never shows a literal.
#[derive(Clone, PartialEq, Eq)]
pub enum ValueSource {
    /// A string written in the config itself (a secret: never shown).
    Literal(String),
    /// `{ env = "VAR" }`: the value of Arbor's variable `VAR`.
    Env(String),
}

impl fmt::Debug for ValueSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueSource::Literal(_) => f.write_str("[REDACTED]"),
            ValueSource::Env(var) => write!(f, "{{ env = {var:?} }}"),
        }
    }
}

impl ValueSource {
    /// A written value: `"${VAR}"` (the whole value, as Claude Code's and
    /// Cursor's configs write it) is `{ env = "VAR" }`; anything else is a
    /// literal.
    pub(crate) fn from_text(text: String) -> ValueSource {
        let var = text
            .strip_prefix("${")
            .and_then(|rest| rest.strip_suffix('}'))
            .filter(|var| {
                !var.is_empty()
                    && !var.starts_with(|c: char| c.is_ascii_digit())
                    && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
        match var {
            Some(var) => ValueSource::Env(var.to_owned()),
            None => ValueSource::Literal(text),
        }
    }

    /// The value now. `Err` names the variable that is unset (never a value).
    pub(crate) fn resolve(&self) -> Result<String, EnvError> {
        match self {
            ValueSource::Literal(value) => Ok(value.clone()),
            ValueSource::Env(var) => read_env(var),
        }
    }
}

/// An environment variable a value is read from that has none (named,
/// never its value).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EnvError {
    /// The variable is not set.
    #[error("environment variable {0} is not set")]
    Unset(String),
    /// The variable's value is not UTF-8.
    #[error("environment variable {0} is not valid UTF-8")]
    NotUnicode(String),
}

/// Reads `var`; `Err` names it, never a value.
pub(crate) fn read_env(var: &str) -> Result<String, EnvError> {
    std::env::var(var).map_err(|e| match e {
        std::env::VarError::NotPresent => EnvError::Unset(var.to_owned()),
        std::env::VarError::NotUnicode(_) => EnvError::NotUnicode(var.to_owned()),
    })
}

impl<'de> Deserialize<'de> for ValueSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SourceVisitor;

        impl<'de> Visitor<'de> for SourceVisitor {
            type Value = ValueSource;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a string or { env = "VAR" }"#)
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<ValueSource, E> {
                Ok(ValueSource::from_text(value.to_owned()))
            }

            fn visit_string<E: de::Error>(self, value: String) -> Result<ValueSource, E> {
                Ok(ValueSource::from_text(value))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ValueSource, A::Error> {
                let mut var: Option<String> = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key != "env" {
                        return Err(de::Error::unknown_field(&key, &["env"]));
                    }
                    if var.is_some() {
                        return Err(de::Error::duplicate_field("env"));
                    }
                    var = Some(map.next_value()?);
                }
                match var {
                    Some(var) if !var.is_empty() => Ok(ValueSource::Env(var)),
                    Some(_) => Err(de::Error::custom("env: the variable name is empty")),
                    None => Err(de::Error::missing_field("env")),
                }
            }
        }

        deserializer.deserialize_any(SourceVisitor)
    }
}

/// How Arbor reaches a server.
#[derive(Clone, Debug)]
pub enum McpTransport {
    /// A child process spoken to over its stdin/stdout.
    Stdio {
        /// The program (found on `PATH` unless it is a path).
        command: String,
        /// Its arguments, as they are (no shell).
        args: Vec<String>,
        /// Variables set for it on top of [`INHERITED_ENV`], resolved when
        /// it starts.
        env: BTreeMap<String, ValueSource>,
        /// Absolute, or relative to Arbor's working directory.
        cwd: Option<PathBuf>,
    },
    /// An HTTP endpoint: streamable HTTP or the legacy HTTP+SSE transport.
    Http {
        /// The endpoint (`http://` or `https://`, checked).
        url: String,
        /// Which HTTP transport.
        kind: HttpKind,
        /// Headers sent with every request, resolved when it connects.
        headers: BTreeMap<String, ValueSource>,
        /// The variable read at connect time for an `Authorization: Bearer`
        /// token (never together with an `Authorization` header).
        bearer_token_env: Option<String>,
    },
}

/// Which HTTP transport a `url` server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpKind {
    /// Streamable HTTP, then HTTP+SSE if the server refuses it.
    Auto,
    /// Streamable HTTP only.
    Streamable,
    /// The legacy HTTP+SSE transport only.
    Sse,
}

/// One server's checked settings. `Debug` shows no secret: literals of `env`
/// and `headers` are redacted, variables are shown by name only.
#[derive(Clone, Debug)]
pub struct McpSettings {
    /// How the server is reached: a child process or an HTTP endpoint.
    pub transport: McpTransport,
    /// How long one tool call may take before it fails with a timeout
    /// (from 1 ms to a day; [`DEFAULT_TIMEOUT`] when not set).
    pub timeout: Duration,
    /// Calls in flight to this server at once, shared by every agent of
    /// every tree (1 to [`MAX_CONCURRENT`]); further calls wait.
    pub max_concurrent: usize,
    /// How long a start (spawn or connect, `initialize`, `tools/list`) may
    /// take ([`DEFAULT_STARTUP_TIMEOUT`] when not set).
    pub startup_timeout: Duration,
    /// The allow-list of tool names (with `*` patterns); `None` allows all.
    pub tools: Option<Vec<String>>,
    /// Tool names (with `*` patterns) that are not allowed, whatever `tools` says.
    pub disabled_tools: Vec<String>,
    /// False: the server is never started (`enabled = false`).
    pub enabled: bool,
    /// Start the server when the runtime is built (inside a tokio runtime)
    /// rather than when a tree first needs one of its tools.
    pub eager: bool,
    /// How much of a result the model gets (1 to [`MAX_OUTPUT_BYTES`];
    /// [`DEFAULT_MAX_OUTPUT_BYTES`] when not set).
    pub max_output_bytes: usize,
}

impl McpSettings {
    /// Whether the allow-list lets agents use the server's tool `tool`.
    pub fn allows(&self, tool: &str) -> bool {
        self.tools
            .as_ref()
            .is_none_or(|patterns| patterns.iter().any(|p| glob_match(p, tool)))
            && !self.disabled_tools.iter().any(|p| glob_match(p, tool))
    }
}

/// `*` matches any run of characters (also none); everything else itself.
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return text.is_empty();
    };
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty(); // no `*`: an exact match
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

impl McpServerSection {
    /// Checks the table of server `name`; relative `cwd`s are resolved against
    /// `base_dir` (the config file's directory). `Err` lists every problem at
    /// once as (key relative to the table, message); the empty key is the
    /// table itself. Variables named by `{ env = "VAR" }` and
    /// `bearer_token_env` are not read here: they are read when the server
    /// starts, and one that is unset is that start's failure.
    pub fn settings(
        &self,
        name: &str,
        base_dir: &Path,
    ) -> Result<McpSettings, Vec<(String, String)>> {
        let mut problems: Vec<(String, String)> = Vec::new();
        let mut problem = |key: &str, message: String| problems.push((key.to_owned(), message));

        if name.is_empty() || name.contains('/') {
            problem(
                "",
                format!(
                    "server name {name:?} must be non-empty and have no '/' (tools are named SERVER/TOOL)"
                ),
            );
        }

        let duration = |key: &str, value: &Option<String>, default: Duration| match value {
            None => Ok(default),
            Some(text) => arbor_actors::duration::parse(text)
                .map_err(|e| e.to_string())
                .and_then(|d| {
                    arbor_actors::duration::within(d, TIMEOUT_RANGE.0, TIMEOUT_RANGE.1)
                        .map_err(|e| e.to_string())
                })
                .map_err(|e| (key.to_owned(), e)),
        };
        // Codex's numbers, as the duration text they mean.
        let seconds = |v: f64| format!("{}ms", (v * 1000.0).round());
        let mut spelled =
            |key: &str, ours: &Option<String>, theirs: Vec<(&str, Option<String>)>| {
                let given: Vec<(&str, String)> = theirs
                    .into_iter()
                    .filter_map(|(k, v)| v.map(|v| (k, v)))
                    .collect();
                match (ours, given.as_slice()) {
                    (Some(text), []) => Some(text.clone()),
                    (None, []) => None,
                    (None, [(_, text)]) => Some(text.clone()),
                    _ => {
                        let mut keys: Vec<&str> = given.iter().map(|(k, _)| *k).collect();
                        if ours.is_some() {
                            keys.insert(0, key);
                        }
                        problem(
                            key,
                            format!("is set more than once ({}): keep one", keys.join(", ")),
                        );
                        None
                    }
                }
            };
        let timeout_text = spelled(
            "timeout",
            &self.timeout,
            vec![("tool_timeout_sec", self.tool_timeout_sec.map(seconds))],
        );
        let startup_text = spelled(
            "startup_timeout",
            &self.startup_timeout,
            vec![
                ("startup_timeout_sec", self.startup_timeout_sec.map(seconds)),
                (
                    "startup_timeout_ms",
                    self.startup_timeout_ms.map(|ms| format!("{ms}ms")),
                ),
            ],
        );
        let timeout =
            duration("timeout", &timeout_text, DEFAULT_TIMEOUT).unwrap_or_else(|(k, m)| {
                problem(&k, m);
                DEFAULT_TIMEOUT
            });
        let startup_timeout = duration("startup_timeout", &startup_text, DEFAULT_STARTUP_TIMEOUT)
            .unwrap_or_else(|(k, m)| {
                problem(&k, m);
                DEFAULT_STARTUP_TIMEOUT
            });
        let max_concurrent = self.max_concurrent.unwrap_or(DEFAULT_MAX_CONCURRENT);
        if !(1..=MAX_CONCURRENT).contains(&max_concurrent) {
            problem(
                "max_concurrent",
                format!("must be from 1 to {MAX_CONCURRENT}"),
            );
        }
        let max_output_bytes = self.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES);
        if !(1..=MAX_OUTPUT_BYTES).contains(&max_output_bytes) {
            problem(
                "max_output_bytes",
                format!("must be from 1 to {MAX_OUTPUT_BYTES}"),
            );
        }
        if let Some(patterns) = &self.tools
            && patterns.iter().any(String::is_empty)
        {
            problem("tools", "a tool name or pattern is empty".to_owned());
        }

        let transport = match (&self.command, &self.url) {
            (Some(_), Some(_)) => {
                problem(
                    "command",
                    "has both command and url: a server is either a process (stdio) or a URL (streamable HTTP)"
                        .to_owned(),
                );
                None
            }
            (None, None) => {
                problem(
                    "command",
                    "needs a command (a process spoken to over stdio) or a url (streamable HTTP)"
                        .to_owned(),
                );
                None
            }
            (Some(command), None) => {
                if self.transport.as_deref().is_some_and(|t| t != "stdio") {
                    problem(
                        "transport",
                        "is for a url; a server with a command speaks stdio".to_owned(),
                    );
                }
                self.stdio(command, base_dir, &mut problem)
            }
            (None, Some(url)) => self.http(url, &mut problem),
        };

        match transport {
            Some(transport) if problems.is_empty() => Ok(McpSettings {
                transport,
                timeout,
                max_concurrent,
                startup_timeout,
                tools: self.tools.clone(),
                disabled_tools: self.disabled_tools.clone().unwrap_or_default(),
                enabled: self.enabled.unwrap_or(true),
                eager: self.eager,
                max_output_bytes,
            }),
            _ => Err(problems),
        }
    }

    fn stdio(
        &self,
        command: &str,
        base_dir: &Path,
        problem: &mut impl FnMut(&str, String),
    ) -> Option<McpTransport> {
        let only_http = "is for a streamable HTTP server (url); this one is a process (command)";
        if self.headers.is_some() {
            problem("headers", only_http.to_owned());
        }
        if self.bearer_token_env.is_some() {
            problem("bearer_token_env", only_http.to_owned());
        }
        if self.env_http_headers.is_some() {
            problem("env_http_headers", only_http.to_owned());
        }
        if command.trim().is_empty() {
            problem("command", "is empty".to_owned());
        }
        let mut env = self.env.clone().unwrap_or_default();
        for var in self.env_vars.iter().flatten() {
            env.entry(var.clone())
                .or_insert_with(|| ValueSource::Env(var.clone()));
        }
        for key in env.keys() {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                problem(
                    &format!("env.{key}"),
                    "is not a valid variable name".to_owned(),
                );
            }
        }
        Some(McpTransport::Stdio {
            command: command.to_owned(),
            args: self.args.clone().unwrap_or_default(),
            env,
            cwd: self.cwd.as_ref().map(|cwd| base_dir.join(cwd)),
        })
    }

    fn http(&self, url: &str, problem: &mut impl FnMut(&str, String)) -> Option<McpTransport> {
        let only_stdio = "is for a process (command); this server is a URL (streamable HTTP)";
        for (key, set) in [
            ("args", self.args.is_some()),
            ("env", self.env.is_some()),
            ("env_vars", self.env_vars.is_some()),
            ("cwd", self.cwd.is_some()),
        ] {
            if set {
                problem(key, only_stdio.to_owned());
            }
        }
        match reqwest::Url::parse(url) {
            Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
            Ok(_) => problem("url", "must be an http:// or https:// URL".to_owned()),
            Err(e) => problem("url", format!("is not a valid URL: {e}")),
        }
        let mut headers = self.headers.clone().unwrap_or_default();
        for (name, var) in self.env_http_headers.iter().flatten() {
            if headers.contains_key(name) {
                problem(
                    &format!("env_http_headers.{name}"),
                    "is also in headers; keep one".to_owned(),
                );
            }
            headers.insert(name.clone(), ValueSource::Env(var.clone()));
        }
        for (name, value) in &headers {
            let key = format!("headers.{name}");
            match HeaderName::from_bytes(name.as_bytes()) {
                Err(_) => problem(&key, "is not a valid header name".to_owned()),
                Ok(header) if header == AUTHORIZATION && self.bearer_token_env.is_some() => {
                    problem(&key, "is also set by bearer_token_env; keep one".to_owned());
                }
                Ok(_) => {}
            }
            if let ValueSource::Literal(literal) = value
                && HeaderValue::from_str(literal).is_err()
            {
                // The value is a secret: say what is wrong, not what it is.
                problem(&key, "is not a valid header value".to_owned());
            }
        }
        if let Some(var) = &self.bearer_token_env
            && var.is_empty()
        {
            problem("bearer_token_env", "the variable name is empty".to_owned());
        }
        let kind = match self.transport.as_deref() {
            None => HttpKind::Auto,
            Some("streamable_http" | "http" | "streamable-http" | "streamableHttp") => {
                HttpKind::Streamable
            }
            Some("sse") => HttpKind::Sse,
            Some(other) => {
                problem(
                    "transport",
                    format!(
                        "{other:?} is not a transport of a url: \"streamable_http\" (or \"http\") or \"sse\" (the legacy HTTP+SSE)"
                    ),
                );
                HttpKind::Auto
            }
        };
        Some(McpTransport::Http {
            kind,
            url: url.to_owned(),
            headers,
            bearer_token_env: self.bearer_token_env.clone(),
        })
    }
}

/// `60s`, `300ms`, `1500ms`: a duration as the config writes it.
pub(crate) fn show_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn globs() {
        assert!(glob_match("read_file", "read_file"));
        assert!(!glob_match("read_file", "read_file2"));
        assert!(glob_match("read_*", "read_file"));
        assert!(glob_match("*", ""));
        assert!(glob_match("*_file", "read_file"));
        assert!(glob_match("r*d*e", "read_file"));
        assert!(!glob_match("r*x*e", "read_file"));
        assert!(glob_match("a*a", "aa"));
        assert!(!glob_match("a*a", "a"));
    }
}
