//! Live slots: at most `max_live_agents` agents step at once. A waiting agent
//! is served by priority, not arrival: a parent taking its slot back to finish
//! comes first, then the deepest agents. Finishing subtrees before opening new
//! ones keeps a huge tree's frontier, and so its memory, bounded (a FIFO queue
//! expands the tree breadth-first and holds every pending leaf at once).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};

use arbor_actors::hooks::{Slot, SlotPriority};
use arbor_actors::sync::LockExt;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::oneshot;

pub(crate) struct Slots {
    inner: Mutex<Inner>,
}

struct Inner {
    free: usize,
    seq: u64,
    waiters: BinaryHeap<Waiter>,
}

struct Waiter {
    priority: SlotPriority,
    seq: u64,
    tx: oneshot::Sender<Slot>,
}

impl Waiter {
    fn rank(&self) -> (bool, usize) {
        (self.priority.resume, self.priority.depth)
    }
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Waiter {}

impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Waiter {
    /// Greater is served first: resumptions, then deeper, then earlier.
    fn cmp(&self, other: &Self) -> Ordering {
        self.rank()
            .cmp(&other.rank())
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// Gives its slot back when dropped.
struct Held {
    slots: Option<Arc<Slots>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            slots.release();
        }
    }
}

impl Slots {
    pub(crate) fn new(count: usize) -> Arc<Self> {
        Arc::new(Slots {
            inner: Mutex::new(Inner {
                free: count.max(1),
                seq: 0,
                waiters: BinaryHeap::new(),
            }),
        })
    }

    pub(crate) fn acquire(
        self: &Arc<Self>,
        priority: SlotPriority,
    ) -> BoxFuture<'static, Option<Slot>> {
        let mut inner = self.inner.locked();
        if inner.free > 0 {
            inner.free -= 1;
            let slot = self.slot();
            return futures::future::ready(Some(slot)).boxed();
        }
        let (tx, rx) = oneshot::channel();
        inner.seq += 1;
        let seq = inner.seq;
        inner.waiters.push(Waiter { priority, seq, tx });
        rx.map(Result::ok).boxed()
    }

    fn slot(self: &Arc<Self>) -> Slot {
        Slot::new(Held {
            slots: Some(self.clone()),
        })
    }

    /// Hands a freed slot to the best waiter still waiting, or keeps it.
    fn release(self: &Arc<Self>) {
        let mut inner = self.inner.locked();
        while let Some(waiter) = inner.waiters.pop() {
            match waiter.tx.send(self.slot()) {
                Ok(()) => return,
                // The waiter gave up: defuse the slot it did not take (its drop
                // would re-enter this lock) and try the next one.
                Err(slot) => defuse(slot),
            }
        }
        inner.free += 1;
    }

    #[cfg(test)]
    fn free(&self) -> usize {
        self.inner.locked().free
    }
}

fn defuse(slot: Slot) {
    if let Ok(mut held) = slot.into_inner().downcast::<Held>() {
        held.slots = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(depth: usize, resume: bool) -> SlotPriority {
        SlotPriority { depth, resume }
    }

    #[tokio::test]
    async fn slots_go_to_resumptions_then_the_deepest_then_the_earliest() {
        let slots = Slots::new(1);
        let held = slots.acquire(p(0, false)).await.unwrap();
        let shallow = slots.acquire(p(1, false));
        let deep_first = slots.acquire(p(3, false));
        let deep_second = slots.acquire(p(3, false));
        let resume = slots.acquire(p(0, true));
        drop(held);
        let a = resume.await.unwrap();
        drop(a);
        let b = deep_first.await.unwrap();
        drop(b);
        let c = deep_second.await.unwrap();
        drop(c);
        let d = shallow.await.unwrap();
        drop(d);
        assert_eq!(slots.free(), 1);
    }

    #[tokio::test]
    async fn a_waiter_that_gave_up_is_skipped() {
        let slots = Slots::new(1);
        let held = slots.acquire(p(0, false)).await.unwrap();
        let gone = slots.acquire(p(5, false));
        let waiting = slots.acquire(p(1, false));
        drop(gone);
        drop(held);
        let slot = waiting.await.unwrap();
        assert_eq!(slots.free(), 0);
        drop(slot);
        assert_eq!(slots.free(), 1);
    }
}
