//! Tree-wide limits (semantics §8) and the counters that enforce them.

use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

pub use arbor_actors::out_of_range;
use arbor_actors::sync::RwLockExt;
use arbor_actors::{Limit, LimitHit, Usage};
use serde::{Deserialize, Deserializer};

use crate::policy::ToolPolicy;
use crate::slots::Slots;

/// Limits of one tree. `None` means unlimited.
///
/// One type, two spellings: the API's (this type's serde form: camelCase
/// keys, the deadline as `deadlineMs`) and a config file's `[limits]`
/// ([`TreeLimits::deserialize_config`]: snake_case keys, the deadline a
/// duration such as `"5m"`). A limit that cannot be zero is a `NonZero*`,
/// refused at zero in its range's words when read; the rest of each range
/// is [`TreeLimits::problems`].
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct TreeLimits {
    /// Deepest level a child may be at (the root is at 0; 0 allows no child).
    pub max_depth: Option<usize>,
    /// Children one spawn call may ask for.
    #[serde(deserialize_with = "nonzero::<_, _, { ranges::MAX_CHILDREN_PER_CALL.1 as u64 }>")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<usize>))]
    pub max_children_per_call: Option<NonZeroUsize>,
    /// Agents stepping at once; a spawn waits for a slot, a parent waiting for its
    /// children gives its slot back.
    #[serde(deserialize_with = "nonzero::<_, _, { ranges::MAX_LIVE_AGENTS.1 as u64 }>")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<usize>))]
    pub max_live_agents: Option<NonZeroUsize>,
    /// Agents in the whole tree, the root included.
    #[serde(deserialize_with = "nonzero::<_, _, { ranges::MAX_AGENTS.1 as u64 }>")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<usize>))]
    pub max_agents: Option<NonZeroUsize>,
    /// Model steps in the whole tree.
    #[serde(deserialize_with = "nonzero::<_, _, { ranges::MAX_STEPS.1 }>")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub max_steps: Option<NonZeroU64>,
    /// Model tokens (input and output) in the whole tree; the tokens of
    /// calls in flight are reserved against it.
    #[serde(deserialize_with = "nonzero::<_, _, { ranges::MAX_TOKENS.1 }>")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub max_tokens: Option<NonZeroU64>,
    /// Credits (the models' priced cost) in the whole tree.
    pub max_credits: Option<f64>,
    /// How long the tree may run, from its start (`deadlineMs` in the API).
    #[serde(rename = "deadlineMs", with = "millis")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub deadline: Option<Duration>,
    /// Which tools the tree's agents may use, whatever their templates list.
    #[serde(skip_serializing_if = "ToolPolicy::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<crate::ToolRule>))]
    pub tools: ToolPolicy,
    /// What a spent budget (`max_steps`, `max_tokens`, `max_credits`) does:
    /// fail the agents it refuses (the default), or pause them until the
    /// budget is raised (semantics §13).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_budget: Option<OnBudget>,
    /// Where the tree's agents work: the directory the workspace tools
    /// resolve every path in and cannot leave, and whether they may only
    /// read there (issue 36). Not a bound: the request's (checked against
    /// the workspace roots the config allows), else this one's; a read-only
    /// default stays read-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace: Option<crate::workspace::WorkspaceSpec>,
}

/// What a spent budget does to the agents that need more (semantics §13).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnBudget {
    /// They fail, naming the budget.
    #[default]
    Fail,
    /// They wait, holding no live slot, until the budget is raised.
    Pause,
}

/// `[limits]` of a config file: [`TreeLimits`] read straight into, with the
/// file's keys (the tool policy is the file's `[policy]`, not a limit).
/// Not a second declaration: serde's remote derive builds a `TreeLimits`
/// from these fields, so the compiler refuses any that differ from its.
#[derive(Deserialize)]
#[serde(remote = "TreeLimits", deny_unknown_fields)]
struct ConfigLimits {
    #[serde(default)]
    max_depth: Option<usize>,
    #[serde(
        default,
        deserialize_with = "nonzero::<_, _, { ranges::MAX_CHILDREN_PER_CALL.1 as u64 }>"
    )]
    max_children_per_call: Option<NonZeroUsize>,
    #[serde(
        default,
        deserialize_with = "nonzero::<_, _, { ranges::MAX_LIVE_AGENTS.1 as u64 }>"
    )]
    max_live_agents: Option<NonZeroUsize>,
    #[serde(
        default,
        deserialize_with = "nonzero::<_, _, { ranges::MAX_AGENTS.1 as u64 }>"
    )]
    max_agents: Option<NonZeroUsize>,
    #[serde(default, deserialize_with = "nonzero::<_, _, { ranges::MAX_STEPS.1 }>")]
    max_steps: Option<NonZeroU64>,
    #[serde(
        default,
        deserialize_with = "nonzero::<_, _, { ranges::MAX_TOKENS.1 }>"
    )]
    max_tokens: Option<NonZeroU64>,
    #[serde(default)]
    max_credits: Option<f64>,
    #[serde(default, deserialize_with = "human_duration")]
    deadline: Option<Duration>,
    #[serde(skip)]
    tools: ToolPolicy,
    #[serde(default)]
    on_budget: Option<OnBudget>,
    /// The config's `[workspace]`, not a limit key.
    #[serde(skip)]
    workspace: Option<crate::workspace::WorkspaceSpec>,
}

/// A duration in the config's words (`"90s"`, `"1h30m"`).
fn human_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|text| arbor_actors::duration::parse(&text).map_err(serde::de::Error::custom))
        .transpose()
}

/// A limit that cannot be zero, read as a count whose zero is refused in
/// the words of its range, `1..=MAX` (the same as [`TreeLimits::problems`]').
/// One helper for every such limit: the field's type picks the integer read
/// (`NonZeroUsize` a `usize`, `NonZeroU64` a `u64`) and the attribute names
/// the range, as in `nonzero::<_, _, { ranges::MAX_AGENTS.1 as u64 }>`.
fn nonzero<'de, D, N, const MAX: u64>(d: D) -> Result<Option<N>, D::Error>
where
    D: Deserializer<'de>,
    N: NonZeroCount,
{
    let Some(value) = Option::<N::Int>::deserialize(d)? else {
        return Ok(None);
    };
    N::new(value)
        .map(Some)
        .ok_or_else(|| serde::de::Error::custom(out_of_range(0, (1, MAX)).unwrap_or_default()))
}

/// A `NonZero*` count and the integer it holds.
trait NonZeroCount: Sized {
    /// The integer it is read as.
    type Int: for<'de> Deserialize<'de>;
    /// `None` for zero.
    fn new(n: Self::Int) -> Option<Self>;
}

impl NonZeroCount for NonZeroUsize {
    type Int = usize;
    fn new(n: usize) -> Option<Self> {
        NonZeroUsize::new(n)
    }
}

impl NonZeroCount for NonZeroU64 {
    type Int = u64;
    fn new(n: u64) -> Option<Self> {
        NonZeroU64::new(n)
    }
}

/// The documented range of each limit (inclusive); config files and start
/// requests are both checked against these, by [`TreeLimits::problems`].
pub(crate) mod ranges {
    use std::time::Duration;

    pub(crate) const MAX_DEPTH: (usize, usize) = (0, 1_000);
    pub(crate) const MAX_CHILDREN_PER_CALL: (usize, usize) = (1, 10_000);
    pub(crate) const MAX_LIVE_AGENTS: (usize, usize) = (1, 1_000_000);
    pub(crate) const MAX_AGENTS: (usize, usize) = (1, 100_000_000);
    pub(crate) const MAX_STEPS: (u64, u64) = (1, 1_000_000_000);
    pub(crate) const MAX_TOKENS: (u64, u64) = (1, 1_000_000_000_000);
    pub(crate) const MAX_CREDITS: (f64, f64) = (0.0, 1e12);
    pub(crate) const DEADLINE: (Duration, Duration) =
        (Duration::from_millis(1), Duration::from_secs(365 * 86_400));
}

impl TreeLimits {
    /// Reads a config file's `[limits]` table (snake_case keys, the deadline
    /// a duration string); unknown keys are refused. Its tool policy is empty.
    pub fn deserialize_config<'de, D: Deserializer<'de>>(d: D) -> Result<TreeLimits, D::Error> {
        ConfigLimits::deserialize(d)
    }

    /// Each limit outside its range, as `(key, problem)` with the config's
    /// snake_case key (`max_agents`); NaN is outside every range. (Zero,
    /// outside the ranges that start at 1, cannot be held: reading refuses it.)
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        fn check<T: PartialOrd + std::fmt::Display + Copy>(
            out: &mut Vec<(&'static str, String)>,
            key: &'static str,
            value: Option<T>,
            (min, max): (T, T),
        ) {
            if let Some(why) = value.and_then(|v| out_of_range(v, (min, max))) {
                out.push((key, why));
            }
        }
        let mut out = Vec::new();
        check(&mut out, "max_depth", self.max_depth, ranges::MAX_DEPTH);
        check(
            &mut out,
            "max_children_per_call",
            self.max_children_per_call.map(NonZeroUsize::get),
            ranges::MAX_CHILDREN_PER_CALL,
        );
        check(
            &mut out,
            "max_live_agents",
            self.max_live_agents.map(NonZeroUsize::get),
            ranges::MAX_LIVE_AGENTS,
        );
        check(
            &mut out,
            "max_agents",
            self.max_agents.map(NonZeroUsize::get),
            ranges::MAX_AGENTS,
        );
        check(
            &mut out,
            "max_steps",
            self.max_steps.map(NonZeroU64::get),
            ranges::MAX_STEPS,
        );
        check(
            &mut out,
            "max_tokens",
            self.max_tokens.map(NonZeroU64::get),
            ranges::MAX_TOKENS,
        );
        check(
            &mut out,
            "max_credits",
            self.max_credits,
            ranges::MAX_CREDITS,
        );
        if let Some(d) = self.deadline
            && !(ranges::DEADLINE.0..=ranges::DEADLINE.1).contains(&d)
        {
            out.push((
                "deadline",
                format!(
                    "must be from {} to {}",
                    arbor_actors::duration::Human(ranges::DEADLINE.0),
                    arbor_actors::duration::Human(ranges::DEADLINE.1)
                ),
            ));
        }
        out
    }

    /// These limits narrowed by `other`'s: each the smaller of the two (one
    /// set on one side only is kept; unlimited on both stays unlimited), and
    /// the tool policy this one's rules then `other`'s. Never loosens.
    pub fn tighten(&self, other: &TreeLimits) -> TreeLimits {
        fn min<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(if b < a { b } else { a }),
                (a, b) => a.or(b),
            }
        }
        TreeLimits {
            max_depth: min(self.max_depth, other.max_depth),
            max_children_per_call: min(self.max_children_per_call, other.max_children_per_call),
            max_live_agents: min(self.max_live_agents, other.max_live_agents),
            max_agents: min(self.max_agents, other.max_agents),
            max_steps: min(self.max_steps, other.max_steps),
            max_tokens: min(self.max_tokens, other.max_tokens),
            max_credits: min(self.max_credits, other.max_credits),
            deadline: min(self.deadline, other.deadline),
            tools: self.tools.clone().with(&other.tools),
            // Not a bound: the request's choice, else this one's.
            on_budget: other.on_budget.or(self.on_budget),
            workspace: match (&self.workspace, &other.workspace) {
                (Some(mine), Some(asked)) => Some(crate::workspace::WorkspaceSpec {
                    root: asked.root.clone(),
                    read_only: mine.read_only || asked.read_only,
                }),
                (mine, asked) => asked.clone().or_else(|| mine.clone()),
            },
        }
    }
}

/// A duration as whole milliseconds in JSON.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&(d.as_millis() as u64)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

/// Budgets raised while a tree runs (semantics §13): each replaces the
/// limit it names.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Raised {
    /// Model steps in the whole tree.
    pub max_steps: Option<u64>,
    /// Tokens in the whole tree.
    pub max_tokens: Option<u64>,
    /// Credits in the whole tree.
    pub max_credits: Option<f64>,
}

impl Raised {
    /// `later` over this: what each names replaces this one's.
    pub fn then(self, later: Raised) -> Raised {
        Raised {
            max_steps: later.max_steps.or(self.max_steps),
            max_tokens: later.max_tokens.or(self.max_tokens),
            max_credits: later.max_credits.or(self.max_credits),
        }
    }

    /// Whether setting `set` and adding `add` (as
    /// `Supervisor::raise_limits` does) can be in force: a step or token
    /// budget is set to at least 1, and every credit amount, set or added,
    /// is finite and not negative. (Raising nothing is asked separately:
    /// [`is_empty`](Self::is_empty).)
    pub fn check_raise(set: &Raised, add: &Raised) -> Result<(), RaiseRefused> {
        let credits = [set.max_credits, add.max_credits];
        if let Some(&amount) = credits
            .iter()
            .flatten()
            .find(|c| !c.is_finite() || **c < 0.0)
        {
            return Err(RaiseRefused::Credits(amount));
        }
        if set.max_steps == Some(0) || set.max_tokens == Some(0) {
            return Err(RaiseRefused::Zero);
        }
        Ok(())
    }

    /// What setting `set` and adding `add` over the budgets `in_force`
    /// (the tree's limits with earlier raises over them) does: the budgets
    /// it changes, as set values (what the journal records), or why it is
    /// refused. A raise only raises: a budget set below the one in force,
    /// or set on a budget the tree does not have (it is unlimited), is
    /// refused, and so is an amount added to a budget the tree does not
    /// have (there is nothing to add to) and a raise that leaves every
    /// budget it names as it was.
    pub fn decide(in_force: Raised, set: Raised, add: Raised) -> Result<Raised, RaiseRefused> {
        Self::check_raise(&set, &add)?;
        let budgets = [
            ("maxSteps", "addSteps", "steps"),
            ("maxTokens", "addTokens", "tokens"),
            ("maxCredits", "addCredits", "credits"),
        ];
        let as_f64 = |r: Raised| {
            [
                r.max_steps.map(|n| n as f64),
                r.max_tokens.map(|n| n as f64),
                r.max_credits,
            ]
        };
        let (now, setting, adding) = (as_f64(in_force), as_f64(set), as_f64(add));
        for (i, (set_key, add_key, what)) in budgets.into_iter().enumerate() {
            match (now[i], setting[i], adding[i]) {
                (None, Some(_), _) | (None, _, Some(_)) => {
                    let key = if setting[i].is_some() {
                        set_key
                    } else {
                        add_key
                    };
                    return Err(RaiseRefused::Unlimited { key, what });
                }
                (Some(current), Some(to), _) if to < current => {
                    return Err(RaiseRefused::Lowers {
                        key: set_key,
                        to,
                        in_force: current,
                    });
                }
                _ => {}
            }
        }
        let after = in_force.then(set).plus(add);
        let changed = Raised {
            max_steps: (set.max_steps.is_some() || add.max_steps.is_some())
                .then_some(after.max_steps)
                .flatten(),
            max_tokens: (set.max_tokens.is_some() || add.max_tokens.is_some())
                .then_some(after.max_tokens)
                .flatten(),
            max_credits: (set.max_credits.is_some() || add.max_credits.is_some())
                .then_some(after.max_credits)
                .flatten(),
        };
        if changed.is_empty() || in_force.then(changed) == in_force {
            return Err(RaiseRefused::Unchanged);
        }
        Ok(changed)
    }

    /// Whether it raises nothing.
    pub fn is_empty(&self) -> bool {
        self.max_steps.is_none() && self.max_tokens.is_none() && self.max_credits.is_none()
    }

    /// These budgets with `more` added to each (a budget with no limit
    /// stays unlimited: there is nothing to add to).
    pub fn plus(self, more: Raised) -> Raised {
        Raised {
            max_steps: self
                .max_steps
                .map(|n| n.saturating_add(more.max_steps.unwrap_or(0))),
            max_tokens: self
                .max_tokens
                .map(|n| n.saturating_add(more.max_tokens.unwrap_or(0))),
            max_credits: self
                .max_credits
                .map(|c| c + more.max_credits.unwrap_or(0.0)),
        }
    }
}

/// Why a raise of a tree's budgets is refused (see [`Raised::check_raise`]).
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RaiseRefused {
    /// A credit amount, set or added, that is negative or not finite (it
    /// holds the amount).
    #[error("maxCredits and addCredits must be finite and not negative")]
    Credits(f64),
    /// A step or token budget set to 0.
    #[error("maxSteps and maxTokens must be at least 1")]
    Zero,
    /// A budget set below the one in force: a raise only raises.
    #[error("{key} {to} would lower the budget in force ({in_force}): a raise only raises")]
    Lowers {
        /// The key that lowers it (`maxCredits`).
        key: &'static str,
        /// The value it asked for.
        to: f64,
        /// The budget in force.
        in_force: f64,
    },
    /// A budget set or added to where the tree has none (it is unlimited).
    #[error("{key}: the tree has no {what} budget (it is unlimited), so there is nothing to raise")]
    Unlimited {
        /// The key (`addSteps`, `maxSteps`).
        key: &'static str,
        /// The budget (`steps`, `tokens`, `credits`).
        what: &'static str,
    },
    /// Every budget named is already at that value (an add of 0, a set to
    /// the value in force).
    #[error("nothing is raised: every budget named is already at that value")]
    Unchanged,
}

/// The running counts of one tree, shared by its agents through the hooks.
pub(crate) struct Budget {
    limits: TreeLimits,
    /// Budgets raised since the tree started (they replace `limits`' own).
    raised: std::sync::RwLock<Raised>,
    agents: AtomicUsize,
    steps: AtomicU64,
    tokens: AtomicU64,
    /// Tokens reserved by model calls in flight.
    reserved: AtomicU64,
    /// Credits in millionths, so they add atomically.
    micro_credits: AtomicU64,
    pub(crate) slots: Option<Arc<Slots>>,
}

impl Budget {
    pub(crate) fn new(limits: TreeLimits) -> Self {
        Budget {
            slots: limits.max_live_agents.map(|n| Slots::new(n.get())),
            limits,
            raised: std::sync::RwLock::new(Raised::default()),
            agents: AtomicUsize::new(1),
            steps: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            micro_credits: AtomicU64::new(0),
        }
    }

    /// Goes on from what a previous run of the tree had spent.
    pub(crate) fn restore(&self, spent: &crate::recovery::Spent) {
        self.agents.store(spent.agents.max(1), Ordering::Relaxed);
        self.steps.store(spent.steps, Ordering::Relaxed);
        self.tokens.store(spent.tokens, Ordering::Relaxed);
        self.micro_credits
            .store((spent.credits * 1e6).round() as u64, Ordering::Relaxed);
    }

    pub(crate) fn limits(&self) -> &TreeLimits {
        &self.limits
    }

    /// Sets the budgets `set` names, then adds `add` to the ones in force;
    /// the agents paused on them can go on. Returns what changed, as the
    /// budgets it set (what a journal records to do the same again).
    /// Puts raises the journal recorded back in force, as they were decided
    /// (a resumed or replayed tree, a look at a stored one's budgets).
    pub(crate) fn restore_raised(&self, raised: Raised) {
        let mut current = self.raised.write_locked();
        *current = current.then(raised);
    }

    /// Refused as [`Raised::decide`] says, under the same lock as the change.
    pub(crate) fn raise(&self, set: Raised, add: Raised) -> Result<Raised, RaiseRefused> {
        let mut current = self.raised.write_locked();
        let changed = Raised::decide(self.in_force(*current), set, add)?;
        *current = current.then(changed);
        Ok(changed)
    }

    fn in_force(&self, raised: Raised) -> Raised {
        Raised {
            max_steps: raised
                .max_steps
                .or(self.limits.max_steps.map(NonZeroU64::get)),
            max_tokens: raised
                .max_tokens
                .or(self.limits.max_tokens.map(NonZeroU64::get)),
            max_credits: raised.max_credits.or(self.limits.max_credits),
        }
    }

    /// The budgets in force: the tree's limits with the raised ones over them.
    pub(crate) fn budgets(&self) -> Raised {
        self.in_force(*self.raised.read_locked())
    }

    /// Whether a spent budget pauses the tree's agents instead of failing them.
    pub(crate) fn pauses(&self) -> bool {
        self.limits.on_budget == Some(OnBudget::Pause)
    }

    pub(crate) fn admit_child(&self, parent_depth: usize, index: usize) -> Result<(), LimitHit> {
        if let Some(max) = self.limits.max_depth
            && parent_depth + 1 > max
        {
            return Err(LimitHit::new(
                Limit::MaxDepth,
                format!("a child at depth {} is deeper than {max}", parent_depth + 1),
            ));
        }
        if let Some(max) = self.limits.max_children_per_call
            && index >= max.get()
        {
            return Err(LimitHit::new(
                Limit::MaxChildrenPerCall,
                format!("child {} of one call is more than {max}", index + 1),
            ));
        }
        let Some(max) = self.limits.max_agents.map(NonZeroUsize::get) else {
            self.agents.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        self.agents
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|_| {
                LimitHit::new(
                    Limit::MaxAgents,
                    format!("the tree already has {max} agents"),
                )
            })
    }

    /// Admits one model step of about `estimate` tokens: reserves them against the
    /// token budget (so concurrent calls cannot all overshoot it), checks the cost
    /// budget, and counts the step.
    pub(crate) fn admit_step(&self, estimate: u64) -> Result<(), LimitHit> {
        let Raised {
            max_steps,
            max_tokens,
            max_credits,
        } = self.budgets();
        if let Some(max) = max_credits {
            let used = self.credits();
            if used >= max {
                return Err(LimitHit::new(
                    Limit::CostBudget,
                    format!("{used:.4} of {max} credits used"),
                ));
            }
        }
        if let Some(max) = max_tokens {
            let used = self.tokens.load(Ordering::Acquire);
            self.reserved
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |reserved| {
                    (used + reserved + estimate <= max).then_some(reserved + estimate)
                })
                .map_err(|reserved| {
                    LimitHit::new(
                        Limit::TokenBudget,
                        format!(
                            "{used} of {max} tokens used, {reserved} reserved by calls in flight, \
                             this call needs about {estimate}"
                        ),
                    )
                })?;
        }
        let Some(max) = max_steps else {
            self.steps.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        self.steps
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|_| {
                self.release(estimate);
                LimitHit::new(
                    Limit::MaxSteps,
                    format!("the tree already took {max} steps"),
                )
            })
    }

    /// Settles a call that reserved `reserved` tokens and used `usage`.
    pub(crate) fn settle(&self, usage: &Usage, reserved: u64) {
        self.release(reserved);
        self.tokens
            .fetch_add(usage.total_tokens(), Ordering::AcqRel);
        let micro = (usage.cost.max(0.0) * 1e6).round() as u64;
        self.micro_credits.fetch_add(micro, Ordering::AcqRel);
    }

    fn release(&self, reserved: u64) {
        if self.budgets().max_tokens.is_some() && reserved > 0 {
            let _ = self
                .reserved
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                    Some(r.saturating_sub(reserved))
                });
        }
    }

    pub(crate) fn agents(&self) -> usize {
        self.agents.load(Ordering::Acquire)
    }

    pub(crate) fn steps(&self) -> u64 {
        self.steps.load(Ordering::Acquire)
    }

    pub(crate) fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Acquire)
    }

    pub(crate) fn credits(&self) -> f64 {
        self.micro_credits.load(Ordering::Acquire) as f64 / 1e6
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn raised(steps: Option<u64>, tokens: Option<u64>, credits: Option<f64>) -> Raised {
        Raised {
            max_steps: steps,
            max_tokens: tokens,
            max_credits: credits,
        }
    }

    /// Issue 34: a raise only raises. `{"maxCredits": 0.5}` over 1.0 and
    /// `{"addSteps": 10}` on a tree with no step budget were answered 200.
    #[test]
    fn a_raise_that_lowers_a_budget_or_adds_to_an_unlimited_one_is_refused() {
        let none = Raised::default();
        let in_force = raised(None, Some(1000), Some(1.0));
        let decide = |set, add| Raised::decide(in_force, set, add);
        assert_eq!(
            decide(raised(None, None, Some(0.5)), none),
            Err(RaiseRefused::Lowers {
                key: "maxCredits",
                to: 0.5,
                in_force: 1.0
            })
        );
        assert_eq!(
            decide(none, raised(Some(10), None, None)),
            Err(RaiseRefused::Unlimited {
                key: "addSteps",
                what: "steps"
            })
        );
        assert_eq!(
            decide(raised(Some(10), None, None), none),
            Err(RaiseRefused::Unlimited {
                key: "maxSteps",
                what: "steps"
            })
        );
        assert_eq!(
            decide(
                raised(None, Some(1000), None),
                raised(None, None, Some(0.0))
            ),
            Err(RaiseRefused::Unchanged)
        );
        // What does raise: the budgets it changes, as set values.
        assert_eq!(
            decide(raised(None, None, Some(2.0)), raised(None, Some(500), None)),
            Ok(raised(None, Some(1500), Some(2.0)))
        );
        assert_eq!(
            decide(none, raised(None, None, Some(0.25))),
            Ok(raised(None, None, Some(1.25)))
        );
    }

    #[test]
    fn a_raise_sets_budgets_of_at_least_one_and_credits_that_are_finite_and_not_negative() {
        let none = Raised::default();
        let check = Raised::check_raise;
        assert_eq!(check(&raised(Some(1), Some(1), Some(0.0)), &none), Ok(()));
        assert_eq!(check(&none, &raised(Some(0), Some(0), Some(0.0))), Ok(()));
        assert_eq!(check(&none, &raised(None, None, Some(2.5))), Ok(()));
        assert_eq!(check(&none, &none), Ok(()));
        assert_eq!(
            check(&raised(Some(0), None, None), &none),
            Err(RaiseRefused::Zero)
        );
        assert_eq!(
            check(&raised(None, Some(0), None), &none),
            Err(RaiseRefused::Zero)
        );
        assert_eq!(
            check(&raised(None, None, Some(-1.0)), &none),
            Err(RaiseRefused::Credits(-1.0))
        );
        assert_eq!(
            check(&none, &raised(None, None, Some(-0.5))),
            Err(RaiseRefused::Credits(-0.5))
        );
        assert_eq!(
            check(&none, &raised(None, None, Some(f64::INFINITY))),
            Err(RaiseRefused::Credits(f64::INFINITY))
        );
        assert!(matches!(
            check(&raised(None, None, Some(f64::NAN)), &none),
            Err(RaiseRefused::Credits(c)) if c.is_nan()
        ));
        // The credit amount is named before a zero budget.
        assert!(matches!(
            check(&raised(Some(0), None, Some(f64::NAN)), &none),
            Err(RaiseRefused::Credits(_))
        ));
    }

    #[test]
    fn depth_children_and_total_refuse_cleanly() {
        let b = Budget::new(TreeLimits {
            max_depth: Some(2),
            max_children_per_call: NonZeroUsize::new(3),
            max_agents: NonZeroUsize::new(3),
            ..TreeLimits::default()
        });
        assert_eq!(b.admit_child(2, 0).unwrap_err().limit, Limit::MaxDepth);
        assert_eq!(
            b.admit_child(0, 3).unwrap_err().limit,
            Limit::MaxChildrenPerCall
        );
        assert!(b.admit_child(0, 0).is_ok());
        assert!(b.admit_child(0, 1).is_ok());
        let hit = b.admit_child(0, 2).unwrap_err();
        assert_eq!(hit.limit, Limit::MaxAgents);
        assert_eq!(
            hit.to_string(),
            "limit max_agents reached: the tree already has 3 agents"
        );
        assert_eq!(b.agents(), 3);
    }

    #[test]
    fn both_spellings_read_one_type_and_refuse_zero_in_the_range_words() {
        let api: TreeLimits =
            serde_json::from_str(r#"{"maxAgents": 5, "deadlineMs": 1500, "maxDepth": 0}"#).unwrap();
        let config = TreeLimits::deserialize_config(serde_json::json!({
            "max_agents": 5, "deadline": "1.5s", "max_depth": 0
        }))
        .unwrap();
        assert_eq!(api, config);
        assert_eq!(api.max_agents, NonZeroUsize::new(5));
        assert_eq!(api.deadline, Some(Duration::from_millis(1500)));
        let zero = serde_json::from_str::<TreeLimits>(r#"{"maxAgents": 0}"#).unwrap_err();
        assert!(
            zero.to_string()
                .starts_with("0 is out of range: must be from 1 to 100000000"),
            "{zero}"
        );
        let zero = TreeLimits::deserialize_config(serde_json::json!({"max_live_agents": 0}));
        assert!(zero.is_err());
        // The file's keys only: no camelCase, no tool policy.
        assert!(TreeLimits::deserialize_config(serde_json::json!({"maxAgents": 5})).is_err());
        assert!(TreeLimits::deserialize_config(serde_json::json!({"tools": []})).is_err());
        // The upper ends are problems, by the config's key.
        let big =
            TreeLimits::deserialize_config(serde_json::json!({"max_agents": 100_000_001})).unwrap();
        assert_eq!(big.problems()[0].0, "max_agents");
    }

    #[test]
    fn tighten_keeps_the_smaller_of_each_and_never_loosens() {
        let server = TreeLimits {
            max_depth: Some(3),
            max_agents: NonZeroUsize::new(100),
            deadline: Some(Duration::from_secs(60)),
            ..TreeLimits::default()
        };
        let asked = TreeLimits {
            max_depth: Some(5),
            max_agents: NonZeroUsize::new(10),
            max_steps: NonZeroU64::new(7),
            ..TreeLimits::default()
        };
        let both = server.tighten(&asked);
        assert_eq!(both.max_depth, Some(3));
        assert_eq!(both.max_agents, NonZeroUsize::new(10));
        assert_eq!(both.max_steps, NonZeroU64::new(7));
        assert_eq!(both.deadline, Some(Duration::from_secs(60)));
        assert_eq!(both.max_tokens, None);
        assert_eq!(asked.tighten(&server), both);
    }

    #[test]
    fn steps_tokens_and_credits_are_budgets() {
        let b = Budget::new(TreeLimits {
            max_steps: NonZeroU64::new(2),
            max_tokens: NonZeroU64::new(100),
            ..TreeLimits::default()
        });
        assert!(b.admit_step(10).is_ok());
        // Reserved tokens count against the budget while the call is in flight.
        let hit = b.admit_step(95).unwrap_err();
        assert_eq!(hit.limit, Limit::TokenBudget);
        assert!(hit.detail.contains("10 reserved"), "{}", hit.detail);
        b.settle(
            &Usage {
                input_tokens: 60,
                output_tokens: 50,
                cost: 0.25,
                ..Usage::default()
            },
            10,
        );
        assert_eq!(b.admit_step(1).unwrap_err().limit, Limit::TokenBudget);
        assert_eq!(b.credits(), 0.25);

        let b = Budget::new(TreeLimits {
            max_steps: NonZeroU64::new(1),
            ..TreeLimits::default()
        });
        assert!(b.admit_step(0).is_ok());
        assert_eq!(b.admit_step(0).unwrap_err().limit, Limit::MaxSteps);
        assert_eq!(b.steps(), 1);
    }
}
