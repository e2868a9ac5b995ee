//! Tools from outside the agent runtime: MCP servers (`mcp`) and command
//! tools (`command`) declared in the config, the process reaper both use
//! (`reaper`), and the built-in workspace tools (`workspace`: files, search,
//! shell, todos, under Arbor's, Codebuff's and Claude Code's names). A
//! [`ToolSet`] is what one runtime has of them; it registers the workspace
//! and command tools in the catalog and serves the MCP servers' tools (and
//! patterns over `workspace/NAME`) as the catalog's [`ToolSource`], whose
//! lists can change at run time.

#![deny(missing_docs)]

pub mod command;
pub mod hooks;
pub mod keeper;
pub mod mcp;
mod process;
mod program;
pub mod reaper;
pub mod sandbox;
pub mod workspace;

use std::collections::BTreeMap;
use std::sync::Arc;

use arbor_actors::toolbox::ToolboxError;
use arbor_actors::{AgentTemplate, Tool};
use arbor_supervisor::{CatalogBuilder, ToolSource, pattern_matches};
use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;

use command::CommandTool;
use mcp::{McpServers, McpSettings};

/// The config's tools for one runtime: one connection per MCP server, shared
/// by every agent of every tree, and the command tools.
#[derive(Clone)]
pub struct ToolSet {
    mcp: Arc<McpServers>,
    commands: Vec<Arc<CommandTool>>,
}

impl ToolSet {
    /// The MCP servers by name (none started yet: each starts when a tree
    /// first needs it, or at once when `eager`) and the command tools.
    /// The `arbor` crate's `Config::tool_set` makes the config's.
    pub fn new(servers: &BTreeMap<String, McpSettings>, commands: Vec<Arc<CommandTool>>) -> Self {
        ToolSet {
            mcp: McpServers::new(servers.clone()),
            commands,
        }
    }

    /// The MCP servers (for start-up, status and shutdown).
    pub fn mcp(&self) -> &Arc<McpServers> {
        &self.mcp
    }

    /// The command tools, in the order they were given.
    pub fn commands(&self) -> &[Arc<CommandTool>] {
        &self.commands
    }

    /// Adds the workspace tools (every family's names), the command tools
    /// (a command tool of the same name as a workspace tool replaces it) and
    /// the MCP servers to a catalog being built. Patterns over Arbor's
    /// names (`workspace/*`) resolve to Arbor's workspace tools, before any
    /// MCP server of that name.
    pub fn register(&self, mut builder: CatalogBuilder) -> CatalogBuilder {
        for tool in workspace::all_tools() {
            builder = builder.tool(tool);
        }
        for tool in &self.commands {
            builder = builder.tool(tool.clone() as Arc<dyn Tool>);
        }
        builder.tool_source(Arc::new(Sources {
            mcp: (!self.mcp.names().is_empty()).then(|| McpSource(self.mcp.clone())),
        }))
    }
}

/// The catalog's tool source: patterns over Arbor's workspace tool names,
/// then the MCP servers.
struct Sources {
    mcp: Option<McpSource>,
}

impl ToolSource for Sources {
    fn owns(&self, entry: &str) -> bool {
        entry.starts_with(workspace::PREFIX) || self.mcp.as_ref().is_some_and(|m| m.owns(entry))
    }

    fn resolve(&self, entry: &str) -> Result<Vec<Arc<dyn Tool>>, ToolboxError> {
        if entry.starts_with(workspace::PREFIX) {
            let tools: Vec<Arc<dyn Tool>> = workspace::tools(workspace::Family::Arbor)
                .into_iter()
                .filter(|t| pattern_matches(entry, t.name()))
                .map(|t| t as Arc<dyn Tool>)
                .collect();
            if tools.is_empty() {
                return Err(ToolboxError::NoWorkspaceTool(entry.to_owned()));
            }
            return Ok(tools);
        }
        match &self.mcp {
            Some(mcp) => mcp.resolve(entry),
            None => Err(ToolboxError::UnknownTool(entry.to_owned())),
        }
    }

    fn generation(&self) -> u64 {
        self.mcp.as_ref().map_or(0, |m| m.generation())
    }

    fn prepare(&self, entries: Vec<String>) -> BoxFuture<'static, ()> {
        let entries: Vec<String> = entries
            .into_iter()
            .filter(|e| !e.starts_with(workspace::PREFIX))
            .collect();
        match &self.mcp {
            Some(mcp) => mcp.prepare(entries),
            None => Box::pin(async {}),
        }
    }
}

/// The MCP servers as the catalog's tool source: `SERVER/*` (or any pattern
/// over the server's tool names) is the server's current list, `SERVER/TOOL`
/// is that tool (a handle whose calls say why, while the server is down).
struct McpSource(Arc<McpServers>);

impl ToolSource for McpSource {
    fn owns(&self, entry: &str) -> bool {
        entry
            .split_once('/')
            .is_some_and(|(server, _)| self.0.names().iter().any(|n| n == server))
    }

    fn resolve(&self, entry: &str) -> Result<Vec<Arc<dyn Tool>>, ToolboxError> {
        let Some((server, tool)) = entry.split_once('/') else {
            return Err(ToolboxError::NotServerTool(entry.to_owned()));
        };
        if !tool.contains('*') {
            return Ok(vec![self.0.tool(server, tool)]);
        }
        // A server that is down offers none of its tools until it is back,
        // only a stand-in whose description (and any call) says why, so the
        // model does not just read "Tool SERVER/… not found".
        let listed = match self.0.tools(server) {
            Ok(listed) => listed,
            Err(_) => return Ok(vec![self.0.stand_in(server)]),
        };
        Ok(listed
            .into_iter()
            .filter(|t| pattern_matches(entry, t.name()))
            .collect())
    }

    fn generation(&self) -> u64 {
        self.0.generation()
    }

    fn prepare(&self, entries: Vec<String>) -> BoxFuture<'static, ()> {
        let mcp = self.0.clone();
        let mut servers: Vec<String> = entries
            .iter()
            .filter_map(|e| e.split_once('/').map(|(s, _)| s.to_owned()))
            .collect();
        servers.sort();
        servers.dedup();
        Box::pin(async move {
            futures::future::join_all(servers.iter().map(|s| mcp.prepare(s))).await;
        })
    }
}

/// Where a tool comes from, for `arbor tools`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ToolOrigin {
    /// One of the runtime's own tools (`spawn_agents`, `end_turn`, ...;
    /// `add_message` and `set_messages` only for the templates that list them).
    Builtin,
    /// A tool an MCP server offers (named `SERVER/TOOL`).
    Mcp,
    /// A built-in workspace tool (`workspace/read`, `read_files`, `Read`, ...).
    Workspace,
    /// A command tool of the config (`[tools.NAME]`).
    Command,
    /// A tool written in Rust and registered in code (the `arbor` crate's
    /// `RuntimeBuilder::tool`).
    Code,
}

/// One tool an agent could get, as `arbor tools` lists it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolListing {
    /// The name templates and policies use.
    pub name: String,
    /// The name the model sees.
    pub wire_name: String,
    /// Where it comes from.
    pub origin: ToolOrigin,
    /// The MCP server, for MCP tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// What the model is told the tool does (for an MCP server that is
    /// down: `unavailable:` and why).
    pub description: String,
    /// The JSON Schema of its input, as the model gets it (`null` for an
    /// MCP server that is down).
    pub input_schema: Value,
    /// Templates that list it.
    pub agents: Vec<String>,
}

/// Every tool an agent of `templates` (a config's) could get: the built-ins, the command
/// tools, and each MCP server's tools (servers are started for this and
/// waited for up to their `startup_timeout`; one that does not come up is
/// listed as `SERVER/*` with why).
pub async fn listing(templates: &[AgentTemplate], tools: &ToolSet) -> Vec<ToolListing> {
    use arbor_actors::toolbox::{OPTIONAL_BUILTINS, builtin_definitions, wire_name};

    let agents_listing = |name: &str, structural: bool| -> Vec<String> {
        let mut agents: Vec<String> = templates
            .iter()
            .filter(|t| structural || t.tools.iter().any(|e| pattern_matches(e, name)))
            .map(|t| t.id.clone())
            .collect();
        agents.sort();
        agents
    };
    let mut out = Vec::new();
    for (name, def) in builtin_definitions() {
        let structural = !OPTIONAL_BUILTINS.contains(&name);
        out.push(ToolListing {
            name: name.to_owned(),
            wire_name: name.to_owned(),
            origin: ToolOrigin::Builtin,
            server: None,
            description: def.description,
            input_schema: def.input_schema,
            agents: agents_listing(name, structural),
        });
    }
    for tool in workspace::all_tools() {
        out.push(ToolListing {
            name: tool.name().to_owned(),
            wire_name: wire_name(tool.name()),
            origin: ToolOrigin::Workspace,
            server: None,
            description: tool.description().to_owned(),
            input_schema: tool.input_schema(),
            agents: agents_listing(tool.name(), false),
        });
    }
    for tool in &tools.commands {
        out.push(ToolListing {
            name: tool.name().to_owned(),
            wire_name: wire_name(tool.name()),
            origin: ToolOrigin::Command,
            server: None,
            description: tool.description().to_owned(),
            input_schema: tool.input_schema(),
            agents: agents_listing(tool.name(), false),
        });
    }
    let servers = tools.mcp.names();
    futures::future::join_all(servers.iter().map(|s| tools.mcp.prepare(s))).await;
    for server in servers {
        match tools.mcp.tools(&server) {
            Ok(list) => {
                for tool in list {
                    out.push(ToolListing {
                        name: tool.name().to_owned(),
                        wire_name: wire_name(tool.name()),
                        origin: ToolOrigin::Mcp,
                        server: Some(server.clone()),
                        description: tool.description().to_owned(),
                        input_schema: tool.input_schema(),
                        agents: agents_listing(tool.name(), false),
                    });
                }
            }
            Err(why) => {
                let name = format!("{server}/*");
                out.push(ToolListing {
                    wire_name: String::new(),
                    origin: ToolOrigin::Mcp,
                    server: Some(server.clone()),
                    description: format!("unavailable: {why}"),
                    input_schema: Value::Null,
                    agents: agents_listing(&name, false),
                    name,
                });
            }
        }
    }
    out
}

/// `arbor tools` as a table: name, source, the agents that get it, and the
/// first line of its description, each column as wide as its widest cell.
pub fn listing_table(listing: &[ToolListing]) -> String {
    use std::fmt::Write;
    let source = |t: &ToolListing| match (t.origin, &t.server) {
        (ToolOrigin::Mcp, Some(server)) => format!("mcp:{server}"),
        (ToolOrigin::Builtin, _) => "built-in".into(),
        (ToolOrigin::Command, _) => "command".into(),
        (ToolOrigin::Workspace, _) => "workspace".into(),
        (ToolOrigin::Code, _) | (ToolOrigin::Mcp, None) => "code".into(),
    };
    let agents = |t: &ToolListing| {
        if t.agents.is_empty() {
            "-".to_owned()
        } else {
            t.agents.join(",")
        }
    };
    // Each column as wide as its widest cell (an MCP server's name is any
    // length), so the columns stay aligned.
    let width = |header: &str, cell: &dyn Fn(&ToolListing) -> usize| {
        listing
            .iter()
            .map(cell)
            .max()
            .unwrap_or(0)
            .max(header.len())
    };
    let name_w = width("TOOL", &|t| t.name.chars().count());
    let source_w = width("SOURCE", &|t| source(t).chars().count());
    let agents_w = width("AGENTS", &|t| agents(t).chars().count());
    let mut out = format!(
        "{:<name_w$}  {:<source_w$}  {:<agents_w$}  DESCRIPTION\n",
        "TOOL", "SOURCE", "AGENTS"
    );
    for t in listing {
        let line = t.description.lines().next().unwrap_or("");
        let _ = writeln!(
            out,
            "{:<name_w$}  {:<source_w$}  {:<agents_w$}  {line}",
            t.name,
            source(t),
            agents(t)
        );
    }
    out
}

#[cfg(test)]
mod listing_tests {
    use super::{ToolListing, ToolOrigin, listing_table};

    #[test]
    fn the_tools_table_stays_aligned_whatever_a_servers_name() {
        let tool = |name: &str, origin, server: Option<&str>| ToolListing {
            name: name.to_owned(),
            wire_name: name.replace('/', "__"),
            origin,
            server: server.map(str::to_owned),
            description: format!("{name} does it"),
            input_schema: serde_json::Value::Null,
            agents: vec!["lead".to_owned()],
        };
        let table = listing_table(&[
            tool("end_turn", ToolOrigin::Builtin, None),
            tool("notes/read_file", ToolOrigin::Mcp, Some("notes")),
            tool("a_long_server/x", ToolOrigin::Mcp, Some("a_long_server")),
        ]);
        // Where the DESCRIPTION column starts: its header, then each
        // tool's description ("NAME does it", the name's last occurrence).
        let names = [
            "DESCRIPTION",
            "end_turn",
            "notes/read_file",
            "a_long_server/x",
        ];
        let at: Vec<usize> = table
            .lines()
            .zip(names)
            .map(|(line, name)| line.rfind(name).unwrap())
            .collect();
        assert!(at.windows(2).all(|w| w[0] == w[1]), "{table}");
    }
}
