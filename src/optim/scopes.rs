//! Which optimizer updates each variable on the parameter servers: the program's, or one given
//! for the variable's name scope ([`OptimizerScopes`]), as a wide-and-deep model updates its
//! linear part with one optimizer and its deep part with another.

use super::{OptimError, Optimizer};

/// Optimizers given for name scopes. A variable is in scope `s` when its name is `s` or
/// begins with `s/` or `s.` (Keras' and candle's separators; a partitioned variable's shards,
/// `name/part_k`, are in its scope); the longest scope it is in decides its optimizer, and a
/// variable in none is updated by the default (the program's).
///
/// ```
/// use cohort::optim::{Optimizer, OptimizerScopes};
///
/// let scopes = OptimizerScopes::new()
///     .with("embedding", Optimizer::adagrad(0.05))
///     .with("embedding.bias", Optimizer::sgd(0.1));
/// assert_eq!(scopes.of("embedding.weight/part_1"), Some(&Optimizer::adagrad(0.05)));
/// assert_eq!(scopes.of("embedding.bias"), Some(&Optimizer::sgd(0.1)));
/// assert_eq!(scopes.of("embeddings.weight"), None);
/// assert_eq!(scopes.of("head.weight"), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OptimizerScopes {
    scopes: Vec<(String, Optimizer)>,
}

/// A scope given no optimizer can serve.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScopeError {
    /// An empty scope, or one ending in a separator, names no variable's scope.
    #[error("optimizer scope {scope:?} is empty or ends in a separator: give a name such as \"embedding\"")]
    BadScope {
        /// The scope given.
        scope: String,
    },
    /// The scope's optimizer has an invalid hyperparameter.
    #[error("the optimizer of scope {scope:?}: {source}")]
    Optimizer {
        /// The scope.
        scope: String,
        /// What is wrong with it.
        source: OptimError,
    },
}

impl OptimizerScopes {
    /// No scope: every variable is updated by the default.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same, with `optimizer` for the variables of `scope` (replacing one given for the
    /// same scope before).
    pub fn with(mut self, scope: impl Into<String>, optimizer: Optimizer) -> Self {
        self.insert(scope, optimizer);
        self
    }

    /// Gives `optimizer` to the variables of `scope` (replacing one given for it before).
    pub fn insert(&mut self, scope: impl Into<String>, optimizer: Optimizer) {
        let scope = scope.into();
        match self.scopes.iter_mut().find(|(s, _)| *s == scope) {
            Some(entry) => entry.1 = optimizer,
            None => self.scopes.push((scope, optimizer)),
        }
    }

    /// The optimizer given for `variable`'s longest scope, if it is in one.
    pub fn of(&self, variable: &str) -> Option<&Optimizer> {
        self.scopes
            .iter()
            .filter(|(scope, _)| in_scope(variable, scope))
            .max_by_key(|(scope, _)| scope.len())
            .map(|(_, optimizer)| optimizer)
    }

    /// Whether no scope was given.
    pub fn is_empty(&self) -> bool {
        self.scopes.is_empty()
    }

    /// The scopes and their optimizers, in the order given.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Optimizer)> {
        self.scopes.iter().map(|(s, o)| (s.as_str(), o))
    }

    /// Checks every scope (a name, not ending in a separator) and its optimizer's
    /// hyperparameters; the first that fails, named.
    pub fn validate(&self) -> Result<(), ScopeError> {
        for (scope, optimizer) in &self.scopes {
            if scope.is_empty() || scope.ends_with(['/', '.']) {
                return Err(ScopeError::BadScope {
                    scope: scope.clone(),
                });
            }
            optimizer
                .validate()
                .map_err(|source| ScopeError::Optimizer {
                    scope: scope.clone(),
                    source,
                })?;
        }
        Ok(())
    }
}

/// Whether `variable` is in `scope`: it is the scope, or a name under it.
fn in_scope(variable: &str, scope: &str) -> bool {
    match variable.strip_prefix(scope) {
        Some("") => true,
        Some(rest) => rest.starts_with(['/', '.']),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variable_takes_its_longest_scope_and_a_name_that_only_begins_alike_takes_none() {
        let scopes = OptimizerScopes::new()
            .with("wide", Optimizer::adagrad(0.1))
            .with("wide/bias", Optimizer::sgd(0.5))
            .with("deep", Optimizer::adam(0.01));
        assert_eq!(scopes.of("wide"), Some(&Optimizer::adagrad(0.1)));
        assert_eq!(
            scopes.of("wide/kernel/part_0"),
            Some(&Optimizer::adagrad(0.1))
        );
        assert_eq!(scopes.of("wide/bias"), Some(&Optimizer::sgd(0.5)));
        assert_eq!(scopes.of("deep.0.weight"), Some(&Optimizer::adam(0.01)));
        assert_eq!(scopes.of("wider/kernel"), None);
        assert_eq!(scopes.of("head"), None);
        // Given again, a scope's optimizer is replaced, not added.
        let again = scopes.with("deep", Optimizer::sgd(0.2));
        assert_eq!(again.of("deep.0.weight"), Some(&Optimizer::sgd(0.2)));
        assert_eq!(again.iter().count(), 3);
    }

    #[test]
    fn an_empty_scope_or_a_bad_optimizer_is_refused_naming_the_scope() {
        for bad in ["", "wide/", "deep."] {
            let scopes = OptimizerScopes::new().with(bad, Optimizer::sgd(0.1));
            assert_eq!(
                scopes.validate(),
                Err(ScopeError::BadScope { scope: bad.into() })
            );
        }
        let negative = OptimizerScopes::new().with("wide", Optimizer::sgd(-1.0));
        let err = negative.validate().unwrap_err();
        assert!(matches!(&err, ScopeError::Optimizer { scope, .. } if scope == "wide"));
        assert!(err.to_string().contains("\"wide\""), "{err}");
        assert!(OptimizerScopes::new().validate().is_ok());
    }
}
