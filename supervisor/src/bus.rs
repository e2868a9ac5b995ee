//! The event bus: every event of every tree goes out here, in order per tree.
//! Subscribers get an unbounded stream (nothing is dropped for a slow reader);
//! observers are called synchronously (counters, progress bars).

use std::sync::{Arc, RwLock};

use arbor_actors::Event;
use tokio::sync::mpsc;

type Observer = Arc<dyn Fn(&Event) + Send + Sync>;
type Sink = Arc<dyn Fn(&Arc<Event>) + Send + Sync>;

struct Subscriber {
    tree: Option<Arc<str>>,
    tx: mpsc::UnboundedSender<Arc<Event>>,
}

#[derive(Clone, Default)]
pub struct EventBus {
    subscribers: Arc<RwLock<Vec<Subscriber>>>,
    observers: Arc<RwLock<Vec<Observer>>>,
    sinks: Arc<RwLock<Vec<Sink>>>,
}

/// A stream of events; ends when the supervisor is dropped.
pub type EventStream = mpsc::UnboundedReceiver<Arc<Event>>;

impl EventBus {
    /// Every event of every tree from now on.
    pub fn subscribe(&self) -> EventStream {
        self.add(None)
    }

    /// Every event of one tree from now on.
    pub fn subscribe_tree(&self, tree_id: &str) -> EventStream {
        self.add(Some(Arc::from(tree_id)))
    }

    /// Calls `f` with every event, on the emitting agent's task: keep it short.
    pub fn observe(&self, f: impl Fn(&Event) + Send + Sync + 'static) {
        if let Ok(mut observers) = self.observers.write() {
            observers.push(Arc::new(f));
        }
    }

    /// Like `observe`, for a reader that keeps the event (the store's writer).
    pub(crate) fn sink(&self, f: impl Fn(&Arc<Event>) + Send + Sync + 'static) {
        if let Ok(mut sinks) = self.sinks.write() {
            sinks.push(Arc::new(f));
        }
    }

    fn add(&self, tree: Option<Arc<str>>) -> EventStream {
        let (tx, rx) = mpsc::unbounded_channel();
        if let Ok(mut subs) = self.subscribers.write() {
            // Readers that have gone (of trees that may never emit again).
            subs.retain(|s| !s.tx.is_closed());
            subs.push(Subscriber { tree, tx });
        }
        rx
    }

    pub(crate) fn publish(&self, event: Event) {
        if let Ok(observers) = self.observers.read() {
            for observe in observers.iter() {
                observe(&event);
            }
        }
        let sinks = self.sinks.read().ok().filter(|s| !s.is_empty());
        let mut closed = false;
        if let Ok(subs) = self.subscribers.read() {
            if subs.is_empty() && sinks.is_none() {
                return;
            }
            let event = Arc::new(event);
            for sink in sinks.iter().flat_map(|s| s.iter()) {
                sink(&event);
            }
            for sub in subs.iter() {
                if sub.tree.as_ref().is_some_and(|t| *t != event.tree_id) {
                    continue;
                }
                closed |= sub.tx.send(event.clone()).is_err();
            }
        }
        if closed && let Ok(mut subs) = self.subscribers.write() {
            subs.retain(|s| !s.tx.is_closed());
        }
    }
}
