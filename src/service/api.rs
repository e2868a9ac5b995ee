//! The routes under `/v1`, their request and response bodies, and the OpenAPI
//! document generated from them (utoipa): what is documented is what the
//! handlers take and give.

use std::sync::Arc;

use arbor_actors::AgentState;
use arbor_actors::approval::Decision;
use arbor_supervisor::store::{RunNode, TreeFilter, TreeStatus, TreeSummary};
use arbor_supervisor::{StartRequest, ToolRule, TreeLimits};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, OpenApi, ToSchema};

use super::Shared;
use super::access::{self, Action, Caller, Scope, Subject};
use super::error::{ApiError, ApiJson, ApiPath, ApiQuery, ErrorBody};
use super::replica::{self, Budget, ControlBody, Route};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Arbor",
        description = "Start trees of LLM agents, follow them live, cancel them and read their results.",
        license(name = "MIT OR Apache-2.0")
    ),
    paths(
        create_run, list_runs, get_run, run_events, cancel_run, steer_run, get_tree, list_agents,
        list_approvals, tree_approvals, decide_approval, decide_approvals, raise_limits, get_limits, create_turn,
        healthz, readyz, metrics
    ),
    components(schemas(ErrorBody, TreeSummary, RunNode, TreeLimits, ToolRule, TreeStatus)),
    modifiers(&BearerAuth, &EventTypes),
    security(("bearer" = []))
)]
/// The service's OpenAPI document (`GET /openapi.json`): every route, its
/// schemas and the bearer-token security scheme.
pub struct ApiDoc;

struct BearerAuth;

/// Names every event type a stream sends (`EventType::ALL`, so the document
/// cannot fall behind the events): the `EventType` schema, which a stream
/// event's `event` field is.
struct EventTypes;

impl utoipa::Modify for EventTypes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
        use utoipa::openapi::{Ref, RefOr};
        let names: Vec<&str> = arbor_actors::EventType::ALL
            .iter()
            .map(|t| t.name())
            .collect();
        let schema = ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "The type of a journal entry and of a stream's event (semantics: docs/semantics.md)",
            ))
            .enum_values(Some(names))
            .build();
        let components = openapi.components.get_or_insert_with(Default::default);
        components
            .schemas
            .insert("EventType".into(), RefOr::T(Schema::Object(schema)));
        if let Some(RefOr::T(Schema::Object(stream))) = components.schemas.get_mut("StreamEvent") {
            stream.properties.insert(
                "event".into(),
                RefOr::Ref(Ref::from_schema_name("EventType")),
            );
        }
    }
}

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

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
    /// Limits for this tree; each can only tighten the server's own.
    pub limits: Option<TreeLimits>,
    /// A tool rule for this tree (`allow`/`deny` patterns over tool names such
    /// as `fs/read_file`): it narrows the server's `[policy]`, never widens it.
    pub tools: Option<ToolRule>,
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
}

#[derive(Serialize, ToSchema)]
pub struct TreeView {
    pub tree: TreeSummary,
    /// Every run of the tree in the order they started.
    pub nodes: Vec<RunNode>,
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

/// A control (cancel, decision, message, budget) for a tree another replica
/// of the service runs: posted to the shared store, applied by that replica.
#[derive(Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Forwarded {
    /// The replica that runs the tree (`scope:pid`); `null` while the tree
    /// waits to be adopted (its owner is gone), for the replica that adopts it.
    pub forwarded_to: Option<String>,
    /// What happened, in words.
    pub note: String,
}

impl Forwarded {
    fn to(owner: Option<String>) -> Forwarded {
        Forwarded {
            note: super::replica::forwarded_note(&owner),
            forwarded_to: owner,
        }
    }
}

/// A budget raise for a tree another replica runs, posted for it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RaiseForwarded {
    /// The tree.
    pub tree_id: String,
    /// Where it went.
    #[serde(flatten)]
    pub forwarded: Forwarded,
}

/// Tool calls waiting for a person's decision (semantics §12), oldest first.
#[derive(Serialize, ToSchema)]
pub struct ApprovalList {
    /// The waiting calls.
    pub approvals: Vec<arbor_supervisor::PendingApproval>,
}

// The schema of the body `decide_approval` takes, only: the body parses as
// `arbor_actors::approval::Decision` (which has no `ToSchema`), whose serde
// attributes these restate.
/// A person's decision on a waiting tool call (semantics §12).
#[derive(ToSchema)]
#[serde(tag = "decision", rename_all = "snake_case", deny_unknown_fields)]
#[expect(dead_code, reason = "schema only: the body parses as Decision")]
enum DecisionBody {
    /// Run it, with the model's input or with `input` instead (checked
    /// against the tool's schema).
    Approve {
        /// The input to run it with instead of the model's.
        #[schema(value_type = Option<Object>)]
        input: Option<Value>,
    },
    /// Do not run it: the model reads an error result with the reason.
    Deny {
        /// Why, for the model.
        #[serde(default)]
        reason: String,
    },
}

/// Raises a running tree's budgets (semantics §13): each `max*` sets that
/// budget, each `add*` adds to the one in force.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RaiseLimits {
    /// Model steps the whole tree may take.
    #[schema(minimum = 1)]
    pub max_steps: Option<u64>,
    /// Tokens the whole tree may use.
    #[schema(minimum = 1)]
    pub max_tokens: Option<u64>,
    /// Credits the whole tree may spend.
    #[schema(minimum = 0.0)]
    pub max_credits: Option<f64>,
    /// Steps to add to the budget in force.
    pub add_steps: Option<u64>,
    /// Tokens to add to the budget in force.
    pub add_tokens: Option<u64>,
    /// Credits to add to the budget in force.
    #[schema(minimum = 0.0)]
    pub add_credits: Option<f64>,
}

/// The budgets in force after a raise (absent: unlimited).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Budgets {
    /// The tree.
    pub tree_id: String,
    /// Model steps the whole tree may take.
    pub max_steps: Option<u64>,
    /// Tokens the whole tree may use.
    pub max_tokens: Option<u64>,
    /// Credits the whole tree may spend.
    pub max_credits: Option<f64>,
}

/// A follow-up turn of a tree (semantics §14).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTurn {
    /// The new prompt for the tree's root.
    pub prompt: String,
    /// Params for the root, checked against its input schema.
    #[schema(value_type = Option<Object>)]
    pub params: Option<Value>,
    /// When a turn is running already: `reject` (409), `enqueue` (default:
    /// queued, answered 202 at once) or `interrupt` (the running turn is
    /// cancelled; queued, answered 202).
    pub multitask: Option<arbor_supervisor::Multitask>,
}

/// A follow-up turn queued behind the tree's running turn (and the turns
/// queued before it): stored, so it starts when they have ended whatever
/// becomes of this connection or this server.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnQueued {
    /// The tree.
    pub tree_id: String,
    /// The run its root will be (`T/0~n`); its events stream at
    /// `/v1/runs/{runId}/events` from now on.
    pub run_id: String,
    /// Its turn number (`n`).
    pub turn: u32,
    /// Its place in the tree's queue: 1 is the next turn.
    pub position: usize,
    /// Always `true`: it waits.
    pub queued: bool,
}

/// A decision was taken.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Decided {
    /// The tree of the call.
    pub tree_id: String,
    /// The call decided on.
    pub tool_call_id: String,
    /// Always `true`: the decision is journaled (an `approvalDecided` event),
    /// here or, when forwarded, by the replica that runs the tree.
    pub decided: bool,
    /// Set when another replica runs the tree (see `Cancelled`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarded: Option<Forwarded>,
}

/// One decision over many waiting calls of a tree (semantics §12).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideMany {
    /// `approve` (each call with the model's input) or `deny`.
    pub decision: String,
    /// Why, for the model (`deny` only).
    #[serde(default)]
    pub reason: Option<String>,
    /// Only the calls of this tool (by the name templates use); absent:
    /// every call of the tree waiting now.
    #[serde(default)]
    pub tool: Option<String>,
}

/// Calls decided by one decision.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecidedMany {
    /// The tree.
    pub tree_id: String,
    /// The calls decided, oldest first (each an `approvalDecided` event).
    pub decided: Vec<String>,
    /// Set when another replica runs the tree: the decisions were posted
    /// for it, one per call its journal has waiting.
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

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentInfo {
    pub id: String,
    pub name: Option<String>,
    /// What the agent is for.
    pub description: Option<String>,
    pub model: String,
    pub spawnable_agents: Vec<String>,
    /// The tools its template lists (`SERVER/*`, `SERVER/TOOL`, command and code tools).
    pub tools: Vec<String>,
}

#[derive(Serialize, ToSchema)]
pub struct AgentList {
    pub agents: Vec<AgentInfo>,
}

#[derive(Serialize, ToSchema)]
pub struct Health {
    /// `ok`; readiness: `starting`, `stopping`, `store unavailable` (it
    /// takes no writes for now: the writes wait and are tried again),
    /// `store unreachable` (it answers no read) or `store failed`; health:
    /// `store failed` (it stayed down past `[store] fail_after`, or refused
    /// a write for good: restart the process).
    pub status: String,
    /// Readiness only: whether the store answers (a shared database may be
    /// down while this process is up).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreHealth>,
}

/// What readiness found of the store.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoreHealth {
    /// It answered a read within the readiness bound (2 s).
    pub reachable: bool,
    /// It takes this process's writes (it is not down, and has not failed).
    pub writable: bool,
    /// How long it has taken no writes, in milliseconds, while it is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub down_for_ms: Option<u64>,
    /// Why not, when it is unreachable, down or failed (without credentials).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A stored or live run id from the path (URL-encoded: `t1/0` is `t1%2F0`).
fn run_path(id: String) -> Result<String, ApiError> {
    match id.parse::<arbor_actors::RunId>() {
        Ok(_) => Ok(id),
        Err(e) => Err(ApiError::not_found(format!(
            "no run {id:?} ({e}; URL-encoded in the path: t1%2F0)"
        ))),
    }
}

/// `max_live_agents` as `maxLiveAgents`.
fn camel(snake: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

#[utoipa::path(
    post, path = "/v1/runs", tag = "runs", request_body = CreateRun,
    responses(
        (status = 201, description = "The tree started (and is durable)", body = Created,
         headers(("Location" = String, description = "The root run"))),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The token's principal may not start trees (role `read`)", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, description = "Bad JSON, an unknown agent or model, params that do not fit", body = ErrorBody),
        (status = 503, description = "Too many trees running, or the store failed", body = ErrorBody),
    )
)]
pub async fn create_run(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiJson(body): ApiJson<CreateRun>,
) -> Result<Response, ApiError> {
    access::check(&shared, &caller, Action::Start, Subject::Service).await?;
    if let Some(limits) = &body.limits
        && let Some((key, problem)) = limits.problems().into_iter().next()
    {
        // The request's own spelling of the key: maxLiveAgents, deadlineMs.
        let key = match key {
            "deadline" => "deadlineMs".to_owned(),
            key => camel(key),
        };
        return Err(ApiError::invalid(format!("limits.{key}: {problem}")));
    }
    if let Some(rule) = &body.tools
        && let Some((pattern, why)) = rule.problems().into_iter().next()
    {
        return Err(ApiError::invalid(format!(
            "tools: pattern {pattern:?}: {why}"
        )));
    }
    // Every agent of the tree goes on `model`: refused before the tree
    // starts when that model's provider would refuse an agent's options.
    if let (Some(model), Some(config)) = (&body.model, shared.runtime.config()) {
        config
            .check_model_override(&body.agent, model)
            .map_err(|why| ApiError::invalid(format!("model: {why}")))?;
    }
    let supervisor = shared.runtime.supervisor();
    let mut limits = match &body.limits {
        Some(asked) => supervisor.default_limits().tighten(asked),
        None => supervisor.default_limits().clone(),
    };
    if let Some(rule) = body.tools {
        limits.tools = limits.tools.narrowed(rule);
    }
    let request = StartRequest {
        agent: body.agent,
        prompt: body.prompt,
        params: body.params,
        model: body.model,
        limits: Some(limits),
        origin: shared.runtime.origin(),
        // The tree is the caller's.
        principal: caller.owner_name(),
        ..StartRequest::default()
    };
    let (tree, run_id) = shared.start(request).await?;
    Ok(created(tree.to_string(), run_id))
}

/// 201 for a run just started (a tree's root, a turn's): its ids, and the
/// run's URL (its id URL-encoded) as the `Location`.
fn created(tree_id: String, run_id: String) -> Response {
    let location = format!("/v1/runs/{}", run_id.replace('/', "%2F"));
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(Created { tree_id, run_id }),
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
    let run_id = run_path(run_id)?;
    access::check(&shared, &caller, Action::Read, Subject::Run(&run_id)).await?;
    let supervisor = shared.runtime.supervisor();
    if let Some(state) = supervisor.live_state(&run_id).await {
        return Ok(Json(RunView {
            tree_id: tree_of(&run_id).to_owned(),
            parent_run_id: state.ancestor_run_ids.last().cloned(),
            agent_type: state.agent_type.clone().unwrap_or_default(),
            status: state.status.as_str().to_owned(),
            run_id,
            live: true,
            is_final: false,
            state: Some(state),
            value: Value::Null,
        }));
    }
    // Finished, interrupted, or run by another replica: as stored (once the
    // store has everything so far).
    let id = run_id.clone();
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
        tree_id: tree_of(&run_id).to_owned(),
        parent_run_id: node.parent_run_id,
        agent_type: node.agent_type,
        status: node.status,
        run_id,
        live: false,
        is_final,
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
    run_id: &str,
) -> Result<arbor_supervisor::store::StoredRun, arbor_supervisor::Error> {
    use arbor_supervisor::Error;
    match store.run(run_id) {
        Err(Error::UnknownRun(_)) => match store.tree(tree_of(run_id)) {
            Ok((record, summary)) if record.root_run_id == run_id && !summary.status.is_final() => {
                let node = RunNode {
                    run_id: run_id.to_owned(),
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
            Ok(_) | Err(Error::UnknownTree(_)) => Err(Error::UnknownRun(run_id.to_owned())),
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
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let run_id = run_path(run_id)?;
    access::check(&shared, &caller, Action::Read, Subject::Run(&run_id)).await?;
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
    Ok(super::events::stream(shared, run_id, after)
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
    let run_id = run_path(run_id)?;
    access::check(&shared, &caller, Action::Write, Subject::Run(&run_id)).await?;
    let supervisor = shared.runtime.supervisor();
    if supervisor.cancel_run(&run_id).is_ok() {
        return Ok((
            StatusCode::ACCEPTED,
            Json(Cancelled {
                run_id,
                cancelled: true,
                forwarded: None,
            }),
        ));
    }
    // Run by another replica: posted for it.
    if let Some(owner) = elsewhere(&shared, tree_of(&run_id)).await? {
        let control = ControlBody::Cancel {
            run_id: run_id.clone(),
        };
        replica::forward(&shared, tree_of(&run_id), &control).await?;
        return Ok((
            StatusCode::ACCEPTED,
            Json(Cancelled {
                run_id,
                cancelled: true,
                forwarded: Some(Forwarded::to(owner)),
            }),
        ));
    }
    Err(not_running(supervisor, run_id, "").await)
}

/// The tree a (checked) run id is of.
fn tree_of(run_id: &str) -> &str {
    run_id.split_once('/').map_or(run_id, |(tree, _)| tree)
}

/// `Some(owner)` when another replica runs the tree (or will, once it adopts
/// it: `Some(None)`); `None` when this process runs it or it runs nowhere
/// (the local route answers then, as it always has).
async fn elsewhere(shared: &Shared, tree_id: &str) -> Result<Option<Option<String>>, ApiError> {
    Ok(match replica::locate(shared, tree_id).await? {
        Route::Forward { owner } => Some(owner),
        Route::Local | Route::Ended(_) | Route::Unknown => None,
    })
}

/// A 409 for a run the store has but this process does not run (a 404, or
/// the store's error, when it has none): names the status it is in.
async fn not_running(
    supervisor: &arbor_supervisor::Supervisor,
    run_id: String,
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
    let run_id = run_path(run_id)?;
    access::check(&shared, &caller, Action::Write, Subject::Run(&run_id)).await?;
    let supervisor = shared.runtime.supervisor();
    match supervisor.steer(&run_id, &body.text).await {
        Ok(()) => Ok((
            StatusCode::ACCEPTED,
            Json(Steered {
                run_id,
                accepted: true,
                forwarded: None,
            }),
        )),
        // Not running here: another replica may run it (posted for it);
        // else a stored run has ended, and one the store does not know is a
        // 404.
        Err(arbor_supervisor::Error::UnknownRun(_)) => {
            if let Some(owner) = elsewhere(&shared, tree_of(&run_id)).await? {
                let control = ControlBody::Steer {
                    run_id: run_id.clone(),
                    text: body.text.clone(),
                };
                replica::forward(&shared, tree_of(&run_id), &control).await?;
                return Ok((
                    StatusCode::ACCEPTED,
                    Json(Steered {
                        run_id,
                        accepted: true,
                        forwarded: Some(Forwarded::to(owner)),
                    }),
                ));
            }
            Err(not_running(supervisor, run_id, "; start a follow-up turn instead").await)
        }
        Err(error) => Err(error.into()),
    }
}

#[utoipa::path(
    get, path = "/v1/approvals", tag = "approvals",
    responses(
        (status = 200, description = "Every tool call waiting for a decision, in every running tree the token's principal may see, whichever replica runs it (read from its journal when another does)", body = ApprovalList),
        (status = 401, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub async fn list_approvals(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
) -> Result<Json<ApprovalList>, ApiError> {
    let supervisor = shared.runtime.supervisor();
    // Every tree that runs, here or on another replica (or waits to be
    // adopted), of those the caller may see, as the store lists them.
    let scope = access::scope(&caller);
    let listing = scope.clone();
    let listed = supervisor
        .read_store(move |store| {
            let mut trees = Vec::new();
            for status in [TreeStatus::Running, TreeStatus::Interrupted] {
                let filter = TreeFilter {
                    status: Some(status),
                    limit: 0,
                    offset: 0,
                };
                let found = match &listing {
                    Scope::All => store.trees(&filter)?,
                    Scope::Owner(name) => store.trees_of(&filter, name)?,
                    Scope::Nothing => Vec::new(),
                };
                trees.extend(found.into_iter().map(|t| (t.tree_id, t.principal)));
            }
            Ok(trees)
        })
        .await?;
    // This replica's trees' calls as it holds them (only those of trees the
    // caller may see); the others' from their journals.
    let local = supervisor.approvals(None);
    let mut approvals = access::readable(&shared, &caller, local, |a| &a.tree_id).await?;
    let elsewhere: Vec<(String, Option<String>)> = listed
        .into_iter()
        .filter(|(tree, _)| !supervisor.is_running(tree))
        .collect();
    let held: std::collections::HashSet<(String, String)> = approvals
        .iter()
        .map(|a| (a.tree_id.clone(), a.tool_call_id.clone()))
        .collect();
    let remote = replica::pending_elsewhere(&shared, elsewhere, &scope).await?;
    approvals.extend(
        remote
            .into_iter()
            .filter(|a| !held.contains(&(a.tree_id.clone(), a.tool_call_id.clone()))),
    );
    // Oldest first, across the replicas.
    approvals.sort_by_key(|a| a.requested_ms);
    Ok(Json(ApprovalList { approvals }))
}

#[utoipa::path(
    get, path = "/v1/trees/{treeId}/approvals", tag = "approvals",
    params(("treeId" = String, Path)),
    responses(
        (status = 200, description = "The tree's tool calls waiting for a decision (read from its journal when another replica runs it)", body = ApprovalList),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub async fn tree_approvals(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiPath(tree_id): ApiPath<String>,
) -> Result<Json<ApprovalList>, ApiError> {
    access::check(&shared, &caller, Action::Read, Subject::Tree(&tree_id)).await?;
    let supervisor = shared.runtime.supervisor();
    if supervisor.is_running(&tree_id) {
        let approvals = supervisor.approvals(Some(&tree_id));
        return Ok(Json(ApprovalList { approvals }));
    }
    // Run by another replica: its approvals are in the tree's journal.
    if elsewhere(&shared, &tree_id).await?.is_some() {
        let tree = tree_id.clone();
        let journal = supervisor
            .read_store(move |store| store.events(&tree, 0))
            .await?;
        let approvals = replica::pending_from_journal(&tree_id, &journal);
        return Ok(Json(ApprovalList { approvals }));
    }
    let approvals = supervisor.approvals(Some(&tree_id));
    Ok(Json(ApprovalList { approvals }))
}

#[utoipa::path(
    post, path = "/v1/trees/{treeId}/approvals/{callId}", tag = "approvals",
    params(("treeId" = String, Path), ("callId" = String, Path, description = "The tool call id, URL-encoded (it holds the run id: t1%2F0.1-s2-c0)")),
    request_body = DecisionBody,
    responses(
        (status = 202, description = "Decided: the call runs (or answers the model with the denial) once its step's last decision is in", body = Decided),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No call of that id waits in that tree", body = ErrorBody),
        (status = 409, description = "The run has ended", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, description = "Not a decision, or an edited input the tool refuses", body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub async fn decide_approval(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiPath((tree_id, call_id)): ApiPath<(String, String)>,
    ApiJson(decision): ApiJson<Decision>,
) -> Result<(StatusCode, Json<Decided>), ApiError> {
    access::check(&shared, &caller, Action::Write, Subject::Tree(&tree_id)).await?;
    let supervisor = shared.runtime.supervisor();
    let forwarded = if supervisor.is_running(&tree_id) {
        None
    } else {
        elsewhere(&shared, &tree_id).await?
    };
    let forwarded = match forwarded {
        // Run by another replica: posted for it (which checks the call).
        Some(owner) => {
            let control = ControlBody::Decide {
                call_id: call_id.clone(),
                decision,
            };
            replica::forward(&shared, &tree_id, &control).await?;
            Some(Forwarded::to(owner))
        }
        None => {
            supervisor.decide(&tree_id, &call_id, decision).await?;
            None
        }
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(Decided {
            tree_id,
            tool_call_id: call_id,
            decided: true,
            forwarded,
        }),
    ))
}

#[utoipa::path(
    post, path = "/v1/trees/{treeId}/approvals", tag = "approvals",
    params(("treeId" = String, Path)),
    request_body = DecideMany,
    responses(
        (status = 200, description = "Decided: every call of the tree (or of `tool`) waiting now, each journaled as its own decision", body = DecidedMany),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No call (of that tool) waits in that tree", body = ErrorBody),
        (status = 409, description = "The tree has ended", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, description = "Not approve or deny, or a reason given to an approval", body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub async fn decide_approvals(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiPath(tree_id): ApiPath<String>,
    ApiJson(body): ApiJson<DecideMany>,
) -> Result<Json<DecidedMany>, ApiError> {
    access::check(&shared, &caller, Action::Write, Subject::Tree(&tree_id)).await?;
    let decision = match (body.decision.as_str(), body.reason) {
        ("approve", None) => Decision::Approve { input: None },
        ("deny", reason) => Decision::Deny {
            reason: reason.unwrap_or_default(),
        },
        ("approve", Some(_)) => {
            return Err(ApiError::invalid(
                "a reason is a denial's: approve takes none".to_owned(),
            ));
        }
        (other, _) => {
            return Err(ApiError::invalid(format!(
                "decision {other:?}: approve or deny"
            )));
        }
    };
    let supervisor = shared.runtime.supervisor();
    if !supervisor.is_running(&tree_id)
        && let Some(owner) = elsewhere(&shared, &tree_id).await?
    {
        // Run by another replica: one decision posted per call its journal has waiting.
        let tree = tree_id.clone();
        let journal = supervisor
            .read_store(move |store| store.events(&tree, 0))
            .await?;
        let mut decided = Vec::new();
        for call in replica::pending_from_journal(&tree_id, &journal) {
            if body.tool.as_ref().is_some_and(|t| *t != call.tool) {
                continue;
            }
            let control = ControlBody::Decide {
                call_id: call.tool_call_id.clone(),
                decision: decision.clone(),
            };
            replica::forward(&shared, &tree_id, &control).await?;
            decided.push(call.tool_call_id);
        }
        return Ok(Json(DecidedMany {
            tree_id,
            decided,
            forwarded: Some(Forwarded::to(owner)),
        }));
    }
    let decided = supervisor
        .decide_all(&tree_id, body.tool.as_deref(), decision)
        .await?;
    Ok(Json(DecidedMany {
        tree_id,
        decided,
        forwarded: None,
    }))
}

#[utoipa::path(
    post, path = "/v1/trees/{treeId}/turns", tag = "runs",
    params(("treeId" = String, Path)),
    request_body = CreateTurn,
    responses(
        (status = 201, description = "The turn started: its root is a new run (`T/0~n`) of the tree's root agent, from its final state", body = Created,
         headers(("Location" = String, description = "The new turn's run"))),
        (status = 202, description = "The tree is running a turn (here, on another replica, or cut short and waiting for its resume): the turn is queued in the store behind it (`enqueue`, or `interrupt`, which also cancels it) and starts when the turns before it end, whatever becomes of this connection", body = TurnQueued,
         headers(("Location" = String, description = "The queued turn's run to be"))),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No stored tree of that id", body = ErrorBody),
        (status = 409, description = "A turn is running (`multitask = reject`)", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody),
        (status = 429, description = "As many turns are queued for the tree as it may hold ([service] max_queued_turns)", body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub async fn create_turn(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiPath(tree_id): ApiPath<String>,
    ApiJson(body): ApiJson<CreateTurn>,
) -> Result<Response, ApiError> {
    access::check(&shared, &caller, Action::Write, Subject::Tree(&tree_id)).await?;
    let request = arbor_supervisor::TurnRequest {
        prompt: body.prompt,
        params: body.params,
        multitask: body.multitask.unwrap_or_default(),
    };
    Ok(match shared.turn(tree_id, request).await? {
        super::turns::Answer::Started { tree, run_id } => created(tree.to_string(), run_id),
        super::turns::Answer::Queued(turn) => {
            let run_id = turn.run_id();
            let location = format!("/v1/runs/{}", run_id.replace('/', "%2F"));
            (
                StatusCode::ACCEPTED,
                [(header::LOCATION, location)],
                Json(TurnQueued {
                    tree_id: turn.tree_id,
                    run_id,
                    turn: turn.turn,
                    position: turn.position,
                    queued: true,
                }),
            )
                .into_response()
        }
    })
}

#[utoipa::path(
    patch, path = "/v1/trees/{treeId}/limits", tag = "runs",
    params(("treeId" = String, Path)),
    request_body = RaiseLimits,
    responses(
        (status = 200, description = "Raised: the budgets in force; agents paused on a spent budget go on", body = Budgets),
        (status = 202, description = "Another replica runs the tree: the raise was posted for it (`forwardedTo`)", body = RaiseForwarded),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No tree of that id runs here", body = ErrorBody),
        (status = 409, description = "The tree has ended: only a running tree's budgets are raised", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, description = "Nothing to raise, a negative or non-finite credit amount, or a body that is not RaiseLimits", body = ErrorBody),
    )
)]
pub async fn raise_limits(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiPath(tree_id): ApiPath<String>,
    ApiJson(body): ApiJson<RaiseLimits>,
) -> Result<Response, ApiError> {
    access::check(&shared, &caller, Action::Write, Subject::Tree(&tree_id)).await?;
    let set = arbor_supervisor::Raised {
        max_steps: body.max_steps,
        max_tokens: body.max_tokens,
        max_credits: body.max_credits,
    };
    let add = arbor_supervisor::Raised {
        max_steps: body.add_steps,
        max_tokens: body.add_tokens,
        max_credits: body.add_credits,
    };
    let supervisor = shared.runtime.supervisor();
    let now = match supervisor.raise_limits(&tree_id, set, add) {
        Ok(now) => now,
        Err(error) => {
            // Run by another replica: posted for it. (A refused raise, a
            // zero budget, is refused here all the same: checked first.)
            if matches!(error, arbor_supervisor::Error::RaiseRefused(_))
                || supervisor.is_running(&tree_id)
            {
                return Err(error.into());
            }
            arbor_supervisor::Raised::check_raise(&set, &add)
                .map_err(arbor_supervisor::Error::from)?;
            let Some(owner) = elsewhere(&shared, &tree_id).await? else {
                // A tree that has ended is named so (409), not "no tree".
                let tree = tree_id.clone();
                if let Ok(status) = supervisor
                    .read_store_now(move |store| store.status(&tree))
                    .await
                    && status.is_final()
                {
                    return Err(arbor_supervisor::Error::RaiseEnded {
                        tree: tree_id,
                        status,
                    }
                    .into());
                }
                return Err(error.into());
            };
            let budget = |r: arbor_supervisor::Raised| Budget {
                max_steps: r.max_steps,
                max_tokens: r.max_tokens,
                max_credits: r.max_credits,
            };
            let control = ControlBody::Raise {
                set: budget(set),
                add: budget(add),
            };
            replica::forward(&shared, &tree_id, &control).await?;
            let body = RaiseForwarded {
                tree_id,
                forwarded: Forwarded::to(owner),
            };
            return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
        }
    };
    Ok(Json(Budgets {
        tree_id,
        max_steps: now.max_steps,
        max_tokens: now.max_tokens,
        max_credits: now.max_credits,
    })
    .into_response())
}

#[utoipa::path(
    get, path = "/v1/trees/{treeId}/limits", tag = "runs",
    params(("treeId" = String, Path)),
    responses(
        (status = 200, description = "The tree's budgets in force: its limits with every raise over them (for a tree that has ended too)", body = Budgets),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub async fn get_limits(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiPath(tree_id): ApiPath<String>,
) -> Result<Json<Budgets>, ApiError> {
    access::check(&shared, &caller, Action::Read, Subject::Tree(&tree_id)).await?;
    let now = shared.runtime.supervisor().budgets(&tree_id).await?;
    Ok(Json(Budgets {
        tree_id,
        max_steps: now.max_steps,
        max_tokens: now.max_tokens,
        max_credits: now.max_credits,
    }))
}

#[utoipa::path(
    get, path = "/v1/trees/{treeId}", tag = "runs",
    params(("treeId" = String, Path)),
    responses(
        (status = 200, description = "The spawn tree with status, usage and cost per node", body = TreeView),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub async fn get_tree(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiPath(tree_id): ApiPath<String>,
) -> Result<Json<TreeView>, ApiError> {
    access::check(&shared, &caller, Action::Read, Subject::Tree(&tree_id)).await?;
    let (tree, nodes) = shared
        .runtime
        .supervisor()
        .read_store_now(move |store| {
            let (_, summary) = store.tree(&tree_id)?;
            Ok((summary, store.runs(&tree_id)?))
        })
        .await?;
    Ok(Json(TreeView { tree, nodes }))
}

#[utoipa::path(
    get, path = "/v1/agents", tag = "agents",
    responses((status = 200, body = AgentList), (status = 401, body = ErrorBody))
)]
pub async fn list_agents(State(shared): State<Arc<Shared>>) -> Json<AgentList> {
    let mut agents: Vec<AgentInfo> = shared
        .runtime
        .supervisor()
        .catalog()
        .templates()
        .map(|t| AgentInfo {
            id: t.id.clone(),
            name: (!t.display_name.is_empty()).then(|| t.display_name.clone()),
            description: t.description.clone(),
            model: t.model.clone(),
            spawnable_agents: t.spawnable_agents.clone(),
            tools: t.tools.clone(),
        })
        .collect();
    agents.sort_by(|a, b| a.id.cmp(&b.id));
    Json(AgentList { agents })
}

#[utoipa::path(
    get, path = "/healthz", tag = "operations", security(()),
    responses(
        (status = 200, description = "The process serves requests", body = Health),
        (status = 503, description = "The store failed for good (it stayed down past `[store] fail_after`, or refused a write): restart the process", body = Health),
    )
)]
pub async fn healthz(State(shared): State<Arc<Shared>>) -> (StatusCode, Json<Health>) {
    match shared.runtime.supervisor().store_failure() {
        None => (
            StatusCode::OK,
            Json(Health {
                status: "ok".into(),
                store: None,
            }),
        ),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Health {
                status: "store failed".into(),
                store: Some(StoreHealth {
                    reachable: false,
                    writable: false,
                    down_for_ms: None,
                    error: Some(crate::config::store::redact(&reason)),
                }),
            }),
        ),
    }
}

#[utoipa::path(
    get, path = "/readyz", tag = "operations", security(()),
    responses(
        (status = 200, description = "Ready: interrupted trees resumed, the store writable", body = Health),
        (status = 503, description = "Starting, stopping, the store down, failed or not answering", body = Health),
    )
)]
pub async fn readyz(State(shared): State<Arc<Shared>>) -> (StatusCode, Json<Health>) {
    let store = store_health(&shared).await;
    let status = match shared.readiness() {
        "ok" if !store.writable => "store unavailable",
        "ok" if !store.reachable => "store unreachable",
        status => status,
    };
    let code = if status == "ok" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        Json(Health {
            status: status.into(),
            store: Some(store),
        }),
    )
}

/// Whether the store takes writes (the writer's word: down for now, or
/// failed), and answers a small read (one tree listed) in time.
async fn store_health(shared: &Shared) -> StoreHealth {
    let supervisor = shared.runtime.supervisor();
    let redact = |text: &str| crate::config::store::redact(text);
    let (writable, down_for_ms, why) = match (supervisor.store_failure(), supervisor.store_down()) {
        (Some(reason), _) => (false, None, Some(redact(&reason))),
        (None, Some(down)) => (false, Some(down.for_ms), Some(redact(&down.to_string()))),
        (None, None) => (true, None, None),
    };
    let filter = TreeFilter {
        status: None,
        limit: 1,
        offset: 0,
    };
    let read = supervisor.read_store(move |store| store.trees(&filter));
    let (reachable, error) =
        match tokio::time::timeout(std::time::Duration::from_secs(2), read).await {
            Ok(Ok(_)) => (true, None),
            Ok(Err(error)) => (false, Some(redact(&error.to_string()))),
            Err(_) => (false, Some("no answer within 2 s".into())),
        };
    StoreHealth {
        reachable,
        writable,
        down_for_ms,
        // The writer's reason first: it says what the store said to a write.
        error: why.or(error),
    }
}

#[utoipa::path(
    get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "Prometheus metrics (OpenMetrics text)",
         content_type = "application/openmetrics-text", body = String),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The token's principal has role `user`", body = ErrorBody),
    )
)]
pub async fn metrics(State(shared): State<Arc<Shared>>, Caller(caller): Caller) -> Response {
    if let Err(error) = access::check(&shared, &caller, Action::Operate, Subject::Service).await {
        return error.into_response();
    }
    let supervisor = shared.runtime.supervisor();
    let approvals_pending = supervisor.approvals(None).len();
    let down = supervisor.store_down();
    let writable = supervisor.store().is_some() && supervisor.store_takes_writes().is_ok();
    shared.metrics.store_state(writable, down.map(|d| d.for_ms));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared
            .replica
            .append_to(shared.metrics.encode(approvals_pending)),
    )
        .into_response()
}

/// The service's OpenAPI document as served at `GET /openapi.json`: what
/// utoipa derives from the routes (with `extend`'s additions, the metrics
/// route's), and the schemas of the bodies that are not Rust types of this
/// crate: the run's `AgentState` (semantics §2) and every event a stream
/// sends (`StreamEventData`, one schema per `EventType`). `RunView.state`
/// refers to `AgentState`, `StreamEvent.data` to `StreamEventData`.
pub fn document(extend: impl FnOnce(&mut utoipa::openapi::OpenApi)) -> Value {
    let mut document = ApiDoc::openapi();
    extend(&mut document);
    let mut json = serde_json::to_value(&document).unwrap_or_default();
    let schemas = &mut json["components"]["schemas"];
    if let Value::Object(schemas) = schemas {
        schemas.extend(payload::schemas());
    }
    schemas["RunView"]["properties"]["state"] = serde_json::json!({
        "description": "The run's AgentState (semantics §2). Null while none is stored and this \
            process does not run it: a run another replica runs has none until its first \
            checkpoint (the end of its first step).",
        "oneOf": [{"$ref": "#/components/schemas/AgentState"}, {"type": "null"}]
    });
    schemas["RunView"]["properties"]["value"] = serde_json::json!({
        "description": "What a finished run hands back to its parent (or the caller), by its \
            agent's output mode; null while it runs.",
        "oneOf": [{"$ref": "#/components/schemas/RunValue"}, {"type": "null"}]
    });
    schemas["StreamEvent"]["properties"]["data"]["contentSchema"] =
        serde_json::json!({"$ref": "#/components/schemas/StreamEventData"});
    json
}

/// `AgentState` and the stream events' payloads (api/payload.rs).
mod payload;

#[cfg(test)]
mod tests {
    use utoipa::OpenApi as _;

    use super::ApiDoc;

    /// The document names every event a stream can send (a new event kind is
    /// in it without an edit here) and every route of approvals, steering
    /// and budgets.
    #[test]
    fn the_document_names_every_event_type_and_the_new_routes() {
        let json = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let listed: Vec<&str> = json["components"]["schemas"]["EventType"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        for t in arbor_actors::EventType::ALL {
            assert!(listed.contains(&t.name()), "{} missing", t.name());
        }
        for name in [
            "approvalRequested",
            "approvalDecided",
            "steered",
            "budgetReached",
        ] {
            assert!(listed.contains(&name), "{name}");
        }
        assert_eq!(
            json["components"]["schemas"]["StreamEvent"]["properties"]["event"]["$ref"],
            "#/components/schemas/EventType"
        );
        for path in [
            "/v1/approvals",
            "/v1/trees/{treeId}/approvals",
            "/v1/trees/{treeId}/approvals/{callId}",
            "/v1/trees/{treeId}/limits",
            "/v1/runs/{runId}/messages",
        ] {
            assert!(json["paths"][path].is_object(), "{path}");
        }
    }
}
