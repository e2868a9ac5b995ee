//! What the tool benchmarks share: settings, CPU time from `/proc`,
//! histograms, the trees' model and runtime.

use super::*;

/// Linux reports `/proc/*/stat` times in USER_HZ, 100 per second.
pub(crate) const TICK_MS: f64 = 10.0;

pub(crate) struct Settings {
    pub(crate) rounds: usize,
    pub(crate) n: usize,
    pub(crate) warmup: usize,
    pub(crate) k: usize,
    pub(crate) workers: usize,
    pub(crate) steps: usize,
    /// Trees on `ScriptedModel` instead of the bench's `StepModel`.
    pub(crate) scripted: bool,
}

pub(crate) fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(text) => text.trim().parse().unwrap_or_else(|_| {
            eprintln!("{name}={text:?} is not a count; using {default}");
            default
        }),
        Err(_) => default,
    }
}

impl Settings {
    pub(crate) fn from_env() -> Settings {
        Settings {
            rounds: env_usize("ARBOR_BENCH_ROUNDS", 5).max(1),
            n: env_usize("ARBOR_BENCH_N", 2000).max(1),
            warmup: env_usize("ARBOR_BENCH_WARMUP", 3000),
            k: env_usize("ARBOR_BENCH_K", 500).max(1),
            workers: env_usize("ARBOR_BENCH_WORKERS", 10).max(1),
            steps: env_usize("ARBOR_BENCH_STEPS", 100).max(1),
            scripted: std::env::var("ARBOR_BENCH_MODEL").is_ok_and(|m| m == "scripted"),
        }
    }
}

// ---------------------------------------------------------------- CPU time

/// (own user+system, reaped children's user+system) of `pid`, in ticks.
pub(crate) fn cpu_ticks(pid: &str) -> (u64, u64) {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return (0, 0);
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return (0, 0);
    };
    // After the name: state (field 3), …, utime (14), stime, cutime, cstime (17).
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    if fields.len() < 4 {
        return (0, 0);
    }
    (fields[0] + fields[1], fields[2] + fields[3])
}

/// CPU spent by this process, one other process, and this process's reaped
/// children, between `start` and `stop`, summed over rounds (ticks).
#[derive(Clone, Copy, Default)]
pub(crate) struct Cpu {
    pub(crate) own: u64,
    pub(crate) server: u64,
    pub(crate) children: u64,
}

pub(crate) struct CpuMark {
    pub(crate) own: u64,
    pub(crate) children: u64,
    pub(crate) server: u64,
    pub(crate) server_pid: Option<u32>,
}

impl CpuMark {
    pub(crate) fn now(server_pid: Option<u32>) -> CpuMark {
        let (own, children) = cpu_ticks("self");
        let server = server_pid.map(|p| cpu_ticks(&p.to_string()).0).unwrap_or(0);
        CpuMark {
            own,
            children,
            server,
            server_pid,
        }
    }

    pub(crate) fn add_to(self, total: &mut Cpu) {
        let after = CpuMark::now(self.server_pid);
        total.own += after.own.saturating_sub(self.own);
        total.children += after.children.saturating_sub(self.children);
        total.server += after.server.saturating_sub(self.server);
    }
}

/// Ticks as µs per call.
pub(crate) fn per_call_us(ticks: u64, calls: usize) -> f64 {
    ticks as f64 * TICK_MS * 1e3 / calls as f64
}

// ---------------------------------------------------------------- shared bits

pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram")
}

pub(crate) fn ctx() -> ToolContext {
    ToolContext {
        tree_id: "t-bench".parse().expect("a tree id"),
        run_id: "t-bench/0".parse().expect("a run id"),
        agent_type: "bench".to_owned(),
        call_id: "call-1".to_owned(),
        workspace: None,
    }
}

pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub(crate) fn ns_us(ns: f64) -> f64 {
    ns / 1e3
}

/// The round's variants in order: forward on even rounds, reversed on odd.
pub(crate) fn order(round: usize, count: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..count).collect();
    if round % 2 == 1 {
        order.reverse();
    }
    order
}

/// (tool results, error results) in an agent's history.
pub(crate) fn tool_results(state: &AgentState) -> (usize, usize) {
    let mut results = 0;
    let mut errors = 0;
    for message in state.message_history.iter() {
        if matches!(**message, Message::Tool { .. }) {
            results += 1;
            if message.has_tag(TOOL_CALL_ERROR) {
                errors += 1;
            }
        }
    }
    (results, errors)
}

/// A script: `agent` makes `steps` steps of one call of `tool` with
/// `input`, then answers.
pub(crate) fn steps_of(tool: &str, input: &Value, steps: usize) -> Vec<Value> {
    let mut out: Vec<Value> = (0..steps)
        .map(|_| json!({"toolCalls": [{"name": tool, "input": input}]}))
        .collect();
    out.push(json!({"text": "done"}));
    out
}

/// A model answering from a script like `ScriptedModel`'s (by agent type and
/// step, first entry per agent type), at O(1) per request: `ScriptedModel`
/// checks the pairing of every request it gets (quadratic in the history) and
/// records it, which at hundreds of steps costs more than the step itself.
pub(crate) struct StepModel {
    pub(crate) replies: HashMap<String, Vec<ScriptedReply>>,
}

#[async_trait]
impl Model for StepModel {
    fn name(&self) -> &str {
        "script"
    }

    async fn complete(
        &self,
        request: ModelRequest,
        deltas: DeltaSink,
    ) -> Result<ModelResponse, ModelError> {
        let meta = &request.meta;
        let reply = self
            .replies
            .get(&meta.agent_type)
            .and_then(|steps| steps.get((meta.step as usize).saturating_sub(1)))
            .ok_or_else(|| ModelError::Invalid {
                model: "script".to_owned(),
                message: format!("no reply for {} step {}", meta.agent_type, meta.step),
            })?;
        let mut parts = Vec::new();
        if let Some(text) = &reply.text {
            deltas(Delta::Text { text: text.clone() });
            parts.push(Part::Text { text: text.clone() });
        }
        for (i, call) in reply.tool_calls.iter().enumerate() {
            parts.push(Part::ToolCall(ToolCall {
                tool_call_id: format!("{}-s{}-c{i}", meta.run_id, meta.step),
                tool_name: call.name.clone(),
                input: call.input.clone().into(),
            }));
        }
        Ok(ModelResponse {
            message: Message::Assistant {
                content: Content::Parts(parts),
                meta: Default::default(),
            },
            usage: Usage {
                input_tokens: 100,
                output_tokens: 10,
                ..Usage::default()
            },
        })
    }
}

/// The trees' model: `StepModel`, or `ScriptedModel` (`ARBOR_BENCH_MODEL=scripted`).
pub(crate) fn scripted(script: &Value, s: &Settings) -> Arc<dyn Model> {
    if s.scripted {
        return Arc::new(
            ScriptedModel::from_json("script", &script.to_string(), "bench").expect("script"),
        );
    }
    let script: Script = serde_json::from_value(script.clone()).expect("script");
    let mut replies = HashMap::new();
    for entry in script.replies {
        replies.entry(entry.agent).or_insert(entry.steps);
    }
    Arc::new(StepModel { replies })
}

/// A runtime over `templates` with `model`, the tool set's tools and `extra`.
pub(crate) fn runtime(
    tools: &ToolSet,
    extra: Option<Arc<dyn Tool>>,
    model: Arc<dyn Model>,
    templates: Vec<AgentTemplate>,
) -> Runtime {
    let mut builder = tools.register(Catalog::builder()).model_as("script", model);
    if let Some(tool) = extra {
        builder = builder.tool(tool);
    }
    for template in templates {
        builder = builder.template(template);
    }
    Runtime::from_catalog(builder.build().expect("catalog"), TreeLimits::default())
        .build()
        .expect("runtime")
}

pub(crate) fn template(id: &str, tools: &[&str], max_steps: usize) -> AgentTemplate {
    let mut template = AgentTemplate::new(id, "script").max_steps(max_steps as u32);
    template.tools = tools.iter().map(|t| (*t).to_owned()).collect();
    template
}
