//! `[models.NAME]`: each model's keys, and what the request would send
//! (a model's `options` and an agent's `model_options`, layered) against
//! what its provider refuses; the same check for `--model` overrides.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use arbor_actors::model::{ModelOptions, ToolChoice};
use arbor_actors::models::Latency;
use arbor_actors::models::scripted::Script;
use serde_json::Value;

use crate::config::catalog::{ModelSpec, simulated_config};
use crate::config::read::{Source, at};
use crate::config::{ConfigFile, ModelSection, Problem};
use crate::providers::{ProviderKind, ProviderSettings};
use arbor_supervisor::TreeLimits;

use super::{number, ranges};

/// Checks every `[models.NAME]` entry and gives what each model is built
/// from (an entry with a problem gives nothing).
pub(in crate::config) fn check_models(
    file: &ConfigFile,
    limits: &TreeLimits,
    base_dir: &Path,
    text: &Source<'_>,
    problems: &mut Vec<Problem>,
) -> BTreeMap<String, ModelSpec> {
    let mut out = BTreeMap::new();
    for (name, model) in &file.models {
        let table = format!("models.{name}");
        let spec = match model {
            ModelSection::Simulated(s) => {
                let latency = Latency::parse(&s.latency)
                    .map_err(|e| problems.push(at(text, &table, "latency", e.to_string())))
                    .ok();
                number(
                    text,
                    &table,
                    "fanout",
                    Some(s.fanout),
                    ranges::FANOUT,
                    problems,
                );
                number(
                    text,
                    &table,
                    "depth",
                    Some(s.depth),
                    ranges::DEPTH,
                    problems,
                );
                number(
                    text,
                    &table,
                    "reply_tokens",
                    Some(s.reply_tokens),
                    ranges::REPLY_TOKENS,
                    problems,
                );
                if let Some(shape) = &s.shape {
                    if shape.len() > ranges::DEPTH.1 {
                        problems.push(at(
                            text,
                            &table,
                            "shape",
                            format!("has {} levels: at most {}", shape.len(), ranges::DEPTH.1),
                        ));
                    }
                    if let Some(&wide) = shape.iter().find(|&&f| f > ranges::FANOUT.1) {
                        problems.push(at(
                            text,
                            &table,
                            "shape",
                            format!("a level of {wide} children: at most {}", ranges::FANOUT.1),
                        ));
                    }
                }
                // Out of range, the tree is not built: `depth = 4294967296` would
                // ask for a 32 GiB shape before being refused.
                let sized = s.fanout <= ranges::FANOUT.1
                    && s.depth <= ranges::DEPTH.1
                    && s.shape.as_ref().is_none_or(|shape| {
                        shape.len() <= ranges::DEPTH.1
                            && shape.iter().all(|&f| f <= ranges::FANOUT.1)
                    });
                let config = latency
                    .filter(|_| sized)
                    .map(|latency| simulated_config(s, latency));
                let agents = config.as_ref().map(|c| c.agents()).unwrap_or(0);
                if agents > ranges::SIMULATED_AGENTS {
                    problems.push(at(
                        text,
                        &table,
                        if s.shape.is_some() { "shape" } else { "fanout" },
                        format!(
                            "makes a tree of {agents} agents: at most {} (a smaller fanout, depth or shape)",
                            ranges::SIMULATED_AGENTS
                        ),
                    ));
                } else if let Some(config) = &config {
                    // A tree this model makes runs under the config's limits
                    // (a request may only tighten them).
                    let live = limits.max_live_agents.map(|n| n.get() as u64);
                    let max_agents = limits.max_agents.map(|n| n.get() as u64);
                    let lower = "set [limits] max_live_agents (lower), or a smaller shape";
                    if let Some(why) = super::peak_problem(config, live, max_agents, lower) {
                        let key = if s.shape.is_some() { "shape" } else { "fanout" };
                        problems.push(at(text, &table, key, why));
                    }
                }
                config.map(ModelSpec::Simulated)
            }
            ModelSection::Scripted(s) => match Script::from_file(&base_dir.join(&s.file)) {
                Ok(script) => Some(ModelSpec::Scripted(script)),
                Err(e) => {
                    problems.push(at(text, &table, "file", e.to_string()));
                    None
                }
            },
            ModelSection::Openai(s) | ModelSection::Anthropic(s) => {
                let kind = match model {
                    ModelSection::Anthropic(_) => ProviderKind::Anthropic,
                    _ => ProviderKind::OpenAi,
                };
                match ProviderSettings::from_section(kind, s) {
                    // Without the key: that is read when a catalog is built,
                    // and never kept in a config.
                    Ok(settings) => Some(ModelSpec::Http(Box::new(settings))),
                    Err((key, message)) => {
                        let mut path = vec!["models", name.as_str()];
                        path.extend(key.split('.'));
                        problems.push(Problem {
                            file: None,
                            line: text.line(&path),
                            key: path.join("."),
                            message,
                        });
                        None
                    }
                }
            }
        };
        if let Some(spec) = spec {
            out.insert(name.clone(), spec);
        }
    }
    check_thinking(file, text, problems);
    out
}

/// Where a value of a request's options was set: a model's `options` or an
/// agent's `model_options` (laid over its model's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layer<'a> {
    /// `[models.NAME] options`.
    Model(&'a str),
    /// `[agents.NAME] model_options`.
    Agent(&'a str),
}

impl<'a> Layer<'a> {
    /// The path of `field` (dotted, e.g. `extra_body.top_k`) in the file.
    fn path(self, field: &'a str) -> Vec<&'a str> {
        let mut path = match self {
            Layer::Model(name) => vec!["models", name, "options"],
            Layer::Agent(name) => vec!["agents", name, "model_options"],
        };
        path.extend(field.split('.'));
        path
    }

    /// The dotted key of `field`: `models.an.options.temperature`.
    fn key(self, field: &str) -> String {
        self.path(field).join(".")
    }
}

/// One option as the request sends it: its value and the layer that set it.
#[derive(Clone, Debug, PartialEq)]
struct Sent<'a, T> {
    value: T,
    field: &'static str,
    layer: Layer<'a>,
}

/// The layer that set a field: the agent's when it has one that set it.
fn layer_of<'a>(
    agent: Option<(&'a str, &ModelOptions)>,
    model: &'a str,
    set: impl Fn(&ModelOptions) -> bool,
) -> Layer<'a> {
    match agent {
        Some((name, options)) if set(options) => Layer::Agent(name),
        _ => Layer::Model(model),
    }
}

/// A key of `extra_body` as sent (an agent's win over its model's), and the
/// layer that set it.
fn extra<'a>(
    key: &'static str,
    field: &'static str,
    model: (&'a str, &ModelOptions),
    agent: Option<(&'a str, &ModelOptions)>,
) -> Option<Sent<'a, Value>> {
    let of = |o: &ModelOptions| o.extra_body.as_ref().and_then(|e| e.get(key)).cloned();
    if let Some((name, options)) = agent
        && let Some(value) = of(options)
    {
        return Some(Sent {
            value,
            field,
            layer: Layer::Agent(name),
        });
    }
    of(model.1).map(|value| Sent {
        value,
        field,
        layer: Layer::Model(model.0),
    })
}

/// What refuses an Anthropic request with extended thinking on, for the
/// options a model sends (`agent`: an agent's `model_options` laid over
/// them, [`ModelOptions::over`]): each problem's layer, field and why.
/// Empty when thinking is off.
///
/// The rules are the Messages API's, from "Extended thinking" (feature
/// compatibility and sampling parameters,
/// <https://platform.claude.com/docs/en/build-with-claude/extended-thinking#feature-compatibility>):
/// with `thinking` enabled, `tool_choice` may only be `auto` or `none` (a
/// forced tool, `any` or `tool`, is an error), `temperature` only 1 (or
/// unset), `top_k` unset, and `top_p` only from 0.95 to 1. The budget's
/// own rules (at least 1024, below `max_tokens`) hold already:
/// [`ModelOptions::check`] refuses a budget under 1024, and the provider
/// raises `max_tokens` above the budget when it would not be.
pub(super) fn thinking_conflicts<'a>(
    model: (&'a str, &ModelOptions),
    agent: Option<(&'a str, &ModelOptions)>,
) -> Vec<(Layer<'a>, &'static str, String)> {
    let options = match agent {
        Some((_, a)) => a.over(model.1),
        None => model.1.clone(),
    };
    // Thinking as sent: `reasoning.budget_tokens`, unless `extra_body`
    // replaces the `thinking` field (then its `type` says).
    let thinking = match extra("thinking", "extra_body.thinking", model, agent) {
        Some(sent) => {
            let kind = sent.value.get("type").and_then(Value::as_str);
            matches!(kind, Some("enabled" | "adaptive")).then(|| {
                format!(
                    "{} = {}",
                    sent.layer.key(sent.field),
                    serde_json::to_string(&sent.value).unwrap_or_default()
                )
            })
        }
        None => options
            .reasoning
            .as_ref()
            .and_then(|r| r.budget_tokens)
            .map(|budget| {
                let layer = layer_of(agent, model.0, |o| o.reasoning.is_some());
                format!("{} = {budget}", layer.key("reasoning.budget_tokens"))
            }),
    };
    let Some(thinking) = thinking else {
        return Vec::new();
    };
    let with = format!("with extended thinking on ({thinking})");
    let mut out = Vec::new();

    // A number as sent: `extra_body`'s key wins over the typed field.
    let number = |key: &'static str,
                  field: &'static str,
                  typed: Option<f64>,
                  set: fn(&ModelOptions) -> bool| {
        match extra(key, field, model, agent) {
            Some(sent) => Some(Sent {
                value: sent.value.as_f64(),
                field: sent.field,
                layer: sent.layer,
            }),
            None => typed.map(|v| Sent {
                value: Some(v),
                field: key,
                layer: layer_of(agent, model.0, set),
            }),
        }
    };
    if let Some(sent) = number(
        "temperature",
        "extra_body.temperature",
        options.temperature,
        |o| o.temperature.is_some(),
    ) && sent.value != Some(1.0)
    {
        out.push((
            sent.layer,
            sent.field,
            format!(
                "{} {with}: Anthropic accepts only temperature 1 (or none) when thinking is on",
                shown(sent.value)
            ),
        ));
    }
    if let Some(sent) = number("top_p", "extra_body.top_p", options.top_p, |o| {
        o.top_p.is_some()
    }) && !sent.value.is_some_and(|p| (0.95..=1.0).contains(&p))
    {
        out.push((
            sent.layer,
            sent.field,
            format!(
                "{} {with}: Anthropic accepts top_p only from 0.95 to 1 when thinking is on",
                shown(sent.value)
            ),
        ));
    }
    if let Some(sent) = extra("top_k", "extra_body.top_k", model, agent) {
        out.push((
            sent.layer,
            sent.field,
            format!(
                "{} {with}: Anthropic refuses top_k when thinking is on (remove it)",
                sent.value
            ),
        ));
    }
    // The tool choice as sent: `extra_body`'s object, else the typed one.
    let forced = match extra("tool_choice", "extra_body.tool_choice", model, agent) {
        Some(sent) => {
            let kind = sent.value.get("type").and_then(Value::as_str);
            matches!(kind, Some("any" | "tool"))
                .then(|| (sent.layer, sent.field, sent.value.to_string()))
        }
        None => match &options.tool_choice {
            Some(choice @ (ToolChoice::Required | ToolChoice::Tool(_))) => {
                let layer = layer_of(agent, model.0, |o| o.tool_choice.is_some());
                let shown = match choice {
                    ToolChoice::Tool(name) => format!("{name:?} (a tool it must call)"),
                    _ => "\"required\"".to_owned(),
                };
                Some((layer, "tool_choice", shown))
            }
            _ => None,
        },
    };
    if let Some((layer, field, shown)) = forced {
        out.push((
            layer,
            field,
            format!(
                "{shown} forces a tool call {with}: Anthropic refuses a forced tool when \
                 thinking is on (use \"auto\" or \"none\")"
            ),
        ));
    }
    out
}

/// A number from the config as the message shows it (not a number: "a non-number").
fn shown(value: Option<f64>) -> String {
    value.map_or_else(
        || "a value that is not a number".to_owned(),
        |v| v.to_string(),
    )
}

/// What the provider of `model` (a `[models]` entry, `name` and section)
/// refuses of the options a request on it sends, `agent` being the
/// `[agents]` entry (id and `model_options`) whose requests they are, or
/// `None` for the model's own: each problem's layer, field and why. The one
/// check of options against a model, run by the config check for each agent
/// on its configured model and by [`Config::check_model_override`] for each
/// agent of a tree on the model a start request puts it on. Empty for a
/// model that is not Anthropic's, and for options out of their ranges (those
/// are reported on their own). Today's rules: Anthropic's with extended
/// thinking on ([`thinking_conflicts`]).
///
/// [`Config::check_model_override`]: crate::config::Config::check_model_override
fn option_conflicts<'a>(
    model: (&'a str, &'a ModelSection),
    agent: Option<(&'a str, &'a ModelOptions)>,
) -> Vec<(Layer<'a>, &'static str, String)> {
    let ModelSection::Anthropic(section) = model.1 else {
        return Vec::new();
    };
    if section.options.check().is_err() || agent.is_some_and(|(_, o)| o.check().is_err()) {
        return Vec::new();
    }
    thinking_conflicts((model.0, &section.options), agent)
}

/// Each effective combination of options a model sends (its own `options`,
/// and each agent's on it with its `model_options` over them) against what
/// its provider refuses ([`option_conflicts`]). A problem is reported once,
/// at the key that set the refused value, naming where thinking was turned
/// on.
fn check_thinking(file: &ConfigFile, text: &Source<'_>, problems: &mut Vec<Problem>) {
    let mut seen = HashSet::new();
    for (name, model) in &file.models {
        let agents = file
            .agents
            .iter()
            .filter(|(_, a)| a.model == *name)
            .map(|(id, a)| a.model_options.as_ref().map(|o| (id.as_str(), o)));
        for agent in std::iter::once(None).chain(agents) {
            for (layer, field, message) in option_conflicts((name.as_str(), model), agent) {
                let key = layer.key(field);
                if seen.insert((key.clone(), message.clone())) {
                    problems.push(Problem {
                        file: None,
                        line: text.line(&layer.path(field)),
                        key,
                        message,
                    });
                }
            }
        }
    }
}

impl crate::config::Config {
    /// Whether a tree of `agent` (an id, or the one `[agents]` entry a
    /// `publisher/name@version` pattern matches) may run every agent on the
    /// model `model` instead of its own (`arbor run --model`, `POST /v1/runs`
    /// `{"model"}`): each agent the tree can reach (the root and what it may
    /// spawn, transitively), with its `model_options` over that model's
    /// `options`, passes the same check (`option_conflicts`) the config
    /// check runs on an agent's configured model. `Err` names the model, the
    /// agent and the option, and why. An agent or a model this config does
    /// not have passes: starting the tree reports it.
    pub fn check_model_override(
        &self,
        agent: &str,
        model: &str,
    ) -> Result<(), arbor_supervisor::OverrideRefused> {
        let file = &self.file;
        let Some((model, section)) = file.models.get_key_value(model) else {
            return Ok(());
        };
        let root = match file.agents.get_key_value(agent) {
            Some((id, _)) => id,
            None => {
                let want = arbor_actors::template::AgentTypeId::parse(agent);
                let mut matching = file
                    .agents
                    .keys()
                    .filter(|id| want.matches(&arbor_actors::template::AgentTypeId::parse(id)));
                match (matching.next(), matching.next()) {
                    (Some(id), None) => id,
                    _ => return Ok(()),
                }
            }
        };
        // The tree's agents, root first, then in the order they are reached.
        let mut reached = vec![root];
        let mut next = 0;
        while let Some(id) = reached.get(next) {
            next += 1;
            for entry in file
                .agents
                .get(*id)
                .map_or(&[][..], |a| &a.spawnable_agents)
            {
                if let Some((entry, _)) = file.agents.get_key_value(entry)
                    && !reached.contains(&entry)
                {
                    reached.push(entry);
                }
            }
        }
        for id in reached {
            let options = file.agents[id].model_options.as_ref();
            let found =
                option_conflicts((model.as_str(), section), options.map(|o| (id.as_str(), o)));
            if let Some((layer, field, why)) = found.into_iter().next() {
                return Err(arbor_supervisor::OverrideRefused::new(
                    model,
                    id,
                    root,
                    layer.key(field),
                    why,
                ));
            }
        }
        Ok(())
    }
}
