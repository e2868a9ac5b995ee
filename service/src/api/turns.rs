//! `/v1/trees/{treeId}/turns`: a tree's follow-up turns (semantics §14).

use std::sync::Arc;

use arbor_actors::{RunId, TreeId};
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::runs::{Created, created};
use crate::Shared;
use crate::access::{self, Action, Caller, Subject};
use crate::error::{ApiError, ApiJson, ApiPath, ErrorBody};

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
    /// Where to post this turn's completion webhook (signed with the
    /// service's `webhook_secret`) when its run ends: an `http(s)` URL; the
    /// service's `[service] webhook` when absent. Kept with the turn while
    /// it waits.
    pub webhook: Option<String>,
}

/// A follow-up turn queued behind the tree's running turn (and the turns
/// queued before it): stored, so it starts when they have ended whatever
/// becomes of this connection or this server.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnQueued {
    /// The tree.
    #[schema(value_type = String)]
    pub tree_id: TreeId,
    /// The run its root will be (`T/0~n`); its events stream at
    /// `/v1/runs/{runId}/events` from now on.
    #[schema(value_type = String)]
    pub run_id: RunId,
    /// Its turn number (`n`).
    pub turn: u32,
    /// Its place in the tree's queue: 1 is the next turn.
    pub position: usize,
    /// Always `true`: it waits.
    pub queued: bool,
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
    let tree_id = super::tree_path(tree_id)?;
    access::check(&shared, &caller, Action::Write, Subject::Tree(&tree_id)).await?;
    let webhook = crate::webhooks::asked(&shared.options.webhooks, body.webhook)?;
    let request = arbor_supervisor::TurnRequest {
        prompt: body.prompt,
        params: body.params,
        multitask: body.multitask.unwrap_or_default(),
        webhook,
    };
    Ok(match shared.turn(tree_id, request).await? {
        crate::turns::Answer::Started { tree, run_id } => created(&tree, &run_id),
        crate::turns::Answer::Queued(turn) => {
            let run_id = turn.run_id();
            let location = format!("/v1/runs/{}", run_id.to_string().replace('/', "%2F"));
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
