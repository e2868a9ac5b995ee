//! `[service]`'s completion webhooks: the default URL, the shared secret
//! deliveries are signed with, and how they are retried (checked by
//! `check_service`; the service reads the secret at its start).

use std::time::Duration;

use serde::Deserialize;

/// `webhook_secret`: written in the file (a secret: kept out of the config
/// text a tree stores, see `redact.rs`) or `{ env = "VAR" }`, read from the
/// environment when the service starts.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum WebhookSecret {
    /// The secret as written in the file.
    Literal(String),
    /// `{ env = "VAR" }`: the value of the variable `VAR`.
    Env {
        /// The variable's name.
        env: String,
    },
}

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WebhookSecret::Literal(_) => f.write_str("[REDACTED]"),
            WebhookSecret::Env { env } => write!(f, "{{ env = {env:?} }}"),
        }
    }
}

impl WebhookSecret {
    /// The secret now; `Err` says why there is none (naming the variable,
    /// never a value).
    pub fn resolve(&self) -> Result<String, SecretError> {
        let value = match self {
            WebhookSecret::Literal(value) => value.clone(),
            WebhookSecret::Env { env } => match std::env::var(env) {
                Ok(value) => value,
                Err(std::env::VarError::NotPresent) => {
                    return Err(SecretError::Unset(env.clone()));
                }
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(SecretError::NotUnicode(env.clone()));
                }
            },
        };
        if value.len() < MIN_SECRET {
            return Err(SecretError::TooShort(value.len()));
        }
        Ok(value)
    }
}

/// Why the webhooks' secret cannot be read (never its value).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The variable it is read from is not set.
    #[error("environment variable {0} is not set")]
    Unset(String),
    /// The variable's value is not UTF-8.
    #[error("environment variable {0} is not valid UTF-8")]
    NotUnicode(String),
    /// The secret is shorter than [`MIN_SECRET`] bytes.
    #[error("the secret has {0} bytes; it needs at least {MIN_SECRET}")]
    TooShort(usize),
}

/// The shortest secret deliveries are signed with.
pub const MIN_SECRET: usize = 16;

/// `[service]`'s webhook keys, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookSettings {
    /// The webhook of every tree started without one (`webhook`).
    pub default_url: Option<String>,
    /// The secret deliveries are signed with (`webhook_secret`); a
    /// webhook, asked for or the default, needs one.
    pub secret: Option<WebhookSecret>,
    /// Attempts per delivery, the first included (`webhook_attempts`).
    pub attempts: u32,
    /// The wait after the first failed attempt (`webhook_backoff`); each
    /// next wait doubles, up to `backoff_max`.
    pub backoff: Duration,
    /// The longest wait between attempts (`webhook_backoff_max`).
    pub backoff_max: Duration,
    /// How long one attempt may take, connection included
    /// (`webhook_timeout`).
    pub timeout: Duration,
    /// The hosts a request's webhook may post to (`webhook_hosts`: a host,
    /// or `*.` and a domain for its subdomains), lowercase; empty: any.
    pub hosts: Vec<String>,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        WebhookSettings {
            default_url: None,
            secret: None,
            attempts: 8,
            backoff: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            timeout: Duration::from_secs(10),
            hosts: Vec::new(),
        }
    }
}

/// Whether `host` (a URL's, as written) is one of `hosts`: the same name
/// (letter case aside), or under a `*.domain` entry (a subdomain of it,
/// not the domain itself). Empty `hosts` allow any.
pub fn host_allowed(host: &str, hosts: &[String]) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    hosts.is_empty()
        || hosts.iter().any(|entry| match entry.strip_prefix("*.") {
            Some(domain) => host
                .strip_suffix(domain)
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => host == *entry,
        })
}

/// Why `entry` is no `webhook_hosts` entry, if it is not: a host name (or
/// an IP address), or `*.` and a domain.
pub(crate) fn host_entry_problem(entry: &str) -> Option<String> {
    let name = entry.strip_prefix("*.").unwrap_or(entry);
    let fine = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'))
        && !name.starts_with('.')
        && !name.contains('*');
    (!fine).then(|| {
        format!(
            "{entry:?} is no host: write a name like \"hooks.example.com\", or \"*.example.com\" \
             for its subdomains (no scheme, path or port)"
        )
    })
}

pub(super) fn default_attempts() -> u32 {
    WebhookSettings::default().attempts
}

pub(super) fn default_backoff() -> String {
    "1s".into()
}

pub(super) fn default_backoff_max() -> String {
    "5m".into()
}

pub(super) fn default_timeout() -> String {
    "10s".into()
}

#[cfg(test)]
mod tests {
    use super::{host_allowed, host_entry_problem};

    #[test]
    fn a_host_is_allowed_by_its_name_or_a_wildcard_over_its_domain() {
        let hosts = vec!["hooks.example.com".to_owned(), "*.corp.example".to_owned()];
        assert!(host_allowed("hooks.example.com", &hosts));
        assert!(host_allowed("HOOKS.Example.com.", &hosts));
        assert!(host_allowed("ci.corp.example", &hosts));
        assert!(host_allowed("a.b.corp.example", &hosts));
        assert!(!host_allowed("corp.example", &hosts), "the domain itself");
        assert!(!host_allowed("evilcorp.example", &hosts));
        assert!(!host_allowed("169.254.169.254", &hosts));
        assert!(!host_allowed("hooks.example.com.evil.io", &hosts));
        assert!(host_allowed("anything", &[]));
        assert!(host_entry_problem("hooks.example.com").is_none());
        assert!(host_entry_problem("*.example.com").is_none());
        assert!(host_entry_problem("https://hooks.example.com/x").is_some());
        assert!(host_entry_problem("*").is_some());
        assert!(host_entry_problem("").is_some());
    }
}
