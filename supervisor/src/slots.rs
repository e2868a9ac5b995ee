//! Live slots: at most `max_live_agents` agents step at once. A waiting agent
//! is served by priority, not arrival: a parent taking its slot back to finish
//! comes first, then the deepest agents. Finishing subtrees before opening new
//! ones keeps a huge tree's frontier, and so its memory, bounded (a FIFO queue
//! expands the tree breadth-first and holds every pending leaf at once).
//!
//! The children of one launch wait in line as one waiter ([`Slots::line`]):
//! it keeps its place (by its priority and arrival) until each of them has
//! had a slot, so a child waiting for its slot costs no entry of its own.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};

use arbor_actors::hooks::{Slot, SlotLine, SlotPriority};
use arbor_actors::sync::LockExt;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

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
    to: To,
}

/// Where a waiter's slots go.
enum To {
    /// One agent's slot.
    One(oneshot::Sender<Slot>),
    /// The next of `wanted` slots of a launch's children.
    Line {
        slots: mpsc::UnboundedSender<Slot>,
        wanted: usize,
    },
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
        inner.waiters.push(Waiter {
            priority,
            seq,
            to: To::One(tx),
        });
        rx.map(Result::ok).boxed()
    }

    /// The slots of `count` children of one launch, in turn: the free ones at
    /// once, the others as they are released, the line waiting as one waiter
    /// at `priority` (it leaves the line once every child had its slot, or
    /// when the launch drops the line).
    pub(crate) fn line(self: &Arc<Self>, priority: SlotPriority, count: usize) -> SlotLine {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut inner = self.inner.locked();
        let mut wanted = count;
        while wanted > 0 && inner.free > 0 {
            inner.free -= 1;
            wanted -= 1;
            // `rx` is here: the send cannot fail.
            let _ = tx.send(self.slot());
        }
        if wanted > 0 {
            inner.seq += 1;
            let seq = inner.seq;
            inner.waiters.push(Waiter {
                priority,
                seq,
                to: To::Line { slots: tx, wanted },
            });
        }
        SlotLine::Line(rx)
    }

    fn slot(self: &Arc<Self>) -> Slot {
        Slot::new(Held {
            slots: Some(self.clone()),
        })
    }

    /// Hands a freed slot to the best waiter still waiting, or keeps it.
    fn release(self: &Arc<Self>) {
        let mut inner = self.inner.locked();
        while let Some(mut waiter) = inner.waiters.pop() {
            // A waiter that gave up: defuse the slot it did not take (its
            // drop would re-enter this lock) and try the next one.
            match &mut waiter.to {
                To::One(_) => {
                    let To::One(tx) = waiter.to else { continue };
                    match tx.send(self.slot()) {
                        Ok(()) => return,
                        Err(slot) => defuse(slot),
                    }
                }
                To::Line { slots, wanted } => match slots.send(self.slot()) {
                    Ok(()) => {
                        *wanted -= 1;
                        // Its next child keeps the line's place.
                        if *wanted > 0 {
                            inner.waiters.push(waiter);
                        }
                        return;
                    }
                    Err(unsent) => defuse(unsent.0),
                },
            }
        }
        inner.free += 1;
    }

    #[cfg(test)]
    fn free(&self) -> usize {
        self.inner.locked().free
    }

    /// Entries in line (a launch's line counts once).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.inner.locked().waiters.len()
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

    /// A wide launch waited with a channel, a boxed future and a heap entry
    /// per child (~160 bytes each; 10^7 children wait in the 10^8-agent tree
    /// at 1,000 live): its children now wait as one entry, served in turn.
    #[tokio::test]
    async fn a_wide_launch_waits_in_line_as_one_entry_not_one_per_child() {
        let slots = Slots::new(2);
        let mut line = slots.line(p(1, false), 10_000);
        // The free slots at once, the rest as one waiter.
        assert_eq!(slots.free(), 0);
        assert_eq!(slots.waiting(), 1);
        let a = line.next().await.unwrap();
        let b = line.next().await.unwrap();
        let deeper = slots.acquire(p(2, false));
        assert_eq!(slots.waiting(), 2);
        // A freed slot goes to the deeper agent first, then back to the line.
        drop(a);
        let d = deeper.await.unwrap();
        drop(b);
        let c = line.next().await.unwrap();
        assert_eq!(slots.waiting(), 1);
        drop((c, d));
        // The launch drops its line: its place goes, the slots come back.
        drop(line);
        let _held = slots.acquire(p(0, false)).await.unwrap();
        assert_eq!(slots.waiting(), 0);
        assert_eq!(slots.free(), 1);
    }

    #[tokio::test]
    async fn a_line_is_served_in_its_place_among_equal_waiters() {
        let slots = Slots::new(1);
        let held = slots.acquire(p(1, false)).await.unwrap();
        let mut first = slots.line(p(1, false), 2);
        let second = slots.acquire(p(1, false));
        drop(held);
        let a = first.next().await.unwrap();
        drop(a);
        // The line's second child comes before the later waiter.
        let b = first.next().await.unwrap();
        drop(b);
        let c = second.await.unwrap();
        drop(c);
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
