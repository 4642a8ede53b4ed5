//! A process incarnation: which process of a node this is. A node (`worker/1`) keeps its name
//! across restarts; each process that runs it is a new incarnation, and a peer that meets a
//! new one knows at once that the old one is gone, with no time window standing in for that
//! knowledge.
//!
//! Not to be confused with a training epoch (one pass over the data) or a group's generation
//! (a membership epoch of a collective group, which moves forward each time the members
//! re-form).

use bincode::{Decode, Encode};

/// One process's identity within its node, carried in its membership messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Encode, Decode)]
pub struct Incarnation(u64);

impl Incarnation {
    /// A new incarnation, distinct from every other with overwhelming probability (64 random
    /// bits): several may live in one process (each `collective::Mesh` is one), so the clock
    /// alone would not do.
    pub fn random() -> Self {
        Incarnation(rand::random::<u64>())
    }

    /// The incarnation with this raw value (as sent on the wire, or in a test).
    pub fn from_raw(raw: u64) -> Self {
        Incarnation(raw)
    }

    /// Its raw value.
    pub fn raw(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for Incarnation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_incarnations_differ_and_print_as_sixteen_hex_digits() {
        let a = Incarnation::random();
        let b = Incarnation::random();
        assert_ne!(a, b);
        assert_eq!(Incarnation::from_raw(0xab).to_string(), "00000000000000ab");
        assert_eq!(Incarnation::from_raw(a.raw()), a);
    }
}
