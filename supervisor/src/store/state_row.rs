//! A state as a checkpoint record keeps it: the state row, written by the
//! encoder after each checkpoint record (`{"st": ROW}`) and read back by
//! the log. The one place its fields and their order are spelled.

use std::borrow::Cow;
use std::sync::Arc;

use arbor_actors::state::ToolDefinitions;
use arbor_actors::{
    AgentId, AgentState, AgentStatus, Checkpoint, FailureKind, History, IdError, RunId,
};
use serde::ser::{Serialize, SerializeTuple, Serializer};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// A state as a checkpoint record keeps it, without its history (the
/// record's message ids) and with its shared values by id. Stored as a JSON
/// array of its fields in this order, without key names (a segment holds
/// one per checkpoint). Ids of the tree's own runs are kept without the
/// `TREE/` every one of them starts with.
///
/// A row has 18 fields, 19 for an isolated run's final state (its
/// worktree); one a build before failure kinds wrote has 17 (no
/// `error_kind`) and reads as one without a kind.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub(crate) struct StateRow<'a> {
    /// The agent id; `None` when it is the run id.
    pub(crate) agent_id: Option<RowId<'a>>,
    /// The agent type.
    pub(crate) agent_type: Option<Cow<'a, str>>,
    /// The run id.
    pub(crate) run_id: RowId<'a>,
    /// The parent's agent id; `None` when it is the last ancestor (or there
    /// is none).
    pub(crate) parent_id: Option<RowId<'a>>,
    /// The ancestors' run ids, the root first.
    pub(crate) ancestor_run_ids: Vec<RowId<'a>>,
    /// The children's run ids.
    pub(crate) child_run_ids: Vec<RowId<'a>>,
    /// The output (a final state's is stored once, here).
    pub(crate) output: Cow<'a, Option<Value>>,
    /// The id of the system prompt's record.
    pub(crate) system_prompt: u64,
    /// The id of the tool definitions' record.
    pub(crate) tool_definitions: u64,
    /// Tokens of the context.
    pub(crate) context_token_count: u64,
    /// Steps remaining.
    pub(crate) steps_remaining: u32,
    /// Credits used, with the subtree's.
    pub(crate) credits_used: f64,
    /// Credits used by the run itself.
    pub(crate) direct_credits_used: f64,
    /// The status.
    pub(crate) status: AgentStatus,
    /// Model steps taken (the checkpoint's).
    pub(crate) step: u32,
    /// Children spawned (the checkpoint's).
    pub(crate) children_spawned: u32,
    /// Messages inherited from the parent (the checkpoint's).
    pub(crate) inherited: usize,
    /// What kind of failure ended the run.
    #[serde(default)]
    pub(crate) error_kind: Option<FailureKind>,
    /// The sealed worktree of an isolated run (issue 36); written only
    /// when there is one, so every other row keeps its 18 fields.
    #[serde(default)]
    pub(crate) worktree: Cow<'a, Option<Box<arbor_actors::worktree::WorktreeReport>>>,
}

/// An id in a row: `PATH` for a run of the row's tree (`0.2~1`), else the
/// whole `TREE/PATH`.
#[derive(Clone, Debug)]
pub(crate) enum RowId<'a> {
    /// An id of the state being written; `short`: of the row's tree.
    Of {
        /// The id.
        id: &'a RunId,
        /// Whether it is written without its tree.
        short: bool,
    },
    /// An id as a stored row holds it.
    Text(Cow<'a, str>),
}

impl<'a> RowId<'a> {
    /// `id`, in a row of tree `tree_id`.
    fn of(id: &'a RunId, tree_id: &str) -> Self {
        RowId::Of {
            id,
            short: id.tree().as_str() == tree_id,
        }
    }

    /// The id this stands for, in a row of tree `tree_id`.
    fn read(&self, tree_id: &str) -> Result<RunId, IdError> {
        match self {
            RowId::Of { id, .. } => Ok((*id).clone()),
            RowId::Text(text) if text.contains('/') => text.parse(),
            RowId::Text(text) => format!("{tree_id}/{text}").parse(),
        }
    }
}

impl Serialize for RowId<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            RowId::Of { id, short: true } => serializer.collect_str(&id.path_text()),
            RowId::Of { id, short: false } => serializer.collect_str(id),
            RowId::Text(text) => serializer.serialize_str(text),
        }
    }
}

impl<'de> Deserialize<'de> for RowId<'_> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(|text| RowId::Text(Cow::Owned(text)))
    }
}

/// Two row ids are alike when they are written alike.
impl PartialEq for RowId<'_> {
    fn eq(&self, other: &Self) -> bool {
        let text = |id: &RowId<'_>| match id {
            RowId::Of { id, short: true } => id.path_text().to_string(),
            RowId::Of { id, short: false } => id.to_string(),
            RowId::Text(text) => text.to_string(),
        };
        text(self) == text(other)
    }
}

/// Fields of a row as this build writes it.
const FIELDS: usize = 18;

/// Where a row keeps the output (see [`StateRow::output_of`]).
const OUTPUT_AT: usize = 6;

impl Serialize for StateRow<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = FIELDS + usize::from(self.worktree.is_some());
        let mut row = serializer.serialize_tuple(fields)?;
        row.serialize_element(&self.agent_id)?;
        row.serialize_element(&self.agent_type)?;
        row.serialize_element(&self.run_id)?;
        row.serialize_element(&self.parent_id)?;
        row.serialize_element(&self.ancestor_run_ids)?;
        row.serialize_element(&self.child_run_ids)?;
        row.serialize_element(&self.output)?;
        row.serialize_element(&self.system_prompt)?;
        row.serialize_element(&self.tool_definitions)?;
        row.serialize_element(&self.context_token_count)?;
        row.serialize_element(&self.steps_remaining)?;
        row.serialize_element(&self.credits_used)?;
        row.serialize_element(&self.direct_credits_used)?;
        row.serialize_element(&self.status)?;
        row.serialize_element(&self.step)?;
        row.serialize_element(&self.children_spawned)?;
        row.serialize_element(&self.inherited)?;
        row.serialize_element(&self.error_kind)?;
        if self.worktree.is_some() {
            row.serialize_element(&self.worktree)?;
        }
        row.end()
    }
}

impl<'a> StateRow<'a> {
    /// The row of `state` in tree `tree_id`, at a checkpoint that has taken
    /// `step` steps, spawned `children_spawned` children and inherited
    /// `inherited` messages; its system prompt and tool definitions are the
    /// records `system_prompt` and `tools`.
    pub(crate) fn of(
        tree_id: &str,
        state: &'a AgentState,
        (system_prompt, tools): (u64, u64),
        (step, children_spawned, inherited): (u32, u32, usize),
    ) -> Self {
        let short = |id: &'a RunId| RowId::of(id, tree_id);
        let last_ancestor = state.parent_run_id();
        StateRow {
            agent_id: (state.agent_id != state.run_id).then(|| short(state.agent_id.as_run())),
            agent_type: state.agent_type.as_deref().map(Cow::Borrowed),
            run_id: short(&state.run_id),
            parent_id: state
                .parent_id
                .as_ref()
                .map(AgentId::as_run)
                .filter(|p| last_ancestor != Some(*p))
                .map(short),
            ancestor_run_ids: state.ancestor_run_ids.iter().map(short).collect(),
            child_run_ids: state.child_run_ids.iter().map(short).collect(),
            output: Cow::Borrowed(&state.output),
            system_prompt,
            tool_definitions: tools,
            context_token_count: state.context_token_count,
            steps_remaining: state.steps_remaining,
            credits_used: state.credits_used,
            direct_credits_used: state.direct_credits_used,
            status: state.status,
            step,
            children_spawned,
            inherited,
            error_kind: state.error_kind,
            worktree: Cow::Borrowed(&state.worktree),
        }
    }
}

impl StateRow<'static> {
    /// A row as a segment holds it.
    pub(crate) fn read(row: &Value) -> Result<Self, serde_json::Error> {
        StateRow::deserialize(row)
    }

    /// The checkpoint this row of tree `tree_id` describes, with its
    /// history and the system prompt and tool definitions its ids name; an
    /// id that is no run id is an error. Ids are taken as they were written
    /// (an agent id keeps an attempt it was stored with).
    pub(crate) fn into_checkpoint(
        self,
        tree_id: &str,
        history: History,
        system_prompt: Arc<str>,
        tool_definitions: ToolDefinitions,
    ) -> Result<Checkpoint, IdError> {
        let full = |id: &RowId<'_>| id.read(tree_id);
        let run_id = full(&self.run_id)?;
        let ancestor_run_ids = self
            .ancestor_run_ids
            .iter()
            .map(full)
            .collect::<Result<Arc<[RunId]>, _>>()?;
        let agent_id = match &self.agent_id {
            Some(id) => full(id)?,
            None => run_id.clone(),
        };
        let parent_id = match &self.parent_id {
            Some(id) => Some(full(id)?),
            None => ancestor_run_ids.last().cloned(),
        };
        Ok(Checkpoint {
            step: self.step,
            children_spawned: self.children_spawned,
            inherited: self.inherited,
            state: AgentState {
                agent_id: AgentId::from_run(agent_id),
                agent_type: self.agent_type.map(Cow::into_owned),
                parent_id: parent_id.map(AgentId::from_run),
                run_id,
                ancestor_run_ids,
                child_run_ids: self
                    .child_run_ids
                    .iter()
                    .map(full)
                    .collect::<Result<_, _>>()?,
                message_history: history,
                output: self.output.into_owned(),
                system_prompt,
                tool_definitions,
                context_token_count: self.context_token_count,
                steps_remaining: self.steps_remaining,
                credits_used: self.credits_used,
                direct_credits_used: self.direct_credits_used,
                status: self.status,
                error_kind: self.error_kind,
                worktree: self.worktree.into_owned(),
            },
        })
    }

    /// The output a stored row keeps, without reading the rest of it.
    pub(crate) fn output_of(row: &Value) -> Option<&Value> {
        row.get(OUTPUT_AT)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::borrow::Cow;
    use std::sync::Arc;

    use arbor_actors::{AgentState, AgentStatus, FailureKind, History, Message};
    use serde_json::json;

    use super::StateRow;

    /// A child's final state in tree `t1`, every field set.
    fn state() -> AgentState {
        let mut history = History::new();
        history.push(Message::user("go"));
        AgentState {
            agent_id: "t1/0.2".parse().unwrap(),
            agent_type: Some("worker".into()),
            run_id: "t1/0.2~1".parse().unwrap(),
            parent_id: Some("t1/0~1".parse().unwrap()),
            ancestor_run_ids: ["t1/0".parse().unwrap(), "t1/0~1".parse().unwrap()].into(),
            child_run_ids: vec!["t1/0.2~1.1".parse().unwrap(), "other/0".parse().unwrap()],
            message_history: history,
            output: Some(json!({"answer": 42})),
            system_prompt: Arc::from("be brief"),
            tool_definitions: Default::default(),
            context_token_count: 120,
            steps_remaining: 7,
            credits_used: 0.5,
            direct_credits_used: 0.25,
            status: AgentStatus::Failed,
            error_kind: Some(FailureKind::ModelTruncated),
            worktree: None,
        }
    }

    #[test]
    fn a_state_row_round_trips_through_its_stored_json() {
        let state = state();
        let row = StateRow::of("t1", &state, (3, 4), (2, 1, 5));
        let stored = serde_json::to_value(&row).unwrap();
        let read = StateRow::read(&stored).unwrap();
        assert_eq!(read, row);
        assert_eq!(StateRow::output_of(&stored), state.output.as_ref());
        let back = read
            .into_checkpoint(
                "t1",
                state.message_history.clone(),
                state.system_prompt.clone(),
                state.tool_definitions.clone(),
            )
            .unwrap();
        assert_eq!(
            (back.step, back.children_spawned, back.inherited),
            (2, 1, 5)
        );
        assert_eq!(back.state, state);
    }

    /// An isolated run's final row has a 19th field, its worktree, and
    /// reads back with it; every other row keeps its 18.
    #[test]
    fn an_isolated_runs_row_keeps_its_worktree_as_a_nineteenth_field() {
        let mut state = state();
        state.worktree = Some(Box::new(arbor_actors::worktree::WorktreeReport {
            branch: "arbor/worker-t1-0-2-1".into(),
            base: "abc".into(),
            summary: "no changes".into(),
            ..Default::default()
        }));
        let row = StateRow::of("t1", &state, (3, 4), (2, 1, 5));
        let stored = serde_json::to_value(&row).unwrap();
        assert_eq!(stored.as_array().unwrap().len(), 19);
        assert_eq!(stored[18]["branch"], "arbor/worker-t1-0-2-1");
        let back = StateRow::read(&stored)
            .unwrap()
            .into_checkpoint(
                "t1",
                state.message_history.clone(),
                state.system_prompt.clone(),
                state.tool_definitions.clone(),
            )
            .unwrap();
        assert_eq!(back.state, state);
        state.worktree = None;
        let row = StateRow::of("t1", &state, (3, 4), (2, 1, 5));
        assert_eq!(
            serde_json::to_value(&row)
                .unwrap()
                .as_array()
                .unwrap()
                .len(),
            18
        );
    }

    /// Rows as the builds before the named row wrote them (an 18-field
    /// positional tuple, and before failure kinds a 17-field one): the same
    /// JSON, field for field, and it still reads.
    #[test]
    fn a_state_row_written_by_earlier_builds_still_decodes() {
        let written = r#"["0.2","worker","0.2~1",null,["0","0~1"],["0.2~1.1","other/0"],{"answer":42},3,4,120,7,0.5,0.25,"failed",2,1,5,"model_truncated"]"#;
        let state = state();
        let row = StateRow::of("t1", &state, (3, 4), (2, 1, 5));
        assert_eq!(serde_json::to_string(&row).unwrap(), written);
        let read = StateRow::read(&serde_json::from_str(written).unwrap()).unwrap();
        assert_eq!(read, row);

        let before_kinds = r#"[null,null,"0",null,[],[],null,1,2,0,50,0.0,0.0,"running",0,0,0]"#;
        let read = StateRow::read(&serde_json::from_str(before_kinds).unwrap()).unwrap();
        assert_eq!(read.run_id, super::RowId::Text(Cow::Borrowed("0")));
        assert_eq!((read.system_prompt, read.tool_definitions), (1, 2));
        assert_eq!(read.status, AgentStatus::Running);
        assert_eq!(read.error_kind, None);
        let checkpoint = read
            .into_checkpoint("t9", History::new(), Arc::from(""), Default::default())
            .unwrap();
        assert_eq!(checkpoint.state.run_id, "t9/0");
        assert_eq!(checkpoint.state.agent_id, "t9/0");
        assert_eq!(checkpoint.state.parent_id, None);
    }

    /// A row whose id is no run id is an error when read back, naming it
    /// (before typed ids it read as a state with that text for an id).
    #[test]
    fn a_state_row_with_an_id_that_is_no_run_id_is_refused() {
        let written = r#"[null,null,"0",null,[],["0.x"],null,1,2,0,50,0.0,0.0,"running",0,0,0]"#;
        let read = StateRow::read(&serde_json::from_str(written).unwrap()).unwrap();
        let error = read
            .into_checkpoint("t9", History::new(), Arc::from(""), Default::default())
            .unwrap_err();
        assert!(error.to_string().contains("t9/0.x"), "{error}");
    }
}
