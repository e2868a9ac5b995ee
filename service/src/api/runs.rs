//! `/v1/runs`: starting a tree, listing trees, a run's state, its event
//! stream, cancelling it and steering it.

use std::sync::Arc;

use arbor_actors::{AgentState, RunId, TreeId};
use arbor_supervisor::store::{RunNode, TreeFilter, TreeStatus, TreeSummary};
use arbor_supervisor::{StartRequest, ToolRule, TreeLimits};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::forward::{Applied, Control, Forwarded, here_or_forward};
use crate::Shared;
use crate::access::{self, Action, Caller, Scope, Subject};
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ErrorBody};
use crate::replica::ControlBody;

/// Start a tree.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    /// The agent type to start (see `GET /v1/agents`).
    #[schema(min_length = 1)]
    pub agent: String,
    pub prompt: String,
    /// Params for the agent, checked against its input schema.
    #[schema(value_type = Option<Object>)]
    pub params: Option<Value>,
    /// Run every agent of the tree on this configured model.
    pub model: Option<String>,
    /// Limits for this tree; each can only tighten the server's own (a looser
    /// one is refused, 422, naming it).
    pub limits: Option<TreeLimits>,
    /// A tool rule for this tree (`allow`/`deny` patterns over tool names such
    /// as `fs/read_file`): it narrows the server's `[policy]`, never widens it.
    pub tools: Option<ToolRule>,
    /// Where to post the tree's end (a `WebhookPayload`, signed with the
    /// service's `webhook_secret`) when it completes, fails or is cancelled:
    /// an `http(s)` URL; the service's `[service] webhook` when absent.
    /// Retried with backoff; journaled, so a restart delivers it once.
    #[schema(max_length = 2048, example = "https://example.com/hooks/arbor")]
    pub webhook: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Created {
    pub tree_id: String,
    /// The root run; its events stream at `/v1/runs/{runId}/events`.
    pub run_id: String,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only trees with this status.
    pub status: Option<TreeStatus>,
    /// Trees per page (1 to 500, default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// Trees to skip (from `nextOffset` of the page before).
    #[param(minimum = 0, maximum = 1_000_000_000)]
    pub offset: Option<u32>,
}

/// The query of `GET /v1/runs/{runId}/events`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Also send the model's reply as it streams in: `modelDelta` events
    /// (`{type, seq, treeId, runId, atMs, step, delta: {kind: text|reasoning|toolCallArgs, text, index?}}`)
    /// with no SSE `id`, never journaled, so a reconnect does not repeat
    /// them; sent while the tree runs on this replica. Default false.
    pub deltas: Option<bool>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunList {
    /// Trees (each with its root run), newest first.
    pub runs: Vec<TreeSummary>,
    /// The offset of the next page; null on the last.
    pub next_offset: Option<u64>,
}

/// A run, as every replica of the service answers for it: its ids, agent
/// type and status alike everywhere; its state the current one where it
/// runs, else the one stored last.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    pub run_id: String,
    /// The tree it is of.
    pub tree_id: String,
    /// The run that spawned it; null for a tree's root (or a turn's).
    pub parent_run_id: Option<String>,
    /// Its agent type (the template id it runs).
    pub agent_type: String,
    /// `running`, or how it ended: `completed`, `failed`, `cancelled`.
    pub status: String,
    /// Whether this process runs it (it runs its tree), so `state` is its
    /// current one; false: `state` is the one stored last.
    pub live: bool,
    /// Whether the state is the run's final one.
    #[serde(rename = "final")]
    pub is_final: bool,
    /// The run's AgentState: ids, messageHistory, output, status, usage.
    /// Null while none is stored and this process does not run it: a run
    /// another replica runs has none until its first checkpoint (the end of
    /// its first step).
    #[schema(value_type = Option<Object>)]
    pub state: Option<AgentState>,
    /// What a finished run hands back to its parent (or the caller), by its
    /// agent's output mode; null while it runs.
    #[schema(value_type = Option<Object>)]
    pub value: Value,
    /// Its todo list as its last todo call wrote it (`TodoWrite`,
    /// `write_todos`, `workspace/todos`): `[{content, status, activeForm}]`,
    /// status `pending`, `in_progress` or `completed`; absent when it has
    /// none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub todos: Option<Vec<arbor::tools::workspace::notes::Todo>>,
}

/// One Server-Sent Event of a run's stream (the document's schema of each
/// event of a `text/event-stream` response, as OpenAPI 3.2 reads it).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct StreamEvent {
    /// The event's `seq` in its tree: send it back as `Last-Event-ID`.
    #[schema(pattern = "^[0-9]+$")]
    pub id: String,
    /// The event's type (an `EventType`: agentStarted, stepStarted, …,
    /// approvalRequested, steered, budgetReached, …).
    pub event: String,
    /// The event as JSON: `{seq, treeId, runId, atMs, type, ...}`.
    #[schema(content_media_type = "application/json")]
    pub data: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cancelled {
    pub run_id: String,
    pub cancelled: bool,
    /// Set when another replica runs the tree: the cancel was posted for it
    /// (`forwarded.forwardedTo` names it) and takes effect there. (Nested,
    /// not flattened: an optional flattened object has no honest schema.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarded: Option<Forwarded>,
}

/// A steering message for a running agent (semantics §9).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SteerMessage {
    /// What to tell the agent; it joins its history as a user message at its
    /// next step boundary.
    #[schema(min_length = 1)]
    pub text: String,
}

/// A steering message was accepted.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Steered {
    /// The run it was sent to.
    pub run_id: String,
    /// Always `true`: the message is journaled (a `steered` event) and will
    /// be in the run's history from its next step.
    pub accepted: bool,
    /// Set when another replica runs the tree (see `Cancelled`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarded: Option<Forwarded>,
}

#[utoipa::path(
    post, path = "/v1/runs", tag = "runs", request_body = CreateRun,
    responses(
        (status = 201, description = "The tree started (and is durable)", body = Created,
         headers(("Location" = String, description = "The root run"))),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The token's principal may not start trees (role `read`)", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, description = "Bad JSON, an unknown agent or model, params that do not fit, a webhook that is no http(s) URL (or with no webhook_secret to sign it)", body = ErrorBody),
        (status = 503, description = "Too many trees running, or the store failed", body = ErrorBody),
    )
)]
pub async fn create_run(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiJson(body): ApiJson<CreateRun>,
) -> Result<Response, ApiError> {
    access::check(&shared, &caller, Action::Start, Subject::Service).await?;
    let request = start_request(&shared, &caller, body)?;
    let (tree, run_id) = shared.start(request).await?;
    Ok(created(&tree, &run_id))
}

/// The start request of a `CreateRun` body (`POST /v1/runs` and
/// `/v1/runs/wait`): the supervisor checks the model override, the limits,
/// the tool rule and the webhook's URL, and tightens the limits against its
/// own, as for every caller; the tree is the caller's. A webhook (asked
/// for, or the service's default) is refused here when the service has no
/// secret to sign it with.
pub(super) fn start_request(
    shared: &Shared,
    caller: &crate::access::Principal,
    body: CreateRun,
) -> Result<StartRequest, ApiError> {
    let webhook = crate::webhooks::asked(&shared.options.webhooks, body.webhook)?;
    let mut limits = body.limits.unwrap_or_default();
    if let Some(rule) = body.tools {
        limits.tools = limits.tools.narrowed(rule);
    }
    Ok(StartRequest {
        agent: body.agent,
        prompt: body.prompt,
        params: body.params,
        model: body.model,
        limits: Some(limits),
        origin: shared.runtime.origin(),
        principal: caller.owner_name(),
        webhook,
        ..StartRequest::default()
    })
}

/// 201 for a run just started (a tree's root, a turn's): its ids, and the
/// run's URL (its id URL-encoded) as the `Location`.
pub(super) fn created(tree_id: &TreeId, run_id: &RunId) -> Response {
    let run_id = run_id.to_string();
    let location = format!("/v1/runs/{}", run_id.replace('/', "%2F"));
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(Created {
            tree_id: tree_id.to_string(),
            run_id,
        }),
    )
        .into_response()
}

#[utoipa::path(
    get, path = "/v1/runs", tag = "runs", params(ListQuery),
    responses(
        (status = 200, description = "Trees, newest first", body = RunList),
        (status = 401, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub async fn list_runs(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<RunList>, ApiError> {
    let limit = query.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 500"));
    }
    let offset = query.offset.unwrap_or(0);
    if offset > 1_000_000_000 {
        return Err(ApiError::invalid("offset must be at most 1000000000"));
    }
    let offset = offset as usize;
    let filter = TreeFilter {
        status: query.status,
        // One more than asked, to know whether a next page exists.
        limit: limit as usize + 1,
        offset,
    };
    // Only the trees the caller may see, selected by the store (so pages
    // count only those).
    let scope = access::scope(&caller);
    let mut runs = shared
        .runtime
        .supervisor()
        .read_store(move |store| match scope {
            Scope::All => store.trees(&filter),
            Scope::Owner(name) => store.trees_of(&filter, &name),
            Scope::Nothing => Ok(Vec::new()),
        })
        .await?;
    let next_offset = (runs.len() > limit as usize).then(|| (offset + limit as usize) as u64);
    runs.truncate(limit as usize);
    Ok(Json(RunList { runs, next_offset }))
}

#[utoipa::path(
    get, path = "/v1/runs/{runId}", tag = "runs",
    params(("runId" = String, Path, description = "A run id, URL-encoded (t1/0.2 is t1%2F0.2)")),
    responses(
        (status = 200, description = "The run's current (live) or stored state", body = RunView),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub async fn get_run(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiPath(run_id): ApiPath<String>,
) -> Result<Json<RunView>, ApiError> {
    let run = super::run_path(run_id)?;
    let run_id = run.to_string();
    access::check(&shared, &caller, Action::Read, Subject::Run(&run)).await?;
    let supervisor = shared.runtime.supervisor();
    if let Some(state) = supervisor.live_state(&run).await {
        return Ok(Json(RunView {
            tree_id: run.tree().to_string(),
            parent_run_id: state.parent_run_id().map(ToString::to_string),
            agent_type: state.agent_type.clone().unwrap_or_default(),
            status: state.status.as_str().to_owned(),
            run_id,
            live: true,
            is_final: false,
            todos: arbor::tools::workspace::notes::latest(&state.message_history),
            state: Some(state),
            value: Value::Null,
        }));
    }
    // Finished, interrupted, or run by another replica: as stored (once the
    // store has everything so far).
    let id = run.clone();
    let stored = supervisor
        .read_store_now(move |store| stored_run(store, &id))
        .await?;
    let arbor_supervisor::store::StoredRun {
        node,
        state,
        is_final,
        inherited,
    } = stored;
    let mode = state
        .as_ref()
        .and_then(|s| s.agent_type.as_deref())
        .and_then(|agent| {
            shared
                .runtime
                .supervisor()
                .catalog()
                .find_template(agent)
                .map(|t| t.output_mode)
        });
    let value = match (mode, &state) {
        (Some(mode), Some(state)) if is_final => {
            arbor_actors::output::output_value(state, mode, inherited)
        }
        _ => Value::Null,
    };
    Ok(Json(RunView {
        tree_id: run.tree().to_string(),
        parent_run_id: node.parent_run_id,
        agent_type: node.agent_type,
        status: node.status,
        run_id,
        live: false,
        is_final,
        todos: state
            .as_ref()
            .and_then(|s| arbor::tools::workspace::notes::latest(&s.message_history)),
        state,
        value,
    }))
}

/// The run `run_id` as the store has it, from its log (its `agentStarted`
/// on); the root of a running tree whose `agentStarted` is not stored yet as
/// the tree's record tells it (no state yet); `Error::UnknownRun` if the
/// store has neither.
fn stored_run(
    store: &dyn arbor_supervisor::store::Store,
    run: &RunId,
) -> Result<arbor_supervisor::store::StoredRun, arbor_supervisor::Error> {
    use arbor_supervisor::Error;
    match store.run(run) {
        Err(Error::UnknownRun(_)) => match store.tree(run.tree()) {
            Ok((record, summary)) if record.root_run_id == *run && !summary.status.is_final() => {
                let node = RunNode {
                    run_id: run.to_string(),
                    parent_run_id: None,
                    agent_type: record.agent,
                    depth: 0,
                    status: "running".to_owned(),
                    error: None,
                    error_kind: None,
                    steps: 0,
                    input_tokens: 0,
                    output_tokens: 0,
                    cost: 0.0,
                    started_ms: record.started_ms,
                    finished_ms: None,
                };
                Ok(arbor_supervisor::store::StoredRun {
                    node,
                    state: None,
                    is_final: false,
                    inherited: 0,
                })
            }
            Ok(_) | Err(Error::UnknownTree(_)) => Err(Error::UnknownRun(run.clone())),
            Err(error) => Err(error),
        },
        run => run,
    }
}

#[utoipa::path(
    get, path = "/v1/runs/{runId}/events", tag = "runs",
    params(
        ("runId" = String, Path, description = "A run id, URL-encoded; the stream has its whole subtree"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id (a seq)"),
        EventsQuery,
    ),
    responses(
        (status = 200, description = "Server-Sent Events: `id` is the event's seq, `event` its type, \
            `data` its JSON ({seq, treeId, runId, atMs, type, ...}); ends after the run's final event",
         content_type = "text/event-stream", body = StreamEvent),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody),
        (status = 429, description = "`too_many_streams`: the tree has `[service] max_event_streams_per_tree` \
            streams open already", body = ErrorBody),
        (status = 503, description = "`busy`: the server has `[service] max_event_streams` streams open \
            already; or `unavailable`", body = ErrorBody),
    )
)]
pub async fn run_events(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiPath(run_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let run = super::run_path(run_id)?;
    access::check(&shared, &caller, Action::Read, Subject::Run(&run)).await?;
    let after = match headers.get("last-event-id") {
        None => 0,
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                ApiError::invalid(
                    "Last-Event-ID must be an event id (a whole number) from this stream",
                )
            })?,
    };
    let deltas = query.deltas.unwrap_or(false);
    Ok(crate::events::stream(shared, run, after, deltas)
        .await?
        .into_response())
}

#[utoipa::path(
    post, path = "/v1/runs/{runId}/cancel", tag = "runs",
    params(("runId" = String, Path, description = "A run id, URL-encoded; its whole subtree is cancelled")),
    responses(
        (status = 202, description = "Cancelling: the run ends as cancelled (here, or on the replica that runs it: `forwarded.forwardedTo`)", body = Cancelled),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The run has already ended", body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub async fn cancel_run(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiPath(run_id): ApiPath<String>,
) -> Result<(StatusCode, Json<Cancelled>), ApiError> {
    let run = super::run_path(run_id)?;
    let run_id = run.to_string();
    access::check(&shared, &caller, Action::Write, Subject::Run(&run)).await?;
    let supervisor = shared.runtime.supervisor();
    let control = Control::One(ControlBody::Cancel {
        run_id: run.clone(),
    });
    let here = async { supervisor.cancel_run(&run) };
    let forwarded = match here_or_forward(&shared, run.tree(), control, here).await? {
        Applied::Here(()) => None,
        // Run by another replica: posted for it.
        Applied::Forwarded { to, .. } => Some(to),
        Applied::Refused(_) => return Err(not_running(supervisor, &run, "").await),
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(Cancelled {
            run_id,
            cancelled: true,
            forwarded,
        }),
    ))
}

/// The tree a (checked) run id is of.
/// A 409 for a run the store has but this process does not run (a 404, or
/// the store's error, when it has none): names the status it is in.
async fn not_running(
    supervisor: &arbor_supervisor::Supervisor,
    run_id: &RunId,
    hint: &str,
) -> ApiError {
    let id = run_id.clone();
    match supervisor.read_store_now(move |store| store.run(&id)).await {
        Ok(stored) => ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "run {run_id} is not running (it is {}){hint}",
                stored.node.status
            ),
        ),
        Err(error) => error.into(),
    }
}

#[utoipa::path(
    post, path = "/v1/runs/{runId}/messages", tag = "runs",
    params(("runId" = String, Path, description = "A run id, URL-encoded")),
    request_body = SteerMessage,
    responses(
        (status = 202, description = "Accepted: the message joins the run's history at its next step boundary", body = Steered),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The run has ended (start a follow-up turn instead) or has not started yet", body = ErrorBody),
        (status = 429, description = "The run holds as many messages not yet taken into its history as it may ([service] max_pending_steers, max_pending_steer_bytes)", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, description = "An empty message or a body that is not a SteerMessage", body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub async fn steer_run(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiPath(run_id): ApiPath<String>,
    ApiJson(body): ApiJson<SteerMessage>,
) -> Result<(StatusCode, Json<Steered>), ApiError> {
    let run = super::run_path(run_id)?;
    let run_id = run.to_string();
    access::check(&shared, &caller, Action::Write, Subject::Run(&run)).await?;
    let supervisor = shared.runtime.supervisor();
    let control = Control::One(ControlBody::Steer {
        run_id: run.clone(),
        text: body.text.clone(),
    });
    let here = supervisor.steer(&run, &body.text);
    let forwarded = match here_or_forward(&shared, run.tree(), control, here).await? {
        Applied::Here(()) => None,
        // Run by another replica: posted for it.
        Applied::Forwarded { to, .. } => Some(to),
        // A stored run has ended; one the store does not know is a 404.
        Applied::Refused(_) => {
            let hint = "; start a follow-up turn instead";
            return Err(not_running(supervisor, &run, hint).await);
        }
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(Steered {
            run_id,
            accepted: true,
            forwarded,
        }),
    ))
}
