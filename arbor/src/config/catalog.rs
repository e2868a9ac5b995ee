//! Building from a checked config: the models, the catalog and the tool set.

use std::sync::Arc;

use arbor_actors::models::scripted::Script;
use arbor_actors::models::{Latency, ScriptedModel, SimulatedConfig, SimulatedModel};
use arbor_supervisor::Catalog;

use super::{Config, ConfigError, ModelSection, Problem, SimulatedSection};
use crate::providers::{HttpModel, HttpSection, ProviderKind, ProviderSettings};
use crate::tools::ToolSet;

/// A `[models.NAME]` entry as its checks left it: what its model is built
/// from, so a catalog reads and validates nothing again.
#[derive(Clone, Debug)]
pub(super) enum ModelSpec {
    Simulated(SimulatedConfig),
    /// The script, read and parsed; each catalog gets a model of its own
    /// (with its own record of requests).
    Scripted(Script),
    /// The provider's settings, validated, without the key: that is read
    /// from the environment when a catalog is built, and kept only there.
    Http(Box<ProviderSettings>),
}

impl Config {
    /// The tools this config declares, for one runtime: its MCP servers (not
    /// started yet: a tree that needs one starts it) and its command tools.
    pub fn tool_set(&self) -> ToolSet {
        ToolSet::new(&self.mcp_servers, self.command_tools.clone())
    }
    /// Builds the models and the catalog (with a tool set of its own).
    pub fn catalog(&self) -> Result<Catalog, ConfigError> {
        self.catalog_with(&self.tool_set(), &[])
    }

    /// Builds the models and the catalog over `tools` and the tools registered
    /// in code (which templates may name).
    pub fn catalog_with(
        &self,
        tools: &ToolSet,
        code_tools: &[Arc<dyn arbor_actors::Tool>],
    ) -> Result<Catalog, ConfigError> {
        let names: Vec<&str> = code_tools.iter().map(|t| t.name()).collect();
        self.check_tools(&names)?;
        let mut builder = tools
            .register(Catalog::builder())
            .workspaces(self.workspace_opener(), self.workspace.roots.clone())
            .principal_roots(self.workspace.principal_roots.clone());
        if let Some(hooks) = &self.hooks {
            builder = builder.lifecycle(Arc::new(hooks.clone()));
        }
        // Codebuff's placeholders that describe the project and the run,
        // filled per tree (used only when a template holds one).
        builder = builder.prompt_context(Arc::new(super::agent_files::CodebuffScene));
        for tool in code_tools {
            builder = builder.tool(tool.clone());
        }
        for (name, spec) in &self.models {
            let model: Arc<dyn arbor_actors::Model> = match spec {
                ModelSpec::Simulated(config) => Arc::new(SimulatedModel::new(name, config.clone())),
                ModelSpec::Scripted(script) => Arc::new(ScriptedModel::new(name, script.clone())),
                ModelSpec::Http(settings) => {
                    Arc::new(self.http_model_from(name, (**settings).clone())?)
                }
            };
            builder = builder.model_as(name, model);
        }
        for template in &self.templates {
            builder = builder.template(template.clone());
        }
        // The supervisor asks the config what a model override may run.
        let config = self.clone();
        builder = builder.override_check(Arc::new(move |agent: &str, model: &str| {
            config.check_model_override(agent, model)
        }));
        builder.build().map_err(|e| ConfigError {
            file: self.source.clone(),
            problems: vec![Problem {
                file: None,
                line: None,
                key: "agents".into(),
                message: e.to_string(),
            }],
        })
    }

    /// The HTTP model of `[models.NAME]`, `kind` and `section` being that
    /// entry's (as [`Config::model_sections`] gives them): built from the settings
    /// checked when the config was read, not validated again. The key is read
    /// from the environment now.
    pub fn http_model(
        &self,
        name: &str,
        kind: ProviderKind,
        section: &HttpSection,
    ) -> Result<HttpModel, ConfigError> {
        let settings = match (self.models.get(name), self.file.models.get(name)) {
            (
                Some(ModelSpec::Http(settings)),
                Some(ModelSection::Openai(checked) | ModelSection::Anthropic(checked)),
            ) if settings.kind == kind && checked == section => (**settings).clone(),
            // Not this config's entry, so not checked yet: checked now.
            _ => ProviderSettings::from_section(kind, section)
                .map_err(|(key, message)| self.problem("models", name, &key, message))?,
        };
        self.http_model_from(name, settings)
    }

    /// The HTTP model over checked settings, with its key read now.
    fn http_model_from(
        &self,
        name: &str,
        mut settings: ProviderSettings,
    ) -> Result<HttpModel, ConfigError> {
        settings.read_api_key();
        HttpModel::new(name, settings)
            .map_err(|e| self.problem("models", name, "provider", e.to_string()))
    }

    fn problem(&self, table: &str, name: &str, key: &str, message: String) -> ConfigError {
        ConfigError {
            file: self.source.clone(),
            problems: vec![Problem {
                file: None,
                line: None,
                key: format!("{table}.{name}.{key}"),
                message,
            }],
        }
    }
}

/// A simulated model's tree, with its latency parsed.
pub(super) fn simulated_config(s: &SimulatedSection, latency: Latency) -> SimulatedConfig {
    SimulatedConfig {
        shape: s.shape.clone().unwrap_or_else(|| vec![s.fanout; s.depth]),
        latency,
        reply_tokens: s.reply_tokens,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use arbor_actors::FailurePolicy;

    use crate::config::Config;

    #[test]
    fn the_shipped_config_loads_and_builds_a_catalog() {
        let config = Config::default_config().unwrap();
        assert_eq!(config.default_agent(), Some("coordinator"));
        assert_eq!(
            config.limits.max_live_agents,
            std::num::NonZeroUsize::new(64)
        );
        assert_eq!(
            config.limits.deadline,
            Some(std::time::Duration::from_secs(300))
        );
        let researcher = config
            .templates
            .iter()
            .find(|t| t.id == "researcher")
            .unwrap();
        assert_eq!(
            researcher.failure,
            FailurePolicy::Retry {
                max: 2,
                backoff: std::time::Duration::from_millis(200)
            }
        );
        let catalog = config.catalog().unwrap();
        assert!(catalog.template("analyst").is_some());
        assert!(catalog.model("sim").is_some());
    }

    #[test]
    fn a_catalog_is_built_from_what_the_checks_read_not_from_the_files_again() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("script.json");
        std::fs::write(&script, r#"{"replies": []}"#).unwrap();
        let text = "[models.s]\nprovider = \"scripted\"\nfile = \"script.json\"\n\n\
                    [agents.a]\nmodel = \"s\"\n";
        let config = Config::parse(text, "c.toml", dir.path().to_path_buf()).unwrap();
        std::fs::remove_file(&script).unwrap();
        // Each catalog gets its own model from the script read once.
        assert!(config.catalog().unwrap().model("s").is_some());
        assert!(config.catalog().unwrap().model("s").is_some());
    }

    #[test]
    fn a_template_picks_the_workspace_tools_family_and_its_names_reach_the_model() {
        let text = "[models.m]\nprovider = \"simulated\"\n\n\
                    [agents.claude]\nmodel = \"m\"\ntools = [\"workspace/*\"]\ntool_names = \"claude\"\n\n\
                    [agents.codebuff]\nmodel = \"m\"\ntools = [\"workspace/read\", \"workspace/grep\", \"workspace/sh*\"]\ntool_names = \"codebuff\"\n\n\
                    [agents.arbor]\nmodel = \"m\"\ntools = [\"workspace/edit\", \"Bash\"]\n";
        let config = Config::parse(text, "c.toml", std::env::temp_dir()).unwrap();
        let tools = |id: &str| {
            config
                .templates
                .iter()
                .find(|t| t.id == id)
                .unwrap()
                .tools
                .clone()
        };
        assert_eq!(
            tools("claude"),
            [
                "Read",
                "Write",
                "Edit",
                "MultiEdit",
                "Bash",
                "Grep",
                "Glob",
                "LS",
                "TodoWrite"
            ]
        );
        assert_eq!(
            tools("codebuff"),
            ["read_files", "code_search", "run_terminal_command"]
        );
        assert_eq!(tools("arbor"), ["workspace/edit", "Bash"]);
        // The names resolve in the catalog, and the model gets them.
        let catalog = config.catalog().unwrap();
        let policy = arbor_supervisor::ToolPolicy::default();
        let offered = catalog.offered("codebuff", &policy).unwrap();
        for name in ["read_files", "code_search", "run_terminal_command"] {
            assert!(offered.iter().any(|n| n == name), "{offered:?}");
        }
        let offered = catalog.offered("arbor", &policy).unwrap();
        assert!(
            offered.iter().any(|n| n == "workspace__edit"),
            "{offered:?}"
        );
    }

    #[test]
    fn a_workspace_entry_naming_no_tool_of_the_family_is_a_problem() {
        let text = "[models.m]\nprovider = \"simulated\"\n\n\
                    [agents.a]\nmodel = \"m\"\ntools = [\"workspace/nope\"]\n\n\
                    [agents.b]\nmodel = \"m\"\ntools = [\"workspace/list\"]\ntool_names = \"codebuff\"\n\n\
                    [agents.c]\nmodel = \"m\"\ntool_names = \"cursor\"\n";
        let error = Config::parse(text, "c.toml", std::env::temp_dir())
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("\"workspace/nope\" names no workspace tool"),
            "{error}"
        );
        assert!(
            error
                .contains("\"workspace/list\": the Codebuff family of tool names has no such tool"),
            "{error}"
        );
        assert!(error.contains("unknown variant `cursor`"), "{error}");
    }
}
