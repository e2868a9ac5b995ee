//! Opening one connection to a server: a child process over stdio (spawned
//! here, in its own process group registered with the reaper) or a
//! streamable HTTP session, then the MCP `initialize` handshake.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::os::unix::process::ExitStatusExt as _;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arbor_actors::sync::LockExt as _;
use nix::sys::signal::Signal;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
use rmcp::service::{ClientInitializeError, NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{DynamicTransportError, StreamableHttpClientTransport};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::mpsc;

use super::bounded;
use super::config::{HttpKind, INHERITED_ENV, MAX_MESSAGE_BYTES, McpTransport, read_env};
use super::sse;
use crate::{keeper, reaper};

/// Longest stderr line logged as one (longer ones are cut in pieces).
const MAX_STDERR_LINE: u64 = 8 * 1024;
/// Stderr lines kept to explain a failed start.
const STDERR_TAIL: usize = 3;
/// How long an HTTP+SSE server may take to name its message endpoint (the
/// start as a whole is bounded by `startup_timeout`).
const SSE_ENDPOINT_WAIT: Duration = Duration::from_secs(30);

/// The values a connection was given that must never be shown (resolved
/// `env` and `headers` values, the bearer token, the password of its `url`).
/// `Debug` is redacted.
#[derive(Clone, Default)]
pub(super) struct Secrets(Arc<Vec<String>>);

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets([REDACTED; {}])", self.0.len())
    }
}

impl Secrets {
    /// `text` with every secret of four or more characters replaced by
    /// `[REDACTED]` (shorter values are flags, not secrets, and replacing them
    /// would garble the text).
    pub(super) fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in self.0.iter().filter(|s| s.len() >= 4) {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), "[REDACTED]");
            }
        }
        text
    }
}

/// The client side of a session: answers nothing special, and asks for a
/// re-list when the server says its tools changed.
pub(super) struct Handler {
    relist: mpsc::Sender<()>,
    info: ClientConfig,
}

impl ClientHandler for Handler {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        // A full channel already holds a re-list request: nothing is lost.
        let _ = self.relist.try_send(());
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }
}

/// A stdio server's process: the registration ends it and all it started
/// when dropped (without a keeper, `kill_on_drop` kills the leader too).
pub(super) struct Process {
    pub child: Child,
    pub pid: Option<u32>,
    pub group: Option<reaper::Registration>,
}

impl Process {
    /// Ends the process: waits up to `grace` for it to exit by itself (its
    /// stdin is closed by then), then kills its group and reaps it.
    pub(super) async fn end(mut self, grace: Duration) {
        let exited = tokio::time::timeout(grace, self.child.wait()).await.is_ok();
        if let Some(mut group) = self.group.take() {
            if exited {
                group.exited(); // what is left of the group after the leader exited
            } else {
                group.kill();
            }
        }
        // A keeper exits once it has ended the server's processes; a leader
        // killed with its group dies at once. Only a stuck one is killed here.
        if !exited
            && tokio::time::timeout(Duration::from_secs(2), self.child.wait())
                .await
                .is_err()
        {
            let _ = self.child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
        }
    }
}

/// An open, initialized session.
pub(super) struct Connection {
    pub service: RunningService<RoleClient, Handler>,
    pub process: Option<Process>,
    /// Receives a message whenever the server sends `tools/list_changed`.
    pub relist: mpsc::Receiver<()>,
    pub secrets: Secrets,
}

/// Connects to server `name` and runs `initialize`. `Err` says why, with
/// every secret scrubbed out. Not bounded in time: the caller bounds it (and
/// dropping the future kills a process it spawned).
pub(super) async fn connect(name: &str, transport: &McpTransport) -> Result<Connection, String> {
    let (relist_tx, relist) = mpsc::channel(1);
    let handler = Handler {
        relist: relist_tx,
        info: ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("arbor", env!("CARGO_PKG_VERSION")),
        )
        // Sessions with the `initialize` handshake: what every server speaks.
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE),
    };
    match transport {
        McpTransport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut secrets = Vec::new();
            let mut vars = Vec::new();
            let mut unset = Vec::new();
            for (key, source) in env {
                match source.resolve() {
                    Ok(value) => {
                        secrets.push(value.clone());
                        vars.push((key.clone(), value));
                    }
                    Err(e) => unset.push(format!("env.{key}: {e}")),
                }
            }
            if !unset.is_empty() {
                return Err(unset.join("; "));
            }
            let secrets = Secrets(Arc::new(secrets));
            let mut cmd = Command::new(command);
            cmd.args(args).env_clear();
            for key in INHERITED_ENV {
                if let Some(value) = std::env::var_os(key) {
                    cmd.env(key, value);
                }
            }
            cmd.envs(vars)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
            if let Some(cwd) = cwd {
                cmd.current_dir(cwd);
            }
            // Under a keeper, the server and all it starts die with Arbor;
            // the registration ends them (a SIGKILL of the keeper alone
            // would leave the server's children behind).
            let kept = keeper::install(&mut cmd, None);
            cmd.kill_on_drop(!kept);
            let mut child = cmd
                .spawn()
                .map_err(|e| format!("cannot run {command:?}: {e}"))?;
            let pid = child.id();
            let group = pid.map(if kept {
                reaper::register_keeper
            } else {
                reaper::register
            });
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                return Err("the process has no stdin/stdout pipes".to_owned());
            };
            let tail = Arc::new(Mutex::new(VecDeque::new()));
            if let Some(stderr) = child.stderr.take() {
                tokio::spawn(drain_stderr(
                    name.to_owned(),
                    stderr,
                    secrets.clone(),
                    tail.clone(),
                ));
            }
            let mut process = Process { child, pid, group };
            // Messages go through a bounded reader (a message too large for
            // the SDK fails its call at once instead of never arriving).
            let (ours, theirs) = tokio::io::duplex(256 * 1024);
            tokio::spawn(bounded::pump(
                name.to_owned(),
                stdout,
                ours,
                MAX_MESSAGE_BYTES,
            ));
            let transport = rmcp::transport::async_rw::AsyncRwTransport::new(theirs, stdin)
                .with_max_line_length(MAX_MESSAGE_BYTES + 1024);
            match handler.serve(transport).await {
                Ok(service) => Ok(Connection {
                    service,
                    process: Some(process),
                    relist,
                    secrets,
                }),
                Err(e) => {
                    let mut why = format!("initialize failed: {}", secrets.scrub(&init_error(&e)));
                    // Say how the process ended and what it last wrote, if it did.
                    if let Ok(Ok(status)) =
                        tokio::time::timeout(Duration::from_millis(500), process.child.wait()).await
                    {
                        why.push_str(&format!("; the process {}", exit_phrase(status)));
                        // Let the stderr reader catch up with the end of the pipe.
                        tokio::task::yield_now().await;
                    }
                    let last = tail.locked().back().cloned();
                    if let Some(last) = last {
                        why.push_str(&format!("; its stderr ends: {last}"));
                    }
                    process.end(Duration::ZERO).await;
                    Err(why)
                }
            }
        }
        McpTransport::Http {
            url,
            kind,
            headers,
            bearer_token_env,
        } => {
            // The URL's password (sent as Basic credentials) is one too.
            let mut secrets: Vec<String> = reqwest::Url::parse(url)
                .ok()
                .and_then(|u| u.password().map(str::to_owned))
                .into_iter()
                .collect();
            let mut custom = HashMap::new();
            let mut unset = Vec::new();
            for (key, source) in headers {
                let value = match source.resolve() {
                    Ok(value) => value,
                    Err(e) => {
                        unset.push(format!("headers.{key}: {e}"));
                        continue;
                    }
                };
                secrets.push(value.clone());
                let (Ok(name), Ok(mut value)) = (
                    HeaderName::from_bytes(key.as_bytes()),
                    HeaderValue::from_str(&value),
                ) else {
                    unset.push(format!("headers.{key}: not a valid header value"));
                    continue;
                };
                value.set_sensitive(true);
                custom.insert(name, value);
            }
            let token = match bearer_token_env {
                Some(var) => match read_env(var) {
                    Ok(token) => {
                        secrets.push(token.clone());
                        Some(token)
                    }
                    Err(e) => {
                        unset.push(format!("bearer_token_env: {e}"));
                        None
                    }
                },
                None => None,
            };
            if !unset.is_empty() {
                return Err(unset.join("; "));
            }
            let secrets = Secrets(Arc::new(secrets));
            let handler_again = Handler {
                relist: handler.relist.clone(),
                info: handler.info.clone(),
            };
            let mut refused = None;
            if *kind != HttpKind::Sse {
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom.clone());
                if let Some(token) = token.clone() {
                    config = config.auth_header(token);
                }
                let transport = StreamableHttpClientTransport::from_config(config);
                match handler.serve(transport).await {
                    Ok(service) => {
                        return Ok(Connection {
                            service,
                            process: None,
                            relist,
                            secrets,
                        });
                    }
                    Err(e) => refused = Some(secrets.scrub(&init_error(&e))),
                }
            }
            if let (HttpKind::Streamable, Some(why)) = (kind, &refused) {
                return Err(format!("initialize failed: {why}"));
            }
            // The legacy HTTP+SSE transport: asked for, or the server refused
            // streamable HTTP (a 405 or 404 to its POST, most often).
            let pair = sse::connect(name, url, &custom, token.as_deref(), SSE_ENDPOINT_WAIT)
                .await
                .map_err(|e| {
                    let e = secrets.scrub(&e);
                    match &refused {
                        Some(why) => format!(
                            "initialize failed: {why} (as streamable HTTP; and as a legacy HTTP+SSE server: {e})"
                        ),
                        None => format!("cannot open the HTTP+SSE session: {e}"),
                    }
                })?;
            let service = handler_again.serve(pair).await.map_err(|e| {
                format!(
                    "initialize failed (HTTP+SSE): {}",
                    secrets.scrub(&init_error(&e))
                )
            })?;
            Ok(Connection {
                service,
                process: None,
                relist,
                secrets,
            })
        }
    }
}

/// A failed `initialize`, without the SDK's type names.
fn init_error(error: &ClientInitializeError) -> String {
    match error {
        ClientInitializeError::TransportError { error, context } => {
            format!("{context}: {}", transport_error(error))
        }
        other => other.to_string(),
    }
}

/// A transport failure as its chain of causes (`error sending request …:
/// tcp connect error: Connection refused`), without the transport's type name.
pub(super) fn transport_error(error: &DynamicTransportError) -> String {
    let mut text = error.error.to_string();
    let mut source = error.error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// `exited with code 1`, `was killed by SIGKILL`.
pub(super) fn exit_phrase(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(signal) => format!("was killed by {signal}"),
            Err(_) => format!("was killed by signal {signal}"),
        },
        (None, None) => format!("ended ({status})"),
    }
}

/// Logs the server's stderr as `debug` lines (scrubbed), so a full pipe never
/// blocks it, and keeps the last lines to explain a failed start.
async fn drain_stderr(
    server: String,
    stderr: ChildStderr,
    secrets: Secrets,
    tail: Arc<Mutex<VecDeque<String>>>,
) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(MAX_STDERR_LINE)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = secrets.scrub(String::from_utf8_lossy(&line).trim_end());
                if text.is_empty() {
                    continue;
                }
                tracing::debug!(server = %server, "MCP server stderr: {text}");
                let mut tail = tail.locked();
                if tail.len() == STDERR_TAIL {
                    tail.pop_front();
                }
                tail.push_back(text);
            }
        }
    }
}
