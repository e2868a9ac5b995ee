//! `/v1/trees/{treeId}`: a tree's spawn tree.

use std::sync::Arc;

use arbor_supervisor::store::{RunNode, TreeSummary};
use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use crate::Shared;
use crate::access::{self, Action, Caller, Subject};
use crate::error::{ApiError, ApiPath, ErrorBody};

#[derive(Serialize, ToSchema)]
pub struct TreeView {
    pub tree: TreeSummary,
    /// Every run of the tree in the order they started.
    pub nodes: Vec<RunNode>,
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
    let tree_id = super::tree_path(tree_id)?;
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
