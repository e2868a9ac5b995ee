//! Locks whose poisoning is impossible to observe: a guard is always handed
//! out, so no work is ever skipped because some thread once panicked. The
//! supervisor and the binary's crate use these helpers too.
//!
//! Why this is sound: a std lock is poisoned when a thread panics while
//! holding it (an `RwLock` only under a write guard). Every lock these
//! helpers take guards plain data (in the supervisor: maps of actors and
//! contexts, final states, counters, a slot queue, observer lists, a `()`
//! that orders events; in the binary's crate: a token bucket, load-test
//! counters and histograms, metric labels by tree, process groups, MCP server
//! state, a cache of catalogs; here: the scripted model's list of recorded
//! requests) and changes it only by single steps that leave it consistent at
//! every point (an insert, a remove, a `push`, a `retain`, a counter set).
//! Nothing that can panic runs between two halves of an update, so the data a
//! panicking thread left behind is as valid as any other, and recovering the
//! guard is correct. A lock whose data could be left half-written (the SQLite
//! store's connection and write buffers) must not use these helpers: its
//! poisoning is reported as an error instead.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`] that recovers the guard of a poisoned mutex.
pub trait LockExt<T: ?Sized> {
    /// Locks the mutex, blocking until it is free; a poisoned mutex's guard
    /// is handed out as if it were not poisoned.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`] that recover a poisoned lock's guard.
pub trait RwLockExt<T: ?Sized> {
    /// Takes a shared read guard, blocking until no writer holds the lock;
    /// a poisoned lock's guard is handed out as if it were not poisoned.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// Takes the exclusive write guard, blocking until the lock is free; a
    /// poisoned lock's guard is handed out as if it were not poisoned.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockExt<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex, RwLock};

    use super::{LockExt, RwLockExt};

    #[test]
    fn a_poisoned_lock_still_hands_out_its_guard() {
        let m = Arc::new(Mutex::new(1));
        let l = Arc::new(RwLock::new(1));
        let (m2, l2) = (m.clone(), l.clone());
        let _ = std::thread::spawn(move || {
            let _g = m2.lock();
            let _w = l2.write();
            panic!("poison both");
        })
        .join();
        assert!(m.is_poisoned() && l.is_poisoned());
        *m.locked() += 1;
        *l.write_locked() += 1;
        assert_eq!((*m.locked(), *l.read_locked()), (2, 2));
    }
}
