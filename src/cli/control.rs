//! `arbor cancel` and `arbor budget`: on the store (the supervisor decides
//! and the process that runs the tree carries them out) or through `arbor
//! serve`; and the loop by which `arbor run` takes what those post for the
//! tree it runs.

use std::process::ExitCode;
use std::time::Duration;

use arbor::Runtime;
use arbor_actors::{IdError, RunId, TreeId};
use arbor_supervisor::{BudgetOutcome, CancelOutcome, Raised, Supervisor, Target};
use serde_json::Value;

use super::args::Stored;
use super::service::Api;
use super::{async_runtime, load_config, store_location};

/// How long `arbor cancel` and `arbor budget` wait for the process that runs
/// the tree to apply what they posted (it looks every [`CONTROL_POLL`]).
const APPLIED_WITHIN: Duration = Duration::from_secs(10);

/// How often `arbor run` looks for what was posted for its tree.
const CONTROL_POLL: Duration = Duration::from_millis(250);

/// A runtime over the store `at` names, to ask its supervisor; it runs
/// nothing (its catalog is empty).
pub(super) fn store_runtime(at: Stored) -> anyhow::Result<(tokio::runtime::Runtime, Runtime)> {
    let Stored { config, store } = at;
    let config = load_config(config.as_deref())?;
    let location = store_location(&config, store)?;
    // Refuses a location that holds no store (a typo is not a new store).
    drop(location.open_existing()?);
    let tokio = async_runtime()?;
    // Only the store is asked: no model is built and no MCP server started
    // (a model's missing API key is no reason to refuse a cancel).
    let runtime = {
        let _guard = tokio.enter();
        let catalog = arbor_supervisor::Catalog::builder().build()?;
        Runtime::from_catalog(catalog, config.limits.clone())
            .store_at(location)
            .build()?
    };
    Ok((tokio, runtime))
}

/// `arbor cancel ID` on the store.
pub(super) fn cancel_on_store(id: Target, at: Stored) -> anyhow::Result<ExitCode> {
    let (tokio, runtime) = store_runtime(at)?;
    tokio.block_on(async {
        let supervisor = runtime.supervisor();
        match supervisor.cancel_stored(&id).await? {
            CancelOutcome::Here => outln!("cancelled: {id}")?,
            CancelOutcome::Ended => outln!(
                "cancelled: tree {id} (nobody ran it); no process resumes or adopts it"
            )?,
            CancelOutcome::Posted { owner } => {
                eprintln!("cancel posted for the process that runs it ({owner})");
                match ended_within(supervisor, &id).await? {
                    Some(status) => outln!("{id}: {status}")?,
                    None => outln!(
                        "{id}: cancel posted; the process that runs it has not applied it within {}",
                        arbor_actors::duration::Human(APPLIED_WITHIN)
                    )?,
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// The status `id` (a tree's latest turn, or a run) ended with, once it
/// has, within [`APPLIED_WITHIN`]; `None` if it still runs then.
async fn ended_within(supervisor: &Supervisor, id: &Target) -> anyhow::Result<Option<String>> {
    let deadline = tokio::time::Instant::now() + APPLIED_WITHIN;
    loop {
        let id = id.clone();
        let status = supervisor
            .read_store(move |store| match &id {
                Target::Run(run) => Ok(store.run(run)?.node.status),
                Target::Tree(tree) => Ok(store.status(tree)?.to_string()),
            })
            .await?;
        if !matches!(status.as_str(), "running" | "interrupted") {
            return Ok(Some(status));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(CONTROL_POLL).await;
    }
}

/// `arbor cancel ID` through a server: `POST /v1/runs/{runId}/cancel`, a
/// tree's latest root (`GET /v1/trees/{treeId}`'s `rootRunId`) for a tree id.
pub(super) async fn cancel_on_server(api: &Api, id: &str) -> anyhow::Result<ExitCode> {
    let run = if id.contains('/') {
        id.to_owned()
    } else {
        let (status, body) = api
            .send(reqwest::Method::GET, &["v1", "trees", id], None)
            .await?;
        if !status.is_success() {
            anyhow::bail!(
                "cannot cancel tree {id}: the server refused ({status}): {}",
                api.refusal(status, &body)
            );
        }
        body["tree"]["rootRunId"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("{id}/0"))
    };
    let (status, body) = api
        .send(reqwest::Method::POST, &["v1", "runs", &run, "cancel"], None)
        .await?;
    if !status.is_success() {
        anyhow::bail!(
            "cannot cancel {id}: the server refused ({status}): {}",
            api.refusal(status, &body)
        );
    }
    outln!("cancelling: run {run} and its subtree end as cancelled")?;
    Ok(ExitCode::SUCCESS)
}

/// The budgets a command line gives: (set, add).
pub(super) struct Raise {
    pub(super) set: Raised,
    pub(super) add: Raised,
}

impl Raise {
    fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty()
    }

    /// The body of `PATCH /v1/trees/{treeId}/limits` (a credit amount JSON
    /// has no number for, NaN or infinite, is left out).
    fn body(&self) -> serde_json::Map<String, Value> {
        let credits = |v: Option<f64>| v.and_then(serde_json::Number::from_f64).map(Into::into);
        let count = |v: Option<u64>| v.map(Into::into);
        [
            ("addCredits", credits(self.add.max_credits)),
            ("addTokens", count(self.add.max_tokens)),
            ("addSteps", count(self.add.max_steps)),
            ("maxCredits", credits(self.set.max_credits)),
            ("maxTokens", count(self.set.max_tokens)),
            ("maxSteps", count(self.set.max_steps)),
        ]
        .into_iter()
        .filter_map(|(key, value)| Some((key.to_owned(), value?)))
        .collect()
    }
}

/// The budgets in force, as `arbor budget` prints them.
fn budgets_line(tree_id: &str, b: &Raised) -> String {
    let show = |v: Option<String>| v.unwrap_or_else(|| "unlimited".to_owned());
    format!(
        "tree {tree_id}: max_steps {}, max_tokens {}, max_credits {}",
        show(b.max_steps.map(|v| v.to_string())),
        show(b.max_tokens.map(|v| v.to_string())),
        show(b.max_credits.map(|v| v.to_string()))
    )
}

/// `arbor budget TREE [raises]` on the store: the budgets in force, or the
/// raise applied by the process that runs the tree (`arbor run` takes it
/// from the store, as `arbor serve` does) and the budgets then in force.
pub(super) fn budget_on_store(
    tree_id: TreeId,
    raise: Raise,
    at: Stored,
) -> anyhow::Result<ExitCode> {
    let (tokio, runtime) = store_runtime(at)?;
    tokio.block_on(async {
        let supervisor = runtime.supervisor();
        if raise.is_empty() {
            let budgets = supervisor.budgets(&tree_id).await?;
            outln!("{}", budgets_line(&tree_id, &budgets))?;
            return Ok(ExitCode::SUCCESS);
        }
        let before = supervisor.budgets(&tree_id).await?;
        match supervisor
            .raise_stored(&tree_id, raise.set, raise.add)
            .await?
        {
            BudgetOutcome::Here(now) => outln!("{}", budgets_line(&tree_id, &now))?,
            BudgetOutcome::Posted { owner: None } => outln!(
                "raise posted for tree {tree_id}: nobody runs it now; the process that resumes it applies it"
            )?,
            BudgetOutcome::Posted { owner: Some(owner) } => {
                eprintln!("raise posted for the process that runs tree {tree_id} ({owner})");
                let deadline = tokio::time::Instant::now() + APPLIED_WITHIN;
                loop {
                    let now = supervisor.budgets(&tree_id).await?;
                    if now != before {
                        outln!("{}", budgets_line(&tree_id, &now))?;
                        break;
                    }
                    if tokio::time::Instant::now() >= deadline {
                        outln!(
                            "tree {tree_id}: raise posted; the process that runs it has not applied it within {}",
                            arbor_actors::duration::Human(APPLIED_WITHIN)
                        )?;
                        break;
                    }
                    tokio::time::sleep(CONTROL_POLL).await;
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `arbor budget TREE [raises…]` through a server: `PATCH
/// /v1/trees/{treeId}/limits` (with no raise, `GET`); prints the budgets
/// now in force.
pub(super) async fn budget_on_server(
    api: &Api,
    tree_id: &str,
    raise: Raise,
) -> anyhow::Result<ExitCode> {
    // Nothing to raise: the budgets in force.
    let (status, answer) = if raise.is_empty() {
        api.send(
            reqwest::Method::GET,
            &["v1", "trees", tree_id, "limits"],
            None,
        )
        .await?
    } else {
        api.send(
            reqwest::Method::PATCH,
            &["v1", "trees", tree_id, "limits"],
            Some(&Value::Object(raise.body())),
        )
        .await?
    };
    if !status.is_success() {
        let message = api.refusal(status, &answer);
        let verb = if raise.is_empty() { "read" } else { "raise" };
        anyhow::bail!(
            "cannot {verb} the budgets of tree {tree_id}: the server refused ({status}): {message}"
        );
    }
    let budgets = Raised {
        max_steps: answer["maxSteps"].as_u64(),
        max_tokens: answer["maxTokens"].as_u64(),
        max_credits: answer["maxCredits"].as_f64(),
    };
    outln!("{}", budgets_line(tree_id, &budgets))?;
    Ok(ExitCode::SUCCESS)
}

/// Takes what is posted in the store for the tree this `arbor run` runs
/// (by `arbor cancel` and `arbor budget`, or forwarded by an `arbor serve`
/// on the same store) and applies it, until dropped: a cancel, a raise, a
/// steering message, a decision on a tool call. Anything else is set aside
/// in `aside`, to be posted back once the tree ends ([`post_back`]).
pub(super) async fn take_controls(
    supervisor: &Supervisor,
    tree_id: &TreeId,
    aside: &std::sync::Mutex<Vec<Value>>,
) -> std::convert::Infallible {
    use arbor_actors::sync::LockExt as _;
    let mut tick = tokio::time::interval(CONTROL_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let tree = tree_id.to_owned();
        let Ok(controls) = supervisor
            .read_store(move |store| store.take_controls(&[tree]))
            .await
        else {
            continue;
        };
        for control in controls {
            let body = &control.body;
            let text = |key: &str| body[key].as_str().unwrap_or_default().to_owned();
            // The control's run, read once (a run id of no tree runs nowhere).
            let run = || {
                let run = text("runId");
                run.parse::<RunId>()
                    .map_err(|_| arbor_supervisor::Error::NoSuchId(IdError::Run(run)))
            };
            let done = match body["control"].as_str() {
                Some("cancel") => run().and_then(|run| supervisor.cancel_run(&run)),
                Some("raise") => supervisor
                    .raise_limits(tree_id, raised(&body["set"]), raised(&body["add"]))
                    .map(drop),
                Some("steer") => match run() {
                    Ok(run) => supervisor.steer(&run, &text("text")).await,
                    Err(error) => Err(error),
                },
                Some("decide") => match serde_json::from_value(body["decision"].clone()) {
                    Ok(decision) => supervisor
                        .decide(tree_id, &text("callId"), decision)
                        .await
                        .map(drop),
                    Err(_) => {
                        aside.locked().push(control.body.clone());
                        Ok(())
                    }
                },
                _ => {
                    aside.locked().push(control.body.clone());
                    Ok(())
                }
            };
            if let Err(why) = done {
                eprintln!("warning: tree {tree_id}: {body} was not applied: {why}");
            }
        }
    }
}

/// Posts back what [`take_controls`] set aside, for whichever process runs
/// the tree next.
pub(super) async fn post_back(supervisor: &Supervisor, tree_id: &TreeId, aside: Vec<Value>) {
    for body in aside {
        let tree = tree_id.to_owned();
        let _ = supervisor
            .read_store(move |store| store.post_control(&tree, &body))
            .await;
    }
}

/// The budgets of a raise control's `set` or `add`.
fn raised(v: &Value) -> Raised {
    Raised {
        max_steps: v["maxSteps"].as_u64(),
        max_tokens: v["maxTokens"].as_u64(),
        max_credits: v["maxCredits"].as_f64(),
    }
}
