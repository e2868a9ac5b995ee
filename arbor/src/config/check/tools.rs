//! `[mcp_servers.NAME]` and `[tools.NAME]`: their names, and the servers
//! and command tools built from them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::config::read::{Source, at};
use crate::config::{ConfigFile, Problem};
use crate::tools::command::CommandTool;
use crate::tools::mcp::McpSettings;

/// What is wrong with a server's or a command tool's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
enum BadToolName {
    /// Empty, or longer than a wire name may be.
    #[error("must have 1 to 48 characters")]
    Length,
    /// A character a wire name may not hold.
    #[error("may hold only letters, digits, '_' and '-'")]
    Characters,
}

/// A name for a server or a command tool: what fits a tool name on the wire.
fn check_tool_name(name: &str) -> Result<(), BadToolName> {
    if name.is_empty() || name.len() > 48 {
        return Err(BadToolName::Length);
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(BadToolName::Characters);
    }
    Ok(())
}

pub(in crate::config) fn mcp_servers(
    file: &ConfigFile,
    base_dir: &Path,
    text: &Source<'_>,
    problems: &mut Vec<Problem>,
) -> BTreeMap<String, McpSettings> {
    let mut out = BTreeMap::new();
    for (name, section) in &file.mcp_servers {
        let table = format!("mcp_servers.{name}");
        if let Err(why) = check_tool_name(name) {
            problems.push(at(
                text,
                "mcp_servers",
                name,
                format!("server name {name:?} {why}"),
            ));
            continue;
        }
        match section.settings(name, base_dir) {
            Ok(settings) => {
                out.insert(name.clone(), settings);
            }
            Err(found) => {
                for (key, message) in found {
                    problems.push(at(text, &table, &key, message));
                }
            }
        }
    }
    out
}

pub(in crate::config) fn command_tools(
    file: &ConfigFile,
    base_dir: &Path,
    text: &Source<'_>,
    problems: &mut Vec<Problem>,
) -> Vec<Arc<CommandTool>> {
    let mut out = Vec::new();
    for (name, section) in &file.tools {
        let table = format!("tools.{name}");
        if let Err(why) = check_tool_name(name) {
            problems.push(at(text, "tools", name, format!("tool name {name:?} {why}")));
            continue;
        }
        if arbor_actors::toolbox::BUILTIN_NAMES.contains(&name.as_str()) {
            problems.push(at(
                text,
                &table,
                "command",
                format!("{name:?} is a built-in tool's name; choose another"),
            ));
            continue;
        }
        match section.build(name, base_dir) {
            Ok(tool) => out.push(Arc::new(tool)),
            Err(found) => {
                for (key, message) in found {
                    problems.push(at(text, &table, &key, message));
                }
            }
        }
    }
    out
}
