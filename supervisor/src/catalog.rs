//! The catalog: every template, model and tool a supervisor can use, checked
//! once when it is built. Templates and models are immutable afterwards, so
//! agents read them without locks. Toolboxes are built once too, and again
//! only when a [`ToolSource`] says its tools changed (an MCP server connected
//! or changed its list): agents that start afterwards get the new ones.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use arbor_actors::sync::RwLockExt;
use arbor_actors::template::AgentTypeId;
use arbor_actors::toolbox::{ToolSources, Toolbox, ToolboxError};
use arbor_actors::{AgentTemplate, Model, Tool};
use futures::future::BoxFuture;

use crate::error::Error;

/// Tools whose list is known only at run time (an MCP server's). The catalog
/// asks it for the tool entries of templates that it claims (`owns`).
pub trait ToolSource: Send + Sync + 'static {
    /// Whether this source provides the template entry `entry` (e.g. `fs/*`).
    fn owns(&self, entry: &str) -> bool;
    /// The tools `entry` names now; `Err` says why there are none.
    fn resolve(&self, entry: &str) -> Result<Vec<Arc<dyn Tool>>, ToolboxError>;
    /// Grows whenever `resolve`'s answers may have changed.
    fn generation(&self) -> u64;
    /// Gets ready to serve these entries (starts the servers they need); never fails
    /// (a server that cannot start is reported by `resolve` and by its calls).
    fn prepare(&self, entries: Vec<String>) -> BoxFuture<'static, ()>;
}

/// Whether a start request's model override can run a tree of an agent
/// type: `Err` says why not (a model whose provider refuses some agent's
/// options). What a provider refuses is its builder's knowledge (the
/// facade's config); the supervisor asks it of every start request.
pub type OverrideCheck = Arc<dyn Fn(&str, &str) -> Result<(), OverrideRefused> + Send + Sync>;

/// Why a model cannot run a tree of an agent type as a start request's
/// override ([`OverrideCheck`]): an agent the tree can reach sets an option
/// the model's provider refuses with the model's own.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "model {model:?} cannot run agent {agent:?}{}: {option}: {problem}",
    .spawned_by.as_ref().map(|root| format!(" (which {root:?} may spawn)")).unwrap_or_default()
)]
#[non_exhaustive]
pub struct OverrideRefused {
    /// The model asked for.
    pub model: String,
    /// The agent that cannot run on it.
    pub agent: String,
    /// The tree's root, when `agent` is one it may spawn (not the root).
    pub spawned_by: Option<String>,
    /// The option, as its config key (`models.NAME.options.temperature`).
    pub option: String,
    /// Why the provider refuses it.
    pub problem: String,
}

impl OverrideRefused {
    /// `agent` of a tree rooted at `root` cannot run on `model`: `option`
    /// is refused because of `problem`.
    pub fn new(model: &str, agent: &str, root: &str, option: String, problem: String) -> Self {
        OverrideRefused {
            model: model.to_owned(),
            agent: agent.to_owned(),
            spawned_by: (agent != root).then(|| root.to_owned()),
            option,
            problem,
        }
    }
}

/// Collects templates, models and tools; `build` checks them into a
/// [`Catalog`].
#[derive(Default)]
pub struct CatalogBuilder {
    templates: Vec<AgentTemplate>,
    models: HashMap<String, Arc<dyn Model>>,
    tools: HashMap<String, Arc<dyn Tool>>,
    source: Option<Arc<dyn ToolSource>>,
    override_check: Option<OverrideCheck>,
    lifecycle: Option<Arc<dyn arbor_actors::lifecycle::Lifecycle>>,
    prompt_context: Option<Arc<dyn crate::PromptContext>>,
    workspaces: Option<crate::workspace::WorkspaceOpener>,
    workspace_roots: Vec<std::path::PathBuf>,
    principal_roots: std::collections::BTreeMap<String, Vec<std::path::PathBuf>>,
}

impl CatalogBuilder {
    /// What fills the placeholders of the templates' prompts that depend on
    /// the tree (where it works, when it started): see [`crate::PromptContext`].
    pub fn prompt_context(mut self, context: Arc<dyn crate::PromptContext>) -> Self {
        self.prompt_context = Some(context);
        self
    }

    /// The lifecycle hooks every tree of this catalog runs (Claude Code's
    /// `PreToolUse` and the others; `arbor_tools::hooks`).
    pub fn lifecycle(mut self, hooks: Arc<dyn arbor_actors::lifecycle::Lifecycle>) -> Self {
        self.lifecycle = Some(hooks);
        self
    }

    /// How a tree's workspace is opened (`arbor_tools::workspace`), and the
    /// directories a start request's workspace must be inside (none: any).
    pub fn workspaces(
        mut self,
        opener: crate::workspace::WorkspaceOpener,
        roots: Vec<std::path::PathBuf>,
    ) -> Self {
        self.workspaces = Some(opener);
        self.workspace_roots = roots;
        self
    }

    /// The directories the requests of each principal named here must keep
    /// their workspace inside, instead of the roots of
    /// [`workspaces`](Self::workspaces).
    pub fn principal_roots(
        mut self,
        roots: std::collections::BTreeMap<String, Vec<std::path::PathBuf>>,
    ) -> Self {
        self.principal_roots = roots;
        self
    }

    /// Adds a template; of two with one id, the later is kept.
    pub fn template(mut self, template: AgentTemplate) -> Self {
        self.templates.push(template);
        self
    }

    /// Registers a model under its own name (replacing one of that name).
    pub fn model(mut self, model: Arc<dyn Model>) -> Self {
        self.models.insert(model.name().to_owned(), model);
        self
    }

    /// Registers a model under a name other than its own.
    pub fn model_as(mut self, name: &str, model: Arc<dyn Model>) -> Self {
        self.models.insert(name.to_owned(), model);
        self
    }

    /// Registers a tool under its own name (replacing one of that name).
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.insert(tool.name().to_owned(), tool);
        self
    }

    /// Where template entries the registered tools do not name come from.
    pub fn tool_source(mut self, source: Arc<dyn ToolSource>) -> Self {
        self.source = Some(source);
        self
    }

    /// How a start request's model override is checked against the agents
    /// of the tree (`check(agent, model)`); none: every configured model may.
    pub fn override_check(mut self, check: OverrideCheck) -> Self {
        self.override_check = Some(check);
        self
    }

    /// Checks that every template's model, tools and spawnable agents exist,
    /// and builds each template's toolbox.
    pub fn build(self) -> Result<Catalog, Error> {
        let mut templates = HashMap::new();
        for template in self.templates {
            if !self.models.contains_key(&template.model) {
                return Err(Error::UnknownModel {
                    agent: template.id.clone(),
                    model: template.model.clone(),
                });
            }
            templates.insert(template.id.clone(), Arc::new(template));
        }
        for template in templates.values() {
            for entry in &template.spawnable_agents {
                if !templates.contains_key(entry) {
                    return Err(Error::InvalidTemplate {
                        agent: template.id.clone(),
                        message: format!("spawnable agent {entry} is not defined"),
                    });
                }
            }
        }
        let catalog = Catalog {
            templates,
            models: self.models,
            tools: self.tools,
            source: self.source,
            override_check: self.override_check,
            lifecycle: self.lifecycle,
            prompt_context: self.prompt_context,
            workspaces: self.workspaces,
            workspace_roots: self.workspace_roots,
            principal_roots: self.principal_roots,
            toolboxes: RwLock::new((0, HashMap::new())),
        };
        let generation = catalog.source_generation();
        let toolboxes = catalog.build_toolboxes()?;
        *catalog.toolboxes.write_locked() = (generation, toolboxes);
        Ok(catalog)
    }
}

type Toolboxes = HashMap<String, Arc<Toolbox>>;

/// The checked templates, models and tools of a supervisor, and every
/// template's toolbox. Built with [`Catalog::builder`].
pub struct Catalog {
    templates: HashMap<String, Arc<AgentTemplate>>,
    models: HashMap<String, Arc<dyn Model>>,
    tools: HashMap<String, Arc<dyn Tool>>,
    source: Option<Arc<dyn ToolSource>>,
    override_check: Option<OverrideCheck>,
    lifecycle: Option<Arc<dyn arbor_actors::lifecycle::Lifecycle>>,
    prompt_context: Option<Arc<dyn crate::PromptContext>>,
    workspaces: Option<crate::workspace::WorkspaceOpener>,
    workspace_roots: Vec<std::path::PathBuf>,
    principal_roots: std::collections::BTreeMap<String, Vec<std::path::PathBuf>>,
    /// Every template's toolbox, as of the source's generation.
    toolboxes: RwLock<(u64, Toolboxes)>,
}

impl Catalog {
    /// An empty builder.
    pub fn builder() -> CatalogBuilder {
        CatalogBuilder::default()
    }

    /// Why `model` cannot run a tree of `agent` as a start request's
    /// override, if it cannot (see [`CatalogBuilder::override_check`]).
    pub fn check_override(&self, agent: &str, model: &str) -> Result<(), OverrideRefused> {
        self.override_check
            .as_ref()
            .map_or(Ok(()), |check| check(agent, model))
    }

    /// What fills its templates' tree-dependent placeholders, when one of
    /// its templates has any.
    pub(crate) fn prompt_context(&self) -> Option<&Arc<dyn crate::PromptContext>> {
        let context = self.prompt_context.as_ref()?;
        self.templates
            .values()
            .any(|t| crate::prompt_context::wanted(&**context, t))
            .then_some(context)
    }

    /// The lifecycle hooks of this catalog's trees, if any.
    pub fn lifecycle(&self) -> Option<&Arc<dyn arbor_actors::lifecycle::Lifecycle>> {
        self.lifecycle.as_ref()
    }

    /// Opens a tree's workspace as checked (`spec` admitted already); `None`
    /// when this catalog opens none (its tools have no workspace).
    pub(crate) fn open_workspace(
        &self,
        spec: &crate::workspace::WorkspaceSpec,
    ) -> Option<std::io::Result<Arc<dyn arbor_actors::tool::Workspace>>> {
        self.workspaces.as_ref().map(|open| open(spec))
    }

    /// The directories a start request's workspace must be inside (none:
    /// any): the principal's own, when `principal` has some, else the
    /// service's.
    pub(crate) fn workspace_roots(&self, principal: Option<&str>) -> &[std::path::PathBuf] {
        principal
            .and_then(|p| self.principal_roots.get(p))
            .unwrap_or(&self.workspace_roots)
    }

    fn source_generation(&self) -> u64 {
        self.source.as_ref().map_or(0, |s| s.generation())
    }

    fn build_toolboxes(&self) -> Result<Toolboxes, Error> {
        let resolve = |entry: &str| -> Result<Vec<Arc<dyn Tool>>, ToolboxError> {
            if let Some(tool) = self.tools.get(entry) {
                return Ok(vec![tool.clone()]);
            }
            match &self.source {
                Some(source) if source.owns(entry) => source.resolve(entry),
                _ => Err(ToolboxError::UnknownTool(entry.to_owned())),
            }
        };
        let spawnable = |id: &str| self.templates.get(id).cloned();
        let sources = ToolSources {
            resolve: &resolve,
            spawnable: &spawnable,
        };
        let mut out = HashMap::new();
        for template in self.templates.values() {
            let invalid = |message| Error::InvalidTemplate {
                agent: template.id.clone(),
                message,
            };
            let mut toolbox =
                Toolbox::build_with(template, &sources).map_err(|e| invalid(e.to_string()))?;
            if !template.approve.is_empty() {
                for pattern in &template.approve {
                    crate::policy::check_pattern(pattern)
                        .map_err(|e| invalid(format!("approve pattern {pattern:?}: {e}")))?;
                }
                toolbox = toolbox.with_approval(|names| {
                    template
                        .approve
                        .iter()
                        .any(|p| names.iter().any(|name| crate::policy::matches(p, name)))
                });
            }
            out.insert(template.id.clone(), Arc::new(toolbox));
        }
        Ok(out)
    }

    /// The template with exactly this id.
    pub fn template(&self, id: &str) -> Option<&Arc<AgentTemplate>> {
        self.templates.get(id)
    }

    /// The template a user names: its exact id, or the one id matching it.
    pub fn find_template(&self, requested: &str) -> Option<&Arc<AgentTemplate>> {
        if let Some(t) = self.templates.get(requested) {
            return Some(t);
        }
        let want = AgentTypeId::parse(requested);
        let mut matching = self
            .templates
            .values()
            .filter(|t| want.matches(&AgentTypeId::parse(&t.id)));
        let first = matching.next()?;
        matching.next().is_none().then_some(first)
    }

    /// Whether some template matches `requested` (an id, or a
    /// `publisher/name@version` pattern of one).
    pub fn knows_agent(&self, requested: &str) -> bool {
        let want = AgentTypeId::parse(requested);
        self.templates
            .keys()
            .any(|id| want.matches(&AgentTypeId::parse(id)))
    }

    /// Every template, in no particular order.
    pub fn templates(&self) -> impl Iterator<Item = &Arc<AgentTemplate>> {
        self.templates.values()
    }

    /// The model registered under `name`.
    pub fn model(&self, name: &str) -> Option<&Arc<dyn Model>> {
        self.models.get(name)
    }

    /// The names models are registered under, in no particular order.
    pub fn model_names(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }

    /// The tools registered in code, by name.
    pub fn tools(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.tools.values()
    }

    /// The tools (by the names the model sees) an agent of the template
    /// `template_id` is offered in a tree under `policy`: its toolbox as of
    /// now (MCP servers' tools once their servers are up), less what the
    /// policy refuses; the structural built-ins (`set_output`, `end_turn`,
    /// the spawn tools) only as its output mode and spawnable agents give
    /// them. `None` for a template the catalog does not have.
    pub fn offered(&self, template_id: &str, policy: &crate::ToolPolicy) -> Option<Vec<String>> {
        let toolbox = self.toolbox(template_id)?;
        let cut = toolbox.restricted(|names| policy.allows_any(names));
        Some(cut.definitions().keys().cloned().collect())
    }

    /// A template's toolbox as of now (rebuilt first if the tool source changed).
    pub(crate) fn toolbox(&self, template_id: &str) -> Option<Arc<Toolbox>> {
        let generation = self.source_generation();
        {
            let current = self.toolboxes.read_locked();
            if current.0 == generation {
                return current.1.get(template_id).cloned();
            }
        }
        match self.build_toolboxes() {
            Ok(toolboxes) => {
                let mut current = self.toolboxes.write_locked();
                if current.0 < generation {
                    *current = (generation, toolboxes);
                }
                current.1.get(template_id).cloned()
            }
            Err(error) => {
                // A changed list that no longer builds (e.g. a server now sends a
                // bad schema): keep serving the last good toolboxes.
                tracing::warn!(%error, "tool list changed but the toolboxes did not build; keeping the previous tools");
                self.toolboxes.read_locked().1.get(template_id).cloned()
            }
        }
    }

    /// Makes the tool source ready for every template a tree rooted at
    /// `root` can reach (starts the MCP servers they name, once per runtime).
    pub(crate) fn prepare_tools(&self, root: &str) -> BoxFuture<'static, ()> {
        let Some(source) = self.source.clone() else {
            return Box::pin(async {});
        };
        let mut seen = HashSet::new();
        let mut stack = vec![root.to_owned()];
        let mut entries = Vec::new();
        while let Some(id) = stack.pop() {
            if !seen.insert(id.clone()) {
                continue;
            }
            let Some(t) = self.templates.get(&id) else {
                continue;
            };
            entries.extend(t.tools.iter().filter(|e| source.owns(e)).cloned());
            stack.extend(t.spawnable_agents.iter().cloned());
        }
        if entries.is_empty() {
            return Box::pin(async {});
        }
        source.prepare(entries)
    }
}
