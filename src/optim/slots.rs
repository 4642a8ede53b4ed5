//! Per-variable optimizer state: named buffers the size of the variable, plus the count of
//! gradients skipped for holding non-finite values.

use super::{OptimError, Optimizer};

/// The optimizer state of one variable: one buffer per slot name (e.g. `m` and `v` for Adam),
/// each as long as the variable, exportable and restorable by name for checkpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct Slots {
    variable: String,
    len: usize,
    buffers: Vec<(&'static str, Vec<f32>)>,
    skipped_non_finite: u64,
}

impl Slots {
    /// Rebuilds slots from named buffers (e.g. read from a checkpoint) for `optimizer`.
    ///
    /// Every slot the optimizer uses must be present with `len` elements, and no other;
    /// otherwise the error names the variable and the slot.
    pub fn restore<I, S>(
        optimizer: &Optimizer,
        variable: &str,
        len: usize,
        named: I,
        skipped_non_finite: u64,
    ) -> Result<Slots, OptimError>
    where
        I: IntoIterator<Item = (S, Vec<f32>)>,
        S: AsRef<str>,
    {
        let names = optimizer.slot_names();
        let mut found: Vec<Option<Vec<f32>>> = vec![None; names.len()];
        for (name, values) in named {
            let name = name.as_ref();
            let Some(k) = names.iter().position(|&n| n == name) else {
                return Err(OptimError::UnknownSlot {
                    variable: variable.to_owned(),
                    slot: name.to_owned(),
                });
            };
            if values.len() != len {
                return Err(OptimError::SlotLength {
                    variable: variable.to_owned(),
                    slot: name.to_owned(),
                    expected: len,
                    got: values.len(),
                });
            }
            found[k] = Some(values);
        }
        let mut buffers = Vec::with_capacity(names.len());
        for (&name, values) in names.iter().zip(found) {
            let Some(values) = values else {
                return Err(OptimError::MissingSlot {
                    variable: variable.to_owned(),
                    slot: name.into(),
                });
            };
            buffers.push((name, values));
        }
        Ok(Slots::from_parts(
            variable.to_owned(),
            len,
            buffers,
            skipped_non_finite,
        ))
    }

    /// Name of the variable these slots belong to (used in every error).
    pub fn variable(&self) -> &str {
        &self.variable
    }

    /// Element count of the variable (and of every buffer).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the variable has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer of slot `name`, if the optimizer keeps one.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.buffers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, values)| values.as_slice())
    }

    /// Whether there is a slot named `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Every slot as `(name, values)`, in the optimizer's slot order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &[f32])> + '_ {
        self.buffers
            .iter()
            .map(|(name, values)| (*name, values.as_slice()))
    }

    /// How many gradients were skipped for holding NaN or ±Inf
    /// ([`NonFinitePolicy::Skip`](super::NonFinitePolicy::Skip)).
    pub fn skipped_non_finite(&self) -> u64 {
        self.skipped_non_finite
    }

    pub(super) fn from_parts(
        variable: String,
        len: usize,
        buffers: Vec<(&'static str, Vec<f32>)>,
        skipped_non_finite: u64,
    ) -> Slots {
        Slots {
            variable,
            len,
            buffers,
            skipped_non_finite,
        }
    }

    pub(super) fn count_skipped_non_finite(&mut self) {
        self.skipped_non_finite = self.skipped_non_finite.saturating_add(1);
    }

    /// The buffer of slot `name`; the caller has checked that it exists.
    pub(super) fn buffer_mut(&mut self, name: &str) -> &mut [f32] {
        let (_, values) = self
            .buffers
            .iter_mut()
            .find(|(n, _)| *n == name)
            .expect("slot presence is checked before every update");
        values
    }

    /// Two distinct buffers at once; the caller has checked that both exist.
    /// The buffers of `names`, in that order.
    pub(super) fn buffers_mut(&mut self, names: &[&str]) -> Vec<&mut [f32]> {
        let mut found: Vec<Option<&mut [f32]>> = names.iter().map(|_| None).collect();
        for (name, values) in self.buffers.iter_mut() {
            if let Some(k) = names.iter().position(|n| n == name) {
                found[k] = Some(values.as_mut_slice());
            }
        }
        found
            .into_iter()
            .zip(names)
            .map(|(buffer, name)| {
                buffer.unwrap_or_else(|| panic!("slot `{name}` is checked before every update"))
            })
            .collect()
    }

    pub(super) fn buffer_pair_mut(&mut self, a: &str, b: &str) -> (&mut [f32], &mut [f32]) {
        let mut first = None;
        let mut second = None;
        for (name, values) in self.buffers.iter_mut() {
            if *name == a {
                first = Some(values.as_mut_slice());
            } else if *name == b {
                second = Some(values.as_mut_slice());
            }
        }
        match (first, second) {
            (Some(first), Some(second)) => (first, second),
            _ => panic!("slots `{a}` and `{b}` are checked before every update"),
        }
    }
}
