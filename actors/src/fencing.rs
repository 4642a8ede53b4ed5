//! Incarnations and fencing (FENCE-1): every message carries its sender's incarnation number, and a receiver
//! keeps, per node, the highest incarnation it has seen so that nothing from an older incarnation
//! changes state.
//!
//! This module owns the pure [`FencingTable`]; it never does IO and never reads a clock.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

use bincode::{Decode, Encode};

/// The incarnation number of a node: a restarted process comes back with a higher incarnation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub struct IncarnationId(pub u64);

impl IncarnationId {
    /// The incarnation that follows this one.
    pub fn next(self) -> IncarnationId {
        IncarnationId(self.0.saturating_add(1))
    }
}

impl fmt::Display for IncarnationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "incarnation {}", self.0)
    }
}

/// One life of one node: the node's identity and the incarnation of this life.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Encode, Decode)]
pub struct Incarnation<N> {
    /// The node.
    pub node: N,
    /// Which life of the node.
    pub incarnation: IncarnationId,
}

impl<N> Incarnation<N> {
    /// Incarnation `incarnation` of `node`.
    pub fn new(node: N, incarnation: IncarnationId) -> Self {
        Self { node, incarnation }
    }
}

impl<N: fmt::Display> fmt::Display for Incarnation<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.node, self.incarnation)
    }
}

/// What the table learnt from an admitted incarnation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission<N> {
    /// The first incarnation seen of this node.
    New,
    /// The incarnation already current for this node.
    Current,
    /// A newer incarnation: the previous one is gone, and everything from it is stale from now on.
    Superseded {
        /// The incarnation that this one replaces.
        old: Incarnation<N>,
    },
}

/// Why an incarnation was refused (FENCE-1).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    /// A newer incarnation of the node has already been seen.
    #[error("stale incarnation: {seen} was seen before, this message comes from {claimed}")]
    Superseded {
        /// The incarnation the message claimed.
        claimed: IncarnationId,
        /// The highest incarnation seen of that node.
        seen: IncarnationId,
    },
    /// This incarnation was declared dead (fenced) and may not come back.
    #[error(
        "stale incarnation: {claimed} was fenced (declared dead); only a newer incarnation is accepted"
    )]
    Fenced {
        /// The incarnation the message claimed, which was fenced.
        claimed: IncarnationId,
    },
}

/// The highest incarnation seen per node, and which of those incarnations were declared dead.
///
/// Calling protocol:
/// 1. For each incoming message, call [`FencingTable::admit`] with the sender's incarnation
///    before the message may change any state. `Err(Stale)` means drop the message (FENCE-1).
/// 2. On `Ok(Admission::Superseded { old })`, treat `old` as gone: cancel what it owned.
/// 3. When a failure detector declares an incarnation dead, call [`FencingTable::fence`]: from
///    then on that incarnation (and any older) is refused even if the process wakes up; only a newer
///    incarnation of the node is admitted again.
///
/// Incarnations only move forward per node; the table never forgets a node, so its size is bounded by
/// the cluster size.
#[derive(Clone, Debug)]
pub struct FencingTable<N> {
    nodes: HashMap<N, NodeFence>,
}

impl<N: Clone + Eq + Hash> FencingTable<N> {
    /// An empty table.
    pub fn new() -> Self {
        Self {
            nodes: HashMap::new(),
        }
    }

    /// Admits `incarnation` if it is not older than (or equal to a fenced) incarnation already
    /// seen of its node, and records it as the node's current one.
    pub fn admit(&mut self, incarnation: &Incarnation<N>) -> Result<Admission<N>, Stale> {
        let claimed = incarnation.incarnation;
        let Some(fence) = self.nodes.get_mut(&incarnation.node) else {
            self.nodes.insert(
                incarnation.node.clone(),
                NodeFence {
                    incarnation: claimed,
                    fenced: false,
                },
            );
            return Ok(Admission::New);
        };
        if claimed < fence.incarnation {
            return Err(Stale::Superseded {
                claimed,
                seen: fence.incarnation,
            });
        }
        if claimed == fence.incarnation {
            if fence.fenced {
                return Err(Stale::Fenced { claimed });
            }
            return Ok(Admission::Current);
        }
        let old = Incarnation::new(incarnation.node.clone(), fence.incarnation);
        let was_fenced = fence.fenced;
        *fence = NodeFence {
            incarnation: claimed,
            fenced: false,
        };
        if was_fenced {
            // The old incarnation was already reported gone when it was fenced.
            Ok(Admission::New)
        } else {
            Ok(Admission::Superseded { old })
        }
    }

    /// Checks `incarnation` without recording anything.
    pub fn check(&self, incarnation: &Incarnation<N>) -> Result<(), Stale> {
        match self.nodes.get(&incarnation.node) {
            None => Ok(()),
            Some(f) if incarnation.incarnation < f.incarnation => Err(Stale::Superseded {
                claimed: incarnation.incarnation,
                seen: f.incarnation,
            }),
            Some(f) if incarnation.incarnation == f.incarnation && f.fenced => Err(Stale::Fenced {
                claimed: incarnation.incarnation,
            }),
            Some(_) => Ok(()),
        }
    }

    /// Declares `incarnation` dead: it and every older incarnation of its node are refused from now on.
    /// Returns false if a newer incarnation of the node is already current (nothing to fence).
    pub fn fence(&mut self, incarnation: &Incarnation<N>) -> bool {
        match self.nodes.get_mut(&incarnation.node) {
            Some(f) if f.incarnation > incarnation.incarnation => false,
            Some(f) => {
                *f = NodeFence {
                    incarnation: incarnation.incarnation,
                    fenced: true,
                };
                true
            }
            None => {
                self.nodes.insert(
                    incarnation.node.clone(),
                    NodeFence {
                        incarnation: incarnation.incarnation,
                        fenced: true,
                    },
                );
                true
            }
        }
    }

    /// The highest incarnation seen of `node`, and whether it is fenced.
    pub fn current(&self, node: &N) -> Option<(IncarnationId, bool)> {
        self.nodes.get(node).map(|f| (f.incarnation, f.fenced))
    }
}

impl<N: Clone + Eq + Hash> Default for FencingTable<N> {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Clone, Copy, Debug)]
struct NodeFence {
    incarnation: IncarnationId,
    fenced: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn inc(node: &str, incarnation: u64) -> Incarnation<String> {
        Incarnation::new(node.to_string(), IncarnationId(incarnation))
    }

    #[test]
    fn fence1_older_incarnation_is_stale_newer_supersedes() {
        let mut t = FencingTable::new();
        assert_eq!(t.admit(&inc("ps", 3)), Ok(Admission::New));
        assert_eq!(t.admit(&inc("ps", 3)), Ok(Admission::Current));
        assert_eq!(
            t.admit(&inc("ps", 2)),
            Err(Stale::Superseded {
                claimed: IncarnationId(2),
                seen: IncarnationId(3)
            })
        );
        assert_eq!(
            t.admit(&inc("ps", 5)),
            Ok(Admission::Superseded { old: inc("ps", 3) })
        );
        assert!(matches!(
            t.admit(&inc("ps", 3)),
            Err(Stale::Superseded { .. })
        ));
        // Other nodes are independent.
        assert_eq!(t.admit(&inc("worker", 0)), Ok(Admission::New));
    }

    #[test]
    fn fence1_fenced_incarnation_never_comes_back() {
        let mut t = FencingTable::new();
        t.admit(&inc("w", 1)).unwrap();
        assert!(t.fence(&inc("w", 1)));
        assert_eq!(
            t.admit(&inc("w", 1)),
            Err(Stale::Fenced {
                claimed: IncarnationId(1)
            })
        );
        assert!(t.check(&inc("w", 0)).is_err());
        // The restarted process, one incarnation later, is welcome; its predecessor was already
        // reported gone when it was fenced.
        assert_eq!(t.admit(&inc("w", 2)), Ok(Admission::New));
        assert_eq!(t.admit(&inc("w", 2)), Ok(Admission::Current));
        // Fencing an old incarnation once a newer one is current does nothing.
        assert!(!t.fence(&inc("w", 1)));
        assert_eq!(t.admit(&inc("w", 2)), Ok(Admission::Current));
    }

    #[test]
    fn fencing_an_unknown_node_refuses_that_incarnation() {
        let mut t = FencingTable::new();
        assert!(t.fence(&inc("c", 4)));
        assert!(t.admit(&inc("c", 4)).is_err());
        assert!(t.admit(&inc("c", 3)).is_err());
        assert_eq!(t.admit(&inc("c", 5)), Ok(Admission::New));
    }

    proptest! {
        /// FENCE-1 over any order of admissions and fences: an admitted incarnation is never below the
        /// highest admitted before it, and a fenced incarnation is never admitted afterwards.
        #[test]
        fn fence1_admitted_incarnations_never_go_back(
            ops in proptest::collection::vec((0u8..3, 0u64..8, any::<bool>()), 1..100),
        ) {
            let mut t = FencingTable::new();
            let mut highest: HashMap<u8, u64> = HashMap::new();
            let mut fenced: HashMap<u8, u64> = HashMap::new();
            for (node, incarnation, is_fence) in ops {
                let i = Incarnation::new(node, IncarnationId(incarnation));
                if is_fence {
                    if t.fence(&i) {
                        let f = fenced.entry(node).or_insert(incarnation);
                        *f = (*f).max(incarnation);
                    }
                    continue;
                }
                let checked = t.check(&i);
                let admitted = t.admit(&i);
                prop_assert_eq!(checked.is_ok(), admitted.is_ok());
                if admitted.is_ok() {
                    if let Some(&h) = highest.get(&node) {
                        prop_assert!(incarnation >= h);
                    }
                    if let Some(&f) = fenced.get(&node) {
                        prop_assert!(incarnation > f);
                    }
                    highest.insert(node, incarnation);
                }
            }
        }
    }
}
