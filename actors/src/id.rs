//! Tree and run identities, and their arithmetic, in one place.
//!
//! A tree id is `t` and the 32 lowercase hex digits of a UUIDv7 when Arbor
//! picks it (128 bits, time-ordered: see [`TreeId::generate`]; builds before
//! issue 33 picked `t` and 12 hex digits, and those ids still read and
//! resume); a caller may pick its own, of 1 to 128 letters, digits, `-`,
//! `_`, `.` or `:` (never the `/` that run ids use as the separator). Every
//! such id is safe in a URL path segment and a file name as it is. A run id is `TREE/PATH`: the root
//! is `T/0`, the `n`-th child a run spawns is its run id plus `.n`, and attempt
//! `a > 0` of a run (a retry) appends `~a` to its last step: `T/0.1~1` is the
//! second attempt of the root's child 1, and `T/0.1~1.0` that attempt's first
//! child. The agent id of a run is its run id without the last attempt, shared
//! by every attempt. Both serialise as today's strings (semantics §2).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Ids of a new run, as the state carries them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunIds {
    /// The agent's id, the same for all its attempts.
    pub agent_id: AgentId,
    /// This attempt's run id.
    pub run_id: RunId,
}

impl RunIds {
    /// The ids of `run`: its agent id ([`RunId::agent_id`]) and itself.
    pub fn of(run: RunId) -> Self {
        RunIds {
            agent_id: run.agent_id(),
            run_id: run,
        }
    }
}

/// What is wrong with a text given as a tree or run id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Not a tree id (the text as given).
    #[error("tree id {0:?} is not valid: use 1 to 128 letters, digits, '-', '_', '.' or ':'")]
    Tree(String),
    #[error(
        "a run id is TREE/PATH, PATH being numbers joined by '.', each with an optional \
         ~ATTEMPT, and starting at 0 (e.g. t1/0.2~1); got {0:?}"
    )]
    /// Not a run id (the text as given).
    Run(String),
}

/// The id of a spawn tree.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TreeId(Arc<str>);

impl TreeId {
    /// A fresh tree id: `t` and the 32 lowercase hex digits of a UUIDv7
    /// (RFC 9562), e.g. `t019af3c2e5a17c3e8b5d2f4a6c8e0b13`. The first 12
    /// digits are the Unix time in milliseconds, so ids sort as they were
    /// made (strictly, within a process: the `uuid` crate counts within a
    /// millisecond); the other bits are a counter seeded at random each
    /// millisecond and random bits, so replicas sharing one database do not
    /// collide (48 random bits did: issue 33). The one generator of tree ids.
    pub fn generate() -> Self {
        TreeId(format!("t{}", uuid::Uuid::now_v7().simple()).into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as shared text (cloned without copying).
    pub fn as_arc(&self) -> &Arc<str> {
        &self.0
    }

    /// The root run of this tree, `T/0`.
    pub fn root(&self) -> RunId {
        RunId {
            tree: self.clone(),
            path: Arc::new([Step {
                ordinal: 0,
                attempt: 0,
            }]),
        }
    }
}

impl FromStr for TreeId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, IdError> {
        if s.is_empty()
            || s.len() > 128
            || !s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
        {
            return Err(IdError::Tree(s.to_owned()));
        }
        Ok(TreeId(s.into()))
    }
}

impl std::ops::Deref for TreeId {
    type Target = str;

    /// A tree id is text: it reads as one wherever text is asked for.
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for TreeId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TreeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl From<TreeId> for String {
    fn from(id: TreeId) -> String {
        id.0.to_string()
    }
}

/// One step of a run's path: the ordinal among its parent's children (0 for
/// the root) and the attempt (0 for the first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Step {
    /// The ordinal among the parent's children, counted over the parent's run.
    pub ordinal: u32,
    /// 0 for the first attempt, n for the n-th retry.
    pub attempt: u32,
}

/// The id of one attempt of one run of a tree.
///
/// Shared: a clone counts two references and copies nothing (a run id is
/// cloned into every event and every child's lineage), and a child's id is
/// one allocation, its path.
///
/// Ordered as [`sort_key`](Self::sort_key): by tree, then in spawn order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId {
    tree: TreeId,
    /// Never empty; the first step is the root (`0`).
    path: Arc<[Step]>,
}

impl RunId {
    /// The tree the run belongs to.
    pub fn tree(&self) -> &TreeId {
        &self.tree
    }

    /// The spawn path from the root (never empty; the root's step first).
    pub fn path(&self) -> &[Step] {
        &self.path
    }

    /// The attempt of this run (0 for the first).
    pub fn attempt(&self) -> u32 {
        self.path.last().map_or(0, |s| s.attempt)
    }

    /// The first attempt of the `ordinal`-th child this run spawns.
    pub fn child(&self, ordinal: u32) -> RunId {
        let step = Step {
            ordinal,
            attempt: 0,
        };
        RunId {
            tree: self.tree.clone(),
            path: self.path.iter().copied().chain([step]).collect(),
        }
    }

    /// The run id of the parent attempt that spawned this run (`T/0.2~1`
    /// for `T/0.2~1.3`); `None` for a root.
    pub fn parent(&self) -> Option<RunId> {
        let (_, above) = self.path.split_last()?;
        (!above.is_empty()).then(|| RunId {
            tree: self.tree.clone(),
            path: above.into(),
        })
    }

    /// Attempt `attempt` of the same run (0 is the first).
    pub fn retry(&self, attempt: u32) -> RunId {
        if self.attempt() == attempt {
            return self.clone();
        }
        let last = self.path.len() - 1;
        let path = self.path.iter().enumerate().map(|(i, step)| Step {
            ordinal: step.ordinal,
            attempt: if i == last { attempt } else { step.attempt },
        });
        RunId {
            tree: self.tree.clone(),
            path: path.collect(),
        }
    }

    /// The root of the run's turn: `T/0` for a run of the first turn, `T/0~n`
    /// for one of a follow-up turn (the first step of its path).
    pub fn turn_root(&self) -> RunId {
        if self.path.len() == 1 {
            return self.clone();
        }
        RunId {
            tree: self.tree.clone(),
            path: self.path[..1].into(),
        }
    }

    /// Whether `run` is an attempt of this run (this one or any other):
    /// the same path but for the last step's attempt.
    pub fn has_attempt(&self, run: &RunId) -> bool {
        match (self.path.split_last(), run.path.split_last()) {
            (Some((mine, above)), Some((theirs, run_above))) => {
                self.tree == run.tree && above == run_above && mine.ordinal == theirs.ordinal
            }
            _ => false,
        }
    }

    /// The agent id: this run id without its last attempt, shared by every
    /// attempt of the run.
    pub fn agent_id(&self) -> AgentId {
        AgentId(self.retry(0))
    }

    /// Whether this run is `ancestor` or runs below it (any attempt of its
    /// children counts; an other attempt of `ancestor` itself does not).
    pub fn is_within(&self, ancestor: &RunId) -> bool {
        self.tree == ancestor.tree && self.path.starts_with(&ancestor.path)
    }

    /// Numbers in spawn order, for sorting siblings as spawned (`0.2` before
    /// `0.10`, attempt 0 before attempt 1).
    pub fn sort_key(&self) -> impl Ord + '_ {
        (&self.tree, &self.path)
    }
}

impl FromStr for RunId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, IdError> {
        let bad = || IdError::Run(s.to_owned());
        let (tree, path) = s.split_once('/').ok_or_else(bad)?;
        let tree = TreeId::from_str(tree).map_err(|_| bad())?;
        let number = |text: &str| -> Result<u32, IdError> {
            // Canonical digits only, so that one run has one spelling.
            if text.is_empty()
                || !text.bytes().all(|b| b.is_ascii_digit())
                || (text.len() > 1 && text.starts_with('0'))
            {
                return Err(bad());
            }
            text.parse().map_err(|_| bad())
        };
        let path = path
            .split('.')
            .map(|part| {
                let (ordinal, attempt) = match part.split_once('~') {
                    Some((n, a)) => (number(n)?, number(a)?),
                    None => (number(part)?, 0),
                };
                if attempt == 0 && part.contains('~') {
                    return Err(bad());
                }
                Ok(Step { ordinal, attempt })
            })
            .collect::<Result<Arc<[Step]>, _>>()?;
        if path.first().map(|s| s.ordinal) != Some(0) {
            return Err(bad());
        }
        Ok(RunId { tree, path })
    }
}

impl RunId {
    /// The path alone, without the tree id and its `/` (`0.3~1.2` for
    /// `T/0.3~1.2`), for showing ids of one tree: printed, it is the text of
    /// the id after `TREE/`.
    pub fn path_text(&self) -> PathText<'_> {
        PathText(self)
    }

    /// Hands the id's text (`T/0.3~1.2`) to `put` in pieces, digits by
    /// hand: the formatter's integer path was ~4 % of a deep tree's CPU
    /// (issue 17).
    fn write_pieces(&self, put: impl FnMut(&[u8]) -> fmt::Result) -> fmt::Result {
        self.write_from(true, put)
    }

    /// [`write_pieces`](Self::write_pieces), with the tree's `TREE/` or without.
    fn write_from(
        &self,
        with_tree: bool,
        mut put: impl FnMut(&[u8]) -> fmt::Result,
    ) -> fmt::Result {
        fn digits(buf: &mut [u8; 10], mut n: u32) -> &[u8] {
            let mut at = buf.len();
            loop {
                at -= 1;
                buf[at] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            &buf[at..]
        }
        let mut buf = [0u8; 10];
        if with_tree {
            put(self.tree.0.as_bytes())?;
            put(b"/")?;
        }
        for (i, step) in self.path.iter().enumerate() {
            if i > 0 {
                put(b".")?;
            }
            put(digits(&mut buf, step.ordinal))?;
            if step.attempt > 0 {
                put(b"~")?;
                put(digits(&mut buf, step.attempt))?;
            }
        }
        Ok(())
    }
}

/// A run id's text on the stack, for [`RunId`]'s `Display`: filled piece by
/// piece, handed on in one. Refuses (`fmt::Error`) what does not fit.
struct IdText {
    buf: [u8; IdText::CAPACITY],
    len: usize,
}

/// Pieces of a run id's text as a `str` (they are ASCII or the tree id's
/// text, so this never fails).
fn text(bytes: &[u8]) -> Result<&str, fmt::Error> {
    std::str::from_utf8(bytes).map_err(|_| fmt::Error)
}

impl IdText {
    /// Room for a tree id and a path ~15 levels deep.
    const CAPACITY: usize = 256;

    fn push(&mut self, bytes: &[u8]) -> fmt::Result {
        let end = self.len + bytes.len();
        self.buf
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(bytes);
        self.len = end;
        Ok(())
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // In one piece: a `to_string` then allocates once, at the id's size.
        // Written piece by piece it grew its string three or four times, and
        // printing was ~1,300 instructions a run id, 6 % of a deep tree's
        // (callgrind, issue 17). An id too long for the stack goes piece by
        // piece. The pieces are ASCII digits and punctuation and the tree
        // id's text, so they read back as UTF-8.
        let mut id = IdText {
            buf: [0; IdText::CAPACITY],
            len: 0,
        };
        match self.write_pieces(|bytes| id.push(bytes)) {
            Ok(()) => f.write_str(text(&id.buf[..id.len])?),
            Err(_) => self.write_pieces(|bytes| f.write_str(text(bytes)?)),
        }
    }
}

/// A run id's path, printed without its tree ([`RunId::path_text`]).
#[derive(Clone, Copy, Debug)]
pub struct PathText<'a>(&'a RunId);

impl fmt::Display for PathText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.write_from(false, |bytes| f.write_str(text(bytes)?))
    }
}

/// [`RunId::is_within`] on the printed ids, without reading them: whether
/// `candidate` is `run` or runs below it. (For filtering many events by one
/// run; both are taken to be run ids.)
pub fn is_within(candidate: &str, run: &str) -> bool {
    candidate == run
        || (candidate.len() > run.len()
            && candidate.starts_with(run)
            && candidate.as_bytes()[run.len()] == b'.')
}

macro_rules! as_string {
    ($ty:ty) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

as_string!(TreeId);
as_string!(RunId);
as_string!(AgentId);

/// The id of an agent: a run id without its last attempt, shared by every
/// attempt of the run (`T/0.2` for `T/0.2~1`), printed and serialised as
/// that run id. The first attempt's run id is the agent id itself.
///
/// Read from text, any run id is an agent id: a stored id is taken as it
/// was written.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentId(RunId);

impl AgentId {
    /// `run`'s text as an agent id, as it is: for an id given or read back
    /// (an agent id a store kept may end in an attempt of its own, and keeps
    /// it). The agent a run belongs to is [`RunId::agent_id`].
    pub fn from_run(run: RunId) -> AgentId {
        AgentId(run)
    }

    /// The agent id as the run id of its first attempt.
    pub fn as_run(&self) -> &RunId {
        &self.0
    }

    /// The tree the agent belongs to.
    pub fn tree(&self) -> &TreeId {
        self.0.tree()
    }

    /// Attempt `attempt` of the agent's run (0 is the first).
    pub fn attempt(&self, attempt: u32) -> RunId {
        self.0.retry(attempt)
    }

    /// Whether `run` is an attempt of this agent.
    pub fn has_attempt(&self, run: &RunId) -> bool {
        self.0.has_attempt(run)
    }
}

impl From<AgentId> for RunId {
    fn from(id: AgentId) -> RunId {
        id.0
    }
}

impl FromStr for AgentId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, IdError> {
        s.parse().map(AgentId)
    }
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl RunId {
    /// Whether the id's text is `text`, without printing it.
    fn is_text(&self, text: &str) -> bool {
        let mut rest = text.as_bytes();
        self.write_pieces(|piece| match rest.strip_prefix(piece) {
            Some(after) => {
                rest = after;
                Ok(())
            }
            None => Err(fmt::Error),
        })
        .is_ok()
            && rest.is_empty()
    }
}

/// Comparisons with the ids' text (`run_id == "t1/0.2"`), without printing
/// or reading either.
macro_rules! eq_text {
    ($ty:ty, $this:ident => $test:expr) => {
        impl PartialEq<str> for $ty {
            fn eq(&self, text: &str) -> bool {
                let $this = (self, text);
                $test
            }
        }

        impl PartialEq<&str> for $ty {
            fn eq(&self, text: &&str) -> bool {
                self == *text
            }
        }

        impl PartialEq<String> for $ty {
            fn eq(&self, text: &String) -> bool {
                self == text.as_str()
            }
        }
    };
}

eq_text!(TreeId, pair => pair.0.as_str() == pair.1);
eq_text!(RunId, pair => pair.0.is_text(pair.1));
eq_text!(AgentId, pair => pair.0.0.is_text(pair.1));

impl PartialEq<RunId> for AgentId {
    fn eq(&self, run: &RunId) -> bool {
        self.0 == *run
    }
}

impl PartialEq<AgentId> for RunId {
    fn eq(&self, agent: &AgentId) -> bool {
        *self == agent.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(s: &str) -> RunId {
        s.parse().unwrap()
    }

    #[test]
    fn a_run_has_every_attempt_of_its_own_path_and_no_other() {
        let agent = run("t1/0.1.2");
        for yes in ["t1/0.1.2", "t1/0.1.2~3"] {
            assert!(agent.has_attempt(&run(yes)), "{yes}");
            assert!(run(yes).has_attempt(&agent), "{yes}");
        }
        for no in ["t1/0.1", "t1/0.1.3", "t1/0.1~1.2", "t1/0.1.2.0", "t2/0.1.2"] {
            assert!(!agent.has_attempt(&run(no)), "{no}");
        }
    }

    #[test]
    fn run_ids_read_and_print_the_same() {
        for s in [
            "t1/0",
            "t1/0.2",
            "t1/0.1~1",
            "t1/0.1~1.0",
            "tabc/0.10.2~3",
            "t1/0.4294967295~4294967295.9.10.99~100",
        ] {
            assert_eq!(run(s).to_string(), s);
        }
    }

    /// An id longer than `Display`'s stack text (a 128-character tree id
    /// and a deep path) prints piece by piece, the same.
    #[test]
    fn a_run_id_too_long_for_the_stack_prints_whole() {
        let tree = "t".repeat(128);
        let path: Vec<String> = (0..40).map(|i| format!("{}~{}", i + 1, i + 2)).collect();
        let long = format!("{tree}/0.{}", path.join("."));
        assert!(long.len() > IdText::CAPACITY, "{}", long.len());
        assert_eq!(run(&long).to_string(), long);
        assert_eq!(format!("[{}]", run(&long)), format!("[{long}]"));
    }

    #[test]
    fn run_ids_that_are_not_canonical_are_refused_with_the_expected_form() {
        for s in [
            "", "t1", "/0", "t1/", "t1/1", "t1/0.", "t1/0..1", "t1/0.x", "t1/0.01", "t1/0~0",
            "t1/0.1~", "t1/0.-1", "a/b/0",
        ] {
            let err = s.parse::<RunId>().unwrap_err();
            assert!(err.to_string().contains("TREE/PATH"), "{s:?}: {err}");
        }
    }

    #[test]
    fn the_turn_root_is_the_first_step_of_the_path() {
        for (s, root) in [
            ("t1/0", "t1/0"),
            ("t1/0.2.1~1", "t1/0"),
            ("t1/0~2", "t1/0~2"),
            ("t1/0~2.3~1.0", "t1/0~2"),
        ] {
            assert_eq!(run(s).turn_root(), run(root), "{s}");
        }
    }

    #[test]
    fn children_and_retries_follow_the_run_id_arithmetic() {
        let root = TreeId::from_str("t1").unwrap().root();
        assert_eq!(root.to_string(), "t1/0");
        let child = root.child(1);
        assert_eq!(child.to_string(), "t1/0.1");
        let retried = child.retry(1);
        assert_eq!(retried.to_string(), "t1/0.1~1");
        assert_eq!(retried.attempt(), 1);
        assert_eq!(retried.child(0).to_string(), "t1/0.1~1.0");
        assert_eq!(retried.agent_id(), child);
        assert_eq!(retried.agent_id().attempt(1), retried);
        assert_eq!(retried.child(0).agent_id().to_string(), "t1/0.1~1.0");
    }

    #[test]
    fn a_run_is_within_itself_and_its_ancestors_only() {
        assert!(run("t/0").is_within(&run("t/0")));
        assert!(run("t/0.1.2").is_within(&run("t/0")));
        assert!(run("t/0.1~1.2").is_within(&run("t/0.1~1")));
        assert!(!run("t/0.1~1.2").is_within(&run("t/0.1")));
        assert!(!run("t/0").is_within(&run("t/0.1")));
        assert!(!run("u/0.1").is_within(&run("t/0")));
        assert!(!run("t/0.10").is_within(&run("t/0.1")));
    }

    #[test]
    fn the_text_form_of_is_within_agrees_with_the_typed_one() {
        let ids = [
            "t/0",
            "t/0.1",
            "t/0.1~1",
            "t/0.1~12",
            "t/0.1.2",
            "t/0.1~1.2",
            "t/0.10",
            "t/0.1.3~1",
            "u/0.1",
        ];
        for a in ids {
            for b in ids {
                assert_eq!(is_within(a, b), run(a).is_within(&run(b)), "{a} within {b}");
            }
        }
    }

    #[test]
    fn siblings_sort_in_spawn_order() {
        let mut ids = [run("t/0.10"), run("t/0.2~1"), run("t/0.2"), run("t/0")];
        ids.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
        let printed: Vec<String> = ids.iter().map(ToString::to_string).collect();
        assert_eq!(printed, ["t/0", "t/0.2", "t/0.2~1", "t/0.10"]);
    }

    #[test]
    fn ids_serialise_as_their_strings() {
        let id = run("t/0.1~2");
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"t/0.1~2\"");
        let back: RunId = serde_json::from_str("\"t/0.1~2\"").unwrap();
        assert_eq!(back, id);
        assert!(serde_json::from_str::<RunId>("\"nope\"").is_err());
        let tree: TreeId = serde_json::from_str("\"t9\"").unwrap();
        assert_eq!(tree.as_str(), "t9");
    }

    /// Issue 33: generated tree ids had 48 random bits, and replicas share
    /// one database. Now each is `t` and a UUIDv7's 32 hex digits (version 7,
    /// RFC variant), made from many threads at once they all differ, and in
    /// one thread they sort (as text) in the order they were made.
    #[test]
    fn tree_ids_carry_128_bits_and_are_time_ordered() {
        let made: Vec<Vec<TreeId>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..5_000).map(|_| TreeId::generate()).collect()))
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut seen = std::collections::HashSet::new();
        for ids in &made {
            for pair in ids.windows(2) {
                assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
            }
            for id in ids {
                let s = id.as_str();
                assert_eq!(s.len(), 33, "{s}");
                assert!(s.starts_with('t'), "{s}");
                assert!(
                    s[1..]
                        .bytes()
                        .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
                    "{s}"
                );
                let uuid = uuid::Uuid::parse_str(&s[1..]).unwrap();
                assert_eq!(uuid.get_version_num(), 7, "{s}");
                assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122, "{s}");
                assert!(uuid.get_timestamp().is_some(), "{s}");
                assert!(seen.insert(id.clone()), "{s} made twice");
                // It reads back, as a tree id and in a run id.
                assert_eq!(&s.parse::<TreeId>().unwrap(), id);
                let run = format!("{s}/0.1~2.0");
                assert_eq!(run.parse::<RunId>().unwrap().to_string(), run);
            }
        }
        assert_eq!(seen.len(), 20_000);
    }

    /// Ids made by the builds before issue 33 (`t` and 12 hex digits) and
    /// ids a caller picked still read, as tree ids and in run ids.
    #[test]
    fn tree_ids_of_the_old_format_still_read() {
        for tree in [
            "t1c2a3b4c5d6e",
            "t000000000000",
            "before13",
            "my-tree:2.a_b",
        ] {
            assert_eq!(tree.parse::<TreeId>().unwrap().as_str(), tree);
            let run = format!("{tree}/0~1.3~2");
            let id = run.parse::<RunId>().unwrap();
            assert_eq!(id.tree().as_str(), tree);
            assert_eq!(id.to_string(), run);
        }
    }
}
