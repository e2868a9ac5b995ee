//! Arbor embedded in an axum app of its own.
//!
//! The app has one route of its own, `POST /ask`, which starts a research
//! tree, waits for it and answers with the root's output; and it mounts
//! Arbor's whole API beside it (`/v1/...`, the live page at `/`), so the
//! trees it starts can be watched, listed and cancelled.
//!
//! ```text
//! cargo run --example embed
//! curl -s -X POST localhost:3000/ask -H 'content-type: application/json' \
//!      -d '{"question": "Why is the sky blue?"}'
//! curl -s localhost:3000/v1/runs -H 'Authorization: Bearer demo-token'
//! ```

use std::time::Duration;

use arbor::actors::EventKind;
use arbor::supervisor::Retain;
use arbor::{Config, Runtime};
use arbor_service::{Service, ServiceOptions, Tokens};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
struct Ask {
    question: String,
}

/// The app's own route: a whole tree per question, answered when it ends.
async fn ask(
    State(service): State<Service>,
    Json(ask): Json<Ask>,
) -> Result<Json<Value>, (StatusCode, String)> {
    let unprocessable = |e: arbor::Error| (StatusCode::UNPROCESSABLE_ENTITY, e.to_string());
    let mut run = service
        .runtime()
        .start("coordinator", &ask.question, None)
        .await
        .map_err(unprocessable)?;
    // Count the tree's agents as they start, while waiting for the answer.
    let mut events = run.take_events();
    let counting = tokio::spawn(async move {
        let mut agents = 0;
        while let Some(event) = events.recv().await {
            agents += usize::from(matches!(event.kind, EventKind::AgentStarted { .. }));
        }
        agents
    });
    let tree_id = run.tree_id.clone();
    let result = run.result().await.map_err(unprocessable)?;
    Ok(Json(json!({
        "treeId": &*tree_id,
        "status": result.state.status.as_str(),
        "agents": counting.await.unwrap_or(0),
        "answer": result.value,
    })))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    // The built-in config: a research swarm on the simulated model (no API key).
    let runtime = Runtime::builder(Config::default_config()?)
        .store("embed.db")
        .retain(Retain::None)
        .build()?;
    let service = Service::new(
        runtime,
        ServiceOptions {
            tokens: Tokens::new(["demo-token"]),
            tokens_env: "ARBOR_API_TOKENS".into(),
            body_limit: 1 << 20,
            max_running_trees: 100,
            shutdown_timeout: Duration::from_secs(5),
            webhooks: Default::default(),
        },
    )?;
    // Trees a previous run of this app left unfinished go on.
    service.resume_interrupted().await;
    let app = Router::new()
        .route("/ask", post(ask))
        .with_state(service.clone())
        .merge(service.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Everything emitted so far is in the store before the app exits.
    service.runtime().supervisor().flush().await?;
    Ok(())
}
