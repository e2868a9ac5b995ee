//! The HTTP client core shared by every wire format: limiter, retries, timeouts,
//! streaming, usage and cost. The wire format (a [`WireFormat`]) only converts;
//! this module names none.

use std::sync::Arc;

use arbor_actors::{
    Delta, DeltaSink, Model, ModelError, ModelRequest, ModelResponse, Usage, UsageSource,
};
use async_trait::async_trait;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use super::limiter::Limiter;
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
    /// The base URL and the format's path, joined once.
    endpoint: String,
    /// Every request's headers, built once from the settings; `Err` (a bad
    /// key or header) is reported by each request, as the model's error.
    headers: Result<HeaderMap, String>,
}

impl HttpModel {
    /// A model speaking `format` (`HttpModel::new` picks it from the settings).
    pub(crate) fn with_format(
        name: impl Into<String>,
        settings: ProviderSettings,
        format: Arc<dyn WireFormat>,
    ) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(settings.timeouts.connect)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(HttpModel {
            name: name.into(),
            limiter: Limiter::new(&settings.limits),
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

    fn body(&self, request: &ModelRequest) -> Value {
        self.format.request_body(&self.settings, request)
    }

    fn assembler(&self) -> Box<dyn Assembler> {
        self.format.assembler()
    }

    fn parse(&self, body: &Value) -> Result<Reply, Failure> {
        self.format.parse_response(body)
    }

    /// One HTTP exchange, streamed or not.
    async fn attempt(
        &self,
        headers: &HeaderMap,
        body: &Value,
        sink: &DeltaSink,
    ) -> Result<Reply, Failure> {
        let response = self
            .client
            .post(self.endpoint.as_str())
            .headers(headers.clone()) // reqwest takes the map by value
            .json(body)
            .send()
            .await
            .map_err(|e| Failure::transient(format!("request failed: {}", without_url(e))))?;
        let status = response.status();
        if !status.is_success() {
            let retry_after = retry_after(response.headers());
            let text = response.text().await.unwrap_or_default();
            let message = error_message(&text, status);
            return Err(if retryable_status(status) {
                Failure::Transient {
                    status: Some(status.as_u16()),
                    message,
                    retry_after,
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
            return self.parse(&value);
        }
        let idle = self.settings.timeouts.idle;
        let mut assembler = self.assembler();
        let mut events = response.bytes_stream().eventsource();
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
                    if assembler.event(&event.event, &event.data, sink)? {
                        return assembler.finish();
                    }
                }
            }
        }
    }

    /// A message naming this model, with the key scrubbed out.
    fn error(&self, failure: Failure) -> ModelError {
        let model = format!(
            "{} ({} {})",
            self.name,
            self.format.kind().name(),
            self.settings.model
        );
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
            Failure::Truncated(message) => ModelError::Truncated {
                model,
                message: scrub(message),
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
        let headers = self
            .headers
            .as_ref()
            .map_err(|message| ModelError::Invalid {
                model: self.name.clone(),
                message: message.clone(),
            })?;
        let body = self.body(&request);
        let estimate = request.messages.estimated_tokens();
        let policy = &self.settings.retry;
        let mut retry = 0;
        loop {
            let admission = self.limiter.admit(estimate).await;
            let outcome = tokio::time::timeout(
                self.settings.timeouts.request,
                self.attempt(headers, &body, &deltas),
            )
            .await
            .unwrap_or_else(|_| {
                Err(Failure::transient(format!(
                    "no complete reply within {:?}",
                    self.settings.timeouts.request
                )))
            });
            drop(admission);
            match outcome {
                Ok(reply) => {
                    let usage = self.usage(reply.tokens);
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
                Err(failure) if failure.retryable() && retry < policy.max_retries => {
                    retry += 1;
                    let after = match &failure {
                        Failure::Transient { retry_after, .. } => *retry_after,
                        _ => None,
                    };
                    let delay = policy.delay(retry, after, jitter());
                    let reason = match self.error(failure) {
                        ModelError::Transient { message, .. }
                        | ModelError::Malformed { message, .. } => message,
                        other => other.to_string(),
                    };
                    tracing::warn!(model = %self.name, retry, ?delay, %reason, "retrying model request");
                    deltas(Delta::Retry {
                        attempt: retry,
                        delay_ms: delay.as_millis() as u64,
                        reason,
                    });
                    tokio::time::sleep(delay).await;
                }
                Err(failure) => {
                    let error = self.error(failure);
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

/// The headers of every request: the key's, the format's fixed ones, then
/// the configured ones.
fn headers(settings: &ProviderSettings, format: &dyn WireFormat) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    if let Some(key) = &settings.api_key {
        let (name, value) = format.auth_header(key.expose());
        let mut value = HeaderValue::from_str(&value)
            .map_err(|_| "the API key is not a valid header value".to_owned())?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    for &(name, value) in format.fixed_headers() {
        headers.insert(name, HeaderValue::from_static(value));
    }
    for (name, value) in &settings.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("header name {name:?} is invalid"))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("header {name} has an invalid value"))?;
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

/// The API's error message from an error body, else the status text.
fn error_message(body: &str, status: reqwest::StatusCode) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    message.unwrap_or_else(|| {
        let reason = status.canonical_reason().unwrap_or("error");
        if body.trim().is_empty() {
            reason.to_owned()
        } else {
            format!("{reason}: {}", body.chars().take(200).collect::<String>())
        }
    })
}
