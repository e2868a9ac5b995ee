//! Final states of finished runs, retrievable by `runId`; fed from events.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arbor_actors::AgentState;

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
pub struct Registry {
    retain: Retain,
    finished: Mutex<HashMap<String, Arc<AgentState>>>,
}

impl Registry {
    pub fn new(retain: Retain) -> Self {
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
        if let Ok(mut finished) = self.finished.lock() {
            finished.insert(state.run_id.clone(), state.clone());
        }
    }

    pub fn get(&self, run_id: &str) -> Option<Arc<AgentState>> {
        self.finished.lock().ok()?.get(run_id).cloned()
    }

    pub fn len(&self) -> usize {
        self.finished.lock().map(|f| f.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
