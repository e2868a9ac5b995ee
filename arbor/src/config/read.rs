//! Reading the file: TOML parsed once (the `Source`), read into
//! [`ConfigFile`] with every problem reported with its key and line (the
//! `Reader`), and the stored snapshot's redaction.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use arbor_supervisor::TreeLimits;
use serde::Deserialize as _;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::{ConfigFile, ModelSection, Problem};

/// Parses TOML into the file structure, reporting every problem it can
/// find, each with its key and line: a value of the wrong type is dropped and
/// the rest of its table read on, so one `check-config` shows them all. An
/// entry that cannot be read at all (a required key missing) is left out and
/// its name returned in `broken`, so that what names it is not reported too.
pub(super) fn parse_file(
    text: &Source<'_>,
) -> Result<(ConfigFile, Vec<Problem>, HashSet<String>), Problem> {
    // The tree the parser built, as values: no second parse.
    let root = toml::Table::deserialize(toml::de::Deserializer::from(text.root.clone()))
        .map_err(|e| Source::syntax(text.text, &e))?;
    let mut reader = Reader {
        text,
        problems: Vec::new(),
        broken: HashSet::new(),
    };
    let mut file = ConfigFile::default();
    for (key, value) in root {
        match key.as_str() {
            "run" => reader.section(&key, value, &mut file.run),
            "limits" => {
                let mut limits = LimitsTable::default();
                reader.section(&key, value, &mut limits);
                file.limits = limits.0;
            }
            "store" => reader.section(&key, value, &mut file.store),
            "service" => reader.section(&key, value, &mut file.service),
            "policy" => reader.section(&key, value, &mut file.policy),
            "hooks" => reader.section(&key, value, &mut file.hooks),
            "workspace" => reader.section(&key, value, &mut file.workspace),
            "models" => {
                for (name, entry) in reader.entries(&key, value) {
                    if let Some(model) = reader.model(&name, entry) {
                        file.models.insert(name, model);
                    }
                }
            }
            "agents" => {
                let mut value = value;
                if let toml::Value::Table(table) = &mut value
                    && let Some(include) = table.remove("include")
                {
                    file.agent_include = reader.include(include);
                }
                reader.map(&key, value, &mut file.agents)
            }
            "model_aliases" => reader.section(&key, value, &mut file.model_aliases),
            "stored_agent_files" => reader.section(&key, value, &mut file.stored_agent_files),
            "mcp_servers" => reader.map(&key, value, &mut file.mcp_servers),
            "tools" => reader.map(&key, value, &mut file.tools),
            _ => reader.problems.push(Problem {
                file: None,
                line: text.line(&[key.as_str()]),
                key: key.clone(),
                message: format!(
                    "unknown section `{key}` (run, limits, models, agents, store, service, \
                     mcp_servers, tools, policy, hooks, workspace, model_aliases)"
                ),
            }),
        }
    }
    Ok((file, reader.problems, reader.broken))
}

/// `[limits]` in the file's spelling (see [`TreeLimits::deserialize_config`]).
#[derive(Default)]
struct LimitsTable(TreeLimits);

impl<'de> serde::Deserialize<'de> for LimitsTable {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        TreeLimits::deserialize_config(d).map(LimitsTable)
    }
}

/// What a literal secret (a header's or an MCP server's `env` value)
/// removed from a stored config reads.
pub(super) const REDACTED: &str = "(not stored)";

/// A stored config read back: an agent that sets both
/// `inherit_parent_system_prompt` and a `system_prompt` (refused in a file
/// since issue 34) ran on its parent's prompt, its own never sent; the
/// unused one is dropped, so a tree stored before goes on as it ran.
pub(super) fn drop_unsent_system_prompts(file: &mut ConfigFile) {
    for agent in file.agents.values_mut() {
        if agent.inherit_parent_system_prompt {
            agent.system_prompt.clear();
        }
    }
}

impl super::Config {
    /// Whether `stored`, the config text a tree was stored with, is this
    /// config's: compared as stored, without secrets on either side. A tree
    /// stored before stored configs were redacted holds its file's secrets;
    /// it is redacted here first, so the very file it started with is not
    /// taken for another config.
    pub fn is_stored_as(&self, stored: &str) -> bool {
        if *stored == *self.snapshot {
            return true;
        }
        Source::parse(stored).is_ok_and(|s| *s.redacted() == *self.snapshot)
    }
}

/// A config file's text and the tree the TOML parser made of it: parsed
/// once, then read into sections, searched for the line of each problem and
/// redacted from it.
pub(super) struct Source<'t> {
    text: &'t str,
    root: Spanned<DeTable<'t>>,
}

impl<'t> Source<'t> {
    /// Parses `text`, or gives its syntax error as a problem.
    pub(super) fn parse(text: &'t str) -> Result<Self, Problem> {
        let root = DeTable::parse(text).map_err(|e| Source::syntax(text, &e))?;
        Ok(Source { text, root })
    }

    /// A syntax error in `text` as a problem.
    fn syntax(text: &str, e: &toml::de::Error) -> Problem {
        Problem {
            file: None,
            line: e.span().map(|s| line_of(text, s.start)),
            key: "(syntax)".into(),
            message: e.message().trim().to_owned(),
        }
    }

    /// The text without its secrets (see [`super::redact`]): each one's
    /// value replaced where the parser's spans say it is, so the rest of the
    /// text, its comments and its lines, stay as they were.
    pub(super) fn redacted(&self) -> Arc<str> {
        let text = self.text;
        let spans = super::redact::secret_spans(self.root.get_ref());
        if spans.is_empty() {
            return Arc::from(text);
        }
        Arc::from(super::redact::splice(text, &spans))
    }

    /// Whether the file has every key of `path` (not only its first ones:
    /// `line` answers a table's own line when a key under it is missing).
    pub(super) fn has(&self, path: &[&str]) -> bool {
        let Some((first, rest)) = path.split_first() else {
            return false;
        };
        let Some((_, mut value)) = self
            .root
            .get_ref()
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == *first)
        else {
            return false;
        };
        for segment in rest {
            let next = match value.get_ref() {
                DeValue::Table(t) => t
                    .iter()
                    .find(|(k, _)| k.get_ref().as_ref() == *segment)
                    .map(|(_, v)| v),
                DeValue::Array(a) => segment.parse::<usize>().ok().and_then(|i| a.get(i)),
                _ => None,
            };
            match next {
                Some(v) => value = v,
                None => return false,
            }
        }
        true
    }

    /// The line of the deepest key of `path` the file has, from the
    /// parser's spans: quoted keys (`[agents."acme/writer@1"]`), dotted ones
    /// and array elements find their line too.
    pub(super) fn line(&self, path: &[&str]) -> Option<usize> {
        let (first, rest) = path.split_first()?;
        let (key, mut value) = self
            .root
            .get_ref()
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == *first)?;
        let mut at = key.span().start;
        for segment in rest {
            let next = match value.get_ref() {
                DeValue::Table(t) => t
                    .iter()
                    .find(|(k, _)| k.get_ref().as_ref() == *segment)
                    .map(|(k, v)| (k.span().start, v)),
                DeValue::Array(a) => segment
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| a.get(i))
                    .map(|v| (v.span().start, v)),
                _ => None,
            };
            match next {
                Some((start, v)) => {
                    at = start;
                    value = v;
                }
                None => break,
            }
        }
        Some(line_of(self.text, at))
    }
}

/// Reads the file's tables one entry at a time, collecting problems.
struct Reader<'t> {
    text: &'t Source<'t>,
    problems: Vec<Problem>,
    broken: HashSet<String>,
}

impl Reader<'_> {
    /// Deserializes `value` (at `path`); a bad key is reported and removed,
    /// and the rest read again, until it reads or cannot be read at all.
    fn read<T: serde::de::DeserializeOwned>(
        &mut self,
        path: &[&str],
        mut value: toml::Value,
    ) -> Option<T> {
        loop {
            match serde_path_to_error::deserialize::<_, T>(value.clone()) {
                Ok(t) => return Some(t),
                Err(e) => {
                    let inner: Vec<String> = e
                        .path()
                        .iter()
                        .filter_map(|s| match s {
                            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                            serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                            _ => None,
                        })
                        .collect();
                    let full: Vec<&str> = path
                        .iter()
                        .copied()
                        .chain(inner.iter().map(String::as_str))
                        .collect();
                    let message = e.into_inner().message().trim().to_owned();
                    self.problems.push(Problem {
                        file: None,
                        line: self.text.line(&full),
                        key: full.join("."),
                        message,
                    });
                    if inner.is_empty() || !remove(&mut value, &inner) {
                        return None;
                    }
                }
            }
        }
    }

    fn section<T: serde::de::DeserializeOwned>(
        &mut self,
        key: &str,
        value: toml::Value,
        into: &mut T,
    ) {
        if let Some(section) = self.read(&[key], value) {
            *into = section;
        }
    }

    /// The named entries of a table of tables (`[agents.NAME]`).
    fn entries(&mut self, key: &str, value: toml::Value) -> Vec<(String, toml::Value)> {
        match value {
            toml::Value::Table(table) => table.into_iter().collect(),
            other => {
                self.problems.push(Problem {
                    file: None,
                    line: self.text.line(&[key]),
                    key: key.to_owned(),
                    message: format!(
                        "must be a table of named entries, not a {}",
                        other.type_str()
                    ),
                });
                Vec::new()
            }
        }
    }

    fn map<T: serde::de::DeserializeOwned>(
        &mut self,
        key: &str,
        value: toml::Value,
        into: &mut BTreeMap<String, T>,
    ) {
        for (name, entry) in self.entries(key, value) {
            match self.read(&[key, name.as_str()], entry) {
                Some(t) => {
                    into.insert(name, t);
                }
                None => {
                    self.broken.insert(format!("{key}.{name}"));
                }
            }
        }
    }

    /// `[agents] include`: a list of directories or files. `include` is
    /// not an agent's name: a table there is an agent named so, refused.
    fn include(&mut self, value: toml::Value) -> Vec<std::path::PathBuf> {
        let problem = |message: String| Problem {
            file: None,
            line: self.text.line(&["agents", "include"]),
            key: "agents.include".into(),
            message,
        };
        match value {
            toml::Value::Array(items) if items.iter().all(toml::Value::is_str) => items
                .into_iter()
                .filter_map(|i| i.as_str().map(std::path::PathBuf::from))
                .collect(),
            toml::Value::Table(_) => {
                let p = problem(
                    "`include` is the list of agent files and directories to load \
                     (include = [\".claude/agents\"]), not an agent: an agent cannot be named \
                     include, rename it"
                        .into(),
                );
                self.problems.push(p);
                Vec::new()
            }
            other => {
                let p = problem(format!(
                    "must be a list of directories or files (include = [\".claude/agents\"]), not a {}",
                    other.type_str()
                ));
                self.problems.push(p);
                Vec::new()
            }
        }
    }

    /// `[models.NAME]`: its `provider` picks the table's shape.
    fn model(&mut self, name: &str, value: toml::Value) -> Option<ModelSection> {
        let path = ["models", name];
        let mut table = match value {
            toml::Value::Table(t) => t,
            other => {
                self.problems.push(Problem {
                    file: None,
                    line: self.text.line(&path),
                    key: path.join("."),
                    message: format!("must be a table, not a {}", other.type_str()),
                });
                return None;
            }
        };
        let provider = table.remove("provider");
        let known = "simulated, scripted, openai, anthropic";
        let problem = |message: String| Problem {
            file: None,
            line: self
                .text
                .line(&["models", name, "provider"])
                .or_else(|| self.text.line(&path)),
            key: format!("models.{name}.provider"),
            message,
        };
        let rest = toml::Value::Table(table);
        let model = match provider.as_ref().and_then(toml::Value::as_str) {
            Some("simulated") => self.read(&path, rest).map(ModelSection::Simulated),
            Some("scripted") => self.read(&path, rest).map(ModelSection::Scripted),
            Some("openai") => self.read(&path, rest).map(ModelSection::Openai),
            Some("anthropic") => self.read(&path, rest).map(ModelSection::Anthropic),
            Some(other) => {
                self.problems
                    .push(problem(format!("unknown provider {other:?} ({known})")));
                None
            }
            None => {
                self.problems
                    .push(problem(format!("missing: say which provider ({known})")));
                None
            }
        };
        if model.is_none() {
            self.broken.insert(format!("models.{name}"));
        }
        model
    }
}

/// Removes the value at `path` inside `value`; whether there was one.
fn remove(value: &mut toml::Value, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut current = value;
    for segment in parents {
        current = match current {
            toml::Value::Table(t) => match t.get_mut(segment) {
                Some(v) => v,
                None => return false,
            },
            toml::Value::Array(a) => match segment.parse::<usize>().ok().and_then(|i| a.get_mut(i))
            {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    match current {
        toml::Value::Table(t) => t.remove(last).is_some(),
        toml::Value::Array(a) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => {
                // The array cannot lose an element without shifting the
                // others' indices; drop it whole instead.
                a.clear();
                true
            }
            _ => false,
        },
        _ => false,
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// A problem at `table.name.key`, with the line where that key (or table) is.
pub(super) fn at(text: &Source<'_>, table: &str, key: &str, message: String) -> Problem {
    Problem {
        file: None,
        line: locate(text, table, key),
        key: format!("{table}.{key}"),
        message,
    }
}

/// The line of `key` inside `[table]` (or of the table's own key, in its
/// header). `table` is `SECTION` or `SECTION.NAME` (the name may hold dots,
/// as a version does).
fn locate(text: &Source<'_>, table: &str, key: &str) -> Option<usize> {
    let mut path: Vec<&str> = match table.split_once('.') {
        Some((section, name)) => vec![section, name],
        None => vec![table],
    };
    path.push(key);
    text.line(&path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::PathBuf;

    use crate::config::Config;

    #[test]
    fn an_unknown_key_is_refused_by_name() {
        let text =
            "[models.m]\nprovider = \"simulated\"\n\n[agents.a]\nmodel = \"m\"\nmax_stepz = 3\n";
        let err = Config::parse(text, "k.toml", PathBuf::new()).unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.starts_with("k.toml:6: agents.a.max_stepz: unknown field `max_stepz`"),
            "{shown}"
        );
    }

    #[test]
    fn an_unknown_provider_is_named() {
        let text = "[models.m]\nprovider = \"telepathy\"\n";
        let err = Config::parse(text, "p.toml", PathBuf::new())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("models.m") && err.contains("telepathy"),
            "{err}"
        );
    }
}
