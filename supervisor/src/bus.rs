//! The event bus: every event of every tree goes out here, in order per tree.
//! Subscribers get an unbounded stream (nothing is dropped for a slow reader);
//! observers are called synchronously (counters, progress bars).

use std::sync::{Arc, RwLock};

use arbor_actors::sync::RwLockExt;
use arbor_actors::{Event, TreeId};
use tokio::sync::mpsc;

type Observer = Arc<dyn Fn(&Event) + Send + Sync>;
type Sink = Arc<dyn Fn(&Arc<Event>) + Send + Sync>;

struct Subscriber {
    tree: Option<TreeId>,
    tx: mpsc::UnboundedSender<Arc<Event>>,
}

/// Where a supervisor's events go out: subscriptions (all trees or one) and
/// observers. Cloning it shares the same bus.
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
    pub fn subscribe_tree(&self, tree_id: &TreeId) -> EventStream {
        self.add(Some(tree_id.clone()))
    }

    /// Calls `f` with every event, on the emitting agent's task: keep it short.
    pub fn observe(&self, f: impl Fn(&Event) + Send + Sync + 'static) {
        self.observers.write_locked().push(Arc::new(f));
    }

    /// Like `observe`, for a reader that keeps the event (the store's writer).
    pub(crate) fn sink(&self, f: impl Fn(&Arc<Event>) + Send + Sync + 'static) {
        self.sinks.write_locked().push(Arc::new(f));
    }

    fn add(&self, tree: Option<TreeId>) -> EventStream {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut subs = self.subscribers.write_locked();
        // Readers that have gone (of trees that may never emit again).
        subs.retain(|s| !s.tx.is_closed());
        subs.push(Subscriber { tree, tx });
        drop(subs);
        rx
    }

    pub(crate) fn publish(&self, event: Event) {
        for observe in self.observers.read_locked().iter() {
            observe(&event);
        }
        let sinks = self.sinks.read_locked();
        let subs = self.subscribers.read_locked();
        if subs.is_empty() && sinks.is_empty() {
            return;
        }
        let event = Arc::new(event);
        for sink in sinks.iter() {
            sink(&event);
        }
        let mut closed = false;
        for sub in subs.iter() {
            if sub.tree.as_ref().is_some_and(|t| *t != event.tree_id) {
                continue;
            }
            closed |= sub.tx.send(event.clone()).is_err();
        }
        drop((subs, sinks));
        if closed {
            self.subscribers
                .write_locked()
                .retain(|s| !s.tx.is_closed());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use arbor_actors::{Event, EventKind};

    use super::EventBus;

    fn event(seq: u64) -> Event {
        Event {
            seq,
            tree_id: "t".parse().unwrap(),
            run_id: "t/0".parse().unwrap(),
            at_ms: 0,
            kind: EventKind::Suspended,
        }
    }

    /// A thread that panicked while it held the bus's locks (a write guard
    /// poisons an `RwLock`) does not make the bus drop events, observers or
    /// subscribers.
    #[test]
    fn a_poisoned_bus_still_delivers_every_event() {
        let bus = EventBus::default();
        let seen = Arc::new(AtomicUsize::new(0));
        let counted = seen.clone();
        bus.observe(move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
        });
        let poisoner = bus.clone();
        let _ = std::thread::spawn(move || {
            let _subscribers = poisoner.subscribers.write();
            let _observers = poisoner.observers.write();
            let _sinks = poisoner.sinks.write();
            panic!("poison the bus");
        })
        .join();
        assert!(bus.subscribers.is_poisoned() && bus.observers.is_poisoned());
        let mut all = bus.subscribe();
        let mut one = bus.subscribe_tree(&"t".parse().unwrap());
        let sunk = Arc::new(AtomicUsize::new(0));
        let sink = sunk.clone();
        bus.sink(move |_| {
            sink.fetch_add(1, Ordering::Relaxed);
        });
        bus.publish(event(1));
        bus.publish(event(2));
        assert_eq!(all.try_recv().map(|e| e.seq).ok(), Some(1));
        assert_eq!(all.try_recv().map(|e| e.seq).ok(), Some(2));
        assert_eq!(one.try_recv().map(|e| e.seq).ok(), Some(1));
        assert_eq!(seen.load(Ordering::Relaxed), 2);
        assert_eq!(sunk.load(Ordering::Relaxed), 2);
    }
}
