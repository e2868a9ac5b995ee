//! How the service runs: [`ServiceOptions`], from the config's `[service]`
//! (its tokens read from the environment) or built in code.

use std::time::Duration;

use super::{Tokens, access};
use arbor::Error;

/// How the service runs (from `[service]` of the config, or in code).
#[derive(Debug)]
pub struct ServiceOptions {
    /// The bearer tokens a request may present (none: only loopback serves).
    pub tokens: Tokens,
    /// Where the tokens come from, named when they are missing.
    pub tokens_env: String,
    /// Largest request body, in bytes.
    pub body_limit: usize,
    /// Trees running at once; more starts are refused (503).
    pub max_running_trees: usize,
    /// After a shutdown signal: how long open requests and streams may take,
    /// then how long the store may take to write what is in flight.
    pub shutdown_timeout: Duration,
    /// Completion webhooks: the default, the secret, the retries.
    pub webhooks: crate::WebhookOptions,
}

impl ServiceOptions {
    /// From the config's `[service]` (validated, so typed already), with the
    /// tokens read from its `tokens_env` (unnamed admins) and from each
    /// `[service.principals.NAME] token_env`. A principal's variable that is
    /// unset or holds no token, and a token two principals share, are
    /// config errors naming the key.
    pub fn from_config(config: &arbor::Config) -> Result<ServiceOptions, Error> {
        let mut tokens =
            Tokens::parse(&std::env::var(&config.service.tokens_env).unwrap_or_default());
        let mut problems = Vec::new();
        let problem =
            |p: &arbor::config::PrincipalSettings, message: String| arbor::config::Problem {
                file: None,
                line: p.line,
                key: format!("service.principals.{}.token_env", p.name),
                message,
            };
        for p in &config.service.principals {
            let value = std::env::var(&p.token_env).unwrap_or_default();
            let before = tokens.len();
            tokens.add(value.split(','), &access::Principal::named(&p.name, p.role));
            if tokens.len() == before {
                let why = match std::env::var_os(&p.token_env) {
                    None => "is not set",
                    Some(_) => "holds no token",
                };
                problems.push(problem(
                    p,
                    format!(
                        "{} {why}: principal {:?} needs its tokens there (comma-separated)",
                        p.token_env, p.name
                    ),
                ));
            }
        }
        if problems.is_empty()
            && let Some((a, b)) = tokens.ambiguous()
            && let Some(p) = config.service.principals.iter().find(|p| p.name == b)
        {
            problems.push(problem(
                p,
                format!(
                    "{} holds a token that {a} has too: a token must name one caller",
                    p.token_env
                ),
            ));
        }
        let webhooks = crate::WebhookOptions::from_settings(&config.service.webhooks)
            .unwrap_or_else(|why| {
                problems.push(arbor::config::Problem {
                    file: None,
                    line: None,
                    key: "service.webhook_secret".into(),
                    message: format!("{why}: webhooks are signed with it"),
                });
                crate::WebhookOptions::default()
            });
        if !problems.is_empty() {
            return Err(Error::Config(arbor::ConfigError {
                file: config.source.clone(),
                problems,
            }));
        }
        Ok(ServiceOptions {
            tokens,
            tokens_env: config.service.tokens_env.clone(),
            body_limit: config.service.body_limit,
            max_running_trees: config.service.max_running_trees,
            shutdown_timeout: config.service.shutdown_timeout,
            webhooks,
        })
    }

    /// Whether the service may listen on `addr`: without tokens, only on a
    /// loopback address.
    pub fn check_bind(&self, addr: std::net::SocketAddr) -> Result<(), Error> {
        if self.tokens.is_empty() && !addr.ip().is_loopback() {
            return Err(Error::Insecure {
                addr: addr.to_string(),
                env: self.tokens_env.clone(),
            });
        }
        Ok(())
    }
}
