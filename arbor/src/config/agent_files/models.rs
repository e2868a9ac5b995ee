//! The model each loaded agent runs on: its named model through
//! `[model_aliases]`, or, on `inherit`, its spawners' one model.

use std::collections::{BTreeMap, BTreeSet};

use super::super::{ConfigFile, ModelSection};
use super::{Mapped, ModelChoice};

/// Why a loaded agent has no model to run on.
#[derive(Debug, thiserror::Error)]
pub(super) enum NoModel {
    /// An `inherit` agent nothing spawns, and no model a root runs on (the
    /// agent, the configured models).
    #[error(
        "inherit (also what no model means): agent {0:?} is spawned by no agent, so it \
         has no parent's model to take: set [model_aliases] inherit = \"<a [models] entry>\" (the model such \
         a root runs on), or name its model (configured: {1})"
    )]
    Root(String, String),
    /// An `inherit` agent whose spawners have no model to give (the agent,
    /// its spawners).
    #[error(
        "inherit (also what no model means): agent {0:?} takes the model of the \
         agents that spawn it ({1}), and none of them has one to give: name its \
         model, or set [model_aliases] inherit = \"<a [models] entry>\""
    )]
    NoneToGive(String, String),
    /// An `inherit` agent whose spawners run on different models (the
    /// agent, each spawner with its models).
    #[error(
        "inherit: agent {0:?} is spawned by agents on different models ({1}), and \
         Arbor picks an inherited model when the config is read: name its model \
         (model: sonnet, with [model_aliases])"
    )]
    Different(String, String),
    /// A Claude Code alias with no `[model_aliases]` entry (the alias, the
    /// configured models).
    #[error(
        "{0:?} is a Claude Code alias: say which [models] entry it is with \
         [model_aliases] {0} = \"<a [models] entry>\" (configured: {1})"
    )]
    ClaudeAlias(String, String),
    /// A name that is no alias, entry nor model id (the name, the
    /// configured models).
    #[error(
        "{0:?} is not a [model_aliases] key, a [models] entry, nor the model id of one \
         (configured: {1}): add [model_aliases] \"{0}\" = \"<a [models] entry>\""
    )]
    Unknown(String, String),
    /// An agent the loader asked about that is not loaded.
    #[error("no agent {0:?}")]
    NoAgent(String),
}

/// The model each loaded agent runs on.
pub(super) struct Models<'a> {
    pub(super) file: &'a ConfigFile,
    pub(super) unique: &'a [(String, Mapped)],
    pub(super) spawns: &'a BTreeMap<String, Vec<String>>,
}

impl Models<'_> {
    /// The `[models]` entry each loaded agent runs on: its named model
    /// (through `[model_aliases]`), or, on `inherit`, the one model of the
    /// agents that spawn it (TOML ones run on their `model`). The models an
    /// agent may run on are found by growing each inheriting agent's set
    /// from its spawners' until nothing changes (a cycle included); an
    /// inheriting agent that nothing spawns, or whose spawners have no
    /// model to give, runs as a root does.
    pub(super) fn resolve_all(&self) -> BTreeMap<String, Result<String, NoModel>> {
        let mut out: BTreeMap<String, Result<String, NoModel>> = BTreeMap::new();
        let mut sets: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for (name, agent) in &self.file.agents {
            sets.insert(name, BTreeSet::from([agent.model.clone()]));
        }
        let spawners = |id: &str| -> BTreeSet<&str> {
            self.file
                .agents
                .iter()
                .filter(|(_, a)| a.spawnable_agents.iter().any(|s| s == id))
                .map(|(n, _)| n.as_str())
                .chain(
                    self.spawns
                        .iter()
                        .filter(|(_, list)| list.iter().any(|s| s == id))
                        .map(|(n, _)| n.as_str()),
                )
                .collect()
        };
        let mut inheriting = Vec::new();
        for (_, m) in self.unique {
            match &m.model {
                ModelChoice::Named(name, _) => {
                    let model = self.named(name);
                    if let Ok(model) = &model {
                        sets.insert(&m.id, BTreeSet::from([model.clone()]));
                    }
                    out.insert(m.id.clone(), model);
                }
                ModelChoice::Inherit(_) => {
                    let from = spawners(&m.id);
                    if from.is_empty()
                        && let Ok(model) = self.root_model(&m.id)
                    {
                        sets.insert(&m.id, BTreeSet::from([model]));
                    }
                    inheriting.push((m.id.as_str(), from));
                }
            }
        }
        // Each round adds a model to a set or ends: at most one round per
        // (agent, model) pair.
        loop {
            let mut changed = false;
            for (id, from) in &inheriting {
                let mut grown: BTreeSet<String> = sets.get(id).cloned().unwrap_or_default();
                for spawner in from {
                    if let Some(models) = sets.get(spawner) {
                        grown.extend(models.iter().cloned());
                    }
                }
                if grown.len() > sets.get(id).map_or(0, BTreeSet::len) {
                    sets.insert(id, grown);
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        for (id, from) in inheriting {
            let models = sets.get(id).cloned().unwrap_or_default();
            let result = match models.len() {
                1 => Ok(models.into_iter().next().unwrap_or_default()),
                0 if from.is_empty() => self.root_model(id),
                0 => self.root_model(id).map_err(|_| {
                    NoModel::NoneToGive(
                        id.to_owned(),
                        from.into_iter().collect::<Vec<_>>().join(", "),
                    )
                }),
                _ => Err(NoModel::Different(
                    id.to_owned(),
                    from.iter()
                        .map(|s| {
                            let on: Vec<String> = sets
                                .get(s)
                                .map(|m| m.iter().map(|m| format!("{m:?}")).collect())
                                .unwrap_or_default();
                            format!("{s} on {}", on.join(" or "))
                        })
                        .collect::<Vec<_>>()
                        .join("; "),
                )),
            };
            out.insert(id.to_owned(), result);
        }
        out
    }

    /// An `inherit` agent nothing spawns runs as a root: on
    /// `[model_aliases] inherit`, else on the config's only model.
    fn root_model(&self, id: &str) -> Result<String, NoModel> {
        if let Some(model) = self.file.model_aliases.get("inherit") {
            return Ok(model.clone());
        }
        let mut configured = self.file.models.keys();
        if let (Some(only), None) = (configured.next(), configured.next()) {
            return Ok(only.clone());
        }
        Err(NoModel::Root(id.to_owned(), self.configured()))
    }

    /// A named model: a `[model_aliases]` key, a `[models]` entry, or the
    /// model id of one `openai` or `anthropic` entry.
    fn named(&self, name: &str) -> Result<String, NoModel> {
        if let Some(model) = self.file.model_aliases.get(name) {
            return Ok(model.clone());
        }
        if self.file.models.contains_key(name) {
            return Ok(name.to_owned());
        }
        let by_id = self.file.models.iter().find(|(_, m)| match m {
            ModelSection::Openai(s) | ModelSection::Anthropic(s) => s.model == name,
            _ => false,
        });
        if let Some((entry, _)) = by_id {
            return Ok(entry.clone());
        }
        if ["sonnet", "opus", "haiku"].contains(&name) {
            return Err(NoModel::ClaudeAlias(name.to_owned(), self.configured()));
        }
        Err(NoModel::Unknown(name.to_owned(), self.configured()))
    }

    fn configured(&self) -> String {
        let names: Vec<&str> = self.file.models.keys().map(String::as_str).collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    }
}
