//! `config.toml`: models, agent templates and limits, parsed into a validated
//! `Config`. Every problem is reported with its file, line and key.
//!
//! The file format is in `file` (the serde sections), reading it with every
//! problem in `read`, its checks in `check`, and building the models and the
//! catalog from it in `catalog`.

pub mod agent_files;
mod catalog;
mod check;
mod file;
mod open;
mod read;
mod redact;
pub mod store;
pub mod webhooks;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arbor_actors::AgentTemplate;
use arbor_supervisor::{ToolPolicy, TreeLimits, check_pattern};

use crate::tools::command::CommandTool;
use crate::tools::mcp::McpSettings;
pub use agent_files::{AgentFiles, AgentOrigin};
use catalog::ModelSpec;
use check::{
    check_graph, check_limits, check_models, check_service, command_tools, mcp_servers, templates,
};
pub use check::{memory_budget, peak_problem, ranges};
pub use file::{
    AgentSection, ConfigFile, FailureSection, InputSchemaSection, ModelSection, PolicySection,
    PrincipalSection, PrincipalSettings, RetrySection, Role, RunSection, ScriptedSection,
    ServiceLimits, ServiceSection, ServiceSettings, SimulatedSection, StoreSection,
};
use read::{Source, at, parse_file};
pub use store::{PgUrl, StoreLocation, StoreLocationError};

/// `[store]`: `path` or `url`, not both, and whichever is given names a
/// store (a Postgres URL is checked here; its password is never repeated).
fn check_store(section: &StoreSection, text: &Source<'_>, problems: &mut Vec<Problem>) {
    check::store_fail_after(section, text, problems);
    if section.url.is_some() && text.has(&["store", "path"]) {
        problems.push(at(
            text,
            "store",
            "url",
            "give path (a SQLite file) or url (postgres://… or sqlite://…), not both".into(),
        ));
        return;
    }
    let key = if section.url.is_some() { "url" } else { "path" };
    match StoreLocation::from_section(section) {
        Ok(_) => {}
        Err(StoreLocationError::Empty) if key == "path" => problems.push(at(
            text,
            "store",
            "path",
            "must name a file (to store nothing, set enabled = false)".into(),
        )),
        Err(error) => problems.push(at(text, "store", key, error.to_string())),
    }
}

/// The configuration a fresh checkout runs with (the repository's `config.toml`).
pub const DEFAULT_CONFIG: &str = include_str!("../../config.toml");
/// How the embedded default is named in messages.
pub const DEFAULT_CONFIG_NAME: &str = "<built-in config.toml>";

/// One problem in a config file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The file, when it is not the config's own (an agent file).
    pub file: Option<String>,
    /// The line of the key (or of its table), when the file has it.
    pub line: Option<usize>,
    /// The dotted key, e.g. `agents.writer.max_steps`.
    pub key: String,
    /// What is wrong with it.
    pub message: String,
}

/// A config that cannot be used, with every problem found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file's name as messages show it.
    pub file: String,
    /// Every problem found, in file order.
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            let file = p.file.as_deref().unwrap_or(&self.file);
            match p.line {
                Some(line) => write!(f, "{file}:{line}: {}: {}", p.key, p.message)?,
                None => write!(f, "{file}: {}: {}", p.key, p.message)?,
            }
        }
        Ok(())
    }
}

/// A parsed and validated config, ready to build a catalog from.
#[derive(Clone, Debug)]
pub struct Config {
    /// The file's sections as read: the config's own. What others need of
    /// it is a checked value (`limits`, `service`, ...) or a method.
    file: ConfigFile,
    /// Where relative paths (scripts) are resolved.
    pub base_dir: PathBuf,
    /// The name used in messages (the path, or the built-in marker).
    pub source: String,
    /// `[limits]` with `[policy]`'s tool rule, checked.
    pub limits: TreeLimits,
    /// The agent templates, built from `[agents]`.
    pub templates: Vec<AgentTemplate>,
    /// The MCP servers, validated (started only by a runtime that needs them).
    pub mcp_servers: BTreeMap<String, McpSettings>,
    /// The command tools, built.
    pub command_tools: Vec<Arc<CommandTool>>,
    /// The lifecycle hooks, checked; `None` when there are none.
    pub hooks: Option<crate::tools::hooks::HookSet>,
    /// The agents loaded from agent files (`[agents] include`, `--agents`,
    /// a workspace's `.claude/agents` and `.agents`): where each came from, by name.
    pub agent_origins: BTreeMap<String, AgentOrigin>,
    /// How trees' workspaces are opened (sandbox, shell environment, roots).
    pub workspace: WorkspaceSettings,
    /// `[service]`, validated and typed.
    pub service: ServiceSettings,
    /// What each `[models]` entry's model is built from, checked.
    models: BTreeMap<String, ModelSpec>,
    /// What trees started from this config store with them (see
    /// [`Config::snapshot`]): the file's text with its secrets removed.
    /// Text, not the checked values, because that is what a stored tree keeps
    /// (the store's format) and what resume and replay read back with
    /// [`Config::from_snapshot`]; the unredacted text is not kept.
    snapshot: Arc<str>,
    /// Template tool entries nothing in the file provides: problems unless a
    /// tool registered in code has that name (see [`Config::check_tools`]).
    unresolved_tools: Vec<(String, Problem)>,
}

impl Config {
    /// Each `[models.NAME]` entry as written, by name (what `arbor models`
    /// lists; [`Config::http_model`] builds one).
    pub fn model_sections(&self) -> impl Iterator<Item = (&str, &ModelSection)> {
        self.file.models.iter().map(|(name, m)| (name.as_str(), m))
    }

    /// Whether `[store] enabled`: trees are stored unless a command says not.
    pub fn stores(&self) -> bool {
        self.file.store.enabled
    }

    /// Where `[store]` keeps trees: its `url` when it has one, else its `path`.
    pub fn store_location(&self) -> Result<StoreLocation, StoreLocationError> {
        StoreLocation::from_section(&self.file.store)
    }

    /// Reads and validates a config file: a regular file of at most 4 MiB
    /// (a device, a FIFO or a larger file is refused, naming it).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Self::load_with(path, &AgentFiles::default())
    }

    /// [`Config::load`], with the agent files of `agents` too (`--agents`
    /// directories, a workspace's `.claude/agents` and `.agents`).
    pub fn load_with(path: &Path, agents: &AgentFiles) -> Result<Config, ConfigError> {
        let source = path.display().to_string();
        let text = open::read_text(path).map_err(|why| ConfigError {
            file: source.clone(),
            problems: vec![Problem {
                file: None,
                line: None,
                key: "(file)".into(),
                message: why.to_string(),
            }],
        })?;
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse_with(&text, &source, base_dir, agents, |_| {})
    }

    /// The built-in default config.
    pub fn default_config() -> Result<Config, ConfigError> {
        Self::default_config_with(&AgentFiles::default())
    }

    /// The built-in default config with the agent files of `agents`.
    pub fn default_config_with(agents: &AgentFiles) -> Result<Config, ConfigError> {
        Self::parse_with(
            DEFAULT_CONFIG,
            DEFAULT_CONFIG_NAME,
            PathBuf::from("."),
            agents,
            |_| {},
        )
    }

    /// Parses and validates config text; `source` names it in errors.
    pub fn parse(text: &str, source: &str, base_dir: PathBuf) -> Result<Config, ConfigError> {
        Self::parse_with(text, source, base_dir, &AgentFiles::default(), |_| {})
    }

    /// [`Config::parse`], with the agent files of `agents` too.
    pub fn parse_with_agents(
        text: &str,
        source: &str,
        base_dir: PathBuf,
        agents: &AgentFiles,
    ) -> Result<Config, ConfigError> {
        Self::parse_with(text, source, base_dir, agents, |_| {})
    }

    /// Parses config text, lets `restore` complete the file's sections (what
    /// a stored snapshot left out), then checks them once, into the values
    /// the catalog is built from.
    fn parse_with(
        raw: &str,
        source: &str,
        base_dir: PathBuf,
        agents: &AgentFiles,
        restore: impl FnOnce(&mut ConfigFile),
    ) -> Result<Config, ConfigError> {
        let error = |problems| ConfigError {
            file: source.to_owned(),
            problems,
        };
        let parsed = Source::parse(raw).map_err(|p| error(vec![p]))?;
        let text = &parsed;
        let (mut file, mut problems, mut broken) = parse_file(text).map_err(|p| error(vec![p]))?;
        check_model_aliases(&file, text, &mut problems);
        let loaded = agent_files::load(
            &mut file,
            &base_dir,
            agents,
            text,
            source,
            &mut problems,
            &mut broken,
        );
        // After the agent files: their inline MCP servers get their secrets
        // back as the file's own do.
        restore(&mut file);
        check_limits(&file.limits, text, &mut problems);
        let mut limits = file.limits.clone();
        let rule = file.policy.rule();
        for (key, patterns) in [
            (
                "allow_tools",
                file.policy.allow_tools.clone().unwrap_or_default(),
            ),
            ("deny_tools", file.policy.deny_tools.clone()),
            ("approve_tools", file.policy.approve_tools.clone()),
        ] {
            for pattern in patterns {
                if let Err(why) = check_pattern(&pattern) {
                    problems.push(at(
                        text,
                        "policy",
                        key,
                        format!("pattern {pattern:?}: {why}"),
                    ));
                }
            }
        }
        limits.tools = ToolPolicy::new(rule);
        let mcp_servers = mcp_servers(&file, &base_dir, text, &mut problems);
        let hooks = match crate::tools::hooks::HookSet::from_section(&file.hooks, &base_dir) {
            Ok(mut hooks) => {
                loaded.add_hooks(&mut hooks, &mut problems);
                (!hooks.is_empty() || loaded.has_hooks()).then_some(hooks)
            }
            Err(found) => {
                for (key, message) in found {
                    let (table, key) = key.rsplit_once('.').unwrap_or(("hooks", &key));
                    problems.push(at(text, table, key, message));
                }
                None
            }
        };
        let workspace = WorkspaceSettings::check(&file.workspace, &base_dir, text, &mut problems);
        for name in file.workspace.principal_roots.keys() {
            if !file.service.principals.contains_key(name) {
                problems.push(at(
                    text,
                    "workspace.principal_roots",
                    name,
                    format!("{name:?} is no principal: [service.principals] has no such entry"),
                ));
            }
        }
        // Command tools run in the workspace's sandbox too.
        let command_tools = command_tools(&file, &base_dir, text, &mut problems)
            .into_iter()
            .map(|tool| Arc::new((*tool).clone().with_sandbox(workspace.sandbox.clone())))
            .collect();
        let mut unresolved_tools = Vec::new();
        let mut templates = templates(
            &file,
            &base_dir,
            &broken,
            text,
            &mut problems,
            &mut unresolved_tools,
        );
        loaded.attach_programs(&mut templates);
        check_graph(&file, &limits, text, &mut problems);
        let models = check_models(&file, &limits, &base_dir, text, &mut problems);
        check_store(&file.store, text, &mut problems);
        let service = check_service(&file.service, text, &mut problems);
        if let Some(agent) = &file.run.agent
            && !file.agents.contains_key(agent)
            && !broken.contains(&format!("agents.{agent}"))
        {
            problems.push(at(
                text,
                "run",
                "agent",
                format!("no agent named {agent:?}"),
            ));
        }
        for p in problems
            .iter_mut()
            .chain(unresolved_tools.iter_mut().map(|(_, p)| p))
        {
            loaded.relocate(p);
        }
        if !problems.is_empty() {
            // The file fails anyway: report the tool names nothing in it
            // provides too, so one check shows every problem.
            problems.extend(unresolved_tools.into_iter().map(|(_, p)| p));
            // The config's own first, then each agent file's, each in line order.
            problems.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
            return Err(error(problems));
        }
        let mut snapshot = text.redacted();
        if !loaded.stored.is_empty() {
            snapshot = agent_files::with_stored(&snapshot, &loaded.stored);
        }
        Ok(Config {
            file,
            base_dir,
            snapshot,
            source: source.to_owned(),
            limits,
            templates,
            models,
            mcp_servers,
            command_tools,
            hooks,
            agent_origins: loaded.origins,
            workspace,
            service,
            unresolved_tools,
        })
    }

    /// Opens a tree's workspace as this config says (its sandbox and shell
    /// environment): the catalog's opener.
    pub fn workspace_opener(&self) -> arbor_supervisor::WorkspaceOpener {
        let settings = self.workspace.clone();
        Arc::new(move |spec: &arbor_supervisor::WorkspaceSpec| {
            use crate::tools::workspace::{Access, Workspace};
            let access = if spec.read_only {
                Access::ReadOnly
            } else {
                Access::ReadWrite
            };
            let mut workspace = Workspace::open(&spec.root, access)?;
            if let Some(env) = &settings.shell_env {
                workspace = workspace.with_shell_env(env.clone());
            }
            Ok(workspace
                .with_sandbox(settings.sandbox.clone())
                .into_handle())
        })
    }

    /// How long the store may stay down before this process gives its
    /// trees up (`[store] fail_after`, checked; 60 s unless set).
    pub fn store_fail_after(&self) -> std::time::Duration {
        self.file
            .store
            .fail_after
            .as_deref()
            .and_then(|v| arbor_actors::duration::parse(v).ok())
            .unwrap_or(arbor_supervisor::store::DEFAULT_FAIL_AFTER)
    }

    /// Checks that every tool a template names is provided: by the file
    /// (built-ins, `[tools]`, `[mcp_servers]`) or by a tool registered in code
    /// under one of `code_tools`. Each unprovided name is a problem at its line.
    pub fn check_tools(&self, code_tools: &[&str]) -> Result<(), ConfigError> {
        let problems: Vec<Problem> = self
            .unresolved_tools
            .iter()
            .filter(|(name, _)| !code_tools.contains(&name.as_str()))
            .map(|(_, p)| p.clone())
            .collect();
        if problems.is_empty() {
            return Ok(());
        }
        Err(ConfigError {
            file: self.source.clone(),
            problems,
        })
    }

    /// Where this config came from, to record with a stored tree (so it can be
    /// resumed and replayed with the same templates): its file's full path,
    /// or `None` for the built-in one.
    pub fn origin(&self) -> Option<String> {
        if self.source == DEFAULT_CONFIG_NAME {
            return None;
        }
        std::fs::canonicalize(&self.source)
            .ok()
            .map(|p| p.display().to_string())
    }

    /// What a tree started from this config stores with it, so that resume
    /// and replay run it on what it started with: the file's text without
    /// its secrets (every literal value of a model's `headers` and of an MCP
    /// server's `env` and `headers` reads `"(not stored)"`, the password of a
    /// model's `base_url`, an MCP server's `url` and the store's `url` reads
    /// `***`; API keys and bearer tokens come from environment variables and
    /// are never in it). Two files that differ only in their secrets store
    /// the same text. [`Config::from_snapshot`] reads it back.
    pub fn snapshot(&self) -> Arc<str> {
        self.snapshot.clone()
    }

    /// The config a tree stored (`snapshot`), read back as it was: its
    /// removed secrets are taken from `current`, the config in force now
    /// (the same entry's same key; a URL's password when it is the same URL),
    /// or left out with a warning, never sent as the placeholder. Relative
    /// paths (a script) are resolved against `base_dir`.
    pub fn from_snapshot(
        snapshot: &str,
        tree_id: &str,
        base_dir: PathBuf,
        current: Option<&Config>,
    ) -> Result<Config, ConfigError> {
        let mut config = Config::parse_with(
            snapshot,
            &format!("<the config tree {tree_id} started with>"),
            base_dir,
            &AgentFiles::default(),
            |file| {
                redact::restore_secrets(file, tree_id, current);
                read::drop_unsent_system_prompts(file);
            },
        )?;
        config.snapshot = Arc::from(snapshot);
        Ok(config)
    }

    /// The agent `arbor run` starts by default.
    pub fn default_agent(&self) -> Option<&str> {
        self.file
            .run
            .agent
            .as_deref()
            .or_else(|| self.file.agents.keys().next().map(String::as_str))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn principal_roots_for_a_principal_the_service_lacks_are_refused_naming_it() {
        let text = "[service.principals.alice]\ntoken_env = \"A\"\nrole = \"user\"\n\n\
                    [workspace.principal_roots]\nalice = [\"repos/alice\"]\nmallory = [\"repos/m\"]\n";
        let error = Config::parse(text, "c.toml", PathBuf::from("/srv")).unwrap_err();
        let error = error.to_string();
        assert!(
            error.contains("c.toml:7: workspace.principal_roots.mallory"),
            "{error}"
        );
        assert!(!error.contains("alice"), "{error}");
        let ok = text.replace("mallory = [\"repos/m\"]\n", "");
        let config = Config::parse(&ok, "c.toml", PathBuf::from("/srv")).unwrap();
        assert_eq!(
            config.workspace.principal_roots["alice"],
            vec![PathBuf::from("/srv/repos/alice")]
        );
    }

    #[test]
    fn a_stored_config_keeps_no_header_value_and_takes_it_back_from_the_current_file() {
        let text = "[models.m]\nprovider = \"openai\"\nmodel = \"x\"\nbase_url = \"http://127.0.0.1:9\"\n\
                    headers = { Authorization = \"Bearer sk-secret\", X-Title = \"arbor\" }\n\n\
                    [agents.a]\nmodel = \"m\"\n";
        let config = Config::parse(text, "c.toml", PathBuf::from(".")).unwrap();
        let snapshot = config.snapshot();
        assert!(!snapshot.contains("sk-secret"), "{snapshot}");
        assert!(
            !snapshot.contains("\"arbor\""),
            "every literal header value goes"
        );
        assert!(
            snapshot.contains("model = \"x\""),
            "the rest stays: {snapshot}"
        );
        let headers = |c: &Config| match &c.file.models["m"] {
            ModelSection::Openai(s) => s.headers.clone(),
            _ => unreachable!(),
        };
        // Back with the current file's values.
        let back =
            Config::from_snapshot(&snapshot, "t", PathBuf::from("."), Some(&config)).unwrap();
        assert_eq!(headers(&back), headers(&config));
        assert_eq!(&*back.snapshot(), &*snapshot, "stored again as it was");
        // Without a current file, the header is left out (not sent as a placeholder).
        let alone = Config::from_snapshot(&snapshot, "t", PathBuf::from("."), None).unwrap();
        assert!(headers(&alone).is_empty());
    }
}

/// `[model_aliases]`: each value a `[models]` entry.
fn check_model_aliases(file: &ConfigFile, text: &Source<'_>, problems: &mut Vec<Problem>) {
    for (alias, model) in &file.model_aliases {
        if !file.models.contains_key(model) {
            let known: Vec<&str> = file.models.keys().map(String::as_str).collect();
            problems.push(at(
                text,
                "model_aliases",
                alias,
                format!(
                    "{alias} = {model:?}: no such [models] entry (configured: {})",
                    known.join(", ")
                ),
            ));
        }
    }
}

/// `[workspace]`, checked: the sandbox found and tried, the roots absolute.
#[derive(Clone, Debug, Default)]
pub struct WorkspaceSettings {
    /// The shell's sandbox, if the config asks for one (it works here:
    /// `check-config` tried it).
    pub sandbox: Option<crate::tools::sandbox::Sandbox>,
    /// What the shell passes from Arbor's environment (`None`: the default).
    pub shell_env: Option<Vec<String>>,
    /// Directories a start request's workspace must be inside (empty: any).
    pub roots: Vec<PathBuf>,
    /// The roots of each principal that has its own, instead of `roots`.
    pub principal_roots: std::collections::BTreeMap<String, Vec<PathBuf>>,
}

impl WorkspaceSettings {
    fn check(
        section: &file::WorkspaceSection,
        base_dir: &Path,
        text: &Source<'_>,
        problems: &mut Vec<Problem>,
    ) -> WorkspaceSettings {
        use crate::tools::sandbox::{Sandbox, SandboxKind};
        let sandbox = match section.sandbox {
            SandboxKind::None => None,
            SandboxKind::Bwrap => {
                let writable = section.writable.iter().map(|d| base_dir.join(d)).collect();
                match Sandbox::bwrap(section.network, writable) {
                    Ok(sandbox) => Some(sandbox),
                    Err(why) => {
                        problems.push(at(text, "workspace", "sandbox", why.to_string()));
                        None
                    }
                }
            }
        };
        WorkspaceSettings {
            sandbox,
            shell_env: section.shell_env.clone(),
            roots: section.roots.iter().map(|r| base_dir.join(r)).collect(),
            principal_roots: section
                .principal_roots
                .iter()
                .map(|(name, roots)| {
                    (
                        name.clone(),
                        roots.iter().map(|r| base_dir.join(r)).collect(),
                    )
                })
                .collect(),
        }
    }
}
