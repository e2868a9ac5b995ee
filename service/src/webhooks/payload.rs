//! What a completion webhook posts: the ended run (a tree's root, or a later
//! turn's), its final text and its tree's usage ([`WebhookPayload`], read from the store), and the
//! signature of the exact bytes posted (`X-Arbor-Signature`).

use std::sync::Arc;

use arbor_actors::RunId;
use hmac::{Hmac, KeyInit as _, Mac as _};
use serde::Serialize;
use serde_json::Value;
use sha2::Sha256;
use utoipa::ToSchema;

/// The body of a completion webhook (`POST` to the run's `webhook`, as
/// JSON): the ended root run (of the tree, or of a later turn), like
/// LangGraph's run webhook payload (its ids, status, output and error),
/// with the tree's usage. The same
/// bytes are signed (`X-Arbor-Signature`).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookPayload {
    /// Always `tree.ended`.
    pub event: String,
    /// Its tree.
    pub tree_id: String,
    /// The root run that ended (`GET /v1/runs/{runId}`): the tree's, or a
    /// later turn's (`T/0~n`); also the delivery's id (`X-Arbor-Delivery`):
    /// a run's webhook is one delivery, whatever its attempts.
    pub run_id: String,
    /// The root's agent type.
    pub agent_type: String,
    /// How the run ended: `completed`, `failed` or `cancelled`.
    pub status: String,
    /// The root's final text: its last reply's text, its structured output
    /// as JSON, or the error it failed with (as `POST /v1/runs/wait` gives
    /// it).
    pub text: String,
    /// What the root hands back by its output mode; null when it has none.
    #[schema(value_type = Option<Object>)]
    pub value: Value,
    /// Why it failed or was cancelled; null when it completed.
    pub error: Option<String>,
    /// What the whole tree spent (every turn so far).
    pub usage: WebhookUsage,
    /// When the run started, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// When it ended, in milliseconds since the Unix epoch.
    pub finished_ms: Option<u64>,
}

/// What a tree spent, over every run of it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookUsage {
    /// Input tokens of every model call.
    pub input_tokens: u64,
    /// Output tokens of every model call.
    pub output_tokens: u64,
    /// Credits every model call cost.
    pub credits: f64,
    /// Runs (agents) the tree started.
    pub runs: u64,
}

/// The payload of the ended root run `run`, from the store; `output_mode`
/// gives the output mode of an agent type (the catalog's), for `value`.
pub(crate) fn read(
    store: &dyn arbor_supervisor::store::Store,
    run: &RunId,
    output_mode: impl Fn(&str) -> Option<arbor_actors::OutputMode>,
) -> Result<WebhookPayload, arbor_supervisor::Error> {
    let (_, summary) = store.tree(run.tree())?;
    let stored = match store.run(run) {
        Ok(stored) => Some(stored),
        // A root that failed before its first checkpoint has no run row.
        Err(arbor_supervisor::Error::UnknownRun(_)) => None,
        Err(error) => return Err(error),
    };
    let (mut text, mut value) = (String::new(), Value::Null);
    if let Some(stored) = &stored
        && let Some(state) = &stored.state
    {
        if stored.is_final
            && let Some(mode) = state.agent_type.as_deref().and_then(&output_mode)
        {
            value = arbor_actors::output::output_value(state, mode, stored.inherited);
        }
        text = arbor_actors::RunResult {
            state: Arc::new(state.clone()),
            value: value.clone(),
        }
        .text();
    }
    // The run's own row once it ended; else (a root that failed before its
    // first checkpoint) the tree's, whose latest run it is.
    let node = stored
        .as_ref()
        .filter(|s| s.is_final)
        .map(|s| &s.node)
        .filter(|n| n.status != "running");
    let (status, error, started_ms, finished_ms) = match node {
        Some(node) => (
            node.status.clone(),
            node.error.clone(),
            node.started_ms,
            node.finished_ms,
        ),
        None if summary.root_run_id == *run => (
            summary.status.to_string(),
            summary.error.clone(),
            summary.started_ms,
            summary.finished_ms,
        ),
        // An earlier turn that ended before its first checkpoint, the tree
        // gone on to a later one: it failed, and the store keeps no more.
        None => (
            "failed".to_owned(),
            Some("the run ended before its first checkpoint".to_owned()),
            summary.started_ms,
            None,
        ),
    };
    if text.is_empty()
        && let Some(error) = &error
    {
        text.clone_from(error);
    }
    Ok(WebhookPayload {
        event: "tree.ended".to_owned(),
        tree_id: summary.tree_id.to_string(),
        run_id: run.to_string(),
        agent_type: summary.agent.clone(),
        status,
        text,
        value,
        error,
        usage: WebhookUsage {
            input_tokens: summary.input_tokens,
            output_tokens: summary.output_tokens,
            credits: summary.cost,
            runs: summary.agents,
        },
        started_ms,
        finished_ms,
    })
}

/// The `X-Arbor-Signature` of a delivery: `sha256=` and the lowercase hex
/// of HMAC-SHA256, keyed with the shared secret, over the timestamp (the
/// `X-Arbor-Timestamp` header's text), a `.`, and the body's exact bytes.
pub fn signature(secret: &[u8], timestamp: &str, body: &[u8]) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        // HMAC takes a key of any length.
        Err(_) => return String::new(),
    };
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256=");
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::signature;

    /// HMAC-SHA256 over `timestamp.body`, keyed with the secret, in
    /// lowercase hex (the values as Python's `hmac` gives them).
    #[test]
    fn the_signature_is_hmac_sha256_over_the_timestamp_a_dot_and_the_body() {
        assert_eq!(
            signature(b"whsec-0123456789abcdef", "1700000000", br#"{"a":1}"#),
            "sha256=d77c78ac4da074c56908b55eac30358b2a7bfc573be4c76819af5102e8dcf939"
        );
        // Another body, another timestamp or another secret: another MAC.
        let one = signature(b"whsec-0123456789abcdef", "1700000000", br#"{"a":2}"#);
        assert!(!one.ends_with("d77c78ac4da074c56908b55eac30358b2a7bfc573be4c76819af5102e8dcf939"));
        assert_ne!(signature(b"k", "1", b"x"), signature(b"k", "2", b"x"));
    }
}
