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

use std::sync::{Arc, RwLock, Weak};
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
