//! `/v1/approvals` and `/v1/trees/{treeId}/approvals`: tool calls waiting
//! for a person's decision and the decisions (semantics §12), here or on the
//! replica that runs the tree.

use std::sync::Arc;

use arbor_actors::TreeId;
use arbor_actors::approval::Decision;
use arbor_supervisor::store::{TreeFilter, TreeStatus};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::forward::{Applied, Control, Forwarded, here_or_forward};
use crate::Shared;
use crate::access::{self, Action, Caller, Scope, Subject};
use crate::error::{ApiError, ApiJson, ApiPath, ErrorBody};
use crate::replica::{self, ControlBody, Route};

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
        /// "Always allow" (the OpenAI Agents SDK's `always_approve`): also
        /// allow the call's tool for good in this tree: its other waiting
        /// calls are approved, and its later calls in the tree (any agent,
        /// any depth, later turns) run without asking. Not with `input`.
        #[serde(default)]
        always: bool,
    },
    /// Do not run it: the model reads an error result with the reason.
    Deny {
        /// Why, for the model.
        #[serde(default)]
        reason: String,
    },
}

/// The body of `decide_approval`: a decision, and whether it is "always"
/// (`{"decision": "approve", "always": true}`).
pub struct DecisionRequest {
    /// The decision on the call.
    pub decision: Decision,
    /// Also allow the call's tool for good in the tree.
    pub always: bool,
}

impl<'de> Deserialize<'de> for DecisionRequest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut body = serde_json::Map::<String, Value>::deserialize(d)?;
        let always = match body.remove("always") {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "always is true or false, not {other}"
                )));
            }
        };
        let decision = Decision::deserialize(Value::Object(body)).map_err(D::Error::custom)?;
        match (&decision, always) {
            (Decision::Deny { .. }, true) => Err(D::Error::custom(
                "always is an approval's: there is no always deny (deny the calls, one or all)",
            )),
            (Decision::Approve { input: Some(_) }, true) => Err(D::Error::custom(
                "always approves with the model's inputs: an edited input is one call's",
            )),
            _ => Ok(DecisionRequest { decision, always }),
        }
    }
}

/// A decision was taken.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Decided {
    /// The tree of the call.
    #[schema(value_type = String)]
    pub tree_id: TreeId,
    /// The call decided on.
    pub tool_call_id: String,
    /// Always `true`: the decision is journaled (an `approvalDecided` event),
    /// here or, when forwarded, by the replica that runs the tree.
    pub decided: bool,
    /// With `always`: the calls approved (this one, and the other calls of
    /// its tool waiting in the tree), oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub approved: Vec<String>,
    /// With `always`: the tool now allowed for good in the tree (an
    /// `approvalRuleAdded` event); empty when forwarded (the replica that
    /// runs the tree adds it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub always_allowed: Vec<String>,
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
    /// `approve` only: also allow each of their tools for good in this
    /// tree ("always allow"): later calls of them run without asking.
    #[serde(default)]
    pub always: bool,
}

/// Calls decided by one decision.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecidedMany {
    /// The tree.
    #[schema(value_type = String)]
    pub tree_id: TreeId,
    /// The calls decided, oldest first (each an `approvalDecided` event).
    pub decided: Vec<String>,
    /// With `always`: the tools now allowed for good in the tree.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub always_allowed: Vec<String>,
    /// Set when another replica runs the tree: the decisions were posted
    /// for it, one per call its journal has waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarded: Option<Forwarded>,
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
    let elsewhere: Vec<(TreeId, Option<String>)> = listed
        .into_iter()
        .filter(|(tree, _)| !supervisor.is_running(tree))
        .collect();
    let held: std::collections::HashSet<(TreeId, String)> = approvals
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
    let tree_id = super::tree_path(tree_id)?;
    access::check(&shared, &caller, Action::Read, Subject::Tree(&tree_id)).await?;
    let supervisor = shared.runtime.supervisor();
    if supervisor.is_running(&tree_id) {
        let approvals = supervisor.approvals(Some(&tree_id));
        return Ok(Json(ApprovalList { approvals }));
    }
    // Run by another replica: its approvals are in the tree's journal.
    if let Route::Forward { .. } = replica::locate(&shared, &tree_id).await? {
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
        (status = 202, description = "Decided: the call runs (or answers the model with the denial) once its step's last decision is in; with `always`, the other waiting calls of its tool are approved too and its later calls in the tree run without asking", body = Decided),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No call of that id waits in that tree", body = ErrorBody),
        (status = 409, description = "The run has ended", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, description = "Not a decision, an edited input the tool refuses, or `always` with a denial or an edited input", body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub async fn decide_approval(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiPath((tree_id, call_id)): ApiPath<(String, String)>,
    ApiJson(request): ApiJson<DecisionRequest>,
) -> Result<(StatusCode, Json<Decided>), ApiError> {
    let tree_id = super::tree_path(tree_id)?;
    access::check(&shared, &caller, Action::Write, Subject::Tree(&tree_id)).await?;
    let supervisor = shared.runtime.supervisor();
    if request.always {
        return approve_always(&shared, tree_id, call_id).await;
    }
    let decision = request.decision;
    let control = Control::One(ControlBody::Decide {
        call_id: call_id.clone(),
        decision: decision.clone(),
    });
    let here = supervisor.decide(&tree_id, &call_id, decision);
    let forwarded = match here_or_forward(&shared, &tree_id, control, here).await? {
        Applied::Here(()) => None,
        // Run by another replica: posted for it (which checks the call).
        Applied::Forwarded { to, .. } => Some(to),
        Applied::Refused(error) => return Err(error.into()),
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(Decided {
            tree_id,
            tool_call_id: call_id,
            decided: true,
            approved: Vec::new(),
            always_allowed: Vec::new(),
            forwarded,
        }),
    ))
}

/// `{"decision": "approve", "always": true}` on one call: approved, with
/// the other waiting calls of its tool, and the tool allowed for good in
/// the tree (`Supervisor::approve_always`), here or by the replica that
/// runs it.
async fn approve_always(
    shared: &Shared,
    tree_id: TreeId,
    call_id: String,
) -> Result<(StatusCode, Json<Decided>), ApiError> {
    let supervisor = shared.runtime.supervisor();
    let control = Control::One(ControlBody::ApproveAlways {
        call_id: call_id.clone(),
    });
    let here = supervisor.approve_always(&tree_id, &call_id);
    let (now, forwarded) = match here_or_forward(shared, &tree_id, control, here).await? {
        Applied::Here(now) => (now, None),
        Applied::Forwarded { to, .. } => (
            arbor_supervisor::AlwaysAllowedNow {
                tools: Vec::new(),
                approved: vec![call_id.clone()],
            },
            Some(to),
        ),
        Applied::Refused(error) => return Err(error.into()),
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(Decided {
            tree_id,
            tool_call_id: call_id,
            decided: true,
            approved: now.approved,
            always_allowed: now.tools,
            forwarded,
        }),
    ))
}

#[utoipa::path(
    post, path = "/v1/trees/{treeId}/approvals", tag = "approvals",
    params(("treeId" = String, Path)),
    request_body = DecideMany,
    responses(
        (status = 200, description = "Decided: every call of the tree (or of `tool`) waiting now, each journaled as its own decision; with `always`, their tools are allowed for good in the tree", body = DecidedMany),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No call (of that tool) waits in that tree", body = ErrorBody),
        (status = 409, description = "The tree has ended", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, description = "Not approve or deny, a reason given to an approval, or `always` with a denial", body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub async fn decide_approvals(
    State(shared): State<Arc<Shared>>,
    Caller(caller): Caller,
    ApiPath(tree_id): ApiPath<String>,
    ApiJson(body): ApiJson<DecideMany>,
) -> Result<Json<DecidedMany>, ApiError> {
    let tree_id = super::tree_path(tree_id)?;
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
    if body.always && matches!(decision, Decision::Deny { .. }) {
        return Err(ApiError::invalid(
            "always is an approval's: there is no always deny".to_owned(),
        ));
    }
    let supervisor = shared.runtime.supervisor();
    // Run by another replica: one decision posted per call its journal has
    // waiting.
    let control = Control::DecideWaiting {
        decision: &decision,
        tool: body.tool.as_deref(),
        always: body.always,
    };
    let tool = body.tool.as_deref();
    let here = async {
        if body.always {
            supervisor.approve_all_always(&tree_id, tool).await
        } else {
            let decided = supervisor.decide_all(&tree_id, tool, decision.clone());
            decided
                .await
                .map(|approved| arbor_supervisor::AlwaysAllowedNow {
                    tools: Vec::new(),
                    approved,
                })
        }
    };
    let (now, forwarded) = match here_or_forward(&shared, &tree_id, control, here).await? {
        Applied::Here(now) => (now, None),
        Applied::Forwarded { to, calls } => (
            arbor_supervisor::AlwaysAllowedNow {
                tools: Vec::new(),
                approved: calls,
            },
            Some(to),
        ),
        Applied::Refused(error) => return Err(error.into()),
    };
    Ok(Json(DecidedMany {
        tree_id,
        decided: now.approved,
        always_allowed: now.tools,
        forwarded,
    }))
}
