//! `/v1/trees/{treeId}/limits`: a tree's budgets in force, and raising them
//! (semantics §13), here or on the replica that runs the tree.

use std::sync::Arc;

use arbor_actors::TreeId;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::forward::{Applied, Control, Forwarded, here_or_forward};
use crate::Shared;
use crate::access::{self, Action, Caller, Subject};
use crate::error::{ApiError, ApiJson, ApiPath, ErrorBody};
use crate::replica::{Budget, ControlBody};

/// A budget raise for a tree another replica runs, posted for it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RaiseForwarded {
    /// The tree.
    #[schema(value_type = String)]
    pub tree_id: TreeId,
    /// Where it went.
    #[serde(flatten)]
    pub forwarded: Forwarded,
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
    #[schema(value_type = String)]
    pub tree_id: TreeId,
    /// Model steps the whole tree may take.
    pub max_steps: Option<u64>,
    /// Tokens the whole tree may use.
    pub max_tokens: Option<u64>,
    /// Credits the whole tree may spend.
    pub max_credits: Option<f64>,
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
    let tree_id = super::tree_path(tree_id)?;
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
    let budget = |r: arbor_supervisor::Raised| Budget {
        max_steps: r.max_steps,
        max_tokens: r.max_tokens,
        max_credits: r.max_credits,
    };
    let control = Control::One(ControlBody::Raise {
        set: budget(set),
        add: budget(add),
    });
    let supervisor = shared.runtime.supervisor();
    let here = async {
        let error = match supervisor.raise_limits(&tree_id, set, add) {
            Ok(now) => return Ok(now),
            // A refused raise, a zero budget, is refused wherever the tree
            // runs: checked first.
            Err(error @ arbor_supervisor::Error::RaiseRefused(_)) => return Err(error),
            Err(error) if supervisor.is_running(&tree_id) => return Err(error),
            Err(error) => error,
        };
        // A tree that has ended is named so (409), not "no tree".
        let tree = tree_id.clone();
        match supervisor
            .read_store_now(move |store| store.status(&tree))
            .await
        {
            Ok(status) if status.is_final() => Err(arbor_supervisor::Error::RaiseEnded {
                tree: tree_id.clone(),
                status,
            }),
            _ => Err(error),
        }
    };
    let now = match here_or_forward(&shared, &tree_id, control, here).await? {
        Applied::Here(now) => now,
        // Run by another replica: posted for it.
        Applied::Forwarded { to, .. } => {
            let body = RaiseForwarded {
                tree_id,
                forwarded: to,
            };
            return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
        }
        Applied::Refused(error) => return Err(error.into()),
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
    let tree_id = super::tree_path(tree_id)?;
    access::check(&shared, &caller, Action::Read, Subject::Tree(&tree_id)).await?;
    let now = shared.runtime.supervisor().budgets(&tree_id).await?;
    Ok(Json(Budgets {
        tree_id,
        max_steps: now.max_steps,
        max_tokens: now.max_tokens,
        max_credits: now.max_credits,
    }))
}
