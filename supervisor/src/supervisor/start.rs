//! Starting a tree: a start request checked against the catalog (its
//! agent, params, model override and tree id), the tree's context, its
//! record stored before it runs, its root actor and its deadline timer.

use std::sync::Arc;

use arbor_actors::TreeHooks as _;
use arbor_actors::spawn::input_messages;
use arbor_actors::state::Start;
use arbor_actors::sync::LockExt as _;
use arbor_actors::{
    AgentActor, AgentArgs, AgentMsg, AgentState, CancelReason, Failure, FailureKind, Limit,
    LimitHit, Model, Reply, RunResult, StepMachine, TreeId,
};
use ractor::Actor;
use tokio::sync::oneshot;

use super::{StartRequest, Supervisor, TreeHandle, not_an_object};
use crate::catalog::Catalog;
use crate::error::Error;
use crate::recovery::Recovery;
use crate::store::{TreeRecord, Write};
use crate::tree::TreeContext;

impl Supervisor {
    /// Starts a tree. Waits only for a live slot for the root, never for its run.
    pub async fn start(&self, request: StartRequest) -> Result<TreeHandle, Error> {
        self.begin(request, None).await
    }

    /// Starts a tree and waits for its root's result.
    pub async fn run(&self, request: StartRequest) -> Result<RunResult, Error> {
        self.start(request).await?.wait().await
    }

    pub(super) async fn begin(
        &self,
        request: StartRequest,
        recovery: Option<(Arc<Recovery>, bool)>,
    ) -> Result<TreeHandle, Error> {
        // One trace per tree: the root agent's span is a child of the span
        // this start runs in (the service's, for a tree started over HTTP).
        let caller = tracing::Span::current();
        self.store_takes_writes()?;
        let config = request.config.clone().or_else(|| self.config.clone());
        let catalog = self.catalog_for(config.as_ref())?;
        let template = catalog
            .find_template(&request.agent)
            .cloned()
            .ok_or_else(|| Error::UnknownAgent(request.agent.clone()))?;
        if let Some(kind) = request.params.as_ref().and_then(not_an_object) {
            return Err(Error::InvalidInput {
                agent: template.id.clone(),
                message: format!("params must be a JSON object, not {kind}"),
            });
        }
        template
            .check_input(Some(&request.prompt), request.params.as_ref())
            .map_err(|e| Error::InvalidInput {
                agent: template.id.clone(),
                message: e.to_string(),
            })?;
        // Every agent of the tree goes on the override: refused before a new
        // tree starts when its provider would refuse an agent's options (a
        // resumed tree and a later turn go on with the one they started with).
        let new_tree = recovery.is_none() && request.turn == 0;
        // When the tree first started: read once, for the record a new tree
        // stores and the date its prompts show (the same day on resume).
        let started_ms = request.started_ms.unwrap_or_else(crate::tree::now_ms);
        if let Some(name) = request.model.as_ref().filter(|_| new_tree) {
            catalog
                .check_override(&request.agent, name)
                .map_err(|refused| Error::InvalidRequest {
                    field: "model".into(),
                    problem: refused.to_string(),
                })?;
        }
        // A webhook is the run's: a new tree's, or a later turn's (a resume
        // asks for none: its run's is on record).
        if let Some(url) = request.webhook.as_deref() {
            crate::request::check_webhook(url)?;
            if self.store.is_none() {
                return Err(Error::InvalidRequest {
                    field: "webhook".into(),
                    problem: "a webhook needs a store to journal its delivery, and this \
                              supervisor has none"
                        .into(),
                });
            }
        }
        let model_override: Option<Arc<dyn Model>> = match &request.model {
            Some(name) => {
                Some(
                    catalog
                        .model(name)
                        .cloned()
                        .ok_or_else(|| Error::UnknownModel {
                            agent: template.id.clone(),
                            model: name.clone(),
                        })?,
                )
            }
            None => None,
        };
        let tree = request.tree_id.clone().unwrap_or_else(TreeId::generate);
        let tree_id: Arc<str> = tree.as_arc().clone();
        // Started outside any span: a fresh `tree` span is the trace's root.
        let tree_span = if caller.is_none() {
            tracing::info_span!(
                parent: None,
                "tree",
                otel.name = format!("tree {}", template.id).as_str(),
                arbor.tree.id = %tree_id,
            )
        } else {
            caller
        };
        if self.is_running(&tree) {
            return Err(Error::TreeExists(tree.clone()));
        }
        // A new tree must not land on a stored one (`resume` continues those).
        if self.store.is_some() && recovery.is_none() {
            let id = tree.clone();
            match self
                .read_store(move |store| store.tree(&id).map(drop))
                .await
            {
                Ok(()) => return Err(Error::TreeStored(tree.clone())),
                Err(Error::UnknownTree(_)) => {}
                Err(error) => return Err(error),
            }
        }
        // A new tree's limits are the request's, checked and tightened here
        // (whoever sent it); a resumed tree and a follow-up turn go on with
        // the ones it started with (and any raised since).
        let mut limits = if recovery.is_none() && request.turn == 0 {
            crate::request::start_limits(request.limits.as_ref(), &self.limits)?
        } else {
            request
                .limits
                .clone()
                .unwrap_or_else(|| self.limits.clone())
        };
        // A request narrows the supervisor's tool policy; it never widens it.
        limits.tools = self.limits.tools.clone().with(&limits.tools);
        // A new tree's workspace is checked against the roots the config
        // allows and kept canonical; a resumed tree reopens where it was.
        if recovery.is_none()
            && request.turn == 0
            && let Some(spec) = &limits.workspace
        {
            let asked = request
                .limits
                .as_ref()
                .is_some_and(|l| l.workspace.is_some());
            let roots = catalog.workspace_roots(request.principal.as_deref());
            if asked && self.confined_workspaces && roots.is_empty() {
                return Err(Error::InvalidRequest {
                    field: "limits.workspace".to_owned(),
                    problem: "this service takes no workspace from a request: its config names \
                              no [workspace] roots"
                        .to_owned(),
                });
            }
            limits.workspace = Some(crate::request::admit_workspace(spec, roots)?);
        }
        let workspace = match limits
            .workspace
            .as_ref()
            .and_then(|spec| catalog.open_workspace(spec))
        {
            None => None,
            Some(Ok(workspace)) => Some(workspace),
            Some(Err(problem)) => {
                return Err(Error::InvalidRequest {
                    field: "limits.workspace.root".to_owned(),
                    problem: format!("cannot open it: {problem}"),
                });
            }
        };
        // The servers of the tools the tree can reach are up (or known to be
        // down) before its first agent builds a request.
        catalog.prepare_tools(&template.id).await;
        let mut ctx = TreeContext::new(
            tree.clone(),
            catalog.clone(),
            limits.clone(),
            self.bus.clone(),
            self.registry.clone(),
            model_override,
        )
        .durable(self.store.is_some())
        .store_writer(self.store.as_ref().map(|(_, w)| w.clone()))
        .workspace(workspace);
        // Placeholders that depend on the tree (its workspace, when it first
        // started, its prompt) are filled once, before its first agent.
        if let Some(context) = catalog.prompt_context() {
            let scene = crate::PromptScene {
                workspace: arbor_actors::TreeHooks::workspace(&ctx).map(|w| w.root().to_path_buf()),
                started_ms,
                prompt: request.prompt.clone(),
            };
            ctx = ctx.prompt_values(Some(Arc::new(context.values(scene).await)));
        }
        let mut allowed = arbor_actors::approval::AlwaysAllowed::default();
        if let Some((recovery, replay)) = recovery {
            if !replay {
                self.approvals.asked_before(&tree, &recovery.asked);
            }
            allowed = recovery.allowed.clone();
            ctx = ctx.recovering(recovery, replay);
        }
        // When the tree is gone (every agent and every handle on it), nothing
        // of it stays here: its deadline timer stops and its entry goes (a
        // server that has run a million trees holds what is running, no more).
        let (ended, tree_ended) = oneshot::channel::<()>();
        let trees = Arc::downgrade(&self.trees);
        let id = tree_id.clone();
        let (gone, is_gone) = tokio::sync::watch::channel(false);
        self.gone.locked().insert(tree_id.clone(), is_gone);
        let gone_map = Arc::downgrade(&self.gone);
        let ctx = Arc::new(ctx.on_drop(move || {
            drop(ended);
            let _ = gone.send(true);
            if let Some(map) = gone_map.upgrade() {
                let mut map = map.locked();
                if map.get(&id).is_some_and(|rx| *rx.borrow()) {
                    map.remove(&id);
                }
            }
            if let Some(trees) = trees.upgrade() {
                let mut trees = trees.locked();
                // Not a later tree of the same id (a resume).
                if trees.get(&id).is_some_and(|(t, _)| t.strong_count() == 0) {
                    trees.remove(&id);
                }
            }
        }));
        let template = ctx.expanded(&template);
        let toolbox = ctx
            .toolbox(&template)
            .map_err(|_| Error::UnknownAgent(template.id.clone()))?;
        let ids = ctx.root_ids(request.turn);
        let root_run_id = ids.run_id.clone();
        let resumed = ctx
            .recovery()
            .and_then(|r| r.checkpoints.get(&root_run_id.to_string()).cloned());
        let machine = match resumed {
            Some(checkpoint) => StepMachine::from_checkpoint(
                &checkpoint,
                template.clone(),
                toolbox,
                ctx.tree_id.clone(),
            ),
            None => {
                let mut history = request.history.clone().unwrap_or_default();
                let inherited = history.len();
                for message in
                    input_messages(&template, Some(&request.prompt), request.params.as_ref())
                {
                    history.push(message);
                }
                let state = AgentState::initial(Start {
                    ids,
                    agent_type: template.id.clone(),
                    parent: None,
                    history,
                    system_prompt: template.system_prompt.clone(),
                    tool_definitions: toolbox.definitions().clone(),
                    context_token_count: 0,
                    steps_remaining: template.max_steps,
                });
                StepMachine::new(
                    state,
                    template.clone(),
                    toolbox,
                    inherited,
                    ctx.tree_id.clone(),
                )
                .with_input(Some(&request.prompt), request.params.as_ref())
            }
        };
        if let Some((_, writer)) = &self.store {
            // Durable before it runs: once `start` returns, the tree can be resumed.
            writer.send(Write::Tree(Box::new(TreeRecord {
                tree_id: tree.clone(),
                root_run_id: root_run_id.clone(),
                agent: template.id.clone(),
                prompt: request.prompt.clone(),
                params: request.params.clone(),
                model: request.model.clone(),
                limits,
                origin: request.origin.clone(),
                config,
                history: request.history.clone(),
                started_ms,
                principal: request.principal.clone(),
                webhook: request.webhook.clone(),
            })));
            writer.flush().await?;
        }
        let slot = {
            use arbor_actors::TreeHooks;
            use arbor_actors::hooks::SlotPriority;
            ctx.acquire_slot(SlotPriority {
                depth: 0,
                resume: false,
            })
            .await
        };
        let (tx, rx) = oneshot::channel();
        let hooks = self.ruled_hooks(ctx.clone(), allowed);
        let workspace = {
            let tree_workspace = arbor_actors::TreeHooks::workspace(&*ctx);
            template.workspace_for(tree_workspace.as_ref(), &root_run_id)
        };
        let (root, root_task) = Actor::spawn(
            None,
            AgentActor,
            AgentArgs {
                hooks,
                machine: Box::new(machine),
                reply: Reply::Root(tx),
                slot,
                parent_span: tree_span,
                workspace,
            },
        )
        .await
        .map_err(|e| Error::Spawn(e.to_string()))?;
        if let Some(deadline) = ctx.budget.limits().deadline {
            let root = root.clone();
            let held = self.deadlines.clone();
            tokio::spawn(async move {
                let _held = held;
                tokio::select! {
                    () = tokio::time::sleep(deadline) => {
                        let limit = LimitHit::new(
                            Limit::Deadline,
                            format!("the tree ran longer than {deadline:?}"),
                        );
                        let _ = root.cast(AgentMsg::Cancel(CancelReason::Limit(limit)));
                    }
                    // The tree is gone: the timer (and the root it holds) with it.
                    _ = tree_ended => {}
                }
            });
        }
        {
            let mut trees = self.trees.locked();
            trees.retain(|_, (t, _)| t.strong_count() > 0);
            trees.insert(tree_id.clone(), (Arc::downgrade(&ctx), root.clone()));
        }
        // A store that failed while the root waited for its slot did not see
        // this tree to fail it; nor did a claim that another process took
        // over meanwhile (the tree is not run here then).
        if let Some(reason) = self.store.as_ref().and_then(|(_, w)| w.failure()) {
            let _ = root.cast(AgentMsg::Cancel(CancelReason::Failed(Failure::new(
                FailureKind::Store,
                reason,
            ))));
        } else if let Some(fenced) = self.store.as_ref().and_then(|(_, w)| w.fenced(&tree)) {
            let reason = Error::from(fenced).to_string();
            let _ = root.cast(AgentMsg::Cancel(CancelReason::Failed(Failure::new(
                FailureKind::Store,
                reason,
            ))));
        }
        Ok(TreeHandle {
            tree_id: tree,
            root_run_id,
            root,
            result: rx,
            root_task,
            ctx,
        })
    }

    /// The catalog a tree that started on `config` (its record's) runs on:
    /// this supervisor's, or the one its resolver builds of another config
    /// ([`Supervisor::with_catalogs`]).
    pub fn catalog_for(&self, config: Option<&Arc<str>>) -> Result<Arc<Catalog>, Error> {
        match (config, &self.catalogs) {
            (Some(config), Some(resolve)) if Some(config) != self.config.as_ref() => {
                resolve(config).map_err(Error::TreeConfig)
            }
            _ => Ok(self.catalog.clone()),
        }
    }
}
