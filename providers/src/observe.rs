//! What the HTTP client tells observers about each request: that it went out
//! (an attempt the limiter and the cooldown gate let through, retries
//! included; never one refused before sending) and how long its first
//! streamed piece took. The service's metrics count requests and measure
//! time to first token from these, so the numbers do not depend on the
//! wire format and count only what was really sent.
//!
//! Observers are process-wide (the client knows nothing of the service
//! that runs it) and held weakly: one lives as long as its owner keeps the
//! `Arc`. A signal names the tree and run it belongs to, so an observer
//! takes only its own runs' requests.
//!
//! The trace exporter, likewise, is no import of this crate: it installs a
//! [`RequestTracer`] ([`trace_requests`]) that puts the trace context on each
//! request's headers and names the model call's span.

use std::sync::{Arc, OnceLock, RwLock, Weak};
use std::time::Duration;

use arbor_actors::sync::RwLockExt as _;

/// What happened to a request.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum RequestEvent {
    /// The request (or a retry of it) is being sent.
    Sent,
    /// The first streamed reply text, reasoning or tool-call piece came,
    /// this long after the request was sent.
    FirstToken(Duration),
}

/// One request's event, with who made the request.
#[derive(Clone, Copy, Debug)]
pub struct RequestSignal<'a> {
    /// The tree of the agent that asked.
    pub tree_id: &'a str,
    /// Its run id.
    pub run_id: &'a str,
    /// The model's name in the catalog.
    pub model: &'a str,
    /// What happened.
    pub event: RequestEvent,
}

/// A request observer: called on the requesting task, so keep it short.
pub type RequestObserver = dyn Fn(&RequestSignal<'_>) + Send + Sync;

static OBSERVERS: RwLock<Vec<Weak<RequestObserver>>> = RwLock::new(Vec::new());

/// Calls `observer` with every HTTP model request's events, for as long as
/// the caller keeps `observer` (it is held weakly).
pub fn observe_requests(observer: &Arc<RequestObserver>) {
    let mut observers = OBSERVERS.write_locked();
    observers.retain(|o| o.strong_count() > 0);
    observers.push(Arc::downgrade(observer));
}

/// Tells every live observer.
pub(crate) fn signal(signal: &RequestSignal<'_>) {
    let observers = OBSERVERS.read_locked();
    for observer in observers.iter().filter_map(Weak::upgrade) {
        observer(signal);
    }
}

/// What a trace exporter adds to each model request, beyond the `tracing`
/// spans the client opens: installed once per process by the exporter's side
/// ([`trace_requests`]), so this crate imports no tracing backend.
pub trait RequestTracer: Send + Sync {
    /// Adds the current span's trace context to a request's headers (W3C
    /// `traceparent`), when there is one.
    fn inject(&self, headers: &mut reqwest::header::HeaderMap);
    /// Sets the attribute `key` of `span` as exported (a value `tracing`'s
    /// fields cannot carry, as they are declared when the span starts).
    fn set_attribute(&self, span: &tracing::Span, key: &'static str, value: String);
    /// Renames `span` as exported (started before its name was known).
    fn rename(&self, span: &tracing::Span, name: String);
}

static TRACER: OnceLock<Box<dyn RequestTracer>> = OnceLock::new();

/// Installs `tracer` for every HTTP model request of the process; the first
/// one installed stays (false when one was already).
pub fn trace_requests(tracer: Box<dyn RequestTracer>) -> bool {
    TRACER.set(tracer).is_ok()
}

/// The installed tracer, if any.
pub(crate) fn tracer() -> Option<&'static dyn RequestTracer> {
    TRACER.get().map(|t| t.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn an_observer_hears_signals_until_it_is_dropped() {
        let heard = Arc::new(Mutex::new(Vec::new()));
        let kept = heard.clone();
        let observer: Arc<RequestObserver> = Arc::new(move |s: &RequestSignal<'_>| {
            if s.tree_id == "observe-test" {
                kept.lock().unwrap_or_else(|e| e.into_inner()).push(s.event);
            }
        });
        observe_requests(&observer);
        let sent = RequestSignal {
            tree_id: "observe-test",
            run_id: "observe-test/0",
            model: "m",
            event: RequestEvent::Sent,
        };
        signal(&sent);
        drop(observer);
        signal(&sent);
        assert_eq!(
            *heard.lock().unwrap_or_else(|e| e.into_inner()),
            vec![RequestEvent::Sent]
        );
    }
}
