//! `arbor serve`: the service's logs, the server and its shutdown signal.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use arbor::config::Config;
use arbor::{Error, Runtime};

use super::args::{LogFormat, ServerArgs};
use super::{async_runtime, colour, log_filter, store_location};

/// A service's logs: stdout (where its supervisor collects them), as text or
/// JSON, `info` unless RUST_LOG says otherwise; and spans to an OpenTelemetry
/// collector when `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT` or `[service]
/// otlp_endpoint` names one (docs/telemetry.md). A JSON line written
/// inside a traced span (a tree's) carries its `trace_id` and `span_id`.
fn service_logs(
    config: &Config,
    format: LogFormat,
) -> anyhow::Result<Option<arbor::telemetry::Otlp>> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = log_filter("info,rmcp=warn,ractor=warn");
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stdout)
        .with_ansi(colour(&std::io::stdout()));
    let lines = match format {
        LogFormat::Text => lines.boxed(),
        LogFormat::Json => lines
            .json()
            .event_format(arbor::telemetry::WithTraceIds(
                tracing_subscriber::fmt::format().json(),
            ))
            .boxed(),
    };
    // OTEL_EXPORTER_OTLP_* and OTEL_SERVICE_NAME, else the config's key.
    let otlp = arbor::telemetry::Otlp::from_env(config.service.otlp_endpoint.as_deref())?;
    tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .with(otlp.as_ref().map(|o| o.layer()))
        .init();
    Ok(otlp)
}

pub(super) fn serve(
    config: Config,
    bind: Option<String>,
    store: Option<arbor::config::StoreLocation>,
    log_format: LogFormat,
) -> anyhow::Result<ExitCode> {
    use arbor_service::{Service, ServiceOptions};
    let otlp = service_logs(&config, log_format)?;
    let addr: std::net::SocketAddr = match bind {
        Some(bind) => bind
            .parse()
            .with_context(|| format!("--bind {bind:?} is not an address like 127.0.0.1:8080"))?,
        None => config.service.bind,
    };
    let options = ServiceOptions::from_config(&config)?;
    let shutdown_timeout = options.shutdown_timeout;
    // Checked again by `serve`; here before the store is opened.
    options.check_bind(addr)?;
    if options.tokens.is_empty() {
        let env = &config.service.tokens_env;
        let why = match std::env::var_os(env) {
            None => "is unset",
            Some(v) if v.is_empty() => "is empty",
            Some(_) => "holds no token",
        };
        tracing::warn!("no API tokens ({env} {why}): anyone on this machine can call the API");
    }
    if store.is_none() && !config.stores() {
        return Err(Error::NoStore.into());
    }
    let location = store_location(&config, store)?;
    // A service idles between bursts: its idle memory matters more than the
    // few percent huge pages save a burst (src/idle.rs).
    crate::idle::no_huge_pages();
    let tokio = async_runtime()?;
    let served = tokio.block_on(async {
        // A tree resumed after a restart runs on the config it started with,
        // whatever the file says now.
        let runtime = Runtime::builder(config)
            .store_at(location.clone())
            .retain(arbor_supervisor::Retain::None)
            .per_tree_configs()
            .confine_workspaces()
            .build()?;
        let service = Service::new(runtime, options)?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Error::Bind {
                addr: addr.to_string(),
                reason: e.to_string(),
            })?;
        let local = listener
            .local_addr()
            .context("the listener has no address")?;
        // The location as shown: a Postgres URL without its password.
        tracing::info!(store = %location, "listening on http://{local}");
        let resuming = service.clone();
        tokio::spawn(async move {
            let resumed = resuming.resume_interrupted().await;
            tracing::info!(trees = resumed.len(), "ready (interrupted trees resumed)");
            // Then trees another replica handed over (released on its
            // shutdown: interrupted at once), and those whose owner crashed,
            // once they go stale.
            resuming.adopt_interrupted(arbor_service::ADOPT_EVERY).await;
        });
        let bound = shutdown_timeout + EXIT_GRACE;
        let signal = async move {
            shutdown_signal().await;
            exit_after(bound);
        };
        service.serve(listener, signal).await?;
        tracing::info!("stopped");
        Ok::<_, anyhow::Error>(())
    });
    // Tasks still running (the trees handed over) are dropped; one that
    // does not yield, or a blocking task, is not waited for past the grace.
    tokio.shutdown_timeout(EXIT_GRACE);
    // The last spans go out whether or not the server ended well.
    if let Some(otlp) = otlp {
        otlp.shutdown();
    }
    served?;
    Ok(ExitCode::SUCCESS)
}

/// How long past its `shutdown_timeout` a stopping `arbor serve` may take
/// before it exits anyway (see [`exit_after`]).
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Arms the exit bound once a shutdown begins: a process that has not
/// exited `bound` later (something it waits for never ends) says so and
/// exits at once with status 70 (EX_SOFTWARE). Its store was flushed and
/// its trees handed over within `shutdown_timeout` (or it said it could
/// not): a supervisor restarting it, or the next replica, resumes them.
/// A service that hangs instead holds its port and its trees until
/// someone kills it.
fn exit_after(bound: Duration) {
    let armed = std::thread::Builder::new()
        .name("arbor-exit".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            std::thread::sleep(bound);
            tracing::error!(
                "arbor serve did not exit within {bound:?} of the shutdown signal; exiting now"
            );
            std::process::exit(70)
        });
    if let Err(error) = armed {
        tracing::warn!(%error, "cannot bound the shutdown: no thread for it");
    }
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}

/// A running `arbor serve` that a command talks to (`arbor say`, `arbor
/// approvals`, `arbor approve`, `arbor deny`, `arbor budget`): every request
/// gives up after `--timeout` (its connection after at most
/// [`CONNECT_TIMEOUT`]), naming the server, so a server that accepts and
/// never answers cannot hang the command.
pub(super) struct Api {
    /// The server as given (for messages).
    pub(super) server: String,
    base: reqwest::Url,
    token: Option<String>,
    client: reqwest::Client,
    /// The most a request may take, its answer's body included.
    timeout: std::time::Duration,
}

/// The most a client command waits for its TCP (and TLS) connection.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Api {
    /// The server `--server`/`$ARBOR_SERVER` names, with the token of
    /// `--token`/`$ARBOR_API_TOKEN`.
    pub(super) fn new(args: ServerArgs) -> anyhow::Result<Api> {
        let timeout = args.timeout;
        if timeout.is_zero() {
            anyhow::bail!("--timeout must be longer than 0");
        }
        let (server, token) = args.resolve();
        let base = reqwest::Url::parse(&server)
            .with_context(|| format!("--server {server:?} is not a URL"))?;
        if base.cannot_be_a_base() {
            anyhow::bail!("--server {server:?} cannot have a path");
        }
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT.min(timeout))
            .timeout(timeout)
            .build()
            .context("cannot make an HTTP client")?;
        Ok(Api {
            server,
            base,
            token,
            client,
            timeout,
        })
    }

    /// What a failed request says: the server, and whether it did not
    /// answer in time or could not be reached.
    fn failed(&self, error: &reqwest::Error) -> String {
        let waited = arbor_actors::duration::Human(self.timeout);
        if error.is_timeout() {
            if error.is_connect() {
                format!(
                    "cannot reach the server at {}: no connection within {}",
                    self.server,
                    arbor_actors::duration::Human(CONNECT_TIMEOUT.min(self.timeout))
                )
            } else {
                format!(
                    "the server at {} did not answer within {waited} (--timeout)",
                    self.server
                )
            }
        } else {
            format!("cannot reach the server at {}", self.server)
        }
    }

    /// The URL of the path `segments` (each one segment: a run id's `/` is
    /// encoded) under the server's.
    fn url(&self, segments: &[&str]) -> anyhow::Result<reqwest::Url> {
        // An empty id would be a path the server has no route for.
        anyhow::ensure!(
            segments.iter().all(|s| !s.trim().is_empty()),
            "an id given is empty"
        );
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("--server {:?} cannot have a path", self.server))?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }

    /// Sends a request (a JSON body when `body` is given) and reads the
    /// answer's status and JSON body (`null` when it has none).
    pub(super) async fn send(
        &self,
        method: reqwest::Method,
        segments: &[&str],
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<(reqwest::StatusCode, serde_json::Value)> {
        let mut request = self.client.request(method, self.url(segments)?);
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                let message = self.failed(&error);
                return Err(anyhow::Error::new(error).context(message));
            }
        };
        let status = response.status();
        // The body within the same timeout: one that never ends is an error
        // naming the server, not an empty answer.
        let bytes = match response.bytes().await {
            Ok(bytes) => bytes,
            Err(error) => {
                let message = self.failed(&error);
                return Err(anyhow::Error::new(error).context(message));
            }
        };
        let body = serde_json::from_slice(&bytes).unwrap_or_default();
        Ok((status, body))
    }
}

impl Api {
    /// Opens `run`'s event stream with the model's streamed text, after
    /// event `last` (`Last-Event-ID`). With no overall timeout (a stream
    /// lasts as long as its tree): the caller bounds each read.
    pub(super) async fn open_stream(
        &self,
        run: &str,
        last: u64,
    ) -> Result<reqwest::Response, super::watch::Refused> {
        use super::watch::Refused;
        let mut url = self
            .url(&["v1", "runs", run, "events"])
            .map_err(Refused::Final)?;
        url.set_query(Some("deltas=true"));
        let mut request = self
            .client
            .get(url)
            .timeout(std::time::Duration::from_secs(365 * 24 * 3600))
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if last > 0 {
            request = request.header("Last-Event-ID", last.to_string());
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                let message = self.failed(&error);
                return Err(Refused::Retry(anyhow::Error::new(error).context(message)));
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.json().await.unwrap_or_default();
        let error = anyhow::anyhow!(
            "the server refused the event stream of {run} ({status}): {}",
            self.refusal(status, &body)
        );
        // A server starting again, busy or overloaded may take it later.
        let again = status.is_server_error()
            || status == reqwest::StatusCode::TOO_MANY_REQUESTS
            || status == reqwest::StatusCode::REQUEST_TIMEOUT;
        Err(if again {
            Refused::Retry(error)
        } else {
            Refused::Final(error)
        })
    }
}

/// The message of the server's JSON error (`{"error": {"code", "message"}}`).
fn error_message(body: &serde_json::Value) -> &str {
    body["error"]["message"].as_str().unwrap_or("no detail")
}

impl Api {
    /// What a refusal (`status`, the server's JSON error `body`) says to the
    /// person at this command: a missing or refused token is named by this
    /// command's flag and variable (the server's own hint is about HTTP
    /// headers), any other refusal by the server's message.
    pub(super) fn refusal(&self, status: reqwest::StatusCode, body: &serde_json::Value) -> String {
        match (status, &self.token) {
            (reqwest::StatusCode::UNAUTHORIZED, None) => format!(
                "the server at {} needs an API token: give --token TOKEN or set $ARBOR_API_TOKEN",
                self.server
            ),
            (reqwest::StatusCode::UNAUTHORIZED, Some(_)) => format!(
                "the server at {} refused the token of --token / $ARBOR_API_TOKEN: {}",
                self.server,
                error_message(body)
            ),
            _ => error_message(body).to_owned(),
        }
    }
}

/// `arbor say`: posts a steering message to a server's
/// `/v1/runs/{runId}/messages`; the server's refusal (its JSON error) is the
/// command's error.
pub(super) async fn say(api: &Api, run_id: &str, text: &str) -> anyhow::Result<ExitCode> {
    let (status, body) = api
        .send(
            reqwest::Method::POST,
            &["v1", "runs", run_id, "messages"],
            Some(&serde_json::json!({ "text": text })),
        )
        .await?;
    if status.is_success() {
        outln!("accepted: run {run_id} takes the message at its next step")?;
        return Ok(ExitCode::SUCCESS);
    }
    let message = api.refusal(status, &body);
    anyhow::bail!("the server refused the message ({status}): {message}")
}
