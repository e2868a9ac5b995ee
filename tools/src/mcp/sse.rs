//! The legacy HTTP+SSE transport (MCP 2024-11-05), which the SDK no longer
//! has a client for: a `GET` of the server's URL opens an event stream whose
//! first event (`endpoint`) names the URL to `POST` messages to; the server's
//! messages come as `message` events on the stream. Many servers still speak
//! only this (a streamable HTTP `POST` to them answers 405 or 404).
//!
//! [`connect`] opens the stream and gives the SDK a sink (each message is
//! POSTed, in order) and a stream of the server's messages. A POST that fails
//! answers its request with an error at once; a message larger than
//! [`MAX_MESSAGE_BYTES`] answers its request with "result too large".

use std::collections::HashMap;
use std::time::Duration;

use eventsource_stream::Eventsource as _;
use futures::StreamExt as _;
use futures::channel::mpsc;
use reqwest::header::{ACCEPT, HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use serde_json::{Value, json};

use super::bounded::{TOO_LARGE, request_id};
use super::config::MAX_MESSAGE_BYTES;

/// Messages waiting to be POSTed.
const QUEUE: usize = 64;

/// The SDK's side of a session: messages to send, messages received.
pub(super) type Pair = (
    mpsc::Sender<ClientJsonRpcMessage>,
    mpsc::Receiver<ServerJsonRpcMessage>,
);

/// Opens an HTTP+SSE session with the server at `url`: `Err` says why not
/// (the status of the `GET`, a stream that is not an event stream, or no
/// `endpoint` event within `wait`).
pub(super) async fn connect(
    server: &str,
    url: &str,
    headers: &HashMap<HeaderName, HeaderValue>,
    token: Option<&str>,
    wait: Duration,
) -> Result<Pair, String> {
    let client = reqwest::Client::builder()
        .build()
        .map_err(|e| format!("no HTTP client: {e}"))?;
    let headers = headers.clone();
    let token = token.map(str::to_owned);
    let response = authed(
        client.get(url).header(ACCEPT, "text/event-stream"),
        &headers,
        token.as_deref(),
    )
    .send()
    .await
    .map_err(|e| format!("GET {url}: {}", error_chain(&e)))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("GET {url} answered {status}"));
    }
    let is_stream = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    if !is_stream {
        return Err(format!("GET {url} did not answer with an event stream"));
    }
    let base = response.url().clone();
    let mut events = response.bytes_stream().eventsource();
    let endpoint = tokio::time::timeout(wait, async {
        while let Some(event) = events.next().await {
            match event {
                Ok(event) if event.event == "endpoint" => return Ok(event.data),
                Ok(_) => {}
                Err(e) => return Err(format!("the event stream failed: {e}")),
            }
        }
        Err("the event stream ended before its endpoint event".to_owned())
    })
    .await
    .map_err(|_| format!("no endpoint event from GET {url} within {wait:?}"))??;
    let endpoint = base
        .join(endpoint.trim())
        .map_err(|e| format!("the endpoint event's URL {endpoint:?} is not valid: {e}"))?;

    let (to_sdk, from_server) = mpsc::channel::<ServerJsonRpcMessage>(QUEUE);
    let (to_server, from_sdk) = mpsc::channel::<ClientJsonRpcMessage>(QUEUE);

    // The server's messages, to the SDK.
    let mut inbox = to_sdk.clone();
    let name = server.to_owned();
    tokio::spawn(async move {
        use futures::SinkExt as _;
        while let Some(event) = events.next().await {
            let Ok(event) = event else { break };
            if !(event.event.is_empty() || event.event == "message") {
                continue;
            }
            let message = if event.data.len() > MAX_MESSAGE_BYTES {
                let bytes = event.data.as_bytes();
                let head = &bytes[..bytes.len().min(4096)];
                let tail = &bytes[bytes.len().saturating_sub(4096)..];
                let error = request_id(head, tail).and_then(|id| {
                    error_for(
                        id,
                        TOO_LARGE,
                        format!(
                            "result too large ({} bytes; Arbor reads messages of up to {MAX_MESSAGE_BYTES} bytes)",
                            event.data.len()
                        ),
                    )
                });
                match error {
                    Some(error) => error,
                    None => continue,
                }
            } else {
                match serde_json::from_str::<ServerJsonRpcMessage>(&event.data) {
                    Ok(message) => message,
                    Err(e) => {
                        tracing::warn!(server = %name, "MCP server sent a message that is not JSON-RPC: {e}");
                        continue;
                    }
                }
            };
            if inbox.send(message).await.is_err() {
                break;
            }
        }
    });

    // The SDK's messages, POSTed in order.
    let mut inbox = to_sdk;
    let url = endpoint.to_string();
    let mut from_sdk = from_sdk;
    tokio::spawn(async move {
        use futures::SinkExt as _;
        while let Some(message) = from_sdk.next().await {
            let id = serde_json::to_value(&message)
                .ok()
                .and_then(|v| v.get("id").cloned())
                .filter(|id| !id.is_null());
            let sent = authed(client.post(&url), &headers, token.as_deref())
                .json(&message)
                .send()
                .await;
            let failure = match sent {
                Ok(response) if response.status().is_success() => None,
                Ok(response) => Some(format!("POST {url} answered {}", response.status())),
                Err(e) => Some(format!("POST {url}: {}", error_chain(&e))),
            };
            if let (Some(why), Some(id)) = (failure, id)
                && let Some(error) = error_for(id, -32_603, why)
                && inbox.send(error).await.is_err()
            {
                break;
            }
        }
    });
    Ok((to_server, from_server))
}

/// A JSON-RPC error answering request `id` (None if `id` is not a valid id).
fn error_for(id: Value, code: i32, message: String) -> Option<ServerJsonRpcMessage> {
    let error = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    serde_json::from_value(error).ok()
}

/// The request with the server's headers and bearer token.
fn authed(
    mut request: reqwest::RequestBuilder,
    headers: &HashMap<HeaderName, HeaderValue>,
    token: Option<&str>,
) -> reqwest::RequestBuilder {
    for (name, value) in headers {
        request = request.header(name, value);
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request
}

/// An error and its causes, joined.
fn error_chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
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
