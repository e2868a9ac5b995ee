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

impl Schema {
    /// Compiles `source`; the error says what is wrong with the schema itself.
    pub fn compile(source: Value) -> Result<Self, String> {
        let validator = jsonschema::validator_for(&source).map_err(|e| e.to_string())?;
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
    pub fn check(&self, instance: &Value) -> Result<(), String> {
        let problems: Vec<String> = self
            .validator
            .iter_errors(instance)
            .map(|e| {
                let path = e.instance_path().to_string();
                let path = if path.is_empty() {
                    "/".to_owned()
                } else {
                    path
                };
                format!("at {path}: {e}")
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
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
        assert!(err.contains("/score"), "{err}");
    }

    #[test]
    fn a_bad_schema_is_an_error() {
        assert!(Schema::compile(json!({"type": 12})).is_err());
    }
}
