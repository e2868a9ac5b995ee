#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use arbor_actors::{
    AgentStatus, AgentTemplate, DeltaSink, Message, Model, ModelError, ModelRequest, ModelResponse,
    Usage,
};

use super::*;
use crate::Raised;
use crate::store::SqliteStore;

/// A tree id from a test's literal.
fn as_tree(id: &str) -> arbor_actors::TreeId {
    id.parse().unwrap()
}

/// A model that answers once its gate opens.
struct Gated(tokio::sync::watch::Receiver<bool>);

#[async_trait::async_trait]
impl Model for Gated {
    fn name(&self) -> &str {
        "gated"
    }

    async fn complete(
        &self,
        _request: ModelRequest,
        _deltas: DeltaSink,
    ) -> Result<ModelResponse, ModelError> {
        let mut gate = self.0.clone();
        let _ = gate.wait_for(|open| *open).await;
        Ok(ModelResponse {
            message: Message::assistant_text("done"),
            usage: Usage::default(),
        })
    }
}

/// A guard on what is awaited (it fires only when something is stuck).
const GUARD: Duration = Duration::from_secs(60);

/// Issue 12, defect 12: a tree another process claimed while this one
/// still runs it is stopped here (its heartbeat is refused, so it need
/// not even write an event), failed with the reason, and nothing more of
/// it is written; the process's other tree goes on and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_another_process_took_over_stops_here_and_the_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (open, gate) = tokio::sync::watch::channel(false);
    let catalog = Catalog::builder()
        .model(Arc::new(Gated(gate)) as Arc<dyn Model>)
        .template(AgentTemplate::new("a", "gated"))
        .build()
        .unwrap();
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    let sup = Supervisor::new(catalog, TreeLimits::default())
        .with_store(store.clone())
        .unwrap();
    let start = |id: &str| StartRequest {
        agent: "a".into(),
        prompt: "p".into(),
        tree_id: Some(id.parse().unwrap()),
        ..StartRequest::default()
    };
    let t = sup.start(start("t")).await.unwrap();
    let u = sup.start(start("u")).await.unwrap();
    sup.flush().await.unwrap();
    // Another process takes t over (as if this one had been paused
    // past its lease).
    let db = rusqlite::Connection::open(&path).unwrap();
    let other = SqliteStore::open(&path).unwrap();
    // This process's next batch may refresh the heartbeat between the two
    // statements (it still holds the epoch): take it over again until the
    // claim sees the lease lapsed, a bounded number of times.
    let mut claimed = None;
    for _ in 0..100 {
        db.execute(
            "UPDATE trees SET owner = '-:1', heartbeat_ms = 0 WHERE tree_id = 't'",
            [],
        )
        .unwrap();
        if let Ok(epoch) = other.claim(&as_tree("t")) {
            claimed = Some(epoch);
            break;
        }
    }
    assert_eq!(claimed, Some(2));
    let before: i64 = db
        .query_row("SELECT segments FROM trees WHERE tree_id = 't'", [], |r| {
            r.get(0)
        })
        .unwrap();
    let stopped = tokio::time::timeout(GUARD, t.wait())
        .await
        .expect("the fenced tree was not stopped")
        .unwrap();
    assert_eq!(stopped.state.status, AgentStatus::Failed);
    let why = stopped.state.error_message().unwrap_or_default().to_owned();
    assert!(why.contains("taken over by another process"), "{why}");
    let fenced = sup
        .store
        .as_ref()
        .unwrap()
        .1
        .fenced(&"t".parse().unwrap())
        .unwrap();
    assert_eq!((fenced.epoch, fenced.current), (1, 2));
    open.send(true).unwrap();
    let done = tokio::time::timeout(GUARD, u.wait())
        .await
        .expect("the other tree is stuck")
        .unwrap();
    assert_eq!(done.state.status, AgentStatus::Completed);
    sup.flush().await.unwrap();
    let (segments, status): (i64, String) = db
        .query_row(
            "SELECT segments, status FROM trees WHERE tree_id = 't'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(segments, before, "the fenced tree's end was written");
    assert_eq!(
        status, "running",
        "the new owner's tree was ended from here"
    );
    assert_eq!(
        store.tree(&as_tree("u")).unwrap().1.status,
        crate::TreeStatus::Completed
    );
}

/// Issue 12, defect 15: a server's memory grew with every wave of trees
/// it ran, because what the supervisor kept of a tree outlived it: each
/// tree's deadline timer (holding the root's actor cell) waited out the
/// whole deadline, and the tree map kept ended trees until the next
/// start. Waves of trees with a long deadline, on a store as the service
/// runs them (no finished state in memory): while a wave's handles are
/// held every tree is counted, and once they are gone nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_waves_of_trees_nothing_of_the_ended_trees_is_retained() {
    use arbor_actors::models::{SimulatedConfig, SimulatedModel};
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.db")).unwrap());
    let mut lead = AgentTemplate::new("lead", "sim");
    lead.spawnable_agents = vec!["lead".into()];
    let catalog = Catalog::builder()
        .model(Arc::new(SimulatedModel::new("sim", SimulatedConfig::tree(3, 1))) as Arc<dyn Model>)
        .template(lead)
        .build()
        .unwrap();
    let limits = TreeLimits {
        deadline: Some(Duration::from_secs(3600)),
        ..TreeLimits::default()
    };
    let sup = Supervisor::with_retention(catalog, limits, Retain::None)
        .with_store(store.clone())
        .unwrap();
    const WAVE: usize = 50;
    for wave in 0..3 {
        let mut handles = Vec::new();
        for i in 0..WAVE {
            let request = StartRequest {
                agent: "lead".into(),
                prompt: "go".into(),
                tree_id: Some(format!("w{wave}-{i}").parse().unwrap()),
                ..StartRequest::default()
            };
            handles.push(sup.start(request).await.unwrap());
        }
        assert_eq!(
            sup.retained(),
            (WAVE, WAVE),
            "wave {wave}: not every tree is counted"
        );
        for handle in handles {
            let done = tokio::time::timeout(GUARD, handle.wait())
                .await
                .expect("a tree is stuck")
                .unwrap();
            assert_eq!(done.state.status, AgentStatus::Completed);
        }
        // The last holders of a tree (its agents' tasks) go a moment after
        // its root's result; then nothing of it may be left.
        let left = tokio::time::timeout(GUARD, async {
            while sup.retained() != (0, 0) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        assert!(
            left.is_ok(),
            "wave {wave}: ended trees are still held (tree map entries, deadline timers): {:?}",
            sup.retained()
        );
        assert_eq!(sup.live_actors(), 0);
    }
    sup.flush().await.unwrap();
    let completed = store
        .trees(&crate::store::TreeFilter {
            status: Some(crate::TreeStatus::Completed),
            limit: 1000,
            offset: 0,
        })
        .unwrap();
    assert_eq!(completed.len(), 3 * WAVE);
}

/// A raise that cannot be in force is refused by the supervisor itself,
/// before the tree is looked up (as the service refuses it before asking).
#[test]
fn a_raise_of_a_zero_budget_or_bad_credits_is_refused() {
    let sup = Supervisor::new(Catalog::builder().build().unwrap(), TreeLimits::default());
    let none = Raised::default();
    let credits = |c| Raised {
        max_credits: Some(c),
        ..Raised::default()
    };
    let steps = Raised {
        max_steps: Some(0),
        ..Raised::default()
    };
    for (set, add) in [
        (credits(-1.0), none),
        (none, credits(f64::NAN)),
        (steps, none),
    ] {
        let refused = sup.raise_limits(&as_tree("t"), set, add);
        assert!(
            matches!(refused, Err(Error::RaiseRefused(_))),
            "{set:?} + {add:?}: {refused:?}"
        );
    }
    // A valid raise of a tree that does not run here is unknown.
    assert!(matches!(
        sup.raise_limits(&as_tree("t"), none, credits(1.0)),
        Err(Error::UnknownTree(_))
    ));
    assert!(matches!(
        sup.raise_limits(&as_tree("t"), none, none),
        Err(Error::NothingRaised)
    ));
}
