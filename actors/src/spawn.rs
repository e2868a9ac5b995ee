//! Spawning and merging as plain functions (semantics §6): who may spawn what, the
//! state a child starts from, and the result its parent records.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::failure::FailureKind;
use crate::history::History;
use crate::hooks::RunIds;
use crate::id::{AgentId, RunId};
use crate::message::{
    Content, INSTRUCTIONS_PROMPT, Message, Meta, Part, SPAWN_PROMPT, SUBAGENT_SPAWN,
};
use crate::state::{AgentState, AgentStatus, Start, ToolDefinitions};
use crate::template::AgentTemplate;
use crate::toolbox::Toolbox;

/// One child as a spawn tool asks for it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub(crate) struct SpawnRequest {
    pub agent_type: String,
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub params: Option<Value>,
}

/// A permitted child, ready to be given ids and started.
///
/// A wide call's children wait for a live slot as plans (issue 34: the
/// 10^8-agent tree holds ~10^7 at once), so a plan is kept small: what its
/// call's children share is shared, its prompt is exactly as long as it is,
/// and its params (rare in a wide call) are boxed.
#[derive(Clone, Debug)]
pub struct ChildPlan {
    /// The matched `spawnableAgents` entry: the child's `agentType` (one
    /// text per agent type of a step's spawn calls, shared).
    pub agent_type: Arc<str>,
    /// The child's template.
    pub template: Arc<AgentTemplate>,
    /// The prompt the parent gave it, if any.
    pub prompt: Option<Box<str>>,
    /// The params the parent gave it, if any (checked against its input schema).
    pub params: Option<Box<Value>>,
    /// The parent's filtered history as of the spawn: one per step, which
    /// the children of all its spawn calls share until each starts from it.
    pub snapshot: Arc<History>,
    /// The `SUBAGENT_SPAWN` notice the child's history gets after the
    /// inherited messages (`None` when it inherits none, or runs inline):
    /// one per agent type in a step's spawn calls, shared by those children.
    pub notice: Option<Arc<Message>>,
    /// Whether it runs inline (`spawn_agent_inline`, semantics §6): on the
    /// parent's history, merged back into it.
    pub inline: bool,
}

/// The `SUBAGENT_SPAWN` notices of one step's spawn calls, one per agent
/// type: those children share them instead of each formatting its own (two
/// strings and a message per child).
#[derive(Default)]
pub(crate) struct Notices(RefCell<Vec<(Arc<str>, Arc<Message>)>>);

impl Notices {
    /// The agent type's shared text and the notice a child of that type
    /// gets (both made by the first one).
    fn of(&self, agent_type: &str) -> (Arc<str>, Arc<Message>) {
        let mut made = self.0.borrow_mut();
        if let Some((t, notice)) = made.iter().find(|(t, _)| &**t == agent_type) {
            return (t.clone(), notice.clone());
        }
        let notice = Arc::new(
            Message::user(format!(
                "You have been spawned as a sub-agent of type {agent_type}."
            ))
            .with_tag(SUBAGENT_SPAWN),
        );
        let text: Arc<str> = agent_type.into();
        made.push((text.clone(), notice.clone()));
        (text, notice)
    }
}

/// Checks permission (first matching entry wins) and the child's input
/// schema: the matched `spawnableAgents` entry and its template.
fn check_child<'p>(
    parent: &'p AgentTemplate,
    request: &SpawnRequest,
    template_of: impl Fn(&str) -> Option<Arc<AgentTemplate>>,
    knows_agent: impl Fn(&str) -> bool,
) -> Result<(&'p str, Arc<AgentTemplate>), String> {
    let requested = request.agent_type.as_str();
    let Some(entry) = parent.match_spawnable(requested) else {
        return Err(if knows_agent(requested) {
            format!(
                "Agent type {} is not allowed to spawn child agent type {requested}",
                parent.id
            )
        } else {
            format!("Agent type {requested} not found")
        });
    };
    let template = template_of(entry).ok_or_else(|| format!("Agent type {requested} not found"))?;
    template
        .check_input(request.prompt.as_deref(), request.params.as_ref())
        .map_err(|e| e.to_string())?;
    Ok((entry, template))
}

/// Checks permission (first matching entry wins) and the child's input schema.
pub(crate) fn plan_child(
    parent: &AgentTemplate,
    request: SpawnRequest,
    snapshot: &Arc<History>,
    notices: &Notices,
    inline: bool,
    template_of: impl Fn(&str) -> Option<Arc<AgentTemplate>>,
    knows_agent: impl Fn(&str) -> bool,
) -> Result<ChildPlan, String> {
    let (entry, template) = check_child(parent, &request, template_of, knows_agent)?;
    let (agent_type, notice) = notices.of(entry);
    let notice = (template.include_message_history && !inline).then_some(notice);
    Ok(ChildPlan {
        agent_type,
        template,
        prompt: request.prompt.map(String::into_boxed_str),
        params: request.params.map(Box::new),
        snapshot: snapshot.clone(),
        notice,
        inline,
    })
}

/// What the children of one agent type in a spawn call share.
#[derive(Debug)]
pub struct ChildKind {
    /// The matched `spawnableAgents` entry: the children's `agentType`.
    pub agent_type: Arc<str>,
    /// Their template.
    pub template: Arc<AgentTemplate>,
    /// The `SUBAGENT_SPAWN` notice their histories get (`None` when they
    /// inherit no history).
    pub notice: Option<Arc<Message>>,
}

/// Where a spawn call's input text is read from when a child comes up.
#[derive(Debug)]
enum Entries {
    /// The call's input in the assistant message the history keeps (the
    /// `index`-th tool call): nothing of it is copied.
    InMessage { message: Arc<Message>, index: usize },
    /// The JSON text a model sent as a string: unquoted once, kept here.
    Text(Box<str>),
}

/// A `spawn_agents` call's children, planned compactly (issue 34: the
/// 10^8-agent tree holds ~10^7 children waiting for a live slot). Every
/// entry was checked when the call was classified; a child's [`ChildPlan`]
/// is made from its entry in the call's input when it comes up
/// ([`SpawnPlan::child`]), so until then a child is its kind's number.
#[derive(Debug)]
pub struct SpawnPlan {
    entries: Entries,
    /// Where each child's entry is in the input's text (start, length).
    spans: Vec<(u32, u32)>,
    kinds: Vec<ChildKind>,
    snapshot: Arc<History>,
}

/// A requested child of a planned call: the index of its [`ChildKind`], or
/// the requested agent type and why it is refused.
pub type PlannedChild = Result<u16, Box<(String, String)>>;

/// The children of a `spawn_agents` call, as the step machine planned them.
#[derive(Debug)]
pub struct SpawnChildren {
    /// What they share, and where their entries are.
    pub plan: Arc<SpawnPlan>,
    /// Each requested child, in request order.
    pub children: Vec<PlannedChild>,
}

impl SpawnChildren {
    /// Each child's full plan (or its refusal), made now: for tests and
    /// small calls; a driver makes a child's plan as it comes up.
    pub fn plans(&self) -> Vec<Result<ChildPlan, (String, String)>> {
        self.children
            .iter()
            .enumerate()
            .map(|(i, child)| match child {
                Ok(kind) => self.plan.child(i, *kind).ok_or_else(|| {
                    (
                        String::new(),
                        format!("agents[{i}] is no longer in the call"),
                    )
                }),
                Err(refused) => Err((**refused).clone()),
            })
            .collect()
    }
}

impl SpawnPlan {
    /// Checks each entry of a `spawn_agents` call's input (`message`'s
    /// `index`-th tool call's) and gives each a kind.
    pub(crate) fn check(
        parent: &AgentTemplate,
        (message, index): (Arc<Message>, usize),
        tool: &str,
        snapshot: &Arc<History>,
        notices: &Notices,
        template_of: impl Fn(&str) -> Option<Arc<AgentTemplate>>,
        knows_agent: impl Fn(&str) -> bool,
    ) -> SpawnChildren {
        let unquoted = message
            .tool_calls()
            .nth(index)
            .filter(|call| call.input.text().starts_with('"'))
            .and_then(|call| call.input.parse::<String>().ok());
        let entries = match unquoted {
            Some(text) => Entries::Text(text.into_boxed_str()),
            None => Entries::InMessage { message, index },
        };
        let text = entries.text();
        let spans = spans_of(text);
        let mut kinds = Vec::new();
        let mut children = Vec::with_capacity(spans.len());
        for (i, &(start, len)) in spans.iter().enumerate() {
            let at = start as usize..(start + len) as usize;
            let entry: Value = text
                .get(at)
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or(Value::Null);
            let entry = &entry;
            let checked = crate::toolbox::CHILD_SCHEMA
                .check(entry)
                .map_err(|e| format!("Invalid input for {tool}: agents[{i}] {e}"))
                .and_then(|()| {
                    SpawnRequest::deserialize(entry)
                        .map_err(|e| format!("Invalid input for {tool}: agents[{i}]: {e}"))
                })
                .and_then(|request| {
                    check_child(parent, &request, &template_of, &knows_agent)
                        .map(|(entry, template)| (entry.to_owned(), template))
                });
            let child = match checked {
                Ok((entry, template)) => kind_of(&mut kinds, &entry, template, notices),
                Err(error) => {
                    let named = entry
                        .get("agent_type")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    Err(Box::new((named, error)))
                }
            };
            children.push(child);
        }
        SpawnChildren {
            plan: Arc::new(SpawnPlan {
                entries,
                spans,
                kinds,
                snapshot: snapshot.clone(),
            }),
            children,
        }
    }

    /// The kinds of the call's children.
    pub fn kinds(&self) -> &[ChildKind] {
        &self.kinds
    }

    /// The plan of child `index`, of kind `kind`, made from its entry
    /// (`None` if there is no such entry or kind: a caller's mistake).
    pub fn child(&self, index: usize, kind: u16) -> Option<ChildPlan> {
        let kind = self.kinds.get(usize::from(kind))?;
        let (start, len) = *self.spans.get(index)?;
        let entry = self
            .entries
            .text()
            .get(start as usize..(start + len) as usize)?;
        // As a value first, as the check read it: the last of duplicate
        // keys wins, where a struct refuses them.
        let entry: Value = serde_json::from_str(entry).ok()?;
        let request = SpawnRequest::deserialize(&entry).ok()?;
        Some(ChildPlan {
            agent_type: kind.agent_type.clone(),
            template: kind.template.clone(),
            prompt: request.prompt.map(String::into_boxed_str),
            params: request.params.map(Box::new),
            snapshot: self.snapshot.clone(),
            notice: kind.notice.clone(),
            inline: false,
        })
    }
}

impl Entries {
    /// The call's input as JSON text.
    fn text(&self) -> &str {
        match self {
            Entries::Text(text) => text,
            Entries::InMessage { message, index } => message
                .tool_calls()
                .nth(*index)
                .map_or("null", |call| call.input.text()),
        }
    }
}

/// Where each entry of the `agents` array of the JSON object `text` is in
/// it (start, length); none if it has no such array (the call's schema
/// check refused it already) or is over 4 GB.
fn spans_of(text: &str) -> Vec<(u32, u32)> {
    use serde_json::value::RawValue;
    // A map, not a struct: of duplicate keys the last wins, as when the
    // check parsed the input into a value.
    let Ok(input) =
        serde_json::from_str::<std::collections::HashMap<Cow<'_, str>, &RawValue>>(text)
    else {
        return Vec::new();
    };
    let Some(agents) = input.get("agents") else {
        return Vec::new();
    };
    let Ok(agents) = serde_json::from_str::<Vec<&RawValue>>(agents.get()) else {
        return Vec::new();
    };
    let base = text.as_ptr() as usize;
    agents
        .iter()
        .map_while(|raw| {
            let start = u32::try_from((raw.get().as_ptr() as usize).checked_sub(base)?).ok()?;
            let len = u32::try_from(raw.get().len()).ok()?;
            Some((start, len))
        })
        .collect()
}

/// The kind of the children of `entry` among `kinds`, added if it is the first.
fn kind_of(
    kinds: &mut Vec<ChildKind>,
    entry: &str,
    template: Arc<AgentTemplate>,
    notices: &Notices,
) -> PlannedChild {
    if let Some(k) = kinds.iter().position(|k| &*k.agent_type == entry) {
        return u16::try_from(k).map_err(|_| too_many_kinds(entry));
    }
    let k = u16::try_from(kinds.len()).map_err(|_| too_many_kinds(entry))?;
    let (agent_type, notice) = notices.of(entry);
    let notice = template.include_message_history.then_some(notice);
    kinds.push(ChildKind {
        agent_type,
        template,
        notice,
    });
    Ok(k)
}

fn too_many_kinds(entry: &str) -> Box<(String, String)> {
    Box::new((
        entry.to_owned(),
        "a spawn call may ask for at most 65,536 agent types".to_owned(),
    ))
}

/// What a child starts with: its state and how many messages it inherited.
pub struct ChildStart {
    /// The child's first state.
    pub state: AgentState,
    /// Messages of its history taken from the parent and its input (for its output, semantics §7).
    pub inherited: usize,
    /// The toolbox it runs with.
    pub toolbox: Arc<Toolbox>,
}

/// What children take from their parent, captured once per spawn call and
/// shared, so a child's state is built only when it gets to run.
#[derive(Clone, Debug)]
pub struct ParentInfo {
    /// The parent's agent id: the children's `parentId`.
    pub agent_id: AgentId,
    /// The parent's run id.
    pub run_id: RunId,
    /// The parent's ancestors plus the parent: the children's `ancestorRunIds`
    /// (one list all of them share).
    pub lineage: Arc<[RunId]>,
    /// The parent's system prompt (a child may inherit it).
    pub system_prompt: Arc<str>,
    /// The parent's latest context size in tokens; a child starts from it.
    pub context_token_count: u64,
    /// The parent's toolbox (a child that inherits the system prompt runs with it).
    pub toolbox: Arc<Toolbox>,
}

impl ParentInfo {
    /// What `parent`, running with `toolbox`, passes on.
    pub fn of(parent: &AgentState, toolbox: &Arc<Toolbox>) -> Self {
        let lineage = parent
            .ancestor_run_ids
            .iter()
            .chain([&parent.run_id])
            .cloned()
            .collect();
        ParentInfo {
            agent_id: parent.agent_id.clone(),
            run_id: parent.run_id.clone(),
            lineage,
            system_prompt: parent.system_prompt.clone(),
            context_token_count: parent.context_token_count,
            toolbox: toolbox.clone(),
        }
    }
}

impl ChildPlan {
    /// The toolbox the child runs with: its own, or its parent's under
    /// `inheritParentSystemPrompt` (with its own structural built-ins: the
    /// parent's spawn tools would refuse its every call).
    pub(crate) fn toolbox_for(
        &self,
        parent: &ParentInfo,
        own_toolbox: Arc<Toolbox>,
    ) -> Arc<Toolbox> {
        if self.template.inherit_parent_system_prompt {
            parent.toolbox.inherited_by(&own_toolbox)
        } else {
            own_toolbox
        }
    }

    /// The child's initial state from what its parent left for it.
    pub fn start_from(
        &self,
        parent: &ParentInfo,
        ids: RunIds,
        own_toolbox: Arc<Toolbox>,
    ) -> ChildStart {
        let t = &self.template;
        let mut history = if self.inline || t.include_message_history {
            History::clone(&self.snapshot)
        } else {
            History::new()
        };
        if let Some(notice) = &self.notice {
            history.push_shared(notice.clone());
        }
        for message in input_messages(t, self.prompt.as_deref(), self.params.as_deref()) {
            history.push(message);
        }
        let system_prompt = if t.inherit_parent_system_prompt {
            parent.system_prompt.clone()
        } else {
            t.system_prompt.clone()
        };
        let toolbox = self.toolbox_for(parent, own_toolbox);
        let tool_definitions: ToolDefinitions = toolbox.definitions().clone();
        ChildStart {
            inherited: history.len(),
            state: AgentState::initial(Start {
                ids,
                agent_type: self.agent_type.to_string(),
                parent: Some((parent.agent_id.clone(), parent.lineage.clone())),
                history,
                system_prompt,
                tool_definitions,
                context_token_count: parent.context_token_count,
                steps_remaining: t.max_steps,
            }),
            toolbox,
        }
    }
}

/// What a run of `template` starts its turn with: the prompt message (if there
/// is a prompt or params), then the template's instructions. Roots and children alike.
pub fn input_messages(
    template: &AgentTemplate,
    prompt: Option<&str>,
    params: Option<&Value>,
) -> Vec<Message> {
    let mut out: Vec<Message> = prompt_message(prompt, params).into_iter().collect();
    if let Some(text) = template
        .instructions_prompt
        .as_deref()
        .filter(|t| !t.is_empty())
    {
        out.push(Message::User {
            content: Content::Text(text.to_owned()),
            // Instructions are for this turn: they expire when it ends, so
            // follow-up turns do not pile them up (as Codebuff's do).
            meta: Meta {
                tags: vec![INSTRUCTIONS_PROMPT.to_owned()],
                keep_during_truncation: Some(true),
                time_to_live: Some(crate::message::TimeToLive::UserPrompt),
                ..Meta::default()
            },
        });
    }
    out
}

/// A spawn's prompt (and params as JSON) as one user message tagged
/// `SPAWN_PROMPT`; `None` when there is neither. Roots and children alike.
/// An empty prompt and empty params say nothing: no message (and no empty
/// content, which a provider like Anthropic refuses).
pub(crate) fn prompt_message(prompt: Option<&str>, params: Option<&Value>) -> Option<Message> {
    let mut parts = Vec::new();
    if let Some(prompt) = prompt.filter(|p| !p.is_empty()) {
        parts.push(Part::Text {
            text: prompt.to_owned(),
        });
    }
    let said = |p: &&Value| !(p.is_null() || p.as_object().is_some_and(|o| o.is_empty()));
    if let Some(params) = params.filter(said) {
        parts.push(Part::Text {
            text: format!("Params: {params}"),
        });
    }
    let content = match parts.as_slice() {
        [] => return None,
        [Part::Text { text }] => Content::Text(text.clone()),
        _ => Content::Parts(parts),
    };
    Some(Message::User {
        content,
        meta: Meta {
            tags: vec![SPAWN_PROMPT.to_owned()],
            ..Meta::default()
        },
    })
}

/// What a parent learns about one requested child.
#[derive(Clone, Debug)]
pub struct ChildReport {
    /// The child's `agentType` (the matched `spawnableAgents` entry, or the
    /// requested type when it was refused).
    pub agent_type: String,
    /// The template's display name (the requested type when it was refused).
    pub agent_name: String,
    /// The child's agent id (`None` when it never started).
    pub agent_id: Option<AgentId>,
    /// Every attempt's run id, in order (empty when it never started).
    pub run_ids: Vec<RunId>,
    /// How it ended (`failed` when it never started).
    pub status: AgentStatus,
    /// The child's output value, or `{errorMessage}` when it could not start or failed.
    pub value: Value,
    /// Credits of every attempt, failed ones included.
    pub credits: f64,
    /// The final history, for inline merges.
    pub history: Option<History>,
    /// What kind of failure ended it (`None` when it completed); `value`'s
    /// `errorMessage` says it in words.
    pub error_kind: Option<FailureKind>,
}

impl ChildReport {
    /// A child that never started (refused, or not permitted).
    pub fn refused(agent_type: &str, message: &str) -> Self {
        ChildReport {
            agent_type: agent_type.to_owned(),
            agent_name: agent_type.to_owned(),
            agent_id: None,
            run_ids: Vec::new(),
            status: AgentStatus::Failed,
            value: json!({ "errorMessage": message }),
            credits: 0.0,
            history: None,
            error_kind: Some(FailureKind::NotStarted),
        }
    }

    /// The entry of a `spawn_agents` result; with a `budget` (estimated
    /// tokens), a larger `value` is cut to it ([`cut_report`]).
    pub(crate) fn entry(&self, budget: Option<u64>) -> Value {
        let run_id = self.run_ids.last();
        let cut = budget.and_then(|b| cut_report(&self.value, b, run_id));
        let value = cut.unwrap_or_else(|| self.value.clone());
        entry_value(
            self.agent_name.clone(),
            self.agent_type.clone(),
            self.agent_id.as_ref(),
            run_id,
            value,
        )
    }

    /// Like [`entry`](Self::entry), taking the report apart: the value moves
    /// into the entry (a child's report can be a whole subtree's answers; it
    /// is not copied), and the run ids come back for the parent's record.
    pub(crate) fn into_entry(self, budget: Option<u64>) -> (Value, Vec<RunId>) {
        let ChildReport {
            agent_type,
            agent_name,
            agent_id,
            run_ids,
            value,
            ..
        } = self;
        let run_id = run_ids.last();
        let value = match budget.and_then(|b| cut_report(&value, b, run_id)) {
            Some(cut) => cut,
            None => value,
        };
        // The report is used up here: its strings move into the entry.
        let entry = entry_value(agent_name, agent_type, agent_id.as_ref(), run_id, value);
        (entry, run_ids)
    }

    /// The `{errorMessage}` of a failed child, if it failed.
    pub(crate) fn error_message(&self) -> Option<&str> {
        self.value.get("errorMessage").and_then(Value::as_str)
    }
}

/// One entry of a spawn result, built as a map directly (the `json!` macro
/// would serialise `value` into a copy). The model reads the ids as text:
/// a child that never started has the agent id `""` and the run id `null`.
fn entry_value(
    agent_name: String,
    agent_type: String,
    agent_id: Option<&AgentId>,
    run_id: Option<&RunId>,
    value: Value,
) -> Value {
    let mut map = serde_json::Map::with_capacity(5);
    map.insert("agentName".to_owned(), Value::String(agent_name));
    map.insert("agentType".to_owned(), Value::String(agent_type));
    map.insert(
        "agentId".to_owned(),
        Value::String(agent_id.map(ToString::to_string).unwrap_or_default()),
    );
    map.insert(
        "runId".to_owned(),
        run_id.map_or(Value::Null, |r| Value::String(r.to_string())),
    );
    map.insert("value".to_owned(), value);
    Value::Object(map)
}

/// A child's report `value` cut to `budget` estimated tokens, or `None` when
/// it fits (semantics §10). A string keeps its first bytes
/// (on a char boundary) followed by the note; any other value is cut as its
/// JSON text inside `{type: "truncated", text, cutBytes, runId, note}`. The
/// note says how many bytes were left out and where the full value is.
pub fn cut_report(value: &Value, budget: u64, run_id: Option<&RunId>) -> Option<Value> {
    use crate::message::{ESTIMATED_BYTES_PER_TOKEN, json_len};
    if (json_len(value) as u64).div_ceil(ESTIMATED_BYTES_PER_TOKEN) <= budget {
        return None;
    }
    let text = match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let budget_bytes =
        usize::try_from(budget.saturating_mul(ESTIMATED_BYTES_PER_TOKEN)).unwrap_or(usize::MAX);
    if text.len() <= budget_bytes {
        // Only the estimate was over: the text itself fits.
        return None;
    }
    // The last char boundary within the budget (MSRV 1.88 has no floor_char_boundary).
    let keep = (0..=budget_bytes)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let cut = text.len() - keep;
    let mut kept = text;
    kept.truncate(keep);
    let note = match run_id {
        // The path's run id is URL-encoded (its `/`s are one path segment),
        // so the path works as written.
        Some(run) => format!(
            "[report cut to fit the context window: {cut} of {} bytes left out; \
             the full value is in run {run} (arbor show {run}, GET /v1/runs/{})]",
            keep + cut,
            run.to_string().replace('%', "%25").replace('/', "%2F")
        ),
        None => format!(
            "[report cut to fit the context window: {cut} of {} bytes left out]",
            keep + cut
        ),
    };
    Some(match value {
        Value::String(_) => Value::String(format!("{kept}\n{note}")),
        _ => json!({
            "type": "truncated",
            "text": kept,
            "cutBytes": cut,
            "runId": run_id,
            "note": note,
        }),
    })
}

/// The value a finished child reports: its output, or `{errorMessage}` on failure.
pub(crate) fn report_value(state: &AgentState, output: Value) -> Value {
    match state.status {
        AgentStatus::Completed => output,
        _ => {
            let message = output
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("Agent failed");
            let mut value = json!({ "errorMessage": message });
            // What a failed or cancelled isolated child changed is kept on
            // its branch: the parent learns where (issue 36).
            if let (Some(worktree), Some(map)) = (output.get("worktree"), value.as_object_mut()) {
                map.insert("worktree".to_owned(), worktree.clone());
            }
            value
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A wide call's children are planned from their entries' places in
    /// the call's text, whether the model sent an object or the same JSON
    /// as a string (issue 34).
    #[test]
    fn a_spawn_calls_children_are_planned_from_their_place_in_its_text() {
        let input = json!({"note": "[not] {an entry}", "agents": [
            {"agent_type": "leaf", "prompt": "ünïcode ] }"},
            {"agent_type": "nope"},
            {"agent_type": "leaf", "params": {"k": [1, {"x": "]"}]}, "prompt": "b"},
        ]});
        let parent = AgentTemplate::new("p", "m").spawns(&["leaf"]);
        let leaf = Arc::new(AgentTemplate::new("leaf", "m"));
        for sent in [input.clone(), json!(input.to_string())] {
            let call = crate::message::ToolCall {
                tool_call_id: "c".into(),
                tool_name: "spawn_agents".into(),
                input: sent.into(),
            };
            let message = Arc::new(Message::assistant(None, vec![call]));
            let planned = SpawnPlan::check(
                &parent,
                (message, 0),
                "spawn_agents",
                &Arc::new(History::new()),
                &Notices::default(),
                |id| (id == "leaf").then(|| leaf.clone()),
                |id| id == "leaf",
            );
            let plans = planned.plans();
            assert_eq!(plans.len(), 3);
            let first = plans[0].as_ref().unwrap();
            assert_eq!(first.prompt.as_deref(), Some("ünïcode ] }"));
            assert_eq!(&*first.agent_type, "leaf");
            assert_eq!(
                plans[1].as_ref().unwrap_err(),
                &("nope".to_owned(), "Agent type nope not found".to_owned())
            );
            let third = plans[2].as_ref().unwrap();
            assert_eq!(
                third.params.as_deref(),
                Some(&json!({"k": [1, {"x": "]"}]}))
            );
            // Two children of one kind share it.
            assert_eq!(planned.plan.kinds().len(), 1);
        }
    }

    /// The review of issue 34's change: of duplicate keys the last wins, as
    /// when the call was checked as a value, both in an entry and for the
    /// `agents` list itself (a struct refuses duplicates: the child was
    /// counted, then could not be planned).
    #[test]
    fn duplicate_keys_plan_the_last_as_the_check_read_them() {
        let text = r#"{"agents":[{"agent_type":"x"}],"agents":[{"agent_type":"leaf","prompt":"a","prompt":"b"}]}"#;
        let call = crate::message::ToolCall {
            tool_call_id: "c".into(),
            tool_name: "spawn_agents".into(),
            input: json!(text).into(),
        };
        let message = Arc::new(Message::assistant(None, vec![call]));
        let parent = AgentTemplate::new("p", "m").spawns(&["leaf"]);
        let leaf = Arc::new(AgentTemplate::new("leaf", "m"));
        let planned = SpawnPlan::check(
            &parent,
            (message, 0),
            "spawn_agents",
            &Arc::new(History::new()),
            &Notices::default(),
            |id| (id == "leaf").then(|| leaf.clone()),
            |id| id == "leaf",
        );
        let plans = planned.plans();
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].as_ref().unwrap().prompt.as_deref(), Some("b"));
    }

    #[test]
    fn a_report_under_its_share_is_untouched() {
        let value = json!({"type": "lastMessage", "value": "short"});
        assert_eq!(
            cut_report(&value, 100, Some(&"T/0.1".parse().unwrap())),
            None
        );
        assert_eq!(cut_report(&json!("é".repeat(10)), 100, None), None);
    }

    #[test]
    fn a_string_report_over_its_share_is_cut_on_a_char_boundary_with_a_note() {
        // 3 bytes a char: a budget of 4 tokens (16 bytes) keeps 5 chars (15 bytes).
        let long = "€".repeat(100);
        let cut = cut_report(&json!(long), 4, Some(&"T/0.2".parse().unwrap())).unwrap();
        let text = cut.as_str().unwrap();
        let (kept, note) = text.split_once('\n').unwrap();
        assert_eq!(kept, "€".repeat(5));
        assert!(note.contains("285 of 300 bytes left out"), "{note}");
        assert!(note.contains("arbor show T/0.2"), "{note}");
        assert!(note.contains("GET /v1/runs/T%2F0.2)"), "{note}");
    }

    /// Issue 34: the note's `GET` path failed unless the reader encoded the
    /// run id; it is written encoded, as the route takes it.
    #[test]
    fn the_cut_reports_get_path_is_written_with_the_run_id_url_encoded() {
        let cut = cut_report(
            &json!("x".repeat(100)),
            4,
            Some(&"t1/0.1~2.3".parse().unwrap()),
        )
        .unwrap();
        let note = cut.as_str().unwrap().split_once('\n').unwrap().1.to_owned();
        assert!(note.contains("arbor show t1/0.1~2.3,"), "{note}");
        assert!(note.contains("GET /v1/runs/t1%2F0.1~2.3)"), "{note}");
    }

    #[test]
    fn a_json_report_over_its_share_is_cut_as_text_in_a_truncated_wrapper() {
        let value = json!({"type": "lastMessage", "value": "x".repeat(1000)});
        let full = value.to_string();
        let cut = cut_report(&value, 10, Some(&"T/0.3".parse().unwrap())).unwrap();
        assert_eq!(cut["type"], "truncated");
        assert_eq!(cut["text"], json!(full[..40]));
        assert_eq!(cut["cutBytes"], json!(full.len() - 40));
        assert_eq!(cut["runId"], "T/0.3");
        let note = cut["note"].as_str().unwrap();
        assert!(
            note.contains(&format!(
                "{} of {} bytes left out",
                full.len() - 40,
                full.len()
            )),
            "{note}"
        );
        assert!(note.contains("the full value is in run T/0.3"), "{note}");
    }

    #[test]
    fn an_empty_prompt_and_empty_params_add_no_prompt_message() {
        assert!(prompt_message(Some(""), None).is_none());
        assert!(prompt_message(Some(""), Some(&json!({}))).is_none());
        assert!(prompt_message(None, Some(&json!({}))).is_none());
        assert!(prompt_message(None, Some(&Value::Null)).is_none());
        let only_params = prompt_message(Some(""), Some(&json!({"n": 1}))).unwrap();
        assert_eq!(
            serde_json::to_value(&only_params).unwrap()["content"],
            json!("Params: {\"n\":1}")
        );
        let t = AgentTemplate::new("a", "m");
        assert!(input_messages(&t, Some(""), Some(&json!({}))).is_empty());
    }
}
