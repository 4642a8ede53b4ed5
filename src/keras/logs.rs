//! What a step, an epoch or an evaluation reports: named figures in a fixed order (Keras'
//! `logs` dict), the same on every worker.

use std::fmt;

/// Named figures (`loss`, `accuracy`, `val_loss`, `learning_rate`, ...) in the order they were
/// added.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Logs {
    entries: Vec<(String, f64)>,
}

impl Logs {
    /// No figures.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `name` to `value` (replacing it, in place, if present).
    pub fn insert(&mut self, name: impl Into<String>, value: f64) {
        let name = name.into();
        match self.entries.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = value,
            None => self.entries.push((name, value)),
        }
    }

    /// The figure named `name`.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.entries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }

    /// Every figure, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.entries.iter().map(|(n, v)| (n.as_str(), *v))
    }

    /// Whether there is no figure.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The figures of `other` with `prefix` before their names, added (`val_` for validation).
    pub fn extend_prefixed(&mut self, prefix: &str, other: &Logs) {
        for (name, value) in other.iter() {
            self.insert(format!("{prefix}{name}"), value);
        }
    }
}

impl fmt::Display for Logs {
    /// `loss: 0.1234 - accuracy: 0.9812`, as Keras prints them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, value)) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(" - ")?;
            }
            write!(f, "{name}: {value:.4}")?;
        }
        Ok(())
    }
}
