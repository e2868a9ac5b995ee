//! The routes under `/v1`, their request and response bodies, and the OpenAPI
//! document generated from them (utoipa): what is documented is what the
//! handlers take and give. One file per group of routes: `runs`, `trees`,
//! `turns`, `limits`, `approvals`, `agents`, and the operator's
//! `operations`; `forward` applies a control here or posts it for the
//! replica that runs the tree.

use arbor_actors::{RunId, TreeId};
use arbor_supervisor::store::{RunNode, TreeStatus, TreeSummary};
use arbor_supervisor::{ToolRule, TreeLimits};
use serde_json::Value;
use utoipa::OpenApi;

use super::error::{ApiError, ErrorBody};

pub(super) mod agents;
pub(super) mod approvals;
mod forward;
pub(super) mod limits;
pub(super) mod operations;
pub(super) mod runs;
pub(super) mod trees;
pub(super) mod turns;
pub(super) mod wait;

/// A stored or live run id from the path (URL-encoded: `t1/0` is `t1%2F0`),
/// read once here; one that is no run id is a run nobody has (404).
pub(super) fn run_path(id: String) -> Result<RunId, ApiError> {
    match id.parse::<RunId>() {
        Ok(run) => Ok(run),
        Err(e) => Err(ApiError::not_found(format!(
            "no run {id:?} ({e}; URL-encoded in the path: t1%2F0)"
        ))),
    }
}

/// A tree id from the path, read once here; one that is no tree id is a
/// tree the store does not have (the 404 of a missing tree).
pub(super) fn tree_path(id: String) -> Result<TreeId, ApiError> {
    id.parse::<TreeId>()
        .map_err(|e| arbor_supervisor::Error::NoSuchId(e).into())
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Arbor",
        description = "Start trees of LLM agents, follow them live, cancel them and read their results.",
        license(name = "MIT OR Apache-2.0")
    ),
    paths(
        runs::create_run, wait::wait_run, runs::list_runs, runs::get_run, runs::run_events, runs::cancel_run,
        runs::steer_run, trees::get_tree, agents::list_agents, approvals::list_approvals,
        approvals::tree_approvals, approvals::decide_approval, approvals::decide_approvals,
        limits::raise_limits, limits::get_limits, turns::create_turn, operations::healthz,
        operations::readyz, operations::metrics
    ),
    components(schemas(
        ErrorBody, TreeSummary, RunNode, TreeLimits, ToolRule, TreeStatus,
        crate::webhooks::payload::WebhookPayload, crate::webhooks::payload::WebhookUsage
    )),
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
