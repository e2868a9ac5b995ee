//! Final states of finished runs, retrievable by `runId`; fed from events.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arbor_actors::sync::LockExt;
use arbor_actors::{AgentState, RunId};

/// Which final states the registry keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Retain {
    /// Every run's final state (the default).
    #[default]
    All,
    /// Only roots' (for huge load-test trees).
    Roots,
    /// None: finished states are read back from the store (a long-lived service).
    None,
}

#[derive(Default)]
pub(crate) struct Registry {
    retain: Retain,
    finished: Mutex<HashMap<RunId, Arc<AgentState>>>,
}

impl Registry {
    pub(crate) fn new(retain: Retain) -> Self {
        Registry {
            retain,
            finished: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn record(&self, state: &Arc<AgentState>) {
        match self.retain {
            Retain::All => {}
            Retain::Roots if state.parent_id.is_none() => {}
            Retain::Roots | Retain::None => return,
        }
        self.finished
            .locked()
            .insert(state.run_id.clone(), state.clone());
    }

    pub(crate) fn get(&self, run_id: &RunId) -> Option<Arc<AgentState>> {
        self.finished.locked().get(run_id).cloned()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.finished.locked().len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arbor_actors::AgentState;

    use super::{Registry, Retain};

    /// A registry whose lock a panicking thread poisoned still records and
    /// serves final states (before, `record` skipped them silently).
    #[test]
    fn a_poisoned_registry_still_records_and_serves_final_states() {
        let registry = Arc::new(Registry::new(Retain::All));
        let poisoner = registry.clone();
        let _ = std::thread::spawn(move || {
            let _finished = poisoner.finished.lock();
            panic!("poison the registry");
        })
        .join();
        assert!(registry.finished.is_poisoned());
        let state = Arc::new(AgentState::of_run("t/0".parse().unwrap()));
        registry.record(&state);
        assert_eq!(registry.len(), 1);
        assert_eq!(
            registry
                .get(&"t/0".parse().unwrap())
                .map(|s| s.run_id.to_string())
                .as_deref(),
            Some("t/0")
        );
    }
}
