//! Mutexes whose poisoning is impossible to observe: a guard is always handed
//! out, so no work is skipped because some thread once panicked.
//!
//! Why this is sound here: a std mutex is poisoned when a thread panics while
//! holding it. Every mutex these helpers take in this crate guards plain data
//! (a token bucket, load-test counters and histograms, metric labels by tree,
//! process groups, MCP server state, a cache of catalogs) and changes it only
//! by single steps that leave it consistent at every point (an insert, a
//! remove, a counter set). Nothing that can panic runs between two halves of
//! an update, so the data a panicking thread left behind is as valid as any
//! other, and recovering the guard is correct.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// [`Mutex::lock`] that recovers the guard of a poisoned mutex.
pub(crate) trait LockExt<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
