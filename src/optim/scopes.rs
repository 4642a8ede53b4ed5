//! Which optimizer updates each variable on the parameter servers: the program's, or one given
//! for the variable's name scope ([`OptimizerScopes`]), as a wide-and-deep model updates its
//! linear part with one optimizer and its deep part with another, each optimizer at its own
//! constant rate or following its own learning-rate schedule.

use super::{LearningRateSchedule, OptimError, Optimizer, ScheduleError};

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
    scopes: Vec<Scope>,
}

/// One scope's optimizer, and the schedule its rate follows (`None`: its constant rate).
#[derive(Debug, Clone, PartialEq)]
struct Scope {
    name: String,
    optimizer: Optimizer,
    schedule: Option<LearningRateSchedule>,
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
    /// The scope's learning-rate schedule cannot give a rate.
    #[error("the learning-rate schedule of scope {scope:?}: {source}")]
    Schedule {
        /// The scope.
        scope: String,
        /// What is wrong with it.
        source: ScheduleError,
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

    /// The same, with `optimizer` for the variables of `scope`, its rate following
    /// `schedule` of each variable's update count (as the program optimizer's follows
    /// `Program::learning_rate_schedule`) instead of its constant rate.
    ///
    /// ```
    /// use cohort::optim::{Optimizer, OptimizerScopes};
    /// use cohort::train::LearningRateSchedule;
    ///
    /// let decay = LearningRateSchedule::cosine_decay(0.1, 1000);
    /// let scopes = OptimizerScopes::new().with_schedule("wide", Optimizer::adagrad(0.1), decay.clone());
    /// assert_eq!(scopes.scoped("wide/kernel"), Some((&Optimizer::adagrad(0.1), Some(&decay))));
    /// ```
    pub fn with_schedule(
        mut self,
        scope: impl Into<String>,
        optimizer: Optimizer,
        schedule: LearningRateSchedule,
    ) -> Self {
        self.insert_scoped(scope.into(), optimizer, Some(schedule));
        self
    }

    /// Gives `optimizer` to the variables of `scope`, at its constant rate (replacing what was
    /// given for the scope before).
    pub fn insert(&mut self, scope: impl Into<String>, optimizer: Optimizer) {
        self.insert_scoped(scope.into(), optimizer, None);
    }

    /// Gives `optimizer` to the variables of `scope`, its rate following `schedule` where one
    /// is given (replacing what was given for the scope before).
    pub fn insert_scoped(
        &mut self,
        name: String,
        optimizer: Optimizer,
        schedule: Option<LearningRateSchedule>,
    ) {
        let scope = Scope {
            name,
            optimizer,
            schedule,
        };
        match self.scopes.iter_mut().find(|s| s.name == scope.name) {
            Some(entry) => *entry = scope,
            None => self.scopes.push(scope),
        }
    }

    /// The optimizer given for `variable`'s longest scope, if it is in one.
    pub fn of(&self, variable: &str) -> Option<&Optimizer> {
        self.scope_of(variable).map(|s| &s.optimizer)
    }

    /// The optimizer given for `variable`'s longest scope and the schedule its rate follows
    /// (`None`: its constant rate), if the variable is in a scope.
    pub fn scoped(&self, variable: &str) -> Option<(&Optimizer, Option<&LearningRateSchedule>)> {
        self.scope_of(variable)
            .map(|s| (&s.optimizer, s.schedule.as_ref()))
    }

    fn scope_of(&self, variable: &str) -> Option<&Scope> {
        self.scopes
            .iter()
            .filter(|s| in_scope(variable, &s.name))
            .max_by_key(|s| s.name.len())
    }

    /// Whether no scope was given.
    pub fn is_empty(&self) -> bool {
        self.scopes.is_empty()
    }

    /// The scopes, their optimizers and schedules, in the order given.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Optimizer, Option<&LearningRateSchedule>)> {
        self.scopes
            .iter()
            .map(|s| (s.name.as_str(), &s.optimizer, s.schedule.as_ref()))
    }

    /// Checks every scope (a name, not ending in a separator), its optimizer's
    /// hyperparameters and its schedule; the first that fails, named.
    pub fn validate(&self) -> Result<(), ScopeError> {
        for Scope {
            name,
            optimizer,
            schedule,
        } in &self.scopes
        {
            if name.is_empty() || name.ends_with(['/', '.']) {
                return Err(ScopeError::BadScope {
                    scope: name.clone(),
                });
            }
            optimizer
                .validate()
                .map_err(|source| ScopeError::Optimizer {
                    scope: name.clone(),
                    source,
                })?;
            if let Some(schedule) = schedule {
                schedule.validate().map_err(|source| ScopeError::Schedule {
                    scope: name.clone(),
                    source,
                })?;
            }
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
        let growing = LearningRateSchedule::ExponentialDecay {
            initial: 0.1,
            decay_steps: 10,
            decay_rate: f32::INFINITY,
            staircase: false,
        };
        let err = OptimizerScopes::new()
            .with_schedule("deep", Optimizer::sgd(0.1), growing)
            .validate()
            .unwrap_err();
        assert!(matches!(&err, ScopeError::Schedule { scope, .. } if scope == "deep"));
        assert!(err.to_string().contains("\"deep\""), "{err}");
    }

    #[test]
    fn a_scope_given_again_replaces_its_schedule_too() {
        let decay = LearningRateSchedule::cosine_decay(0.1, 100);
        let scopes = OptimizerScopes::new()
            .with_schedule("wide", Optimizer::adagrad(0.1), decay.clone())
            .with("deep", Optimizer::adam(0.01));
        assert_eq!(
            scopes.scoped("wide/kernel/part_0"),
            Some((&Optimizer::adagrad(0.1), Some(&decay)))
        );
        assert_eq!(
            scopes.scoped("deep.0.weight"),
            Some((&Optimizer::adam(0.01), None))
        );
        assert_eq!(scopes.scoped("head"), None);
        let again = scopes.with("wide", Optimizer::sgd(0.2));
        assert_eq!(
            again.scoped("wide/kernel"),
            Some((&Optimizer::sgd(0.2), None))
        );
    }
}
