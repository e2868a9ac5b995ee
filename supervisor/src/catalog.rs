//! The catalog: every template, model and tool a supervisor can use, checked
//! once when it is built. Immutable afterwards, so agents read it without locks.

use std::collections::HashMap;
use std::sync::Arc;

use arbor_actors::template::AgentTypeId;
use arbor_actors::toolbox::Toolbox;
use arbor_actors::{AgentTemplate, Model, Tool};

use crate::error::Error;

#[derive(Default)]
pub struct CatalogBuilder {
    templates: Vec<AgentTemplate>,
    models: HashMap<String, Arc<dyn Model>>,
    tools: HashMap<String, Arc<dyn Tool>>,
}

impl CatalogBuilder {
    pub fn template(mut self, template: AgentTemplate) -> Self {
        self.templates.push(template);
        self
    }

    pub fn model(mut self, model: Arc<dyn Model>) -> Self {
        self.models.insert(model.name().to_owned(), model);
        self
    }

    /// Registers a model under a name other than its own.
    pub fn model_as(mut self, name: &str, model: Arc<dyn Model>) -> Self {
        self.models.insert(name.to_owned(), model);
        self
    }

    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.insert(tool.name().to_owned(), tool);
        self
    }

    /// Checks that every template's model, tools and spawnable agents exist,
    /// and builds each template's toolbox.
    pub fn build(self) -> Result<Catalog, Error> {
        let mut catalog = Catalog {
            templates: HashMap::new(),
            toolboxes: HashMap::new(),
            models: self.models,
        };
        for template in &self.templates {
            let tools = &self.tools;
            let toolbox =
                Toolbox::build(template, |name| tools.get(name).cloned()).map_err(|message| {
                    Error::InvalidTemplate {
                        agent: template.id.clone(),
                        message,
                    }
                })?;
            catalog
                .toolboxes
                .insert(template.id.clone(), Arc::new(toolbox));
        }
        for template in self.templates {
            if !catalog.models.contains_key(&template.model) {
                return Err(Error::UnknownModel {
                    agent: template.id.clone(),
                    model: template.model.clone(),
                });
            }
            catalog
                .templates
                .insert(template.id.clone(), Arc::new(template));
        }
        for template in catalog.templates.values() {
            for entry in &template.spawnable_agents {
                if !catalog.templates.contains_key(entry) {
                    return Err(Error::InvalidTemplate {
                        agent: template.id.clone(),
                        message: format!("spawnable agent {entry} is not defined"),
                    });
                }
            }
        }
        Ok(catalog)
    }
}

pub struct Catalog {
    templates: HashMap<String, Arc<AgentTemplate>>,
    toolboxes: HashMap<String, Arc<Toolbox>>,
    models: HashMap<String, Arc<dyn Model>>,
}

impl Catalog {
    pub fn builder() -> CatalogBuilder {
        CatalogBuilder::default()
    }

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

    pub fn knows_agent(&self, requested: &str) -> bool {
        let want = AgentTypeId::parse(requested);
        self.templates
            .keys()
            .any(|id| want.matches(&AgentTypeId::parse(id)))
    }

    pub fn templates(&self) -> impl Iterator<Item = &Arc<AgentTemplate>> {
        self.templates.values()
    }

    pub fn model(&self, name: &str) -> Option<&Arc<dyn Model>> {
        self.models.get(name)
    }

    pub fn model_names(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }

    pub fn toolbox(&self, template_id: &str) -> Option<&Arc<Toolbox>> {
        self.toolboxes.get(template_id)
    }
}
