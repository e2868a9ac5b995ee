//! A tree's tool policy: which tools its agents may be offered and call, as
//! allow and deny patterns over the names templates use (`fs/read_file`,
//! `rg`, `add_message`). A policy is a stack of rules and a tool must pass
//! every one, so a start request can add a rule (narrow) but never take one
//! away (widen). Pure: no I/O.

use serde::{Deserialize, Serialize};

/// One rule: a tool passes when some `allow` pattern matches it (or `allow`
/// is absent) and no `deny` pattern does. `*` matches any run of characters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolRule {
    /// Patterns of the tools allowed; absent means every tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    /// Patterns of the tools refused.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// Patterns of the tools whose calls wait for a person's decision
    /// (semantics §12): a rule can add approvals, never take one away.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub approve: Vec<String>,
}

impl ToolRule {
    pub(crate) fn is_empty(&self) -> bool {
        self.allow.is_none() && self.deny.is_empty() && self.approve.is_empty()
    }

    /// Every pattern that is not a valid one, with why.
    pub fn problems(&self) -> Vec<(String, String)> {
        self.allow
            .iter()
            .flatten()
            .chain(&self.deny)
            .chain(&self.approve)
            .filter_map(|p| check_pattern(p).err().map(|e| (p.clone(), e.to_string())))
            .collect()
    }

    /// Whether a tool known by all of `names` passes: some name on the
    /// allow list (when there is one), none on the deny list. A workspace
    /// tool under Claude Code's or Codebuff's name is also its
    /// `workspace/OP`, so a pattern over either reaches it.
    pub(crate) fn allows_any(&self, names: &[&str]) -> bool {
        let hit = |patterns: &[String]| {
            patterns
                .iter()
                .any(|p| names.iter().any(|name| matches(p, name)))
        };
        self.allow.as_deref().is_none_or(hit) && !hit(&self.deny)
    }
}

/// The rules of one tree, all of which a tool must pass.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ToolPolicy {
    rules: Vec<ToolRule>,
}

impl ToolPolicy {
    /// A policy of one rule (none if the rule is empty).
    pub fn new(rule: ToolRule) -> Self {
        ToolPolicy::default().narrowed(rule)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Its rules, in the order they were added.
    pub fn rules(&self) -> &[ToolRule] {
        &self.rules
    }

    #[cfg(test)]
    pub(crate) fn allows(&self, tool: &str) -> bool {
        self.allows_any(&[tool])
    }

    /// Whether every rule lets a tool known by all of `names` be offered.
    pub(crate) fn allows_any(&self, names: &[&str]) -> bool {
        self.rules.iter().all(|r| r.allows_any(names))
    }

    #[cfg(test)]
    pub(crate) fn needs_approval(&self, tool: &str) -> bool {
        self.needs_approval_any(&[tool])
    }

    /// Whether some rule says the calls of a tool known by all of `names`
    /// wait for approval.
    pub(crate) fn needs_approval_any(&self, names: &[&str]) -> bool {
        self.rules.iter().any(|r| {
            r.approve
                .iter()
                .any(|p| names.iter().any(|name| matches(p, name)))
        })
    }

    /// Whether some rule asks for approvals at all.
    pub(crate) fn approves(&self) -> bool {
        self.rules.iter().any(|r| !r.approve.is_empty())
    }

    /// This policy with one more rule (an empty rule or one already there adds nothing).
    pub fn narrowed(mut self, rule: ToolRule) -> Self {
        if !rule.is_empty() && !self.rules.contains(&rule) {
            self.rules.push(rule);
        }
        self
    }

    /// This policy with every rule of `other` added: never wider than either.
    pub(crate) fn with(self, other: &ToolPolicy) -> Self {
        other.rules.iter().cloned().fold(self, ToolPolicy::narrowed)
    }

    /// Every invalid pattern of every rule, with why.
    pub fn problems(&self) -> Vec<(String, String)> {
        self.rules.iter().flat_map(ToolRule::problems).collect()
    }
}

/// Why a text is not a tool pattern.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PatternError {
    /// The empty text.
    #[error("an empty pattern matches no tool")]
    Empty,
    /// A character no tool name has.
    #[error("{0:?} cannot be in a tool name (patterns are names with * wildcards)")]
    Character(char),
    /// More than one `/`.
    #[error("a tool name has at most one '/' (SERVER/TOOL)")]
    Slashes,
}

/// A pattern is a tool name with `*` wildcards: letters, digits and `_-./@*`,
/// with at most one `/` (an MCP server's namespace).
pub fn check_pattern(pattern: &str) -> Result<(), PatternError> {
    if pattern.is_empty() {
        return Err(PatternError::Empty);
    }
    if let Some(c) = pattern
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-./@*".contains(*c)))
    {
        return Err(PatternError::Character(c));
    }
    if pattern.matches('/').count() > 1 {
        return Err(PatternError::Slashes);
    }
    Ok(())
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters.
pub fn matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return false;
    };
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(pattern: &str, name: &str, expected: bool) {
        assert_eq!(matches(pattern, name), expected, "{pattern} ~ {name}");
    }

    #[test]
    fn patterns_match_with_wildcards() {
        check("fs/read_file", "fs/read_file", true);
        check("fs/read_file", "fs/read_files", false);
        check("fs/*", "fs/read_file", true);
        check("fs/*", "fsx/read_file", false);
        check("*", "anything", true);
        check("fs/write_*", "fs/write_file", true);
        check("fs/write_*", "fs/read_file", false);
        check("*_file", "fs/read_file", true);
        check("a*b*c", "aXbYc", true);
        check("a*b*c", "aXcYb", false);
        check("ab*ba", "aba", false);
        check("rg", "rg", true);
    }

    #[test]
    fn a_tool_passes_every_rule_or_none() {
        let config = ToolRule {
            allow: Some(vec!["fs/*".into(), "rg".into()]),
            deny: vec!["fs/write_*".into()],
            approve: Vec::new(),
        };
        let policy = ToolPolicy::new(config);
        assert!(policy.allows("fs/read_file"));
        assert!(!policy.allows("fs/write_file"));
        assert!(!policy.allows("curl"));
        // A request narrows; it cannot widen by allowing what the config refuses.
        let narrowed = policy.clone().narrowed(ToolRule {
            allow: Some(vec!["*".into()]),
            deny: vec!["rg".into()],
            approve: vec!["fs/*".into()],
        });
        assert!(!narrowed.allows("rg"));
        assert!(!narrowed.allows("fs/write_file"));
        assert!(!narrowed.allows("curl"));
        assert!(narrowed.allows("fs/read_file"));
        // A rule adds approvals; the config's own rule asked for none.
        assert!(!policy.needs_approval("fs/read_file"));
        assert!(narrowed.needs_approval("fs/read_file"));
        assert!(!narrowed.needs_approval("curl"));
        assert_eq!(policy.clone().with(&policy), policy);
    }

    #[test]
    fn bad_patterns_are_named() {
        assert!(check_pattern("fs/*").is_ok());
        assert!(check_pattern("acme/writer@1").is_ok());
        assert_eq!(check_pattern(""), Err(PatternError::Empty));
        assert_eq!(check_pattern("fs read"), Err(PatternError::Character(' ')));
        assert!(
            check_pattern("fs read")
                .unwrap_err()
                .to_string()
                .contains("' '")
        );
        assert_eq!(check_pattern("a/b/c"), Err(PatternError::Slashes));
        assert_eq!(check_pattern("fs/[ab]"), Err(PatternError::Character('[')));
    }
}
