//! A stdio server's messages, bounded: one JSON-RPC message is one line of
//! its stdout, and the SDK drops a line longer than its bound without a word,
//! so the call it answers would wait for its whole timeout and be reported as
//! "timed out". [`pump`] reads the lines first: one of at most
//! [`MAX_MESSAGE_BYTES`](super::config::MAX_MESSAGE_BYTES) is passed on as
//! is, a longer one is not kept (only its first and last bytes, to find its
//! request id) and is replaced by a JSON-RPC error answering that request:
//! "result too large (N bytes)", at once.

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// How many bytes of each end of a line too long to keep are looked at for
/// its id.
const ENDS: usize = 4096;

/// The JSON-RPC error code of a message too large to read.
pub(super) const TOO_LARGE: i32 = -32_001;

/// Copies `from` to `to` line by line, replacing each line longer than `max`
/// bytes by an error answering its request (or dropping it, with a warning,
/// when no id is found in it). Ends when either side closes.
pub(super) async fn pump(
    server: String,
    from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    max: usize,
) {
    let mut reader = BufReader::with_capacity(64 * 1024, from);
    let mut line: Vec<u8> = Vec::new();
    let mut tail: Vec<u8> = Vec::new();
    let mut total: usize = 0;
    loop {
        let available = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(available) => available,
        };
        let newline = available.iter().position(|b| *b == b'\n');
        let take = newline.map_or(available.len(), |i| i + 1);
        let chunk = &available[..take];
        total = total.saturating_add(take);
        if total <= max {
            line.extend_from_slice(chunk);
        } else {
            // Too long: keep the head (up to ENDS bytes) and a rolling tail.
            line.truncate(ENDS);
            tail.extend_from_slice(chunk);
            if tail.len() > 2 * ENDS {
                tail.drain(..tail.len() - ENDS);
            }
        }
        reader.consume(take);
        if newline.is_none() {
            continue;
        }
        let written = if total <= max {
            to.write_all(&line).await
        } else {
            match request_id(&line, &tail) {
                Some(id) => {
                    let error = json!({
                        "jsonrpc": "2.0",
                        "id": id,
                        "error": {
                            "code": TOO_LARGE,
                            "message": format!(
                                "result too large ({total} bytes; Arbor reads messages of up to {max} bytes)"
                            ),
                        },
                    });
                    let mut text = error.to_string();
                    text.push('\n');
                    to.write_all(text.as_bytes()).await
                }
                None => {
                    tracing::warn!(
                        server = %server,
                        "MCP server sent a message of {total} bytes (more than {max}) with no request id; dropped"
                    );
                    Ok(())
                }
            }
        };
        if written.is_err() {
            break;
        }
        line.clear();
        tail.clear();
        total = 0;
    }
    let _ = to.shutdown().await;
}

/// The `id` of a JSON-RPC response, found at the start of its text
/// (`{"jsonrpc":"2.0","id":7,…`) or at its end (`…,"jsonrpc":"2.0","id":7}`).
pub(super) fn request_id(head: &[u8], tail: &[u8]) -> Option<Value> {
    let head = String::from_utf8_lossy(head);
    let tail = String::from_utf8_lossy(tail);
    // At the end: the last `"id":` of the text, followed by a value and `}`.
    if let Some(at) = tail.rfind("\"id\"") {
        let rest = tail[at + 4..].trim_start().strip_prefix(':')?.trim_start();
        let rest = rest.trim_end().strip_suffix('}')?.trim_end();
        if let Ok(id) = serde_json::from_str::<Value>(rest)
            && (id.is_number() || id.is_string())
        {
            return Some(id);
        }
    }
    // At the start: an `"id":` before the result begins.
    let before = ["\"result\"", "\"error\""]
        .iter()
        .filter_map(|k| head.find(k))
        .min()
        .unwrap_or(head.len());
    let at = head[..before].find("\"id\"")?;
    let rest = head[at + 4..].trim_start().strip_prefix(':')?.trim_start();
    let end = rest.find([',', '}'])?;
    let id: Value = serde_json::from_str(rest[..end].trim()).ok()?;
    (id.is_number() || id.is_string()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_found_at_either_end() {
        let tail = br#"aaaa"}]},"jsonrpc":"2.0","id":12}"#;
        assert_eq!(request_id(b"{\"result\":{", tail), Some(json!(12)));
        let head = br#"{"jsonrpc":"2.0","id":"r-3","result":{"content":"#;
        assert_eq!(request_id(head, b"aaaa\"}]}}"), Some(json!("r-3")));
        assert_eq!(request_id(b"{\"result\":{\"id\":", b"xx}}"), None);
    }

    #[tokio::test]
    async fn a_line_too_long_becomes_an_error_for_its_request() {
        let big = format!(
            "{{\"result\":{{\"text\":\"{}\"}},\"jsonrpc\":\"2.0\",\"id\":4}}\n",
            "x".repeat(300_000)
        );
        let input = format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{{}}}}\n{big}");
        let mut out = Vec::new();
        pump("s".into(), input.as_bytes(), &mut out, 100_000).await;
        let lines: Vec<Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["id"], 1);
        assert_eq!(lines[1]["id"], 4);
        let message = lines[1]["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("result too large ({} bytes", big.len())),
            "{message}"
        );
    }
}
