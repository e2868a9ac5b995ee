//! What one server accepts at once: connections, how long a connection may
//! take to send a request head or sit idle, and how many event streams are
//! open (in total and per tree). The values come from `[service]`
//! (`Config::service`, validated there) or from code; the defaults are safe
//! for a server on the open network.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arbor_actors::sync::LockExt as _;
use axum::http::StatusCode;

use super::error::ApiError;

pub use arbor::config::ServiceLimits;

/// File descriptors kept free of connections for everything else a server
/// opens (its store, MCP servers, tool processes, model connections): a
/// quarter of the limit, at least 64 and at most 1024.
pub fn fd_reserve(fd_limit: u64) -> u64 {
    (fd_limit / 4).clamp(64, 1024)
}

/// The connections a server accepts at once: the configured cap, lowered to
/// stay under the file-descriptor limit (`None`: unknown) less the reserve.
pub fn connection_cap(configured: usize, fd_limit: Option<u64>) -> usize {
    let Some(limit) = fd_limit else {
        return configured.max(1);
    };
    let room = limit.saturating_sub(fd_reserve(limit)).max(1);
    configured
        .min(usize::try_from(room).unwrap_or(usize::MAX))
        .max(1)
}

/// Refuses a request whose `Content-Length` is above `body_limit` with 413
/// at once, before any of its body is read (or a `100 Continue` invites it):
/// otherwise the server would wait for the body only to refuse it at the
/// limit. A body without a length is still cut at the limit as it is read.
pub(crate) async fn refuse_large_body(
    axum::extract::State(limit): axum::extract::State<usize>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let length = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match length {
        Some(length) if length > limit as u64 => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the request body ({length} bytes by its Content-Length) is larger than the \
                 {limit} bytes the server accepts ([service] body_limit)"
            ),
        )
        .into_response(),
        _ => next.run(request).await,
    }
}

/// The event streams open now, in total and per tree.
#[derive(Default)]
pub(crate) struct StreamCounts {
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    per_tree: HashMap<Arc<str>, usize>,
}

/// One open stream; closing it (dropping) frees its place.
pub(crate) struct StreamSlot {
    counts: Arc<StreamCounts>,
    tree: Arc<str>,
}

impl StreamCounts {
    /// A place for one more stream of `tree`, or the error that names the
    /// cap it would pass: 503 `busy` for the server's total, 429
    /// `too_many_streams` for the tree's own.
    pub(crate) fn open(
        self: &Arc<Self>,
        tree: &Arc<str>,
        limits: &ServiceLimits,
    ) -> Result<StreamSlot, ApiError> {
        let mut open = self.open.locked();
        if open.total >= limits.max_event_streams {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                format!(
                    "{} event streams are open, the most this server serves at once \
                     ([service] max_event_streams); try again later",
                    open.total
                ),
            ));
        }
        let of_tree = open.per_tree.get(tree).copied().unwrap_or(0);
        if of_tree >= limits.max_event_streams_per_tree {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_streams",
                format!(
                    "{of_tree} event streams of tree {tree} are open, the most one tree may have \
                     ([service] max_event_streams_per_tree); close one or try again later"
                ),
            ));
        }
        open.total += 1;
        *open.per_tree.entry(tree.clone()).or_insert(0) += 1;
        Ok(StreamSlot {
            counts: self.clone(),
            tree: tree.clone(),
        })
    }

    /// Streams open now: in total, and of `tree`.
    #[cfg(test)]
    fn count(&self, tree: &str) -> (usize, usize) {
        let open = self.open.locked();
        (open.total, open.per_tree.get(tree).copied().unwrap_or(0))
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.counts.open.locked();
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.per_tree.get_mut(&self.tree) {
            *n -= 1;
            if *n == 0 {
                // No entry is kept for a tree without streams.
                open.per_tree.remove(&self.tree);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits(total: usize, per_tree: usize) -> ServiceLimits {
        ServiceLimits {
            max_event_streams: total,
            max_event_streams_per_tree: per_tree,
            ..ServiceLimits::default()
        }
    }

    #[test]
    fn a_stream_beyond_a_trees_cap_is_refused_with_429_naming_the_key() {
        let counts = Arc::new(StreamCounts::default());
        let (a, b): (Arc<str>, Arc<str>) = ("ta".into(), "tb".into());
        let limits = limits(10, 2);
        let first = counts.open(&a, &limits).unwrap();
        let _second = counts.open(&a, &limits).unwrap();
        let refused = counts.open(&a, &limits).err().unwrap();
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.code, "too_many_streams");
        assert!(refused.message.contains("max_event_streams_per_tree"));
        // Another tree is not held back; a closed stream frees its place.
        let _other = counts.open(&b, &limits).unwrap();
        drop(first);
        let _third = counts.open(&a, &limits).unwrap();
        assert_eq!(counts.count("ta"), (3, 2));
    }

    #[test]
    fn a_stream_beyond_the_total_cap_is_refused_with_503_naming_the_key() {
        let counts = Arc::new(StreamCounts::default());
        let limits = limits(2, 2);
        let slots: Vec<_> = ["t1", "t2"]
            .iter()
            .map(|t| counts.open(&Arc::from(*t), &limits).unwrap())
            .collect();
        let refused = counts.open(&Arc::from("t3"), &limits).err().unwrap();
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.code, "busy");
        assert!(refused.message.contains("[service] max_event_streams)"));
        drop(slots);
        // Nothing is kept for trees whose streams are closed.
        assert_eq!(counts.count("t1"), (0, 0));
        assert!(
            counts
                .open
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .per_tree
                .is_empty()
        );
    }

    #[test]
    fn the_connection_cap_stays_under_the_file_descriptor_limit() {
        assert_eq!(connection_cap(10_000, None), 10_000);
        assert_eq!(connection_cap(10_000, Some(1024)), 768);
        assert_eq!(connection_cap(10_000, Some(20_000)), 10_000);
        assert_eq!(connection_cap(100_000, Some(20_000)), 18_976);
        assert_eq!(connection_cap(500, Some(1024)), 500);
        assert_eq!(connection_cap(10, Some(16)), 1);
        assert_eq!(connection_cap(0, None), 1);
    }

    #[test]
    fn a_quiet_stream_sends_keep_alives_well_within_the_idle_timeout() {
        let at = |idle| {
            ServiceLimits {
                idle_timeout: Duration::from_secs(idle),
                ..ServiceLimits::default()
            }
            .stream_keep_alive()
        };
        assert_eq!(at(60), Duration::from_secs(15));
        assert_eq!(at(3), Duration::from_secs(1));
        assert!(at(1) < Duration::from_secs(1));
    }
}
