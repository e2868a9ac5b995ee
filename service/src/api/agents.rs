//! `/v1/agents`: the agent types a tree can start with.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use crate::Shared;
use crate::error::ErrorBody;

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
