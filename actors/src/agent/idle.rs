//! The idle watchdog (semantics §11, `idle_timeout`): an agent whose own work
//! is in flight (its model call or its tools) and that makes no progress for
//! its template's `idle_timeout` emits `stalled` and fails.
//!
//! Progress is the instant of the run's latest own event or model delta, kept
//! in an atomic that the actor and its model call's delta sink both write (the
//! sink runs in the model's task). One timer task per agent at a time, tagged
//! with a generation like the step timer, sends `IdleCheck`; the handler
//! decides with [`decide`] (pure) whether the run stalled or when to look again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ractor::ActorRef;
use tokio::time::Instant;

use super::{AgentMsg, AgentRun};
use crate::event::EventKind;
use crate::failure::{Failure, FailureKind};
use crate::step::Action;

/// What the watchdog does when its timer fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Idle {
    /// No work of the run's own is in flight: nothing to watch until some starts.
    Off,
    /// Look again when the run has been this long (since the watch began)
    /// without progress.
    WaitUntil(Duration),
    /// The run went this long without progress: it stalled.
    Stalled(Duration),
}

/// The decision, on instants given as offsets from one origin: with work in
/// flight, a run whose last progress is `timeout` or more before `now` has
/// stalled; otherwise it is looked at again `timeout` after its last progress.
pub(crate) fn decide(
    in_flight: bool,
    last_progress: Duration,
    now: Duration,
    timeout: Duration,
) -> Idle {
    if !in_flight {
        return Idle::Off;
    }
    let idle = now.saturating_sub(last_progress);
    if idle >= timeout {
        Idle::Stalled(idle)
    } else {
        Idle::WaitUntil(last_progress + timeout)
    }
}

/// When the run last made progress, shared with its model call's delta sink.
#[derive(Clone)]
pub(super) struct Progress {
    origin: Instant,
    /// Nanoseconds from `origin` to the latest progress.
    at: Arc<AtomicU64>,
}

impl Progress {
    fn new() -> Self {
        Progress {
            origin: Instant::now(),
            at: Arc::new(AtomicU64::new(0)),
        }
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// The run made progress now.
    pub(super) fn touch(&self) {
        let nanos = u64::try_from(self.now().as_nanos()).unwrap_or(u64::MAX);
        self.at.fetch_max(nanos, Ordering::Relaxed);
    }

    fn last(&self) -> Duration {
        Duration::from_nanos(self.at.load(Ordering::Relaxed))
    }
}

/// One agent's watchdog: its timeout, its progress and its timer.
pub(super) struct IdleWatch {
    timeout: Duration,
    pub(super) progress: Progress,
    timer: super::timer::Timer,
}

impl IdleWatch {
    /// The watch for a template's `idle_timeout` (`None`: not watched).
    pub(super) fn new(timeout: Option<Duration>) -> Option<Self> {
        Some(IdleWatch {
            timeout: timeout?,
            progress: Progress::new(),
            timer: super::timer::Timer::default(),
        })
    }

    fn arm(&mut self, myself: &ActorRef<AgentMsg>, at: Duration) {
        let deadline = self.progress.origin + at;
        self.timer
            .start_at(myself, deadline, |generation| AgentMsg::IdleCheck {
                generation,
            });
    }
}

impl AgentRun {
    /// Records progress (an event of the run's own).
    pub(super) fn touch_progress(&self) {
        if let Some(idle) = &self.idle {
            idle.progress.touch();
        }
    }

    /// Work of the run's own starts (a model call, a tool): it counts as
    /// progress, and the watch runs if it was not running.
    pub(super) fn watch_idle(&mut self, myself: &ActorRef<AgentMsg>) {
        let Some(idle) = &mut self.idle else {
            return;
        };
        idle.progress.touch();
        if !idle.timer.is_running() {
            let at = idle.progress.last() + idle.timeout;
            idle.arm(myself, at);
        }
    }

    /// The watch's timer fired: stall the run, look again later, or stop watching.
    pub(super) fn idle_check(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        generation: u64,
    ) -> Vec<Action> {
        let in_flight = self.model_task.is_some() || self.tools_running > 0;
        if self.machine.state().status.is_final() {
            return Vec::new();
        }
        let Some(idle) = &mut self.idle else {
            return Vec::new();
        };
        if !idle.timer.fired(generation) {
            return Vec::new();
        }
        let timeout = idle.timeout;
        match decide(
            in_flight,
            idle.progress.last(),
            idle.progress.now(),
            timeout,
        ) {
            Idle::Off => Vec::new(),
            Idle::WaitUntil(at) => {
                idle.arm(myself, at);
                Vec::new()
            }
            Idle::Stalled(idle) => {
                let step = self.machine.step();
                self.emit(EventKind::Stalled {
                    step,
                    idle_ms: u64::try_from(idle.as_millis()).unwrap_or(u64::MAX),
                });
                self.machine.fail(Failure::new(
                    FailureKind::Stalled,
                    format!(
                        "stalled: step {step} made no progress for {idle:?} while its model call or tools ran (idle_timeout = {timeout:?})"
                    ),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Idle, decide};
    use std::time::Duration;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn without_work_in_flight_nothing_is_watched() {
        assert_eq!(decide(false, Duration::ZERO, 100 * S, 30 * S), Idle::Off);
    }

    #[test]
    fn work_without_progress_for_the_timeout_has_stalled() {
        assert_eq!(decide(true, 5 * S, 35 * S, 30 * S), Idle::Stalled(30 * S));
        assert_eq!(decide(true, 5 * S, 50 * S, 30 * S), Idle::Stalled(45 * S));
    }

    #[test]
    fn recent_progress_waits_until_a_timeout_after_it() {
        assert_eq!(
            decide(true, 29 * S, 30 * S, 30 * S),
            Idle::WaitUntil(59 * S)
        );
        let just_short = 30 * S - Duration::from_nanos(1);
        assert_eq!(
            decide(true, Duration::ZERO, just_short, 30 * S),
            Idle::WaitUntil(30 * S)
        );
    }

    #[test]
    fn progress_after_now_is_no_idle_time() {
        // A delta recorded by the model's task between reading now and the
        // progress: not idle at all.
        assert_eq!(
            decide(true, 31 * S, 30 * S, 30 * S),
            Idle::WaitUntil(61 * S)
        );
    }
}
