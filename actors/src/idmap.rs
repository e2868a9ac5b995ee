//! Maps and sets keyed by what a tree makes itself (run ids, actor ids, child
//! keys), hashed with foldhash, seeded per map, instead of std's SipHash:
//! SipHash was ~11 % of a deep load-test tree's instructions (callgrind on
//! `arbor loadtest --fanout 10 --depth 4 --history 100 --no-store`,
//! issue 17). Their keys are not chosen by whoever sends a request, so the
//! per-map seed is all the flooding resistance they need.

use std::collections::{HashMap, HashSet};

/// The hasher of [`IdMap`] and [`IdSet`].
pub type IdHasher = foldhash::fast::RandomState;

/// A `HashMap` keyed by ids (`IdMap::default()` makes one).
pub type IdMap<K, V> = HashMap<K, V, IdHasher>;

/// A `HashSet` of ids (`IdSet::default()` makes one).
pub type IdSet<K> = HashSet<K, IdHasher>;
