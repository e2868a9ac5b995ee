//! The sandbox: one QuickJS runtime and context with a memory limit, a stack
//! limit and a time limit (an interrupt handler), and a module loader that
//! serves only the modules of one [`Bundle`]. QuickJS as embedded here has no
//! `std` or `os` module: a program has no file, network or process access.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rquickjs::loader::{ImportAttributes, Loader, Resolver};
use rquickjs::module::Declared;
use rquickjs::{CaughtError, Context, Ctx, Module, Runtime};

use crate::load::Bundle;

/// What one program may use of the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The most memory its engine may allocate, in bytes.
    pub memory: usize,
    /// The most time one run of its code may take: loading the module, or
    /// going from one yield to the next.
    pub time: Duration,
    /// The most stack its code may use, in bytes.
    pub stack: usize,
}

impl Default for Limits {
    /// 32 MiB of memory, 1 s between yields, 512 KiB of stack.
    fn default() -> Self {
        Self {
            memory: 32 << 20,
            time: Duration::from_secs(1),
            stack: 512 << 10,
        }
    }
}

/// A runtime and context with the limits set, its modules those of one bundle.
pub(crate) struct Sandbox {
    // Field order: the context is dropped before its runtime.
    pub context: Context,
    runtime: Runtime,
    deadline: Arc<Mutex<Option<Instant>>>,
    limits: Limits,
    bundle: Arc<Bundle>,
}

/// Why code in the sandbox failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JsError {
    /// The module (its key in the bundle) and 1-based source line, where known.
    pub at: Option<(String, usize)>,
    pub message: String,
}

impl JsError {
    pub(crate) fn plain(message: impl Into<String>) -> Self {
        Self {
            at: None,
            message: message.into(),
        }
    }
}

struct BundleResolver(Arc<Bundle>);

impl Resolver for BundleResolver {
    fn resolve<'js>(
        &mut self,
        _ctx: &Ctx<'js>,
        base: &str,
        name: &str,
        _attributes: Option<ImportAttributes<'js>>,
    ) -> rquickjs::Result<String> {
        self.0
            .modules
            .get(base)
            .and_then(|m| m.resolved.get(name))
            .cloned()
            .ok_or_else(|| rquickjs::Error::new_resolving_message(base, name, "not in the bundle"))
    }
}

struct BundleLoader(Arc<Bundle>);

impl Loader for BundleLoader {
    fn load<'js>(
        &mut self,
        ctx: &Ctx<'js>,
        name: &str,
        _attributes: Option<ImportAttributes<'js>>,
    ) -> rquickjs::Result<Module<'js, Declared>> {
        let module = self
            .0
            .modules
            .get(name)
            .ok_or_else(|| rquickjs::Error::new_loading_message(name, "not in the bundle"))?;
        Module::declare(ctx.clone(), name, module.code.clone())
    }
}

impl Sandbox {
    /// A fresh runtime and context for `bundle`, with `limits`.
    pub(crate) fn new(bundle: Arc<Bundle>, limits: Limits) -> Result<Self, JsError> {
        let runtime =
            Runtime::new().map_err(|e| JsError::plain(format!("the engine cannot start: {e}")))?;
        runtime.set_memory_limit(limits.memory);
        runtime.set_max_stack_size(limits.stack);
        let deadline: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
        let watched = Arc::clone(&deadline);
        runtime.set_interrupt_handler(Some(Box::new(move || {
            // A poisoned lock stops the code: nothing would stop it later.
            watched
                .lock()
                .map(|d| d.is_some_and(|d| Instant::now() >= d))
                .unwrap_or(true)
        })));
        runtime.set_loader(
            BundleResolver(Arc::clone(&bundle)),
            BundleLoader(Arc::clone(&bundle)),
        );
        let context = Context::full(&runtime)
            .map_err(|e| JsError::plain(format!("the engine cannot start: {e}")))?;
        Ok(Self {
            context,
            runtime,
            deadline,
            limits,
            bundle,
        })
    }

    /// Runs `f` in the context under the time limit; an exception, the
    /// time limit or the memory limit comes back as a [`JsError`].
    pub(crate) fn run<T>(
        &self,
        f: impl for<'js> FnOnce(&Ctx<'js>) -> rquickjs::Result<T>,
    ) -> Result<T, JsError> {
        self.set_deadline(Some(Instant::now() + self.limits.time));
        let out = self.context.with(|ctx| {
            let result = f(&ctx);
            // Pending jobs (promise reactions) run under the same limit.
            // (Through the context: the runtime's own lock is held here.)
            while ctx.execute_pending_job() {
                if self.expired() {
                    break;
                }
            }
            result.map_err(|e| self.describe(&ctx, e))
        });
        let expired = self.expired();
        self.set_deadline(None);
        match out {
            Err(e) if expired && e.message.contains("interrupted") => Err(JsError {
                message: format!(
                    "ran longer than its time limit of {} ms without yielding (a loop that never ends?)",
                    self.limits.time.as_millis()
                ),
                ..e
            }),
            other => other,
        }
    }

    /// Whether the time limit of the current call has passed.
    fn expired(&self) -> bool {
        self.deadline
            .lock()
            .map(|d| d.is_some_and(|d| Instant::now() >= d))
            .unwrap_or(true)
    }

    fn set_deadline(&self, at: Option<Instant>) {
        if let Ok(mut d) = self.deadline.lock() {
            *d = at;
        }
    }

    /// The message and place of a failure in the context.
    fn describe<'js>(&self, ctx: &Ctx<'js>, error: rquickjs::Error) -> JsError {
        let memory = || {
            JsError::plain(format!(
                "exceeded its memory limit of {} MiB",
                self.limits.memory >> 20
            ))
        };
        if matches!(error, rquickjs::Error::Allocation) {
            return memory();
        }
        let caught = CaughtError::from_error(ctx, error);
        let (message, stack) = match &caught {
            CaughtError::Exception(e) => (
                format!(
                    "{}{}",
                    e.get::<_, Option<String>>("name")
                        .ok()
                        .flatten()
                        .map(|n| format!("{n}: "))
                        .unwrap_or_default(),
                    e.message().unwrap_or_default()
                ),
                e.stack().unwrap_or_default(),
            ),
            CaughtError::Value(v) => (
                ctx.json_stringify(v.clone())
                    .ok()
                    .flatten()
                    .and_then(|s| s.to_string().ok())
                    .map(|s| format!("threw {s}"))
                    .unwrap_or_else(|| "threw a value that is not an Error".into()),
                String::new(),
            ),
            CaughtError::Error(e) => (e.to_string(), String::new()),
        };
        if message.contains("out of memory") {
            return memory();
        }
        JsError {
            at: self.place(&stack),
            message,
        }
    }

    /// The first frame of `stack` in a module of the bundle, as a source line.
    fn place(&self, stack: &str) -> Option<(String, usize)> {
        for frame in stack.lines() {
            for key in self.bundle.modules.keys() {
                let Some(i) = frame.find(&format!("{key}:")) else {
                    continue;
                };
                let rest = &frame[i + key.len() + 1..];
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                if let Ok(line) = digits.parse::<usize>() {
                    let line = self.bundle.source_line(key, line).unwrap_or(line);
                    return Some((key.clone(), line));
                }
            }
        }
        None
    }

    /// The bundle this sandbox serves.
    pub(crate) fn bundle(&self) -> &Arc<Bundle> {
        &self.bundle
    }

    /// The bytes the engine holds now.
    pub(crate) fn memory_used(&self) -> i64 {
        self.runtime.memory_usage().memory_used_size
    }
}
