//! The MCP servers other clients configure, as Arbor's `[mcp_servers.NAME]`
//! tables (`arbor mcp import FILE`).
//!
//! Claude Code's `.mcp.json`, Claude Desktop's `claude_desktop_config.json`
//! and Cursor's `mcp.json` keep their servers under `mcpServers`, VS Code's
//! `mcp.json` under `servers`; each entry has the keys Arbor's table reads
//! (`type`, `command`, `args`, `env`, `url`, `headers`; a whole value
//! `"${VAR}"` is read from the variable). So the import is a check and a
//! change of notation: every entry is read as Arbor reads a table, and one
//! that it would refuse is named with its key and the reason, before
//! anything is printed.

use std::path::Path;

use serde_json::Value;

use super::config::McpServerSection;

/// The `[mcp_servers.NAME]` tables (TOML) of the servers in `json`, a
/// client's MCP config; `base_dir` is where a relative `cwd` would be read
/// from. `Err` lists every problem, one per line, each naming the entry and
/// key (`mcpServers.NAME.KEY: …`).
pub fn mcp_servers_toml(json: &str, base_dir: &Path) -> Result<String, ImportError> {
    toml_of(json, base_dir)
}

/// An import that fails for one reason.
fn refused(problem: String) -> ImportError {
    ImportError {
        problems: vec![problem],
    }
}

/// Why a client's MCP config cannot be imported: every problem, each naming
/// the entry and key (`mcpServers.NAME.KEY: …`), one per line when shown.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", problems.join("\n"))]
pub struct ImportError {
    /// The problems, in the document's order.
    pub problems: Vec<String>,
}

fn toml_of(json: &str, base_dir: &Path) -> Result<String, ImportError> {
    let root: Value =
        serde_json::from_str(json).map_err(|e| refused(format!("not a JSON document: {e}")))?;
    let Some(object) = root.as_object() else {
        return Err(refused(format!(
            "the document is {}, not an object with mcpServers",
            kind(&root)
        )));
    };
    let (key, servers) = ["mcpServers", "servers"]
        .iter()
        .find_map(|key| object.get(*key).map(|servers| (*key, servers)))
        .ok_or_else(|| {
            let keys: Vec<&str> = object.keys().map(String::as_str).collect();
            refused(format!(
                "no mcpServers (Claude Code, Claude Desktop, Cursor) or servers (VS Code) \
                 object in the document (its keys: {})",
                keys.join(", ")
            ))
        })?;
    let Some(servers) = servers.as_object() else {
        return Err(refused(format!(
            "{key} is {}, not an object of servers by name",
            kind(servers)
        )));
    };
    let mut problems = Vec::new();
    let mut tables = toml::Table::new();
    for (name, entry) in servers {
        let at = format!("{key}.{name}");
        let Some(object) = entry.as_object() else {
            problems.push(format!("{at}: {}, not an object", kind(entry)));
            continue;
        };
        let entry = &Value::Object(bearer_from_header(object.clone()));
        let before = problems.len();
        unexpanded(entry, &at, &mut problems);
        if problems.len() > before {
            continue;
        }
        let section = match serde_path_to_error::deserialize::<_, McpServerSection>(entry) {
            Ok(section) => section,
            Err(error) => {
                let path = error.path().to_string();
                let inner = error.into_inner();
                let at = if path == "." {
                    at
                } else {
                    format!("{at}.{path}")
                };
                problems.push(format!("{at}: {inner}"));
                continue;
            }
        };
        if let Err(found) = section.settings(name, base_dir) {
            problems.extend(found.into_iter().map(|(key, message)| match key.as_str() {
                "" => format!("{at}: {message}"),
                _ => format!("{at}.{key}: {message}"),
            }));
            continue;
        }
        match to_toml(entry) {
            Ok(table) => {
                tables.insert(name.clone(), table);
            }
            Err(message) => problems.push(format!("{at}: {message}")),
        }
    }
    if !problems.is_empty() {
        return Err(ImportError { problems });
    }
    let mut root = toml::Table::new();
    root.insert("mcp_servers".to_owned(), toml::Value::Table(tables));
    toml::to_string(&root).map_err(|e| refused(format!("cannot write TOML: {e}")))
}

/// `headers.Authorization = "Bearer ${VAR}"` (as Claude Code's docs write
/// a token) is Arbor's `bearer_token_env = "VAR"`.
fn bearer_from_header(mut entry: serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
    let Some(Value::Object(headers)) = entry.get_mut("headers") else {
        return entry;
    };
    let found = headers.iter().find_map(|(name, value)| {
        let var = value
            .as_str()?
            .strip_prefix("Bearer ${")?
            .strip_suffix('}')
            .filter(|v| is_variable(v))?;
        name.eq_ignore_ascii_case("authorization")
            .then(|| (name.clone(), var.to_owned()))
    });
    if let Some((name, var)) = found {
        headers.remove(&name);
        if headers.is_empty() {
            entry.remove("headers");
        }
        entry.insert("bearer_token_env".to_owned(), Value::String(var));
    }
    entry
}

/// Problems for strings that hold `${…}` other than as a whole value
/// `"${VAR}"`: Arbor does not expand variables inside a value or give them
/// defaults, so such a value would be sent as written.
fn unexpanded(value: &Value, at: &str, problems: &mut Vec<String>) {
    match value {
        Value::String(text) if text.contains("${") => {
            let whole = text
                .strip_prefix("${")
                .and_then(|t| t.strip_suffix('}'))
                .is_some_and(is_variable);
            if !whole {
                problems.push(format!(
                    "{at}: {text:?} has a variable inside it, which Arbor does not expand \
                     (only a whole value \"${{VAR}}\" is read from VAR): write the value out"
                ));
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                unexpanded(item, &format!("{at}[{i}]"), problems);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                unexpanded(item, &format!("{at}.{key}"), problems);
            }
        }
        _ => {}
    }
}

/// A variable's name: letters, digits and `_`, not starting with a digit.
fn is_variable(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A JSON value TOML cannot write.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum NoToml {
    /// `null`.
    #[error("null has no TOML form: leave the key out")]
    Null,
    /// A number neither an `i64` nor an `f64` (as JSON wrote it).
    #[error("the number {0} does not fit TOML")]
    Number(String),
}

/// A JSON value as TOML; `null` has no TOML form.
fn to_toml(value: &Value) -> Result<toml::Value, NoToml> {
    Ok(match value {
        Value::Null => return Err(NoToml::Null),
        Value::Bool(b) => toml::Value::Boolean(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => toml::Value::Integer(i),
            (None, Some(f)) => toml::Value::Float(f),
            (None, None) => return Err(NoToml::Number(n.to_string())),
        },
        Value::String(s) => toml::Value::String(s.clone()),
        Value::Array(items) => {
            toml::Value::Array(items.iter().map(to_toml).collect::<Result<_, _>>()?)
        }
        Value::Object(map) => toml::Value::Table(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), to_toml(v)?)))
                .collect::<Result<_, NoToml>>()?,
        ),
    })
}

/// What a JSON value is, for an error.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Claude Code's `.mcp.json` as its docs show it: a stdio server with
    /// `env`, an HTTP server and an SSE server with headers.
    const CLAUDE: &str = r#"{
      "mcpServers": {
        "shared-server": {
          "command": "/path/to/server",
          "args": [],
          "env": {}
        },
        "api-server": {
          "type": "http",
          "url": "${API_BASE_URL:-https://api.example.com}/mcp",
          "headers": { "Authorization": "Bearer ${API_KEY}" }
        },
        "events": {
          "type": "sse",
          "url": "https://mcp.example.com/sse",
          "headers": { "X-API-Key": "${EVENTS_KEY}" }
        }
      }
    }"#;

    #[test]
    fn a_variable_inside_a_value_is_named_not_sent_as_written() {
        let error = mcp_servers_toml(CLAUDE, Path::new("."))
            .unwrap_err()
            .to_string();
        assert_eq!(error.lines().count(), 1, "{error}");
        assert!(
            error.starts_with("mcpServers.api-server.url: \"${API_BASE_URL:-"),
            "{error}"
        );
        assert!(error.contains("does not expand"), "{error}");
    }

    #[test]
    fn claude_codes_mcp_json_becomes_tables_arbor_reads() {
        let json = CLAUDE.replace(
            "${API_BASE_URL:-https://api.example.com}",
            "https://api.example.com",
        );
        let toml_text = mcp_servers_toml(&json, Path::new(".")).unwrap();
        let parsed: toml::Table = toml::from_str(&toml_text).unwrap();
        let servers = parsed["mcp_servers"].as_table().unwrap();
        assert_eq!(servers.len(), 3, "{toml_text}");
        assert_eq!(servers["events"]["type"].as_str(), Some("sse"));
        assert_eq!(
            servers["events"]["headers"]["X-API-Key"].as_str(),
            Some("${EVENTS_KEY}")
        );
        // "Bearer ${API_KEY}" is Arbor's bearer_token_env.
        assert_eq!(
            servers["api-server"]["bearer_token_env"].as_str(),
            Some("API_KEY")
        );
        assert!(
            servers["api-server"].get("headers").is_none(),
            "{toml_text}"
        );
        // Each table is one Arbor reads.
        for (name, table) in servers {
            let section: McpServerSection = table.clone().try_into().unwrap();
            assert!(section.settings(name, Path::new(".")).is_ok(), "{name}");
        }
    }

    #[test]
    fn an_entry_arbor_would_refuse_is_named_with_its_key_and_why() {
        let bad = r#"{"mcpServers": {
            "a/b": {"command": "x"},
            "neither": {"args": ["y"]},
            "typo": {"comand": "x"},
            "odd": 3,
            "nil": {"command": "x", "cwd": null}
        }}"#;
        let error = mcp_servers_toml(bad, Path::new("."))
            .unwrap_err()
            .to_string();
        let lines: Vec<&str> = error.lines().collect();
        assert_eq!(lines.len(), 5, "{error}");
        assert!(
            lines[0].starts_with("mcpServers.a/b: server name"),
            "{error}"
        );
        assert!(lines[1].starts_with("mcpServers.neither"), "{error}");
        assert!(
            lines[2].starts_with("mcpServers.typo") && lines[2].contains("comand"),
            "{error}"
        );
        assert_eq!(lines[3], "mcpServers.odd: a number, not an object");
        assert!(lines[4].starts_with("mcpServers.nil"), "{error}");
    }

    #[test]
    fn a_document_without_servers_says_which_keys_it_looked_for() {
        let error = mcp_servers_toml(r#"{"theme": "dark"}"#, Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("mcpServers") && error.contains("theme"),
            "{error}"
        );
        let vscode =
            r#"{"servers": {"fs": {"type": "stdio", "command": "npx", "args": ["-y", "x"]}}}"#;
        assert!(
            mcp_servers_toml(vscode, Path::new("."))
                .unwrap()
                .contains("[mcp_servers.fs]")
        );
        assert!(
            mcp_servers_toml("[1]", Path::new("."))
                .unwrap_err()
                .to_string()
                .contains("an array")
        );
        assert!(
            mcp_servers_toml("{", Path::new("."))
                .unwrap_err()
                .to_string()
                .starts_with("not a JSON")
        );
    }
}
