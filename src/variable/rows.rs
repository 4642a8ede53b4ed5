//! Row ids of embedding tables: the hash map every per-row path keys on, and the distinct
//! rows of a batch.
//!
//! A sparse step touches thousands of rows; hashing their ids with the standard library's
//! SipHash showed up as a tenth of a parameter server's time. Row ids come from
//! authenticated cluster members, so a fast multiplicative hash is enough.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hash map keyed by row id.
pub type RowIdMap<V> = HashMap<u64, V, BuildHasherDefault<RowIdHasher>>;

/// A new [`RowIdMap`] with room for `capacity` ids.
pub fn row_id_map<V>(capacity: usize) -> RowIdMap<V> {
    RowIdMap::with_capacity_and_hasher(capacity, BuildHasherDefault::default())
}

/// Folded 128-bit multiply of the id: every input bit reaches the high bits hashbrown's
/// control bytes use and the low bits its bucket index uses.
#[derive(Debug, Default, Clone, Copy)]
pub struct RowIdHasher(u64);

impl Hasher for RowIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed in practice; other writes fold in byte by byte.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, id: u64) {
        let product = u128::from(self.0 ^ id) * u128::from(MULTIPLIER);
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

/// 2^64 / φ, odd.
const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// The rows a batch touches: the distinct ids (in first-seen order) and, for every id of the
/// batch, its index among them. A worker pulls and pushes only these rows.
pub fn unique_rows(ids: &[u64]) -> (Vec<u64>, Vec<u32>) {
    let mut index = row_id_map(ids.len());
    let mut unique = Vec::with_capacity(ids.len());
    let positions = ids
        .iter()
        .map(|&id| {
            *index.entry(id).or_insert_with(|| {
                unique.push(id);
                (unique.len() - 1) as u32
            })
        })
        .collect();
    (unique, positions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_rows_keeps_first_seen_order_and_maps_every_id() {
        let (unique, positions) = unique_rows(&[5, 9, 5, 7, 9]);
        assert_eq!(unique, vec![5, 9, 7]);
        assert_eq!(positions, vec![0, 1, 0, 2, 1]);
    }

    #[test]
    fn the_hash_spreads_sequential_and_strided_ids_over_the_low_bits() {
        use std::collections::BTreeSet;
        use std::hash::BuildHasher;
        // hashbrown picks buckets with the low bits: ids that differ only in high bits
        // (strided by 2^32) must still land in different buckets, or lookups degrade.
        let build = BuildHasherDefault::<RowIdHasher>::default();
        for ids in [
            (0..4096u64).collect::<Vec<_>>(),
            (0..4096u64).map(|i| i << 32).collect(),
        ] {
            let buckets: BTreeSet<u64> = ids.iter().map(|id| build.hash_one(id) & 0xfff).collect();
            assert!(
                buckets.len() > 2000,
                "{} of 4096 buckets used",
                buckets.len()
            );
        }
        let mut map = row_id_map(16);
        map.insert(7u64, 'a');
        map.insert(7u64 << 32, 'b');
        assert_eq!((map[&7], map[&(7 << 32)]), ('a', 'b'));
    }
}
