//! The scripted model: replies read from a JSON script, keyed by agent type and
//! step. On every request it checks that each tool call has its result, and it
//! records every request so a test can assert what an agent sent.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use crate::history::check_pairing;
use crate::message::{Message, Part, SPAWN_PROMPT, ToolCall};
use crate::model::{Delta, DeltaSink, Model, ModelError, ModelRequest, ModelResponse, Usage};
use crate::sync::LockExt as _;
use crate::template::AgentTypeId;

/// A script: for each agent type (optionally narrowed by prompt), its replies by step.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// The entries; the first that matches a run answers it.
    pub replies: Vec<ScriptEntry>,
}

impl Script {
    /// A script from its JSON text; `path` names it in errors.
    pub fn from_json(json: &str, path: &str) -> Result<Script, ScriptError> {
        serde_json::from_str(json).map_err(|source| ScriptError::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// A script read from a file and parsed; errors name the file as given.
    pub fn from_file(path: &Path) -> Result<Script, ScriptError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: shown.clone(),
            source,
        })?;
        Script::from_json(&text, &shown)
    }
}

/// The replies of one agent type (or of its runs whose prompt matches).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptEntry {
    /// Agent type this entry answers (`name`, `publisher/name` or a full id).
    pub agent: String,
    /// Only for runs whose spawn prompt contains this text.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Replies for steps 1, 2, …
    pub steps: Vec<ScriptedReply>,
    /// The reply to every summary call of its runs (a template's
    /// `compact_at`), which is no step's.
    #[serde(default)]
    pub summary: Option<ScriptedReply>,
}

/// One scripted step: the reply the model gives (or how it fails).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScriptedReply {
    /// The reply's text, if any.
    #[serde(default)]
    pub text: Option<String>,
    /// The reply's reasoning part, if any.
    #[serde(default)]
    pub reasoning: Option<String>,
    /// The tool calls the reply makes, in order.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
    /// Wait this long (tokio time, so tests can pause it) before answering.
    #[serde(default)]
    pub delay_ms: u64,
    /// Stream the text one word at a time, waiting this long (tokio time)
    /// before each word; 0 streams it as one piece.
    #[serde(default)]
    pub word_ms: u64,
    /// The usage reported (`None`: estimated from the request and the reply).
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Fail the call with this message instead of answering.
    #[serde(default)]
    pub error: Option<String>,
    /// Panic with this message (to test that a panic is a failure, not a crash).
    #[serde(default)]
    pub panic: Option<String>,
}

/// One tool call of a scripted reply.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    /// The tool's wire name.
    pub name: String,
    /// The arguments; a string is sent as raw (possibly malformed) JSON text.
    #[serde(default)]
    pub input: Value,
    /// The call's id (`None`: `RUN-sSTEP-cINDEX`).
    #[serde(default)]
    pub id: Option<String>,
}

/// A script that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The file could not be read.
    #[error("cannot read script {path}: {source}")]
    Read {
        /// The script's path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The text is not a valid script.
    #[error("script {path} is invalid: {source}")]
    Parse {
        /// The script's path (as given to `from_json`).
        path: String,
        /// Why.
        source: serde_json::Error,
    },
}

/// What one request looked like, for assertions.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// The asking agent's run id.
    pub run_id: String,
    /// Its `agentType`.
    pub agent_type: String,
    /// The step (from 1).
    pub step: u32,
    /// The messages sent.
    pub messages: Vec<Arc<Message>>,
    /// The wire names of the tools offered, sorted.
    pub tools: Vec<String>,
    /// The tool definitions as sent (descriptions and input schemas).
    pub definitions: crate::state::ToolDefinitions,
    /// The system prompt sent.
    pub system_prompt: Arc<str>,
    /// Its `meta.shared_prefix`: leading messages taken from the parent.
    pub shared_prefix: usize,
    /// Whether it was a summary call (`compact_at`), not the step's own.
    pub summary: bool,
}

/// A model that answers from a [`Script`] and records every request.
pub struct ScriptedModel {
    name: String,
    script: Script,
    requests: Mutex<Vec<RecordedRequest>>,
}

impl ScriptedModel {
    /// A scripted model named `name` (its catalog name).
    pub fn new(name: impl Into<String>, script: Script) -> Self {
        ScriptedModel {
            name: name.into(),
            script,
            requests: Mutex::new(Vec::new()),
        }
    }

    /// A scripted model from a script's JSON text; `path` names it in errors.
    pub fn from_json(name: impl Into<String>, json: &str, path: &str) -> Result<Self, ScriptError> {
        Ok(Self::new(name, Script::from_json(json, path)?))
    }

    /// A scripted model from a script file.
    pub fn from_file(name: impl Into<String>, path: &Path) -> Result<Self, ScriptError> {
        Ok(Self::new(name, Script::from_file(path)?))
    }

    /// Every request answered so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        // A poisoned list is recovered: it is only pushed to, whole entries at a time.
        self.requests.locked().clone()
    }

    fn reply_for(&self, request: &ModelRequest) -> Result<&ScriptedReply, Unscripted> {
        let agent_type = request.meta.agent_type.as_str();
        let prompt = spawn_prompt(&request.messages.to_vec());
        let entry = self
            .script
            .replies
            .iter()
            .find(|e| {
                AgentTypeId::parse(&e.agent).matches(&AgentTypeId::parse(agent_type))
                    && e.prompt
                        .as_ref()
                        .is_none_or(|p| prompt.contains(p.as_str()))
            })
            .ok_or_else(|| Unscripted::Agent(agent_type.to_owned()))?;
        if request.meta.summary {
            return entry
                .summary
                .as_ref()
                .ok_or_else(|| Unscripted::Summary(agent_type.to_owned()));
        }
        let step = request.meta.step as usize;
        entry
            .steps
            .get(step.saturating_sub(1))
            .ok_or_else(|| Unscripted::Step(agent_type.to_owned(), step))
    }
}

/// A request the script has no reply for (the model's error says so).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum Unscripted {
    /// No entry for the agent type (and the run's prompt).
    #[error("no scripted replies for agent type {0}")]
    Agent(String),
    /// The entry has no reply for this step.
    #[error("no scripted reply for {0} step {1}")]
    Step(String, usize),
    /// The entry has no `summary` for a summary call.
    #[error("no scripted summary for agent type {0}")]
    Summary(String),
}

/// The text of the prompt a run was spawned with (the last one: a child that
/// inherits history also carries its ancestors' prompts), or its first user message.
fn spawn_prompt(messages: &[Arc<Message>]) -> String {
    messages
        .iter()
        .rev()
        .find(|m| m.has_tag(SPAWN_PROMPT))
        .or_else(|| {
            messages
                .iter()
                .find(|m| matches!(***m, Message::User { .. }))
        })
        .map(|m| m.text())
        .unwrap_or_default()
}

#[async_trait]
impl Model for ScriptedModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(
        &self,
        request: ModelRequest,
        deltas: DeltaSink,
    ) -> Result<ModelResponse, ModelError> {
        let invalid = |message: String| ModelError::Invalid {
            model: self.name.clone(),
            message,
        };
        check_pairing(&request.messages).map_err(|e| invalid(format!("invalid request: {e}")))?;
        {
            let mut requests = self.requests.locked();
            requests.push(RecordedRequest {
                run_id: request.meta.run_id.clone(),
                agent_type: request.meta.agent_type.clone(),
                step: request.meta.step,
                messages: request.messages.to_vec(),
                tools: request.tools.keys().cloned().collect(),
                definitions: request.tools.clone(),
                system_prompt: request.system_prompt.clone(),
                shared_prefix: request.meta.shared_prefix,
                summary: request.meta.summary,
            });
        }
        let reply = self
            .reply_for(&request)
            .map_err(|e| invalid(e.to_string()))?
            .clone();
        if reply.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(reply.delay_ms)).await;
        }
        if let Some(message) = reply.panic {
            panic!("{message}");
        }
        if let Some(message) = reply.error {
            return Err(ModelError::Transient {
                model: self.name.clone(),
                message,
                retry_after: None,
            });
        }
        let mut parts = Vec::new();
        if let Some(text) = reply.reasoning {
            parts.push(Part::Reasoning { text });
        }
        if let Some(text) = reply.text {
            if reply.word_ms == 0 {
                deltas(Delta::Text { text: text.clone() });
            } else {
                for word in text.split_inclusive(char::is_whitespace) {
                    tokio::time::sleep(Duration::from_millis(reply.word_ms)).await;
                    deltas(Delta::Text { text: word.into() });
                }
            }
            parts.push(Part::Text { text });
        }
        for (i, call) in reply.tool_calls.into_iter().enumerate() {
            parts.push(Part::ToolCall(ToolCall {
                tool_call_id: call.id.unwrap_or_else(|| {
                    format!("{}-s{}-c{i}", request.meta.run_id, request.meta.step)
                }),
                tool_name: call.name,
                input: call.input.into(),
            }));
        }
        let message = Message::Assistant {
            content: crate::message::Content::Parts(parts),
            meta: Default::default(),
        };
        let usage = reply.usage.unwrap_or(Usage {
            input_tokens: request.messages.estimated_tokens(),
            output_tokens: message.estimated_tokens(),
            ..Usage::default()
        });
        Ok(ModelResponse { message, usage })
    }
}
