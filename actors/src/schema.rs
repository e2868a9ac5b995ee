//! Compiled JSON Schemas for tool inputs, spawn inputs and structured output.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

/// A JSON Schema compiled once and shared; checking names the failing path.
#[derive(Clone)]
pub struct Schema {
    source: Arc<Value>,
    validator: Arc<jsonschema::Validator>,
}

/// A schema that does not compile: what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSchema(String);

/// An instance that does not conform: every problem, each at its JSON
/// pointer, in the validator's order.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.shown())]
pub struct Mismatch {
    /// `(pointer, problem)`: `/` for the instance itself.
    pub problems: Vec<(String, String)>,
}

impl Mismatch {
    fn shown(&self) -> String {
        self.problems
            .iter()
            .map(|(path, problem)| format!("at {path}: {problem}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl Schema {
    /// Compiles `source`; the error says what is wrong with the schema itself.
    pub fn compile(source: Value) -> Result<Self, InvalidSchema> {
        let validator =
            jsonschema::validator_for(&source).map_err(|e| InvalidSchema(e.to_string()))?;
        Ok(Schema {
            source: Arc::new(source),
            validator: Arc::new(validator),
        })
    }

    /// The schema as it was given.
    pub fn source(&self) -> &Value {
        &self.source
    }

    /// `Ok` when `instance` conforms; else every problem, each with its JSON pointer.
    pub fn check(&self, instance: &Value) -> Result<(), Mismatch> {
        let problems: Vec<(String, String)> = self
            .validator
            .iter_errors(instance)
            .map(|e| {
                let path = e.instance_path().to_string();
                let path = if path.is_empty() {
                    "/".to_owned()
                } else {
                    path
                };
                (path, e.to_string())
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Mismatch { problems })
        }
    }
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schema({})", self.source)
    }
}

impl PartialEq for Schema {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// Whether `schema` fits OpenAI's strict structured-output subset, so it can
/// be sent with `strict: true`: the root is an object schema, and every
/// object schema in it (under `properties`, `items`, `anyOf`, `$defs`, ...)
/// says `additionalProperties: false` and lists every one of its properties
/// in `required`. Keywords strict mode refuses (`allOf`, `oneOf`, `not`,
/// `if`/`then`/`else`, `patternProperties`, `dependentRequired`,
/// `dependentSchemas`, `unevaluatedProperties`) make it not fit either. A
/// schema that does not fit is sent with `strict: false`: the model is
/// asked, not forced, to follow it, and the reply is checked either way.
pub fn fits_strict_subset(schema: &Value) -> bool {
    is_object_schema(schema) && strict_node(schema)
}

const STRICT_REFUSES: [&str; 9] = [
    "allOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "patternProperties",
    "dependentRequired",
    "dependentSchemas",
];

fn is_object_schema(node: &Value) -> bool {
    match node.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(types)) => types.iter().any(|t| t == "object"),
        _ => node.get("properties").is_some(),
    }
}

fn strict_node(node: &Value) -> bool {
    let Value::Object(map) = node else {
        // `true`/`false` schemas and anything else: nothing strict can say.
        return false;
    };
    if STRICT_REFUSES.iter().any(|k| map.contains_key(*k))
        || map.contains_key("unevaluatedProperties")
    {
        return false;
    }
    if is_object_schema(node) {
        if map.get("additionalProperties") != Some(&Value::Bool(false)) {
            return false;
        }
        let required: Vec<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(Value::Object(props)) = map.get("properties") {
            if !props.keys().all(|k| required.contains(&k.as_str())) {
                return false;
            }
            if !props.values().all(strict_node) {
                return false;
            }
        }
    }
    let children = |key: &str| -> bool {
        match map.get(key) {
            None => true,
            Some(Value::Array(list)) => list.iter().all(strict_node),
            Some(Value::Object(defs)) if key == "$defs" || key == "definitions" => {
                defs.values().all(strict_node)
            }
            Some(one) => strict_node(one),
        }
    };
    ["items", "anyOf", "$defs", "definitions"]
        .iter()
        .all(|k| children(k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn check_names_the_failing_path() {
        let schema = Schema::compile(json!({
            "type": "object",
            "properties": {"score": {"type": "number"}},
            "required": ["score"]
        }))
        .unwrap();
        assert!(schema.check(&json!({"score": 1})).is_ok());
        let err = schema.check(&json!({"score": "high"})).unwrap_err();
        assert_eq!(err.problems.len(), 1, "{err}");
        assert_eq!(
            err.problems[0].0, "/score",
            "the problem is named by its pointer"
        );
        assert!(err.to_string().starts_with("at /score: "), "{err}");
    }

    #[test]
    fn the_strict_subset_wants_closed_objects_with_every_property_required() {
        let closed = json!({
            "type": "object",
            "properties": {
                "score": {"type": "number"},
                "tags": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"],
                    "additionalProperties": false
                }},
                "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}
            },
            "required": ["score", "tags", "note"],
            "additionalProperties": false
        });
        assert!(fits_strict_subset(&closed));

        let mut open = closed.clone();
        open["additionalProperties"] = json!(true);
        assert!(!fits_strict_subset(&open), "an open root");

        let mut optional = closed.clone();
        optional["required"] = json!(["score", "tags"]);
        assert!(!fits_strict_subset(&optional), "a property not required");

        let mut nested = closed.clone();
        nested["properties"]["tags"]["items"]
            .as_object_mut()
            .unwrap()
            .remove("additionalProperties");
        assert!(!fits_strict_subset(&nested), "an open nested object");

        let mut refused = closed.clone();
        refused["properties"]["score"] = json!({"oneOf": [{"type": "number"}]});
        assert!(!fits_strict_subset(&refused), "oneOf");

        assert!(
            !fits_strict_subset(&json!({"type": "string"})),
            "not an object"
        );
        assert!(
            !fits_strict_subset(&json!({"type": "object"})),
            "open by default"
        );
        assert!(fits_strict_subset(
            &json!({"type": "object", "properties": {}, "additionalProperties": false})
        ));
    }

    #[test]
    fn a_bad_schema_is_an_error() {
        assert!(Schema::compile(json!({"type": 12})).is_err());
    }
}
