//! The JSON Schemas of what the runtime's own types serialise to (the
//! actors crate has no OpenAPI derive): `AgentState` and its parts, and the
//! payload of each stream event (an entry of the tree's journal, as
//! `arbor_supervisor::store::JournalEntry` serialises it, with `treeId`).
//! Checked against real answers by tests/it/openapi_client.rs (a client
//! generated from the document type-checks them) and the schemathesis run.

use arbor_actors::EventType;
use serde_json::{Map, Value, json};

fn r(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn count() -> Value {
    json!({"type": "integer", "format": "int64", "minimum": 0})
}

fn text() -> Value {
    json!({"type": "string"})
}

fn nullable(schema: Value) -> Value {
    json!({"oneOf": [schema, {"type": "null"}]})
}

/// Any JSON value.
fn any(description: &str) -> Value {
    json!({"description": description})
}

/// An object with `required` fields (always there) and `optional` ones.
fn object(description: &str, required: &[(&str, Value)], optional: &[(&str, Value)]) -> Value {
    let mut properties = Map::new();
    for (name, schema) in required.iter().chain(optional) {
        properties.insert((*name).to_owned(), schema.clone());
    }
    let names: Vec<&str> = required.iter().map(|(name, _)| *name).collect();
    json!({
        "type": "object",
        "description": description,
        "properties": properties,
        "required": names,
    })
}

/// The wire names of `FailureKind` (`errorKind`).
const FAILURE_KINDS: &[&str] = &[
    "model_rejected",
    "model_rate_limited",
    "model_unavailable",
    "model_malformed",
    "model_truncated",
    "model_invalid",
    "model_not_configured",
    "limit",
    "child_failed",
    "not_started",
    "cancelled",
    "lost",
    "panicked",
    "store",
    "fenced",
    "internal",
    "looping",
    "stalled",
    "blocked",
    "program",
];

/// The wire names of `Limit` (a `LimitHit`'s `limit`).
const LIMITS: &[&str] = &[
    "max_depth",
    "max_children_per_call",
    "max_agents",
    "max_steps",
    "agent_steps",
    "token_budget",
    "cost_budget",
    "deadline",
    "step_timeout",
];

/// The fields of one event type beyond the ones every event has:
/// (required, optional).
/// Named fields' schemas.
type Fields = Vec<(&'static str, Value)>;

fn event_fields(t: EventType) -> (Fields, Fields) {
    let step = ("step", count());
    let ended = || {
        (
            vec![
                ("status", r("AgentStatus")),
                (
                    "output",
                    any("The run's output (its final state's `output`; null when it has none)"),
                ),
            ],
            vec![("error", text()), ("errorKind", r("FailureKind"))],
        )
    };
    match t {
        EventType::AgentStarted => (
            vec![
                ("agentId", text()),
                ("agentType", text()),
                ("parentRunId", nullable(text())),
                ("depth", count()),
            ],
            vec![],
        ),
        EventType::StepStarted => (vec![step], vec![]),
        EventType::ModelRetrying => (
            vec![
                step,
                ("attempt", count()),
                ("delayMs", count()),
                ("reason", text()),
            ],
            vec![],
        ),
        EventType::ModelResponded => (
            vec![step, ("usage", r("Usage")), ("toolCalls", count())],
            vec![
                (
                    "tools",
                    json!({"type": "array", "items": {"type": "string"}}),
                ),
                ("fromRecord", json!({"type": "boolean"})),
                ("refused", json!({"type": "boolean"})),
            ],
        ),
        EventType::ToolCalled => (
            vec![
                step,
                ("tool", text()),
                ("toolCallId", text()),
                ("error", nullable(text())),
            ],
            vec![("result", r("Message"))],
        ),
        EventType::ProgramYielded => (
            vec![
                ("index", count()),
                (
                    "yielded",
                    any(
                        "The yield in Codebuff's spelling: \"STEP\", \"STEP_ALL\", {type: \"STEP_TEXT\", text}, {toolName, input}",
                    ),
                ),
            ],
            vec![(
                "drawn",
                any("What the program drew on its way to it (clock readings, its random seed)"),
            )],
        ),
        EventType::HistoryRepaired => (
            vec![
                ("unansweredCalls", json!({"type": "array", "items": text()})),
                ("orphanResults", json!({"type": "array", "items": text()})),
            ],
            vec![],
        ),
        EventType::HistoryCompacted => (
            vec![
                step,
                ("tokens", count()),
                (
                    "cut",
                    json!({"type": "array", "items": {
                        "type": "object",
                        "required": ["toolCallId", "toolName", "chars"],
                        "properties": {
                            "toolCallId": text(),
                            "toolName": text(),
                            "chars": count(),
                        },
                    }}),
                ),
                ("summarized", count()),
                ("usage", r("Usage")),
            ],
            vec![
                ("summary", text()),
                ("fromRecord", json!({"type": "boolean"})),
            ],
        ),
        EventType::ChildSpawned => (
            vec![
                ("childRunId", text()),
                ("agentType", text()),
                ("attempt", count()),
            ],
            vec![],
        ),
        EventType::ChildRetrying => (
            vec![
                ("failedRunId", text()),
                ("attempt", count()),
                ("delayMs", count()),
                ("error", text()),
            ],
            vec![],
        ),
        EventType::ChildFinished => (
            vec![("childRunId", text()), ("status", r("AgentStatus"))],
            vec![],
        ),
        EventType::BackgroundDelivered => (vec![step, ("childRunId", text())], vec![]),
        EventType::OutputSet => (vec![("output", any("The value set"))], vec![]),
        EventType::AgentFinished | EventType::AgentFailed | EventType::AgentCancelled => ended(),
        EventType::LimitHit | EventType::BudgetReached => (vec![("limit", r("LimitHit"))], vec![]),
        EventType::Steered => (vec![step, ("text", text())], vec![]),
        EventType::LimitsRaised => (
            vec![],
            vec![
                ("maxSteps", count()),
                ("maxTokens", count()),
                ("maxCredits", json!({"type": "number", "minimum": 0})),
            ],
        ),
        EventType::ApprovalRequested => (
            vec![
                step,
                ("toolCallId", text()),
                ("tool", text()),
                ("input", any("The input the model gave the tool")),
            ],
            vec![],
        ),
        EventType::ApprovalRuleAdded => (vec![("tool", text())], vec![]),
        EventType::ApprovalDecided => (
            vec![
                step,
                ("toolCallId", text()),
                ("decision", r("DecisionBody")),
            ],
            vec![],
        ),
        EventType::Looping => (
            vec![
                step,
                ("tool", text()),
                ("repeats", count()),
                ("fatal", json!({"type": "boolean"})),
            ],
            vec![],
        ),
        EventType::HookDecided => (
            vec![
                step,
                ("toolCallId", text()),
                (
                    "hook",
                    json!({"type": "string", "enum": ["PreToolUse", "PostToolUse", "SubagentStop", "Stop"]}),
                ),
                (
                    "verdict",
                    json!({
                        "type": "object",
                        "description": "What the hooks decided together: stop, block, permission (allow, ask, deny), reason, updatedInput, context, errors",
                        "properties": {
                            "stop": {"type": "string"},
                            "block": {"type": "string"},
                            "permission": {"type": "string", "enum": ["allow", "ask", "deny"]},
                            "reason": {"type": "string"},
                            "updatedInput": {"type": "object"},
                            "context": {"type": "array", "items": {"type": "string"}},
                            "errors": {"type": "array", "items": {"type": "string"}}
                        }
                    }),
                ),
            ],
            vec![],
        ),
        EventType::WorktreeSealed => (
            vec![(
                "report",
                json!({
                    "type": "object",
                    "description": "The sealed worktree: branch, base, path (while kept), commits [{sha, subject}], files [{path, added, removed}], summary, error",
                    "required": ["branch", "base", "commits", "files", "summary"],
                    "properties": {
                        "branch": {"type": "string"},
                        "base": {"type": "string"},
                        "path": {"type": "string"},
                        "commits": {"type": "array", "items": {"type": "object"}},
                        "files": {"type": "array", "items": {"type": "object"}},
                        "summary": {"type": "string"},
                        "error": {"type": "string"}
                    }
                }),
            )],
            vec![],
        ),
        EventType::Stalled => (vec![step, ("idleMs", count())], vec![]),
        EventType::TurnQueued => (
            vec![("turn", count()), ("position", count()), ("prompt", text())],
            vec![],
        ),
        EventType::Suspended | EventType::Resumed => (vec![], vec![]),
        // A type added later: its common fields, and whatever else it has.
        _ => (vec![], vec![]),
    }
}

/// `agentStarted` → `AgentStartedEvent`.
fn event_schema_name(t: EventType) -> String {
    let name = t.name();
    let mut chars = name.chars();
    let first = chars.next().map(|c| c.to_ascii_uppercase());
    format!(
        "{}{}Event",
        first.into_iter().collect::<String>(),
        chars.as_str()
    )
}

/// Every schema this module adds, by component name.
pub(super) fn schemas() -> Map<String, Value> {
    let mut schemas = Map::new();
    let mut add = |name: &str, schema: Value| {
        schemas.insert(name.to_owned(), schema);
    };
    add(
        "AgentStatus",
        json!({"type": "string", "enum": ["running", "completed", "failed", "cancelled"],
            "description": "Whether a run is going, or how it ended"}),
    );
    add(
        "FailureKind",
        json!({"type": "string", "enum": FAILURE_KINDS,
            "description": "What kind of failure ended a run"}),
    );
    add(
        "LimitHit",
        object(
            "A limit that refused something (semantics §8)",
            &[
                ("limit", json!({"type": "string", "enum": LIMITS})),
                ("detail", text()),
            ],
            &[],
        ),
    );
    add(
        "Usage",
        object(
            "Token counts (and credits) of one model call",
            &[("inputTokens", count()), ("outputTokens", count())],
            &[
                ("cacheReadTokens", count()),
                ("cacheWriteTokens", count()),
                ("cost", json!({"type": "number"})),
                (
                    "source",
                    json!({"type": "string",
                        "enum": ["reported", "absent", "estimated", "recorded"],
                        "description": "Absent: the counts were reported"}),
                ),
            ],
        ),
    );
    add(
        "ToolDefinition",
        object(
            "A tool as the model sees it",
            &[
                ("description", text()),
                ("inputSchema", any("The JSON Schema of its input")),
            ],
            &[],
        ),
    );
    add(
        "ToolCall",
        object(
            "A request by the model to run one tool",
            &[
                ("type", json!({"type": "string", "enum": ["tool-call"]})),
                ("toolCallId", text()),
                ("toolName", text()),
                (
                    "input",
                    any("The tool's input (null if the model sent none)"),
                ),
            ],
            &[],
        ),
    );
    let part = |kind: &str, required: &[(&str, Value)], optional: &[(&str, Value)]| {
        let mut all = vec![("type", json!({"type": "string", "enum": [kind]}))];
        all.extend(required.iter().cloned());
        object(&format!("A `{kind}` part"), &all, optional)
    };
    add(
        "MessagePart",
        json!({
            "description": "A typed part of a message body",
            "oneOf": [
                part("text", &[("text", text())], &[]),
                part("reasoning", &[("text", text())], &[]),
                part("image", &[("image", text())], &[("mediaType", text())]),
                part(
                    "file",
                    &[("data", text()), ("mediaType", text())],
                    &[("filename", text())],
                ),
                r("ToolCall"),
            ]
        }),
    );
    add(
        "MessageContent",
        json!({
            "description": "A message body: a plain string or typed parts",
            "oneOf": [text(), {"type": "array", "items": r("MessagePart")}]
        }),
    );
    add(
        "ToolResultPart",
        json!({
            "description": "A part of a tool result",
            "oneOf": [
                part("json", &[("value", any("The value (a text result is a string)"))], &[]),
                part("media", &[("data", text()), ("mediaType", text())], &[]),
            ]
        }),
    );
    let meta = [
        ("tags", json!({"type": "array", "items": text()})),
        (
            "timeToLive",
            json!({"type": "string", "enum": ["agentStep", "userPrompt"]}),
        ),
        ("keepDuringTruncation", json!({"type": "boolean"})),
        (
            "providerOptions",
            any("Options passed to the provider as they are"),
        ),
        (
            "sentAt",
            json!({"type": "number", "description": "Milliseconds since the Unix epoch"}),
        ),
    ];
    let message = |role: &str, required: &[(&str, Value)]| {
        let mut all = vec![("role", json!({"type": "string", "enum": [role]}))];
        all.extend(required.iter().cloned());
        object(&format!("A `{role}` message"), &all, &meta)
    };
    add(
        "Message",
        json!({
            "description": "One message of a conversation (semantics §2), tagged by `role`",
            "oneOf": [
                message("system", &[("content", r("MessageContent"))]),
                message("user", &[("content", r("MessageContent"))]),
                message("assistant", &[("content", r("MessageContent"))]),
                message("tool", &[
                    ("toolCallId", text()),
                    ("toolName", text()),
                    ("content", json!({"type": "array", "items": r("ToolResultPart")})),
                ]),
            ]
        }),
    );
    add(
        "AgentState",
        object(
            "One run's state (semantics §2)",
            &[
                ("agentId", text()),
                ("agentType", nullable(text())),
                ("runId", text()),
                ("parentId", nullable(text())),
                ("ancestorRunIds", json!({"type": "array", "items": text()})),
                ("childRunIds", json!({"type": "array", "items": text()})),
                (
                    "messageHistory",
                    json!({"type": "array", "items": r("Message")}),
                ),
                (
                    "output",
                    any(
                        "The last accepted set_output value; a failed run's is {errorMessage}; null when none",
                    ),
                ),
                ("systemPrompt", text()),
                (
                    "toolDefinitions",
                    json!({"type": "object", "additionalProperties": r("ToolDefinition"),
                        "description": "Exactly the tools the model is offered, by wire name"}),
                ),
                ("contextTokenCount", count()),
                ("stepsRemaining", count()),
                ("creditsUsed", json!({"type": "number"})),
                ("directCreditsUsed", json!({"type": "number"})),
                ("status", r("AgentStatus")),
            ],
            &[("errorKind", r("FailureKind"))],
        ),
    );
    let messages = || json!({"type": "array", "items": r("Message")});
    let kind = |name: &str| ("type", json!({"type": "string", "enum": [name]}));
    add(
        "RunValue",
        json!({
            "description": "A finished run's value (semantics §7): by its agent's output \
                mode, or the error a failed or cancelled run hands back",
            "oneOf": [
                object(
                    "output_mode last_message: the run's last assistant turn",
                    &[kind("lastMessage"), ("value", messages())],
                    &[],
                ),
                object(
                    "output_mode all_messages: the messages the run added",
                    &[kind("allMessages"), ("value", messages())],
                    &[],
                ),
                object(
                    "output_mode structured_output: the value set_output set",
                    &[kind("structuredOutput"), ("value", any("The output"))],
                    &[],
                ),
                object(
                    "A run that failed or was cancelled",
                    &[kind("error"), ("message", text())],
                    &[],
                ),
            ]
        }),
    );
    // The stream's events: the fields every one has, then its own.
    let mut variants = Vec::new();
    let mut mapping = Map::new();
    for t in EventType::ALL {
        let (own, optional) = event_fields(t);
        let mut required = vec![
            ("type", json!({"type": "string", "enum": [t.name()]})),
            ("seq", count()),
            ("treeId", text()),
            ("runId", text()),
            ("atMs", count()),
        ];
        required.extend(own);
        let name = event_schema_name(t);
        add(
            &name,
            object(
                &format!("The payload of a `{}` event", t.name()),
                &required,
                &optional,
            ),
        );
        variants.push(r(&name));
        mapping.insert(
            t.name().to_owned(),
            json!(format!("#/components/schemas/{name}")),
        );
    }
    add(
        "StreamEventData",
        json!({
            "description": "The JSON `data` of a stream's event: `type` (its EventType), \
                the event's own fields, then `seq` (its `id`), `runId`, `atMs` and `treeId`. \
                A run's final event (agentFinished, agentFailed, agentCancelled) carries its \
                `output`.",
            "oneOf": variants,
            "discriminator": {"propertyName": "type", "mapping": mapping}
        }),
    );
    schemas
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_event_type_has_a_payload_schema_with_its_type() {
        let schemas = super::schemas();
        for t in arbor_actors::EventType::ALL {
            let schema = &schemas[&super::event_schema_name(t)];
            assert_eq!(schema["properties"]["type"]["enum"][0], t.name());
        }
    }

    #[test]
    fn the_failure_kinds_listed_are_failure_kinds() {
        for name in super::FAILURE_KINDS {
            let kind: arbor_actors::FailureKind =
                serde_json::from_value(serde_json::json!(name)).unwrap();
            assert_eq!(kind.name(), *name);
        }
    }
}
