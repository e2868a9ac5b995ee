//! `[service]` and `[principals.NAME]`: each numeric and duration key against
//! its range, and the typed settings the service runs with.

use std::collections::BTreeMap;

use crate::config::file::{PrincipalSettings, Role};
use crate::config::read::{Source, at};
use crate::config::webhooks::{WebhookSecret, WebhookSettings};
use crate::config::{Problem, ServiceSection, ServiceSettings};

use super::duration_in;

/// Checks `[service]`, each numeric and duration key against its range
/// (README's service section lists them), and gives the typed values.
pub(in crate::config) fn check_service(
    service: &ServiceSection,
    text: &Source<'_>,
    problems: &mut Vec<Problem>,
) -> ServiceSettings {
    use std::time::Duration;
    let defaults = ServiceSettings::default();
    if let Err(e) = service.bind.parse::<std::net::SocketAddr>() {
        problems.push(at(
            text,
            "service",
            "bind",
            format!(
                "{:?} is not an address like 127.0.0.1:8080 ({e})",
                service.bind
            ),
        ));
    }
    // A duration within [min, max], or the default after a problem.
    let mut within = |key: &str, value: &String, min: Duration, max: Duration, default| {
        duration_in(
            text,
            "service",
            key,
            &Some(value.clone()),
            (min, max),
            problems,
        )
        .unwrap_or(default)
    };
    let secs = Duration::from_secs;
    let shutdown_timeout = within(
        "shutdown_timeout",
        &service.shutdown_timeout,
        Duration::ZERO,
        secs(3600),
        defaults.shutdown_timeout,
    );
    let header_read_timeout = within(
        "header_read_timeout",
        &service.header_read_timeout,
        Duration::from_millis(100),
        secs(300),
        defaults.limits.header_read_timeout,
    );
    let idle_timeout = within(
        "idle_timeout",
        &service.idle_timeout,
        secs(1),
        secs(3600),
        defaults.limits.idle_timeout,
    );
    let body_read_timeout = within(
        "body_read_timeout",
        &service.body_read_timeout,
        Duration::from_millis(100),
        secs(3600),
        defaults.limits.body_read_timeout,
    );
    // A count within [min, max], or the default after a problem.
    let mut count =
        |key: &str, value: usize, min: usize, max: usize, unit: &str, default: usize| {
            if value < min {
                problems.push(at(
                    text,
                    "service",
                    key,
                    format!("must be at least {min}{unit}"),
                ));
                default
            } else if value > max {
                problems.push(at(
                    text,
                    "service",
                    key,
                    format!("must be at most {max}{unit} (got {value})"),
                ));
                default
            } else {
                value
            }
        };
    count(
        "body_limit",
        service.body_limit,
        1024,
        64 << 20,
        " bytes",
        1 << 20,
    );
    count(
        "max_running_trees",
        service.max_running_trees,
        1,
        100_000,
        "",
        1000,
    );
    let max_connections = count(
        "max_connections",
        service.max_connections,
        1,
        1_000_000,
        "",
        defaults.limits.max_connections,
    );
    let max_event_streams = count(
        "max_event_streams",
        service.max_event_streams,
        1,
        100_000,
        "",
        defaults.limits.max_event_streams,
    );
    let max_event_streams_per_tree = count(
        "max_event_streams_per_tree",
        service.max_event_streams_per_tree,
        1,
        max_event_streams,
        " (max_event_streams)",
        defaults
            .limits
            .max_event_streams_per_tree
            .min(max_event_streams),
    );
    // At least what hyper's parser needs (it refuses a smaller buffer).
    let max_head_size = count(
        "max_head_size",
        service.max_head_size,
        8 << 10,
        1 << 20,
        " bytes",
        defaults.limits.max_head_size,
    );
    let steering = arbor_actors::steer::SteerLimits {
        max_pending: count(
            "max_pending_steers",
            service.max_pending_steers,
            1,
            100_000,
            "",
            defaults.steering.max_pending,
        ),
        max_pending_bytes: count(
            "max_pending_steer_bytes",
            service.max_pending_steer_bytes,
            1024,
            64 << 20,
            " bytes",
            defaults.steering.max_pending_bytes,
        ),
    };
    let queued_turns = count(
        "max_queued_turns",
        service.max_queued_turns,
        1,
        10_000,
        "",
        defaults.queued_turns,
    );
    if let Some(endpoint) = &service.otlp_endpoint {
        let ok = endpoint
            .strip_prefix("http://")
            .or_else(|| endpoint.strip_prefix("https://"))
            .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'));
        if !ok {
            problems.push(at(
                text,
                "service",
                "otlp_endpoint",
                format!("{endpoint:?} is not an http(s) URL like http://127.0.0.1:4318/v1/traces"),
            ));
        }
    }
    if service.tokens_env.is_empty() {
        problems.push(at(
            text,
            "service",
            "tokens_env",
            "must name an environment variable".into(),
        ));
    }
    let principals = check_principals(service, text, problems);
    let webhooks = check_webhooks(service, text, problems);
    ServiceSettings {
        shutdown_timeout,
        steering,
        queued_turns,
        limits: crate::config::ServiceLimits {
            header_read_timeout,
            idle_timeout,
            max_connections,
            max_event_streams,
            max_event_streams_per_tree,
            max_head_size,
            body_read_timeout,
        },
        principals,
        bind: service.bind.parse().unwrap_or(defaults.bind),
        tokens_env: service.tokens_env.clone(),
        otlp_endpoint: service.otlp_endpoint.clone(),
        body_limit: service.body_limit,
        max_running_trees: service.max_running_trees,
        webhooks,
    }
}

/// The webhook keys: a default that is a webhook URL (the supervisor's
/// check), a secret that is not empty (a default needs one), the retries
/// within their ranges.
fn check_webhooks(
    service: &ServiceSection,
    text: &Source<'_>,
    problems: &mut Vec<Problem>,
) -> WebhookSettings {
    use std::time::Duration;
    let defaults = WebhookSettings::default();
    let mut within = |key: &str, value: &String, min: Duration, max: Duration, default| {
        duration_in(
            text,
            "service",
            key,
            &Some(value.clone()),
            (min, max),
            problems,
        )
        .unwrap_or(default)
    };
    let ms = Duration::from_millis;
    let backoff = within(
        "webhook_backoff",
        &service.webhook_backoff,
        ms(1),
        Duration::from_secs(3600),
        defaults.backoff,
    );
    let backoff_max = within(
        "webhook_backoff_max",
        &service.webhook_backoff_max,
        ms(1),
        Duration::from_secs(86_400),
        defaults.backoff_max,
    );
    let timeout = within(
        "webhook_timeout",
        &service.webhook_timeout,
        ms(10),
        Duration::from_secs(300),
        defaults.timeout,
    );
    let attempts = if (1..=100).contains(&service.webhook_attempts) {
        service.webhook_attempts
    } else {
        problems.push(at(
            text,
            "service",
            "webhook_attempts",
            format!(
                "must be between 1 and 100 (got {})",
                service.webhook_attempts
            ),
        ));
        defaults.attempts
    };
    if let Some(url) = &service.webhook {
        if let Err(e) = arbor_supervisor::request::check_webhook(url) {
            let message = match e {
                arbor_supervisor::Error::InvalidRequest { problem, .. } => problem,
                other => other.to_string(),
            };
            problems.push(at(text, "service", "webhook", message));
        } else if service.webhook_secret.is_none() {
            problems.push(at(
                text,
                "service",
                "webhook",
                "a webhook needs webhook_secret (a string, or { env = \"VAR\" }) to sign its \
                 deliveries with"
                    .into(),
            ));
        }
    }
    // A literal's length is checked when the service reads it (a stored
    // config has it redacted, and must still read).
    if let Some(WebhookSecret::Env { env }) = &service.webhook_secret
        && (env.is_empty() || env.contains(['=', '\0']))
    {
        problems.push(at(
            text,
            "service",
            "webhook_secret",
            "env must name an environment variable".into(),
        ));
    }
    let mut hosts = Vec::new();
    for entry in &service.webhook_hosts {
        match crate::config::webhooks::host_entry_problem(entry) {
            Some(problem) => problems.push(at(text, "service", "webhook_hosts", problem)),
            None => hosts.push(entry.trim_end_matches('.').to_ascii_lowercase()),
        }
    }
    WebhookSettings {
        default_url: service.webhook.clone(),
        secret: service.webhook_secret.clone(),
        attempts,
        backoff,
        backoff_max: backoff_max.max(backoff),
        timeout,
        hosts,
    }
}

/// `[service.principals.NAME]`: a known role, and a `token_env` of its own
/// (two principals reading one variable would share their tokens, and so
/// their identity). Whether the variable is set is the service's check, at
/// its start: other commands do not need it.
fn check_principals(
    service: &ServiceSection,
    text: &Source<'_>,
    problems: &mut Vec<Problem>,
) -> Vec<PrincipalSettings> {
    let mut out = Vec::new();
    let mut envs: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, section) in &service.principals {
        let key = |k: &str| format!("service.principals.{name}.{k}");
        let line = |k: &str| text.line(&["service", "principals", name, k]);
        let mut problem = |k: &str, message: String| {
            problems.push(Problem {
                file: None,
                line: line(k),
                key: key(k),
                message,
            })
        };
        if name.trim().is_empty() {
            problem("role", "a principal needs a name".into());
            continue;
        }
        let role = Role::parse(&section.role);
        if role.is_none() {
            let known: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
            problem(
                "role",
                format!(
                    "{:?} is not a role (one of {})",
                    section.role,
                    known.join(", ")
                ),
            );
        }
        let env = section.token_env.as_str();
        if env.is_empty() || env.contains('=') || env.contains('\0') {
            problem(
                "token_env",
                "must name an environment variable (holding the principal's tokens)".into(),
            );
            continue;
        }
        if env == service.tokens_env {
            problem(
                "token_env",
                format!(
                    "{env} is [service] tokens_env, whose tokens are unnamed admins; give \
                     the principal a variable of its own"
                ),
            );
            continue;
        }
        if let Some(other) = envs.insert(env, name) {
            problem(
                "token_env",
                format!(
                    "{env} is also principal {other:?}'s token_env: each principal needs a \
                     variable of its own"
                ),
            );
            continue;
        }
        if let Some(role) = role {
            out.push(PrincipalSettings {
                name: name.clone(),
                role,
                token_env: env.to_owned(),
                line: line("token_env"),
            });
        }
    }
    out
}
