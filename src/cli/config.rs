//! The commands on a config: `agents`, `tools`, `models`, `check-config`
//! and `ping`.

use std::path::PathBuf;
use std::process::ExitCode;

use arbor::config::Config;

use super::run::until_signal;
use super::{async_runtime, configured_model, load_config, load_config_with};

pub(super) fn agents(
    config: Option<PathBuf>,
    agents: arbor::config::AgentFiles,
) -> anyhow::Result<ExitCode> {
    let config = load_config_with(config.as_deref(), &agents)?;
    let list = |items: &[String]| {
        if items.is_empty() {
            "-".to_owned()
        } else {
            items.join(", ")
        }
    };
    for t in &config.templates {
        let output = serde_json::to_value(t.output_mode)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        outln!(
            "{:<20} model={:<10} steps={:<4} output={output} spawns: {}",
            t.id,
            t.model,
            t.max_steps,
            list(&t.spawnable_agents)
        )?;
        if let Some(description) = &t.description {
            outln!("    {description}")?;
        }
        outln!("    tools: {}", list(&t.tools))?;
        if let Some(origin) = config.agent_origins.get(&t.id) {
            match &origin.color {
                Some(color) => outln!("    from {}:{} (color {color})", origin.file, origin.line)?,
                None => outln!("    from {}:{}", origin.file, origin.line)?,
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The most a client's MCP config may be (it is a few servers).
const MCP_IMPORT_MAX_BYTES: u64 = 4 << 20;

/// `arbor mcp import FILE`: the servers of another client's MCP config as
/// `[mcp_servers.NAME]` tables on stdout; exit 2 naming every entry Arbor
/// would refuse.
pub(super) fn mcp_import(file: &std::path::Path) -> anyhow::Result<ExitCode> {
    use anyhow::Context as _;
    use std::io::Read as _;
    let shown = file.display();
    let opened = std::fs::File::open(file).with_context(|| format!("cannot read {shown}"))?;
    let mut json = String::new();
    opened
        .take(MCP_IMPORT_MAX_BYTES + 1)
        .read_to_string(&mut json)
        .with_context(|| format!("cannot read {shown} as UTF-8 text"))?;
    if json.len() as u64 > MCP_IMPORT_MAX_BYTES {
        anyhow::bail!("{shown} is larger than {MCP_IMPORT_MAX_BYTES} bytes: not an MCP config");
    }
    let base = file.parent().unwrap_or(std::path::Path::new("."));
    match arbor::tools::mcp::import::mcp_servers_toml(&json, base) {
        Ok(tables) => {
            outln!("# MCP servers imported from {shown} (arbor mcp import)")?;
            out!("{tables}")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("error: {shown} has servers Arbor would refuse; nothing was printed");
            for line in &error.problems {
                eprintln!("  {line}");
            }
            Ok(ExitCode::from(2))
        }
    }
}

pub(super) fn tools(config: Option<PathBuf>, json: bool) -> anyhow::Result<ExitCode> {
    let config = load_config(config.as_deref())?;
    let tools = config.tool_set();
    let catalog = config.catalog_with(&tools, &[])?;
    let listing = async_runtime()?.block_on(until_signal(async {
        let mut listing = arbor::tools::listing(&config.templates, &tools).await;
        // Each tool with the agents that get it: what each template's agents
        // are offered under [policy], as a tree offers it (the spawn tools
        // only to agents that may spawn, set_output as the output mode says).
        let offered: Vec<(&str, Vec<String>)> = config
            .templates
            .iter()
            .map(|t| {
                let tools = catalog.offered(&t.id, &config.limits.tools);
                (t.id.as_str(), tools.unwrap_or_default())
            })
            .collect();
        for tool in &mut listing {
            // A server that is down: the agents that list its tools.
            if tool.wire_name.is_empty() {
                continue;
            }
            tool.agents = offered
                .iter()
                .filter(|(_, tools)| tools.contains(&tool.wire_name))
                .map(|(agent, _)| (*agent).to_owned())
                .collect();
            tool.agents.sort();
        }
        tools.mcp().shutdown().await;
        Ok(listing)
    }))?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&listing)?)?;
    } else {
        out!("{}", arbor::tools::listing_table(&listing))?;
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn models(config: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let config = load_config(config.as_deref())?;
    for (name, model) in config.model_sections() {
        outln!("{name:<16} {:<10} {}", model.provider(), model.describe())?;
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn check_config(
    file: Option<PathBuf>,
    agents: arbor::config::AgentFiles,
) -> anyhow::Result<ExitCode> {
    let config = load_config_with(file.as_deref(), &agents)?;
    config.catalog()?;
    outln!(
        "{}: ok ({} models, {} agents)",
        config.source,
        config.model_sections().count(),
        config.templates.len()
    )?;
    Ok(ExitCode::SUCCESS)
}

/// `arbor ping MODEL`: one tiny request, reported in one line. A ping is
/// not retried: its first failure (a closed port, a 429) is the answer, at
/// once, where a run would retry it (`retry.max_retries`).
pub(super) async fn ping(config: Config, name: String) -> anyhow::Result<ExitCode> {
    use std::sync::{Arc, Mutex};

    use arbor_actors::sync::LockExt as _;
    use arbor_actors::{Delta, Message, ModelRequest, RequestMeta};

    let catalog = config.catalog()?;
    let model = configured_model(&catalog, &name)?;
    // The first failure the model would retry: the ping stops there.
    let (failed, first_failure) = tokio::sync::oneshot::channel::<String>();
    let failed = Arc::new(Mutex::new(Some(failed)));
    let sink = Arc::new(move |delta: Delta| {
        if let Delta::Retry { reason, .. } = delta
            && let Some(failed) = failed.locked().take()
        {
            let _ = failed.send(reason);
        }
    });
    let request = ModelRequest {
        system_prompt: Arc::from("You are a health check. Answer with one word."),
        messages: [Message::user("Reply with the single word: pong")]
            .into_iter()
            .collect(),
        tools: Default::default(),
        meta: RequestMeta {
            agent_type: "ping".into(),
            run_id: "ping".into(),
            step: 1,
            ..RequestMeta::default()
        },
    };
    let start = std::time::Instant::now();
    let result = tokio::select! {
        result = model.complete(request, sink) => result.map_err(|e| e.to_string()),
        Ok(reason) = first_failure => Err(format!("{reason} (not retried: a ping reports the first failure)")),
    };
    let ms = start.elapsed().as_millis();
    match result {
        Ok(response) => {
            let reply: String = response.message.text().chars().take(60).collect();
            outln!(
                "{name}: ok in {ms}ms, {} in / {} out tokens, cost {:.6}, reply {reply:?}",
                response.usage.input_tokens,
                response.usage.output_tokens,
                response.usage.cost
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            outln!("{name}: failed after {ms}ms: {error}")?;
            Ok(ExitCode::from(1))
        }
    }
}
