//! Giving the allocator's freed memory back to the system once the process
//! goes idle (issue 33).
//!
//! mimalloc purges the pages a thread freed only when some thread frees
//! again after the purge delay, and a thread's empty pages only when that
//! thread allocates again: a server that falls idle after a burst keeps the
//! burst's memory for as long as it stays idle (2.3-2.5 times its RSS at
//! start after waves of trees, BENCHMARKS.md). jemalloc has a background
//! thread for this; mimalloc does not, so this is one: a thread that sees the
//! process use no CPU for a second bumps the idle generation, purges the
//! arenas, and wakes the runtime's workers, each of which collects its own
//! pages when it parks again ([`on_park`]). Under load nothing is collected
//! (the process is never idle for a second), so the work costs nothing then.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bumped each time the process is found idle after being busy.
static IDLE_GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The idle generation this thread last collected at.
    static COLLECTED_AT: Cell<u64> = const { Cell::new(0) };
}

/// How often the watcher looks at the process's CPU time.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// CPU time (clock ticks, 10 ms on Linux) a process may use in
/// [`LOOK_EVERY`] and still count as idle: timers, a health check.
const IDLE_TICKS: u64 = 2;

/// The runtime's `on_thread_park`: a worker that goes to sleep after the
/// process was found idle returns its freed pages first, once per idle
/// period.
pub(crate) fn on_park() {
    let generation = IDLE_GENERATION.load(Ordering::Relaxed);
    if COLLECTED_AT.get() != generation {
        COLLECTED_AT.set(generation);
        collect();
    }
}

/// Starts the watcher thread; `wake` wakes the runtime's workers (spawns
/// a no-op task per worker) so that they park again and [`on_park`].
pub(crate) fn watch(wake: impl Fn() + Send + 'static) {
    let watcher = move || {
        let mut last = cpu_ticks();
        let mut busy = false;
        loop {
            std::thread::sleep(LOOK_EVERY);
            let now = cpu_ticks();
            let (Some(before), Some(after)) = (last, now) else {
                // No /proc: nothing to go by, so nothing is collected.
                return;
            };
            last = now;
            if after.saturating_sub(before) > IDLE_TICKS {
                busy = true;
            } else if busy {
                busy = false;
                IDLE_GENERATION.fetch_add(1, Ordering::Relaxed);
                collect();
                wake();
            }
        }
    };
    // A thread that cannot start leaves memory as it is: nothing else
    // depends on it.
    let _ = std::thread::Builder::new()
        .name("arbor-idle".into())
        .stack_size(64 * 1024)
        .spawn(watcher);
}

/// The process's CPU time (user + system) in clock ticks, from
/// `/proc/self/stat`; `None` where there is no such file.
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    ticks_of(&stat)
}

/// utime + stime of a `/proc/PID/stat` line: fields 14 and 15, counted
/// after the command name's closing parenthesis (the name may hold spaces).
fn ticks_of(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Asks the kernel for no transparent huge pages in this process (Linux).
/// With them (mimalloc asks for them on its arenas), the kernel's
/// khugepaged fills a 2 MiB region of which a few pages are in use with
/// memory nobody asked for: an idle `arbor serve` grew by 11 MB in seconds
/// with no CPU spent (BENCHMARKS.md). A service that cannot set it keeps
/// them.
pub(crate) fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(error) = nix::sys::prctl::set_thp_disable(true) {
        tracing::debug!("cannot turn transparent huge pages off: {error}");
    }
}

/// Returns this thread's free pages and purges the arenas' freed memory.
#[cfg(feature = "mimalloc")]
#[allow(unsafe_code)]
fn collect() {
    // SAFETY: mi_collect takes no pointer and may be called from any thread
    // at any time (mimalloc.h); it only frees memory no block lives in.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// The system allocator keeps its own policy.
#[cfg(not(feature = "mimalloc"))]
fn collect() {}

#[cfg(test)]
mod tests {
    use super::ticks_of;

    #[test]
    fn cpu_ticks_are_read_after_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (arbor (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    37 5 0 0 20 0 9 0 12345 1000000 500 18446744073709551615";
        assert_eq!(ticks_of(stat), Some(42));
        assert_eq!(ticks_of("garbage"), None);
        assert_eq!(ticks_of("1 (a) S 1 2"), None);
    }
}
