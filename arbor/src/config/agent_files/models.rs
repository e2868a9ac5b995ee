//! The model each loaded agent runs on: its named model through
//! `[model_aliases]`, or, on `inherit`, its spawners' one model.

use std::collections::{BTreeMap, BTreeSet};

use super::super::{ConfigFile, ModelSection};
use super::{Mapped, ModelChoice};

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
    pub(super) fn resolve_all(&self) -> BTreeMap<String, Result<String, String>> {
        let mut out: BTreeMap<String, Result<String, String>> = BTreeMap::new();
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
                    format!(
                        "inherit (also what no model means): agent {id:?} takes the model of the \
                         agents that spawn it ({}), and none of them has one to give: name its \
                         model, or set [model_aliases] inherit = \"<a [models] entry>\"",
                        from.into_iter().collect::<Vec<_>>().join(", ")
                    )
                }),
                _ => Err(format!(
                    "inherit: agent {id:?} is spawned by agents on different models ({}), and \
                     Arbor picks an inherited model when the config is read: name its model \
                     (model: sonnet, with [model_aliases])",
                    from.iter()
                        .map(|s| {
                            let on: Vec<String> = sets
                                .get(s)
                                .map(|m| m.iter().map(|m| format!("{m:?}")).collect())
                                .unwrap_or_default();
                            format!("{s} on {}", on.join(" or "))
                        })
                        .collect::<Vec<_>>()
                        .join("; ")
                )),
            };
            out.insert(id.to_owned(), result);
        }
        out
    }

    /// An `inherit` agent nothing spawns runs as a root: on
    /// `[model_aliases] inherit`, else on the config's only model.
    fn root_model(&self, id: &str) -> Result<String, String> {
        if let Some(model) = self.file.model_aliases.get("inherit") {
            return Ok(model.clone());
        }
        let mut configured = self.file.models.keys();
        if let (Some(only), None) = (configured.next(), configured.next()) {
            return Ok(only.clone());
        }
        Err(format!(
            "inherit (also what no model means): agent {id:?} is spawned by no agent, so it \
             has no parent's model to take: set [model_aliases] inherit = \"<a [models] entry>\" (the model such \
             a root runs on), or name its model (configured: {})",
            self.configured()
        ))
    }

    /// A named model: a `[model_aliases]` key, a `[models]` entry, or the
    /// model id of one `openai` or `anthropic` entry.
    fn named(&self, name: &str) -> Result<String, String> {
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
            return Err(format!(
                "{name:?} is a Claude Code alias: say which [models] entry it is with \
                 [model_aliases] {name} = \"<a [models] entry>\" (configured: {})",
                self.configured()
            ));
        }
        Err(format!(
            "{name:?} is not a [model_aliases] key, a [models] entry, nor the model id of one \
             (configured: {}): add [model_aliases] \"{name}\" = \"<a [models] entry>\"",
            self.configured()
        ))
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
