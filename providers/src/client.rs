//! The HTTP client core shared by every wire format: limiter, retries, timeouts,
//! streaming, usage and cost. The wire format (a [`WireFormat`]) only converts;
//! this module names none.

use std::sync::Arc;

use arbor_actors::{
    Delta, DeltaSink, Model, ModelError, ModelRequest, ModelResponse, RequestMeta, Usage,
    UsageSource,
};
use async_trait::async_trait;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, USER_AGENT};
use serde_json::Value;
use tokio::time::Instant;

use super::limiter::{Closed, Gate, Limiter, Said, seconds};
use super::observe::{RequestEvent, RequestSignal, signal, tracer};
use super::retry::{jitter, retry_after, retryable_status};
use super::settings::ProviderSettings;
use super::wire::{Assembler, Failure, Reply, Tokens, WireFormat};

/// A model behind an HTTP endpoint that speaks one wire format.
pub struct HttpModel {
    name: String,
    settings: ProviderSettings,
    format: Arc<dyn WireFormat>,
    client: reqwest::Client,
    limiter: Limiter,
    /// The cooldown gate of the endpoint and key, shared with every other
    /// model on them (`None`: [`HttpModel::without_cooldown`]).
    gate: Option<Arc<Gate>>,
    /// The base URL and the format's path, joined once.
    endpoint: String,
    /// Every request's headers, built once from the settings; `Err` (a bad
    /// key or header) is reported by each request, as the model's error.
    headers: Result<HeaderMap, BadHeader>,
}

/// A configured header (or the key's) that HTTP cannot carry: every
/// request of the model fails with it, as the model's error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum BadHeader {
    /// The API key is not a valid header value.
    #[error("the API key is not a valid header value")]
    Key,
    /// A header's name is not one.
    #[error("header name {0:?} is invalid")]
    Name(String),
    /// A header's value is not one (the header's name).
    #[error("header {0} has an invalid value")]
    Value(String),
}

/// The HTTP client of a model could not be built (its TLS backend did not
/// start, say).
#[derive(Debug, thiserror::Error)]
#[error("cannot build the HTTP client: {0}")]
pub struct ClientError(#[source] reqwest::Error);

impl HttpModel {
    /// A model speaking `format` (`HttpModel::new` picks it from the settings).
    pub(crate) fn with_format(
        name: impl Into<String>,
        settings: ProviderSettings,
        format: Arc<dyn WireFormat>,
    ) -> Result<Self, ClientError> {
        let client = reqwest::Client::builder()
            .connect_timeout(settings.timeouts.connect)
            .build()
            .map_err(ClientError)?;
        // The limiter and the cooldown gate are both the endpoint's and key's.
        let key = settings.api_key.as_ref().map_or("", |key| key.expose());
        let limiter = Limiter::shared(&settings.base_url, key, &settings.limits);
        let gate = Gate::shared(&settings.base_url, key);
        Ok(HttpModel {
            name: name.into(),
            limiter,
            gate: Some(gate),
            endpoint: format!("{}{}", settings.base_url, format.path()),
            headers: headers(&settings, &*format),
            settings,
            format,
            client,
        })
    }

    /// The settings it was built from.
    pub fn settings(&self) -> &ProviderSettings {
        &self.settings
    }

    /// The model without the endpoint's shared cooldown: it neither closes
    /// nor waits for the gate, reads no rate-limit headers, and each request
    /// waits only for its own `Retry-After`. For measuring what the cooldown
    /// saves (BENCHMARKS.md), not for use.
    #[doc(hidden)]
    pub fn without_cooldown(mut self) -> Self {
        self.gate = None;
        self
    }

    fn body(&self, request: &ModelRequest) -> Value {
        self.format.request_body(&self.settings, request)
    }

    fn assembler(&self) -> Box<dyn Assembler> {
        self.format.assembler()
    }

    fn parse(&self, body: &Value) -> Result<Reply, Failure> {
        self.format.parse_response(body)
    }

    /// Tells the request observers (the service's metrics) about the
    /// request of `meta`.
    fn signal(&self, meta: &RequestMeta, event: RequestEvent) {
        signal(&RequestSignal {
            tree_id: &meta.tree_id,
            run_id: &meta.run_id,
            model: &self.name,
            event,
        });
    }

    /// One HTTP exchange, streamed or not.
    async fn attempt(
        &self,
        headers: &HeaderMap,
        body: &Value,
        sink: &DeltaSink,
        meta: &RequestMeta,
    ) -> Result<Reply, Failure> {
        let mut headers = headers.clone(); // reqwest takes the map by value
        // The model call's span (`chat {model}`) goes on at the provider.
        if let Some(tracer) = tracer() {
            tracer.inject(&mut headers);
        }
        // Counted here, past the gate and the limiter: a request refused
        // before this point was never sent.
        self.signal(meta, RequestEvent::Sent);
        let sent = Instant::now();
        let response = self
            .client
            .post(self.endpoint.as_str())
            .headers(headers)
            .json(body)
            .send()
            .await
            .map_err(|e| Failure::transient(format!("request failed: {}", without_url(e))))?;
        let status = response.status();
        // A 429 or 503 with Retry-After closes the gate for that long: the
        // server said when to come back, which overrides its buckets' resets
        // (a server may send `Retry-After: 0` beside a bucket that resets in
        // minutes).
        let retry_after = retry_after(response.headers());
        let told = matches!(status.as_u16(), 429 | 503) && retry_after.is_some();
        // The endpoint's buckets, whatever the status: new requests then go
        // at their rate (the limiter's turns); a spent bucket whose rate is
        // unknown closes the gate until its reset.
        let paused = match &self.gate {
            Some(_) => self.limiter.pace(response.headers(), sent),
            None => None,
        };
        let exhausted = paused.as_ref().map(|pause| pause.wait);
        match (&self.gate, told, retry_after, paused) {
            (Some(gate), true, Some(wait), _) => {
                gate.close_for(wait, Said::retry_after(response.headers()))
            }
            (Some(gate), false, _, Some(pause)) => gate.close_for(pause.wait, pause.said),
            _ => {}
        }
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            let message = error_message(&text, status);
            return Err(if retryable_status(status) {
                Failure::Transient {
                    status: Some(status.as_u16()),
                    message,
                    retry_after: retry_after.or(exhausted),
                }
            } else {
                Failure::Rejected {
                    status: status.as_u16(),
                    message,
                }
            });
        }
        if !self.settings.stream {
            let text = response.text().await.map_err(|e| {
                Failure::transient(format!("reading the reply failed: {}", without_url(e)))
            })?;
            let value: Value = serde_json::from_str(&text)
                .map_err(|e| Failure::Malformed(format!("reply is not JSON: {e}")))?;
            record_response_model(&value);
            return self.parse(&value);
        }
        let idle = self.settings.timeouts.idle;
        let mut assembler = self.assembler();
        let mut events = response.bytes_stream().eventsource();
        let sink = self.first_token_sink(sink, meta, sent);
        // The replying model is in the stream's first event or so.
        let mut look_for_model = MODEL_EVENTS;
        loop {
            let next = tokio::time::timeout(idle, events.next())
                .await
                .map_err(|_| Failure::transient(format!("the stream was idle for {idle:?}")))?;
            match next {
                None if assembler.complete_without_end() => return assembler.finish(),
                None => {
                    return Err(Failure::transient(
                        "the stream ended before the reply was complete",
                    ));
                }
                Some(Err(e)) => return Err(Failure::transient(format!("the stream broke: {e}"))),
                Some(Ok(event)) => {
                    if look_for_model > 0 {
                        look_for_model -= 1;
                        if let Ok(value) = serde_json::from_str::<Value>(&event.data)
                            && record_response_model(&value)
                        {
                            look_for_model = 0;
                        }
                    }
                    if assembler.event(&event.event, &event.data, &sink)? {
                        return assembler.finish();
                    }
                }
            }
        }
    }

    /// `sink`, also telling the observers when the first piece of the reply
    /// (text, reasoning or a tool call's input) comes: time to first token,
    /// the same for every wire format.
    fn first_token_sink(&self, sink: &DeltaSink, meta: &RequestMeta, sent: Instant) -> DeltaSink {
        let sink = sink.clone();
        let (tree_id, run_id, model) =
            (meta.tree_id.clone(), meta.run_id.clone(), self.name.clone());
        let first = std::sync::atomic::AtomicBool::new(true);
        Arc::new(move |delta: Delta| {
            let content = matches!(
                delta,
                Delta::Text { .. } | Delta::Reasoning { .. } | Delta::ToolCallArgs { .. }
            );
            if content && first.swap(false, std::sync::atomic::Ordering::Relaxed) {
                signal(&RequestSignal {
                    tree_id: &tree_id,
                    run_id: &run_id,
                    model: &model,
                    event: RequestEvent::FirstToken(sent.elapsed()),
                });
            }
            sink(delta)
        })
    }

    /// The model as errors name it.
    fn label(&self) -> String {
        format!(
            "{} ({} {})",
            self.name,
            self.format.kind().name(),
            self.settings.model
        )
    }

    /// The endpoint asked for a wait that ends beyond the tree's deadline:
    /// the request fails now rather than waiting for nothing. `reason` is the
    /// failure of the request's last attempt, if it made one.
    fn beyond_deadline(&self, closed: Closed, reason: Option<&str>, attempts: u32) -> ModelError {
        let asked = closed.to_string();
        let error = ModelError::RateLimited {
            model: self.label(),
            message: match reason {
                Some(reason) => format!("{reason}; {asked}"),
                None => asked,
            },
            retry_after: Some(closed.wait),
        };
        if attempts > 1 {
            error.after_attempts(attempts)
        } else {
            error
        }
    }

    /// Waits until the endpoint's gate is open (at once without a gate).
    async fn wait_for_gate(&self, deadline: Option<Instant>) -> Result<(), Closed> {
        match &self.gate {
            Some(gate) => gate.wait(deadline).await,
            None => Ok(()),
        }
    }

    /// A message naming this model, with the key scrubbed out.
    fn error(&self, failure: Failure) -> ModelError {
        let model = self.label();
        let scrub = |text: String| match &self.settings.api_key {
            Some(key) if !key.expose().is_empty() => text.replace(key.expose(), "[REDACTED]"),
            _ => text,
        };
        match failure {
            Failure::Rejected { status, message } => ModelError::Rejected {
                model,
                status,
                message: scrub(message),
            },
            Failure::Transient {
                status: Some(429),
                message,
                retry_after,
            } => ModelError::RateLimited {
                model,
                message: scrub(format!("429: {message}")),
                retry_after,
            },
            Failure::Transient {
                status,
                message,
                retry_after,
            } => ModelError::Transient {
                model,
                // The status goes first so a retry reason names it ("429: …").
                message: scrub(match status {
                    Some(status) => format!("{status}: {message}"),
                    None => message,
                }),
                retry_after,
            },
            Failure::Malformed(message) => ModelError::Malformed {
                model,
                message: scrub(message),
            },
            Failure::Truncated(message, tokens) => ModelError::Truncated {
                model,
                message: scrub(message),
                usage: self.usage(tokens),
            },
        }
    }

    fn usage(&self, tokens: Tokens) -> Usage {
        Usage {
            input_tokens: tokens.input + tokens.cache_read + tokens.cache_write,
            output_tokens: tokens.output,
            cache_read_tokens: tokens.cache_read,
            cache_write_tokens: tokens.cache_write,
            cost: self.settings.pricing.cost(
                tokens.input,
                tokens.output,
                tokens.cache_read,
                tokens.cache_write,
            ),
            source: if tokens.reported {
                UsageSource::Reported
            } else {
                UsageSource::Absent
            },
        }
    }
}

#[async_trait]
impl Model for HttpModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(
        &self,
        request: ModelRequest,
        deltas: DeltaSink,
    ) -> Result<ModelResponse, ModelError> {
        if let (Some(var), None) = (&self.settings.api_key_env, &self.settings.api_key) {
            return Err(ModelError::Invalid {
                model: self.name.clone(),
                message: format!("the API key variable {var} is not set"),
            });
        }
        let headers = self.headers.as_ref().map_err(|bad| ModelError::Invalid {
            model: self.name.clone(),
            message: bad.to_string(),
        })?;
        // On the model call's span (GenAI conventions): the provider, the
        // model id sent on the wire (over the catalog name the span starts
        // with) and the catalog name as `arbor.model`; the span is named
        // `chat {gen_ai.request.model}`, so with the model id too.
        let span = tracing::Span::current();
        span.record("gen_ai.provider.name", self.settings.kind.name());
        span.record("gen_ai.request.model", self.settings.model.as_str());
        if let Some(tracer) = tracer() {
            tracer.set_attribute(&span, "arbor.model", self.name.clone());
            // Started when it was entered, so renamed on the span itself.
            tracer.rename(&span, format!("chat {}", self.settings.model));
        }
        let mut body = self.body(&request);
        let estimate = request.messages.estimated_tokens();
        let policy = &self.settings.retry;
        let deadline = request.meta.deadline;
        // Attempts after the first, whatever their cause.
        let mut retry = 0;
        // Those of them that `policy.max_retries` bounds (not the truncation's).
        let mut retried = 0;
        // The larger max_tokens a cut reply is asked for again with, once
        // (`None` once used).
        let mut more_room = self.settings.truncated_max_tokens;
        // The last attempt's failure, for an error that ends the retries.
        let mut reason: Option<String> = None;
        // What a cut reply asked for again was billed: counted with the
        // call's usage, whatever the retry gives.
        let mut billed: Option<Usage> = None;
        loop {
            // The gate before the limiter (a closed gate holds no slot) and
            // again once admitted: it may have closed while this queued.
            self.wait_for_gate(deadline)
                .await
                .map_err(|closed| self.beyond_deadline(closed, reason.as_deref(), retry))?;
            let admission = self
                .limiter
                .admit_before(estimate, deadline)
                .await
                .map_err(|closed| self.beyond_deadline(closed, reason.as_deref(), retry))?;
            self.wait_for_gate(deadline)
                .await
                .map_err(|closed| self.beyond_deadline(closed, reason.as_deref(), retry))?;
            admission.sending();
            let outcome = tokio::time::timeout(
                self.settings.timeouts.request,
                self.attempt(headers, &body, &deltas, &request.meta),
            )
            .await
            .unwrap_or_else(|_| {
                Err(Failure::transient(format!(
                    "no complete reply within {:?}",
                    self.settings.timeouts.request
                )))
            });
            drop(admission);
            // A reply cut at the output limit is asked for again, once, with
            // more room (`on_truncated`), at once: the endpoint is well.
            if let (Err(Failure::Truncated(message, tokens)), Some(max_tokens)) =
                (&outcome, more_room)
            {
                let message = message.clone();
                billed = Some(self.usage(*tokens));
                more_room = None;
                retry += 1;
                self.format.with_room(&mut body, &self.settings, max_tokens);
                let shown = format!("{message}; asking again with max_tokens {max_tokens}");
                tracing::warn!(model = %self.name, retry, reason = %shown, "retrying a truncated model request with more room");
                deltas(Delta::Retry {
                    attempt: retry,
                    delay_ms: 0,
                    reason: shown,
                });
                reason = Some(message);
                continue;
            }
            match outcome {
                Ok(reply) => {
                    let usage = self.usage(reply.tokens);
                    let usage = billed.map_or(usage, |cut| cut.plus(usage));
                    // No usage in the reply: count the estimate, not zero.
                    let used = match usage.total_tokens() {
                        0 => estimate,
                        n => n,
                    };
                    self.limiter.settle(estimate, used);
                    return Ok(ModelResponse {
                        message: reply.message,
                        usage,
                    });
                }
                Err(failure) if failure.retryable() && retried < policy.max_retries => {
                    retry += 1;
                    retried += 1;
                    let after = match &failure {
                        Failure::Transient { retry_after, .. } => *retry_after,
                        _ => None,
                    };
                    let delay = policy.delay(retry, after, jitter());
                    let error = self.error(failure);
                    // A retry's reason is the message; a rate limit's names
                    // the model too.
                    let shown = match &error {
                        ModelError::Transient { message, .. }
                        | ModelError::Malformed { message, .. } => message.clone(),
                        other => other.to_string(),
                    };
                    let message = match error {
                        ModelError::Transient { message, .. }
                        | ModelError::RateLimited { message, .. }
                        | ModelError::Malformed { message, .. } => message,
                        other => other.to_string(),
                    };
                    // The endpoint's own wait is honoured in full, so one that
                    // ends beyond the deadline fails now.
                    let now = Instant::now();
                    if let (Some(after), Some(deadline)) = (after, deadline)
                        && now + after > deadline
                    {
                        // What the endpoint sent is the gate's (the reply
                        // closed it for this wait).
                        let said = self.gate.as_ref().and_then(|gate| gate.said());
                        let closed = Closed {
                            wait: after,
                            left: deadline.saturating_duration_since(now),
                            said: said.unwrap_or_else(|| {
                                Said::RetryAfter(format!("a wait of {}", seconds(after)))
                            }),
                        };
                        return Err(self.beyond_deadline(closed, Some(&message), retry));
                    }
                    reason = Some(message);
                    tracing::warn!(model = %self.name, retry, ?delay, reason = %shown, "retrying model request");
                    deltas(Delta::Retry {
                        attempt: retry,
                        delay_ms: delay.as_millis() as u64,
                        reason: shown,
                    });
                    tokio::time::sleep(delay).await;
                }
                Err(failure) => {
                    // A retry with more room was cut too.
                    let roomier = self
                        .settings
                        .truncated_max_tokens
                        .filter(|_| more_room.is_none());
                    let error = match (self.error(failure), roomier) {
                        (
                            ModelError::Truncated {
                                model,
                                message,
                                usage,
                            },
                            Some(max_tokens),
                        ) => ModelError::Truncated {
                            model,
                            message: format!(
                                "{message} (cut again after a retry with max_tokens {max_tokens})"
                            ),
                            usage: billed.map_or(usage, |cut| cut.plus(usage)),
                        },
                        (error, _) => error,
                    };
                    return Err(if retry > 0 {
                        error.after_attempts(retry + 1)
                    } else {
                        error
                    });
                }
            }
        }
    }
}

/// How many of a stream's first events may name the replying model.
const MODEL_EVENTS: u32 = 3;

/// Records the model a reply names (`gen_ai.response.model`) on the model
/// call's span: a reply's top-level `model`, or that of the message or
/// response object a stream starts with. Whether it found one.
fn record_response_model(value: &Value) -> bool {
    let model = ["/model", "/message/model", "/response/model"]
        .into_iter()
        .find_map(|at| value.pointer(at).and_then(Value::as_str))
        .filter(|model| !model.is_empty());
    let Some(model) = model else {
        return false;
    };
    if let Some(tracer) = tracer() {
        tracer.set_attribute(
            &tracing::Span::current(),
            "gen_ai.response.model",
            model.to_owned(),
        );
    }
    true
}

/// The `User-Agent` of every request.
const ARBOR_AGENT: &str = concat!("arbor/", env!("CARGO_PKG_VERSION"));

/// The headers of every request: `User-Agent: arbor/<version>`, the key's,
/// the format's fixed ones, then the configured ones (which may replace the
/// user agent).
fn headers(settings: &ProviderSettings, format: &dyn WireFormat) -> Result<HeaderMap, BadHeader> {
    let mut headers = HeaderMap::new();
    headers.insert(USER_AGENT, HeaderValue::from_static(ARBOR_AGENT));
    if let Some(key) = &settings.api_key {
        let (name, value) = format.auth_header(key.expose());
        let mut value = HeaderValue::from_str(&value).map_err(|_| BadHeader::Key)?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    for &(name, value) in format.fixed_headers() {
        headers.insert(name, HeaderValue::from_static(value));
    }
    for (name, value) in &settings.headers {
        let name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| BadHeader::Name(name.clone()))?;
        let value = HeaderValue::from_str(value).map_err(|_| BadHeader::Value(name.to_string()))?;
        headers.insert(name, value);
    }
    Ok(headers)
}

/// A transport error with its causes (reqwest's top-level text alone says
/// little), without the URL, which may carry credentials.
fn without_url(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The API's error message from an error body, after the error's `type`
/// and `code` when it gives them (`invalid_request_error/context_length_exceeded:
/// …`), else the status text.
fn error_message(body: &str, status: reqwest::StatusCode) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let Some(message) = message else {
        let reason = status.canonical_reason().unwrap_or("error");
        return if body.trim().is_empty() {
            reason.to_owned()
        } else {
            format!("{reason}: {}", body.chars().take(200).collect::<String>())
        };
    };
    match parsed.as_ref().and_then(error_kind) {
        Some(kind) => format!("{kind}: {message}"),
        None => message,
    }
}

/// `type/code`, `type` or `code` of an error body's `error` object (OpenAI
/// `{"error": {"type", "code", "message"}}`, Anthropic `{"type": "error",
/// "error": {"type", "message"}}`).
fn error_kind(body: &Value) -> Option<String> {
    let error = body.get("error")?;
    let text = |key: &str| match error.get(key)? {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    match (text("type"), text("code")) {
        (Some(kind), Some(code)) if kind != code => Some(format!("{kind}/{code}")),
        (Some(kind), _) => Some(kind),
        (None, code) => code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn error_messages_keep_the_type_and_code() {
        let status = reqwest::StatusCode::BAD_REQUEST;
        let with_code = json!({"error": {"message": "too long", "type": "invalid_request_error",
            "param": "messages", "code": "context_length_exceeded"}});
        assert_eq!(
            error_message(&with_code.to_string(), status),
            "invalid_request_error/context_length_exceeded: too long"
        );
        let no_code = json!({"error": {"message": "slow down", "type": "requests", "code": null}});
        assert_eq!(
            error_message(&no_code.to_string(), status),
            "requests: slow down"
        );
        let nested = json!({"type": "error", "error": {"type": "overloaded_error",
            "message": "Overloaded"}});
        assert_eq!(
            error_message(&nested.to_string(), status),
            "overloaded_error: Overloaded"
        );
        let bare = json!({"message": "nope"});
        assert_eq!(error_message(&bare.to_string(), status), "nope");
        assert_eq!(error_message("", status), "Bad Request");
        assert_eq!(error_message("oops", status), "Bad Request: oops");
    }
}
