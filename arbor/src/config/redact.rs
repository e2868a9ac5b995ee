//! The secrets a config file may hold, kept out of the config text a tree
//! stores with it ([`secret_spans`]) and taken back from the file in force
//! when a stored config is read again ([`restore_secrets`]).
//!
//! What is a secret: every literal value of a model's `headers`, of an MCP
//! server's `env` and `headers` (or Codex's `http_headers`), and the password of a URL (a model's
//! `base_url`, an MCP server's `url`, the store's `url`), and `[service]`'s
//! `webhook_secret` when written as a string. API keys, bearer
//! tokens and `{ env = "VAR" }` values come from environment variables, so
//! the file has only their names.
//!
//! An agent file's inline MCP servers (Claude Code's `mcpServers`, Codebuff's)
//! hold the same secrets: the stored copy of the file has them replaced the
//! same way ([`server_secrets`], [`splice`]), and a stored config read back
//! takes them from the current config's server of the same name.

use std::collections::BTreeMap;
use std::ops::Range;

use toml::de::{DeTable, DeValue};

use super::read::REDACTED;
use super::store::redact;
use super::{Config, ConfigFile, ModelSection};
use crate::tools::mcp::ValueSource;

/// A URL's password as the stored text shows it (see [`redact`]).
const PASSWORD: &str = "***";

/// The keys of an MCP server definition whose literal (string) values are
/// secrets.
pub(super) const SERVER_SECRET_MAPS: [&str; 3] = ["env", "headers", "http_headers"];

/// The key of an MCP server definition whose password is a secret.
pub(super) const SERVER_URL: &str = "url";

/// One secret of an MCP server definition (`.mcp.json`'s shape, as JSON):
/// where it is (`env.TOKEN`, `url`), its value, and what its stored copy
/// reads instead.
pub(super) struct ServerSecret {
    /// The key under the server (`env`, `headers`, `http_headers` or `url`)
    /// and, for a map, the entry's name.
    pub key: (&'static str, Option<String>),
    /// The secret as written.
    pub value: String,
    /// What the stored copy has in its place: `"(not stored)"`, or the URL
    /// with its password as `***`.
    pub stored: String,
}

/// Every secret of an MCP server `definition` (as JSON): the literal values
/// of its `env`, `headers` and `http_headers`, and its URL when it has a
/// password.
pub(super) fn server_secrets(definition: &serde_json::Value) -> Vec<ServerSecret> {
    let mut out = Vec::new();
    for key in SERVER_SECRET_MAPS {
        if let Some(map) = definition.get(key).and_then(|v| v.as_object()) {
            for (name, value) in map {
                if let Some(value) = value.as_str() {
                    out.push(ServerSecret {
                        key: (key, Some(name.clone())),
                        value: value.to_owned(),
                        stored: REDACTED.to_owned(),
                    });
                }
            }
        }
    }
    if let Some(url) = definition.get(SERVER_URL).and_then(|v| v.as_str()) {
        let shown = redact(url);
        if shown != url {
            out.push(ServerSecret {
                key: (SERVER_URL, None),
                value: url.to_owned(),
                stored: shown,
            });
        }
    }
    out
}

/// `text` with each span (sorted, not overlapping) replaced by its text.
pub(super) fn splice(text: &str, spans: &[(Range<usize>, String)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (span, value) in spans {
        let (Some(before), true) = (text.get(at..span.start), span.end >= span.start) else {
            continue;
        };
        out.push_str(before);
        out.push_str(value);
        at = span.end;
    }
    out.push_str(text.get(at..).unwrap_or_default());
    out
}

/// The spans of `root`'s secret values, each with the TOML value that
/// replaces it in the stored text: `"(not stored)"` for a literal value, the
/// URL with its password as `***` for a URL. Sorted by position.
pub(super) fn secret_spans(root: &DeTable<'_>) -> Vec<(Range<usize>, String)> {
    let mut spans = Vec::new();
    for (section, literals, url) in [
        ("models", &["headers"][..], "base_url"),
        ("mcp_servers", &SERVER_SECRET_MAPS[..], SERVER_URL),
    ] {
        for (_, entry) in tables(get(root, section)) {
            for key in literals {
                for (_, span) in strings(get(entry, key)) {
                    spans.push((span, quoted(REDACTED)));
                }
            }
            spans.extend(url_span(entry, url));
        }
    }
    if let Some(DeValue::Table(store)) = get(root, "store") {
        spans.extend(url_span(store, "url"));
    }
    // The webhooks' shared secret, when written in the file.
    if let Some(DeValue::Table(service)) = get(root, "service")
        && let Some(secret) = service
            .iter()
            .find(|(k, _)| k.get_ref() == "webhook_secret")
            .map(|(_, v)| v)
        && let DeValue::String(_) = secret.get_ref()
    {
        spans.push((secret.span(), quoted(REDACTED)));
    }
    spans.sort_by_key(|(span, _)| span.start);
    spans
}

/// The value of `key` in `table`.
fn get<'a, 't>(table: &'a DeTable<'t>, key: &str) -> Option<&'a DeValue<'t>> {
    table
        .iter()
        .find(|(k, _)| k.get_ref() == key)
        .map(|(_, v)| v.get_ref())
}

/// The entries of `value` that are tables (none when it is not a table).
fn tables<'a, 't>(
    value: Option<&'a DeValue<'t>>,
) -> impl Iterator<Item = (&'a str, &'a DeTable<'t>)> {
    entries(value).filter_map(|(name, v)| match v.get_ref() {
        DeValue::Table(t) => Some((name, t)),
        _ => None,
    })
}

/// The spans of the entries of `value` that are strings.
fn strings<'a, 't>(
    value: Option<&'a DeValue<'t>>,
) -> impl Iterator<Item = (&'a str, Range<usize>)> {
    entries(value).filter_map(|(name, v)| match v.get_ref() {
        DeValue::String(_) => Some((name, v.span())),
        _ => None,
    })
}

/// The entries of `value`, when it is a table.
fn entries<'a, 't>(
    value: Option<&'a DeValue<'t>>,
) -> impl Iterator<Item = (&'a str, &'a toml::Spanned<DeValue<'t>>)> {
    let table = match value {
        Some(DeValue::Table(t)) => Some(t),
        _ => None,
    };
    table
        .into_iter()
        .flat_map(|t| t.iter().map(|(k, v)| (k.get_ref().as_ref(), v)))
}

/// The span of `table`'s URL `key` and its redacted value, when it has a
/// password.
fn url_span(table: &DeTable<'_>, key: &str) -> Option<(Range<usize>, String)> {
    let (_, value) = table.iter().find(|(k, _)| k.get_ref() == key)?;
    let DeValue::String(url) = value.get_ref() else {
        return None;
    };
    let shown = redact(url);
    (shown != **url).then(|| (value.span(), quoted(&shown)))
}

/// `text` as a TOML string.
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

/// The secrets a stored config (`file`, read from its text) left out, taken
/// back from `current`, the config in force now: a model's or server's
/// removed value from the same entry's same key, a URL's password from the
/// same entry's URL when it is the same URL. What `current` does not have is
/// left out, with a warning (a header or variable is not set, a URL is used
/// without its password): a placeholder is never sent as a secret.
pub(super) fn restore_secrets(file: &mut ConfigFile, tree_id: &str, current: Option<&Config>) {
    for (name, model) in file.models.iter_mut() {
        let (ModelSection::Openai(section) | ModelSection::Anthropic(section)) = model else {
            continue;
        };
        let theirs = current.and_then(|c| match c.file.models.get(name) {
            Some(ModelSection::Openai(s) | ModelSection::Anthropic(s)) => Some(s),
            _ => None,
        });
        let place = format!("models.{name}");
        restore_map(
            &mut section.headers,
            theirs.map(|s| &s.headers),
            |value| value == REDACTED,
            tree_id,
            &format!("{place}.headers"),
        );
        if let Some(url) = &mut section.base_url {
            restore_url(
                url,
                theirs.and_then(|s| s.base_url.as_deref()),
                tree_id,
                &format!("{place}.base_url"),
            );
        }
    }
    for (name, server) in file.mcp_servers.iter_mut() {
        let theirs = current.and_then(|c| c.file.mcp_servers.get(name));
        let place = format!("mcp_servers.{name}");
        let removed = |value: &ValueSource| *value == ValueSource::Literal(REDACTED.to_owned());
        if let Some(env) = &mut server.env {
            let now = theirs.and_then(|s| s.env.as_ref());
            restore_map(env, now, removed, tree_id, &format!("{place}.env"));
        }
        if let Some(headers) = &mut server.headers {
            let now = theirs.and_then(|s| s.headers.as_ref());
            restore_map(headers, now, removed, tree_id, &format!("{place}.headers"));
        }
        if let Some(url) = &mut server.url {
            let now = theirs.and_then(|s| s.url.as_deref());
            restore_url(url, now, tree_id, &format!("{place}.url"));
        }
    }
}

/// The values of `map` that `removed` says were left out, taken from the
/// same keys of `current`, or dropped with a warning naming `place`.
fn restore_map<V: Clone>(
    map: &mut BTreeMap<String, V>,
    current: Option<&BTreeMap<String, V>>,
    removed: impl Fn(&V) -> bool,
    tree_id: &str,
    place: &str,
) {
    map.retain(|key, value| {
        if !removed(value) {
            return true;
        }
        match current.and_then(|now| now.get(key)) {
            Some(now) => {
                value.clone_from(now);
                true
            }
            None => {
                tracing::warn!(
                    tree = tree_id,
                    key = %format!("{place}.{key}"),
                    "the value is not stored with the tree and the current config has none: \
                     left out"
                );
                false
            }
        }
    });
}

/// A stored URL whose password was redacted: the current file's URL when it
/// is the same one, else the URL without a password, with a warning.
fn restore_url(url: &mut String, current: Option<&str>, tree_id: &str, place: &str) {
    let bare = without_placeholder(url);
    if bare == *url {
        return;
    }
    match current {
        Some(now) if redact(now) == *url => *url = now.to_owned(),
        _ => {
            tracing::warn!(
                tree = tree_id,
                key = place,
                "the URL's password is not stored with the tree and the current config has \
                 not the same URL: used without it"
            );
            *url = bare;
        }
    }
}

/// `url` without the `***` that [`redact`] puts for a password (in its
/// `user:password@` part or a `password=` query parameter).
fn without_placeholder(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some(("", PASSWORD)) => host.to_owned(),
            Some((user, PASSWORD)) => format!("{user}@{host}"),
            _ => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let (query, fragment) = match query.split_once('#') {
                Some((q, f)) => (q, Some(f)),
                None => (query, None),
            };
            let kept: Vec<&str> = query
                .split('&')
                .filter(|pair| {
                    !matches!(pair.split_once('='),
                        Some((key, PASSWORD)) if key.eq_ignore_ascii_case("password"))
                })
                .collect();
            let mut tail = path.to_owned();
            if !kept.is_empty() {
                tail.push('?');
                tail.push_str(&kept.join("&"));
            }
            if let Some(fragment) = fragment {
                tail.push('#');
                tail.push_str(fragment);
            }
            tail
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::PathBuf;

    use super::*;

    /// A config with one secret of each kind (and values that are not).
    const TEXT: &str = r#"# secrets below
[models.m]
provider = "openai"
model = "x"
base_url = "https://user:pw-base@llm.example.com/v1"
headers = { Authorization = "Bearer sk-header", X-Title = "arbor" }

[models.plain]
provider = "openai"
model = "y"
base_url = "http://127.0.0.1:9/v1"

[mcp_servers.local]
command = "server"
args = ["--flag"]
env = { TOKEN = "env-literal", FROM = { env = "ARBOR_TEST_VAR" } }

[mcp_servers.remote]
url = "https://bot:pw-mcp@mcp.example.com/mcp?password=pw-query&x=1"
bearer_token_env = "REMOTE_TOKEN"

[mcp_servers.remote.headers]
X-Key = 'header-literal'
X-From = { env = "ARBOR_TEST_KEY" }

[service]
webhook = "https://hooks.example.com/arbor"
webhook_secret = "whsec-literal-0123456789"

[agents.a]
model = "m"
"#;

    const SECRETS: &[&str] = &[
        "pw-base",
        "sk-header",
        "\"arbor\"",
        "env-literal",
        "pw-mcp",
        "pw-query",
        "header-literal",
        "whsec-literal-0123456789",
    ];

    fn config(text: &str) -> Config {
        Config::parse(text, "c.toml", PathBuf::from(".")).unwrap()
    }

    #[test]
    fn the_stored_text_has_no_literal_secret_and_keeps_the_rest() {
        let snapshot = config(TEXT).snapshot();
        for secret in SECRETS {
            assert!(!snapshot.contains(secret), "{secret}: {snapshot}");
        }
        for kept in [
            "# secrets below",
            "https://user:***@llm.example.com/v1",
            "http://127.0.0.1:9/v1",
            "https://bot:***@mcp.example.com/mcp?password=***&x=1",
            "FROM = { env = \"ARBOR_TEST_VAR\" }",
            "X-From = { env = \"ARBOR_TEST_KEY\" }",
            "REMOTE_TOKEN",
            "args = [\"--flag\"]",
            "webhook = \"https://hooks.example.com/arbor\"",
        ] {
            assert!(snapshot.contains(kept), "{kept}: {snapshot}");
        }
        // Still a config that reads.
        config(&snapshot);
    }

    #[test]
    fn a_stored_config_gets_its_secrets_back_from_the_current_file() {
        let current = config(TEXT);
        let snapshot = current.snapshot();
        let back = Config::from_snapshot(&snapshot, "t", PathBuf::from("."), Some(&current));
        let back = back.unwrap();
        assert_eq!(format!("{:?}", back.file), format!("{:?}", current.file));
        let (ModelSection::Openai(was), ModelSection::Openai(now)) =
            (&current.file.models["m"], &back.file.models["m"])
        else {
            unreachable!()
        };
        assert_eq!(now.headers, was.headers);
        assert_eq!(now.base_url, was.base_url);
        let (was, now) = (
            &current.file.mcp_servers["local"],
            &back.file.mcp_servers["local"],
        );
        assert_eq!(now.env, was.env);
        let (was, now) = (
            &current.file.mcp_servers["remote"],
            &back.file.mcp_servers["remote"],
        );
        assert_eq!((&now.url, &now.headers), (&was.url, &was.headers));
        assert_eq!(&*back.snapshot(), &*snapshot, "stored again as it was");
    }

    #[test]
    fn without_the_current_file_no_placeholder_is_used_as_a_secret() {
        let snapshot = config(TEXT).snapshot();
        let alone = Config::from_snapshot(&snapshot, "t", PathBuf::from("."), None).unwrap();
        let shown = format!("{:?}", alone.file);
        assert!(!shown.contains(PASSWORD), "{shown}");
        assert!(!shown.contains(REDACTED), "{shown}");
        let ModelSection::Openai(m) = &alone.file.models["m"] else {
            unreachable!()
        };
        assert!(m.headers.is_empty());
        assert_eq!(
            m.base_url.as_deref(),
            Some("https://user@llm.example.com/v1")
        );
        let local = &alone.file.mcp_servers["local"];
        assert_eq!(
            local.env.as_ref().unwrap().keys().collect::<Vec<_>>(),
            ["FROM"],
            "a variable's name is kept"
        );
        let remote = &alone.file.mcp_servers["remote"];
        assert_eq!(
            remote.url.as_deref(),
            Some("https://bot@mcp.example.com/mcp?x=1")
        );
        assert_eq!(
            remote.headers.as_ref().unwrap().keys().collect::<Vec<_>>(),
            ["X-From"]
        );
    }

    #[test]
    fn a_url_changed_since_is_not_given_the_old_password() {
        let stored = config(TEXT).snapshot();
        let moved = TEXT.replace("llm.example.com", "other.example.com");
        let back =
            Config::from_snapshot(&stored, "t", PathBuf::from("."), Some(&config(&moved))).unwrap();
        let ModelSection::Openai(m) = &back.file.models["m"] else {
            unreachable!()
        };
        assert_eq!(
            m.base_url.as_deref(),
            Some("https://user@llm.example.com/v1")
        );
    }

    #[test]
    fn a_placeholder_is_taken_out_of_a_url_and_nothing_else() {
        for (url, bare) in [
            ("http://u:***@h/v1", "http://u@h/v1"),
            ("http://:***@h", "http://h"),
            ("http://u@h/v1", "http://u@h/v1"),
            ("http://u:pw@h/v1", "http://u:pw@h/v1"),
            ("http://h/p?password=***", "http://h/p"),
            ("http://h/p?a=1&PASSWORD=***&b=2#f", "http://h/p?a=1&b=2#f"),
            ("http://h/p?password=kept", "http://h/p?password=kept"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(without_placeholder(url), bare, "{url}");
        }
    }
}
