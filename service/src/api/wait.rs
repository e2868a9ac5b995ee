//! `POST /v1/runs/wait`: start a tree and answer with its result in the same
//! call (LangGraph's `runs/wait`), for callers that do not want to hold an
//! event stream. The tree is started exactly as `POST /v1/runs` starts it;
//! the call then waits up to `timeout` (default 60 s, at most 10 min) for it
//! to end. A tree still running then goes on: the answer is 202 with where
//! to follow it. A client that hangs up does not stop the tree.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::runs::{CreateRun, RunView, get_run, start_request};
use crate::Shared;
use crate::access::{self, Action, Caller, Subject};
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ErrorBody};

/// How long a wait may last unless the caller says (`timeout`).
const DEFAULT_WAIT: Duration = Duration::from_secs(60);
/// The longest a caller may ask to wait: beyond it, follow the stream.
const MAX_WAIT: Duration = Duration::from_secs(600);

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    /// How long to wait for the tree to end (a duration: `30s`, `2m`; at
    /// most `10m`; default `60s`).
    pub timeout: Option<String>,
}

/// The ended tree's root run, with its final text.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Waited {
    /// The root run as `GET /v1/runs/{runId}` gives it.
    #[serde(flatten)]
    pub run: RunView,
    /// The root's final text: its last reply's text, its structured output
    /// as JSON, or the error it failed with.
    pub text: String,
}

/// The tree still runs after `timeout`: where to follow it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StillRunning {
    pub tree_id: String,
    pub run_id: String,
    /// Always `running`.
    pub status: String,
    /// The root run's event stream (SSE).
    pub events: String,
    /// The root run, to read once it has ended.
    pub run: String,
}

#[utoipa::path(
    post, path = "/v1/runs/wait", tag = "runs", request_body = CreateRun, params(WaitQuery),
    responses(
        (status = 200, description = "The tree ended: its root run, with its final text", body = Waited),
        (status = 202, description = "Still running after the timeout; it goes on", body = StillRunning,
         headers(("Location" = String, description = "The root run"))),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The token's principal may not start trees (role `read`)", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, description = "Bad JSON, a bad timeout, an unknown agent or model, params that do not fit, a bad webhook", body = ErrorBody),
        (status = 503, description = "Too many trees running, or the store failed", body = ErrorBody),
    )
)]
pub async fn wait_run(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiQuery(query): ApiQuery<WaitQuery>,
    ApiJson(body): ApiJson<CreateRun>,
) -> Result<Response, ApiError> {
    let timeout = match query.timeout.as_deref() {
        None => DEFAULT_WAIT,
        Some(text) => {
            let timeout = arbor_actors::duration::parse(text)
                .map_err(|e| ApiError::invalid(format!("timeout: {e}")))?;
            if timeout.is_zero() || timeout > MAX_WAIT {
                return Err(ApiError::invalid(format!(
                    "timeout: {text} is not within 1ms and 10m (follow the event stream for longer)"
                )));
            }
            timeout
        }
    };
    access::check(&shared, &caller, Action::Start, Subject::Service).await?;
    let request = start_request(&shared, &caller, body)?;
    let (tree, run) = shared.start(request).await?;
    let supervisor = shared.runtime.supervisor();
    let ended = tokio::time::timeout(timeout, supervisor.until_ended(&tree)).await;
    let run_id = run.to_string();
    let encoded = run_id.replace('/', "%2F");
    if ended.is_err() {
        let location = format!("/v1/runs/{encoded}");
        let body = StillRunning {
            tree_id: tree.to_string(),
            status: "running".to_owned(),
            events: format!("{location}/events"),
            run: location.clone(),
            run_id,
        };
        return Ok((
            StatusCode::ACCEPTED,
            [(header::LOCATION, location)],
            Json(body),
        )
            .into_response());
    }
    let Json(view) = get_run(State(shared.clone()), Caller(caller), ApiPath(run_id)).await?;
    let text = match &view.state {
        Some(state) => arbor_actors::RunResult {
            state: Arc::new(state.clone()),
            value: view.value.clone(),
        }
        .text(),
        None => String::new(),
    };
    Ok(Json(Waited { run: view, text }).into_response())
}
