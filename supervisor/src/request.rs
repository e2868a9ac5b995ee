//! What a start request may ask, decided where every request arrives: the
//! supervisor. The library ([`Supervisor::start`](crate::Supervisor::start)),
//! the CLI and HTTP hand the request over as they read it, and the same bad
//! request gets the same [`Error::InvalidRequest`] from each. Pure: no I/O.

use arbor_actors::toolbox::{OPTIONAL_BUILTINS, builtin_definitions};

use crate::error::Error;
use crate::limits::TreeLimits;
use crate::policy::{ToolRule, check_pattern};

/// The limits a new tree runs with: what it `asked` for (`None`: the
/// supervisor's `defaults`), each in its range, none looser than the
/// defaults, its tool rules valid. A limit asked above the default is
/// refused, naming the default, rather than quietly cut to it: the caller
/// asked for something it will not get.
pub fn start_limits(
    asked: Option<&TreeLimits>,
    defaults: &TreeLimits,
) -> Result<TreeLimits, Error> {
    let Some(asked) = asked else {
        return Ok(defaults.clone());
    };
    if let Some((key, problem)) = asked.problems().into_iter().next() {
        return Err(invalid(format!("limits.{}", wire_key(key)), problem));
    }
    for rule in asked.tools.rules() {
        check_rule(rule)?;
    }
    let tightened = defaults.tighten(asked);
    if let Some((key, allowed)) = widened(asked, defaults) {
        return Err(invalid(
            format!("limits.{}", wire_key(key)),
            format!("asks for more than this supervisor allows ({allowed})"),
        ));
    }
    Ok(tightened)
}

/// The first problem of a tool rule a request adds: a pattern that is not
/// one, or a name of a structural built-in (`set_output`, `end_turn`, the
/// spawn tools), which no policy gives or takes (an agent's output mode and
/// spawnable agents decide those).
pub fn check_rule(rule: &ToolRule) -> Result<(), Error> {
    let patterns = [
        (
            "tools.allow",
            rule.allow.iter().flatten().collect::<Vec<_>>(),
        ),
        ("tools.deny", rule.deny.iter().collect()),
        ("tools.approve", rule.approve.iter().collect()),
    ];
    for (field, patterns) in patterns {
        for pattern in patterns {
            if let Err(why) = check_pattern(pattern) {
                return Err(invalid(field, format!("pattern {pattern:?}: {why}")));
            }
            let structural = builtin_definitions()
                .into_iter()
                .any(|(name, _)| name == pattern && !OPTIONAL_BUILTINS.contains(&name));
            if structural {
                return Err(invalid(
                    field,
                    format!(
                        "pattern {pattern:?}: {pattern} is a structural built-in: a tool policy \
                         neither gives nor takes it (an agent's output_mode and \
                         spawnable_agents decide it)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The longest webhook URL a request may give.
pub const MAX_WEBHOOK_URL: usize = 2048;

/// Whether `url` can be a tree's completion webhook: an absolute `http` or
/// `https` URL with a host (and a port that is one), no credentials in it
/// (deliveries are signed with the service's secret instead; the URL is
/// stored as given), no spaces or control characters, at most
/// [`MAX_WEBHOOK_URL`] bytes. `Error::InvalidRequest` on field `webhook`
/// names the problem.
pub fn check_webhook(url: &str) -> Result<(), Error> {
    let problem = |why: String| invalid("webhook", format!("{url:?}: {why}"));
    if url.len() > MAX_WEBHOOK_URL {
        return Err(invalid(
            "webhook",
            format!(
                "a URL of {} bytes is longer than {MAX_WEBHOOK_URL}",
                url.len()
            ),
        ));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(problem("a URL has no spaces or control characters".into()));
    }
    let lower = url.to_ascii_lowercase();
    let Some(rest) = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
    else {
        return Err(problem(
            "not an http(s) URL like https://example.com/hooks/arbor".into(),
        ));
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err(problem(
            "a webhook URL holds no credentials (deliveries are signed with the \
             service's webhook_secret)"
                .into(),
        ));
    }
    let (host, port) = match authority.rsplit_once(':') {
        // An IPv6 literal's colons are inside its brackets.
        Some((host, port)) if !port.contains(']') => (host, Some(port)),
        _ => (authority, None),
    };
    if host.is_empty() || host == "[]" {
        return Err(problem("it names no host".into()));
    }
    if let Some(port) = port
        && port.parse::<u16>().map_or(true, |p| p == 0)
    {
        return Err(problem(format!("{port:?} is not a port")));
    }
    Ok(())
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Error {
    Error::InvalidRequest {
        field: field.into(),
        problem: problem.into(),
    }
}

/// The first limit `asked` sets looser than `defaults` (a default that is
/// set, asked above it), with the default as shown to the caller.
fn widened(asked: &TreeLimits, defaults: &TreeLimits) -> Option<(&'static str, String)> {
    fn over<T: PartialOrd + std::fmt::Display>(
        key: &'static str,
        asked: Option<T>,
        default: Option<T>,
    ) -> Option<(&'static str, String)> {
        match (asked, default) {
            (Some(a), Some(d)) if a > d => Some((key, d.to_string())),
            _ => None,
        }
    }
    over("max_depth", asked.max_depth, defaults.max_depth)
        .or_else(|| {
            over(
                "max_children_per_call",
                asked.max_children_per_call,
                defaults.max_children_per_call,
            )
        })
        .or_else(|| {
            over(
                "max_live_agents",
                asked.max_live_agents,
                defaults.max_live_agents,
            )
        })
        .or_else(|| over("max_agents", asked.max_agents, defaults.max_agents))
        .or_else(|| over("max_steps", asked.max_steps, defaults.max_steps))
        .or_else(|| over("max_tokens", asked.max_tokens, defaults.max_tokens))
        .or_else(|| over("max_credits", asked.max_credits, defaults.max_credits))
        .or_else(|| match (asked.deadline, defaults.deadline) {
            (Some(a), Some(d)) if a > d => Some(("deadline", format!("{} ms", d.as_millis()))),
            _ => None,
        })
}

/// A limit's key as a request spells it (`maxLiveAgents`, `deadlineMs`).
fn wire_key(key: &str) -> String {
    if key == "deadline" {
        return "deadlineMs".to_owned();
    }
    let mut out = String::with_capacity(key.len());
    let mut upper = false;
    for c in key.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// A new tree's workspace, checked: an existing directory, given as an
/// absolute path, inside one of `roots` when there are any (a service's
/// `workspace_roots`); kept canonical, so the store holds where it really
/// is.
pub(crate) fn admit_workspace(
    spec: &crate::workspace::WorkspaceSpec,
    roots: &[std::path::PathBuf],
) -> Result<crate::workspace::WorkspaceSpec, Error> {
    let invalid = |problem: String| Error::InvalidRequest {
        field: "limits.workspace.root".to_owned(),
        problem,
    };
    if !spec.root.is_absolute() {
        return Err(invalid(format!(
            "{} is not an absolute path",
            spec.root.display()
        )));
    }
    let root = std::fs::canonicalize(&spec.root)
        .map_err(|e| invalid(format!("{}: {e}", spec.root.display())))?;
    if !root.is_dir() {
        return Err(invalid(format!("{} is not a directory", root.display())));
    }
    if !roots.is_empty() && !roots.iter().any(|allowed| within(&root, allowed)) {
        return Err(invalid(format!(
            "{} is outside the workspace roots this service allows ({})",
            root.display(),
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(crate::workspace::WorkspaceSpec {
        root,
        read_only: spec.read_only,
    })
}

/// Whether `path` (canonical) is `root` or below it (`root` canonicalised
/// here; a root that does not exist holds nothing).
fn within(path: &std::path::Path, root: &std::path::Path) -> bool {
    std::fs::canonicalize(root).is_ok_and(|root| path.starts_with(root))
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;
    use std::time::Duration;

    use super::*;
    use crate::policy::ToolPolicy;

    /// A webhook is an http(s) URL with a host; anything else is refused
    /// naming the field and what is wrong.
    #[test]
    fn a_webhook_that_is_no_http_url_with_a_host_is_refused_naming_why() {
        for ok in [
            "http://127.0.0.1:9000/hook",
            "https://example.com",
            "HTTPS://example.com/a?b=c",
            "http://[::1]:80/x",
        ] {
            assert!(check_webhook(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("ftp://example.com", "not an http(s) URL"),
            ("example.com/hook", "not an http(s) URL"),
            ("http://", "names no host"),
            ("http:///path", "names no host"),
            ("http://user:pw@example.com/", "holds no credentials"),
            ("http://example.com:99999/", "is not a port"),
            ("http://example.com:0/", "is not a port"),
            ("http://exa mple.com/", "no spaces"),
        ] {
            let err = check_webhook(bad).unwrap_err().to_string();
            assert!(err.contains("webhook") && err.contains(why), "{bad}: {err}");
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_WEBHOOK_URL));
        assert!(
            check_webhook(&long)
                .unwrap_err()
                .to_string()
                .contains("longer than")
        );
    }

    fn steps(n: u64) -> TreeLimits {
        TreeLimits {
            max_steps: NonZeroU64::new(n),
            ..TreeLimits::default()
        }
    }

    fn problem(result: Result<TreeLimits, Error>) -> String {
        match result {
            Err(e) => e.to_string(),
            Ok(limits) => panic!("accepted: {limits:?}"),
        }
    }

    #[test]
    fn no_asked_limits_are_the_defaults() {
        assert_eq!(start_limits(None, &steps(10)).unwrap(), steps(10));
    }

    #[test]
    fn a_tighter_limit_is_kept_and_an_unset_one_takes_the_default() {
        let asked = TreeLimits {
            max_steps: NonZeroU64::new(5),
            deadline: Some(Duration::from_secs(30)),
            ..TreeLimits::default()
        };
        let limits = start_limits(Some(&asked), &steps(10)).unwrap();
        assert_eq!(limits.max_steps, NonZeroU64::new(5));
        assert_eq!(limits.deadline, Some(Duration::from_secs(30)));
        let defaults_only = start_limits(Some(&TreeLimits::default()), &steps(10)).unwrap();
        assert_eq!(defaults_only.max_steps, NonZeroU64::new(10));
    }

    #[test]
    fn a_limit_looser_than_the_default_is_refused_naming_the_default() {
        assert_eq!(
            problem(start_limits(Some(&steps(500)), &steps(100))),
            "limits.maxSteps: asks for more than this supervisor allows (100)"
        );
        let later = TreeLimits {
            deadline: Some(Duration::from_secs(60)),
            ..TreeLimits::default()
        };
        let defaults = TreeLimits {
            deadline: Some(Duration::from_secs(10)),
            ..TreeLimits::default()
        };
        assert_eq!(
            problem(start_limits(Some(&later), &defaults)),
            "limits.deadlineMs: asks for more than this supervisor allows (10000 ms)"
        );
        // Unlimited by default: any limit tightens.
        assert!(start_limits(Some(&steps(500)), &TreeLimits::default()).is_ok());
    }

    #[test]
    fn a_limit_outside_its_range_is_refused_in_the_requests_spelling() {
        let asked = TreeLimits {
            max_credits: Some(-1.0),
            ..TreeLimits::default()
        };
        assert!(
            problem(start_limits(Some(&asked), &TreeLimits::default()))
                .starts_with("limits.maxCredits: ")
        );
    }

    #[test]
    fn a_bad_pattern_or_a_structural_built_in_in_a_tool_rule_is_refused_naming_its_list() {
        let with = |rule: ToolRule| TreeLimits {
            tools: ToolPolicy::new(rule),
            ..TreeLimits::default()
        };
        let bad = with(ToolRule {
            deny: vec![String::new()],
            ..ToolRule::default()
        });
        assert_eq!(
            problem(start_limits(Some(&bad), &TreeLimits::default())),
            "tools.deny: pattern \"\": an empty pattern matches no tool"
        );
        let structural = with(ToolRule {
            allow: Some(vec!["end_turn".into()]),
            ..ToolRule::default()
        });
        assert!(
            problem(start_limits(Some(&structural), &TreeLimits::default())).starts_with(
                "tools.allow: pattern \"end_turn\": end_turn is a structural built-in"
            )
        );
        let fine = with(ToolRule {
            deny: vec!["fs/*".into(), "add_message".into()],
            ..ToolRule::default()
        });
        assert!(start_limits(Some(&fine), &TreeLimits::default()).is_ok());
    }

    fn spec(root: &std::path::Path) -> crate::workspace::WorkspaceSpec {
        crate::workspace::WorkspaceSpec {
            root: root.to_path_buf(),
            read_only: false,
        }
    }

    #[test]
    fn a_workspace_must_be_an_absolute_existing_directory_inside_the_roots() {
        let dir = tempfile::tempdir().expect("tempdir");
        let inside = dir.path().join("repo");
        std::fs::create_dir(&inside).expect("mkdir");
        let other = tempfile::tempdir().expect("tempdir");
        let roots = [dir.path().to_path_buf()];
        let admitted = admit_workspace(&spec(&inside), &roots).expect("inside a root");
        assert_eq!(
            admitted.root,
            std::fs::canonicalize(&inside).expect("canon")
        );
        // Anywhere, without roots (the CLI).
        assert!(admit_workspace(&spec(other.path()), &[]).is_ok());
        let problem = |s: crate::workspace::WorkspaceSpec| match admit_workspace(&s, &roots) {
            Err(Error::InvalidRequest { field, problem }) => {
                assert_eq!(field, "limits.workspace.root");
                problem
            }
            other => panic!("{other:?}"),
        };
        assert!(problem(spec(other.path())).contains("outside the workspace roots"));
        assert!(problem(spec(std::path::Path::new("repo"))).contains("not an absolute path"));
        assert!(problem(spec(&dir.path().join("missing"))).contains("No such file"));
        let file = dir.path().join("f");
        std::fs::write(&file, "x").expect("write");
        assert!(problem(spec(&file)).contains("not a directory"));
        // A link inside the root that leads out is judged by where it leads.
        let link = dir.path().join("out");
        std::os::unix::fs::symlink(other.path(), &link).expect("symlink");
        assert!(problem(spec(&link)).contains("outside the workspace roots"));
    }
}
