//! Catalogs, supervisors and trees run to the end, every wait bounded.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arbor_actors::models::scripted::ScriptedModel;
use arbor_actors::{AgentTemplate, Event, Model, RunResult, Tool};
use arbor_supervisor::{Catalog, EventStream, StartRequest, Supervisor, TreeHandle, TreeLimits};

use crate::tools::echo;

/// The bound of the tree helpers' waits: virtual time under `start_paused`,
/// so it only fires when the tree is stuck.
pub const GUARD: Duration = Duration::from_secs(24 * 3600);

/// Awaits `f`, failing the test if it is still pending after `bound`.
pub async fn within<T>(bound: Duration, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(bound, f)
        .await
        .unwrap_or_else(|_| panic!("stuck: still pending after {bound:?}"))
}

/// A catalog of `models` (by the names given), `templates` and `tools`.
pub fn catalog(
    models: Vec<(&str, Arc<dyn Model>)>,
    templates: Vec<AgentTemplate>,
    tools: Vec<Arc<dyn Tool>>,
) -> Catalog {
    let mut builder = Catalog::builder();
    for (name, m) in models {
        builder = builder.model_as(name, m);
    }
    for tool in tools {
        builder = builder.tool(tool);
    }
    for t in templates {
        builder = builder.template(t);
    }
    builder.build().expect("valid catalog")
}

/// A supervisor over `templates`, the scripted `model`, extra models and tools.
pub fn supervisor_with(
    model: &Arc<ScriptedModel>,
    templates: Vec<AgentTemplate>,
    models: Vec<(&str, Arc<dyn Model>)>,
    tools: Vec<Arc<dyn Tool>>,
    limits: TreeLimits,
) -> Supervisor {
    let mut all: Vec<(&str, Arc<dyn Model>)> = vec![(model.name(), model.clone())];
    all.extend(models);
    Supervisor::new(catalog(all, templates, tools), limits)
}

/// A supervisor over `templates` and the scripted `model`, with the echo tool.
pub fn supervisor(
    model: &Arc<ScriptedModel>,
    templates: Vec<AgentTemplate>,
    limits: TreeLimits,
) -> Supervisor {
    supervisor_with(model, templates, Vec::new(), vec![echo()], limits)
}

/// A request for tree `t`.
pub fn request(agent: &str, prompt: &str) -> StartRequest {
    StartRequest {
        agent: agent.to_owned(),
        prompt: prompt.to_owned(),
        tree_id: Some("t".parse().expect("a tree id")),
        ..StartRequest::default()
    }
}

/// Starts tree `t`.
pub async fn start(sup: &Supervisor, agent: &str, prompt: &str) -> TreeHandle {
    sup.start(request(agent, prompt))
        .await
        .expect("tree starts")
}

/// Waits (guarded) for the root's result.
pub async fn finish(handle: TreeHandle) -> RunResult {
    tokio::time::timeout(GUARD, handle.wait())
        .await
        .expect("the tree ends")
        .expect("the root reports")
}

/// Starts tree `t` and waits for its result; returns it with every event
/// published until then (the root's final event is published before its
/// result is sent).
pub async fn run(sup: &Supervisor, agent: &str, prompt: &str) -> (RunResult, Vec<Arc<Event>>) {
    let mut rx = sup.subscribe();
    let result = finish(start(sup, agent, prompt).await).await;
    (result, drain(&mut rx))
}

/// Runs `request` to the end (bounded by `bound`); returns the result with
/// every event published until then.
pub async fn run_request(
    sup: &Supervisor,
    request: StartRequest,
    bound: Duration,
) -> (RunResult, Vec<Arc<Event>>) {
    let mut rx = sup.subscribe();
    let result = within(bound, sup.run(request))
        .await
        .expect("the tree runs");
    (result, drain(&mut rx))
}

/// Every event already queued.
pub fn drain(rx: &mut EventStream) -> Vec<Arc<Event>> {
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    events
}

/// Waits (guarded) for the first event matching `pred`, keeping the ones
/// before it in `seen`.
pub async fn wait_for(
    rx: &mut EventStream,
    seen: &mut Vec<Arc<Event>>,
    pred: impl Fn(&Event) -> bool,
) -> Arc<Event> {
    tokio::time::timeout(GUARD, async {
        loop {
            let e = rx.recv().await.expect("event stream open");
            seen.push(e.clone());
            if pred(&e) {
                return e;
            }
        }
    })
    .await
    .expect("the awaited event arrives")
}
