//! Where a new variable lives: the placement policy seam and the scope stack that selects it.
//!
//! A strategy's `scope()` pushes its [`VariablePlacement`] policy on the calling thread's stack;
//! [`Variable::new`](super::Variable::new) asks the innermost policy for a [`Placement`], or
//! makes a plain local variable when no scope is active. Parameter-server training adds
//! [`ParameterServerPlacement`] (a worker's model variables are the servers' variables, by the
//! layouts the chief created) and [`DeclaredPlacement`] (variables listed, never stored); the
//! enum is `#[non_exhaustive]` so that such additions do not break callers.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use candle_core::DType;

use super::VariableError;
use crate::distribute::{DeviceSpec, StrategyId};
use crate::layout::Layout;

/// Decides where a variable created under a strategy's scope lives.
///
/// Policies may keep state (a round-robin counter, for instance); they are called once per
/// variable, in creation order, from the thread that creates it.
pub trait VariablePlacement: Send + Sync + fmt::Debug {
    /// The placement of the variable described by `request`.
    fn place(&self, request: &VariableRequest<'_>) -> Result<Placement, VariableError>;

    /// Called once the variable this policy placed exists, before its creator gets it: a
    /// policy whose copies span processes makes them start identical here (MultiWorkerMirrored
    /// broadcasts the first worker's initial value). An error fails the creation.
    fn created(&self, _variable: &super::Variable) -> Result<(), VariableError> {
        Ok(())
    }

    /// Called once a model's variables are all created (`ReplicatedModel::build`): a policy
    /// whose copies span processes checks that every process's model created as many. An
    /// error names what differs.
    fn model_built(&self) -> Result<(), VariableError> {
        Ok(())
    }
}

/// What a placement policy knows about a variable being created.
#[derive(Debug, Clone, Copy)]
pub struct VariableRequest<'a> {
    /// The variable's name.
    pub name: &'a str,
    /// Its shape.
    pub shape: &'a [usize],
    /// Its element type.
    pub dtype: DType,
}

/// Where a variable's value is stored, and so how many copies (components) it has.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placement {
    /// A plain variable: one copy on one device, updated directly from any context.
    Local {
        /// The device holding it.
        device: DeviceSpec,
    },
    /// One copy per replica of `strategy`, kept equal by applying every update to all of them
    /// (TensorFlow's `MirroredVariable`).
    Mirrored {
        /// The strategy whose replicas hold the copies.
        strategy: StrategyId,
        /// The replicas' devices, in replica order; component `i` lives on `devices[i]`.
        devices: Vec<DeviceSpec>,
    },
    /// One copy on the host, shared by the `num_replicas` compute replicas of `strategy`
    /// (TensorFlow's `CentralStorageStrategy`): an update from a replica context is reduced
    /// across replicas and applied once.
    Central {
        /// The strategy whose replicas share it.
        strategy: StrategyId,
        /// The device holding it.
        device: DeviceSpec,
        /// How many replicas update it together.
        num_replicas: usize,
    },
    /// On parameter servers, split as `layout` says: no local copy. A worker reads it through
    /// a tape with a variable source (the parameter-server bridge) and sends gradients instead
    /// of updating it; local reads give zeros and local updates are refused.
    ParameterServer {
        /// Its shards and the servers holding them.
        layout: Layout,
    },
    /// Declared only: a name, a shape and a dtype with no storage anywhere yet. Used to list a
    /// model's variables (for instance to create them on parameter servers) without drawing
    /// their initial values.
    Declared,
}

impl Placement {
    /// How many stored copies a variable with this placement has.
    pub fn num_components(&self) -> usize {
        match self {
            Placement::Local { .. } | Placement::Central { .. } => 1,
            Placement::Mirrored { devices, .. } => devices.len(),
            Placement::ParameterServer { .. } | Placement::Declared => 0,
        }
    }

    /// Whether a variable with this placement has a value in this process.
    pub fn has_local_copy(&self) -> bool {
        self.num_components() > 0
    }

    /// The strategy that keeps this variable in sync, if any.
    pub fn strategy(&self) -> Option<StrategyId> {
        match self {
            Placement::Local { .. } | Placement::ParameterServer { .. } | Placement::Declared => {
                None
            }
            Placement::Mirrored { strategy, .. } | Placement::Central { strategy, .. } => {
                Some(*strategy)
            }
        }
    }

    /// The device of each component, in component order.
    pub fn devices(&self) -> Vec<DeviceSpec> {
        match self {
            Placement::Local { device } | Placement::Central { device, .. } => vec![*device],
            Placement::Mirrored { devices, .. } => devices.clone(),
            Placement::ParameterServer { .. } | Placement::Declared => Vec::new(),
        }
    }
}

/// Places every variable on one device (plain variables; the Default and OneDevice strategies).
#[derive(Debug, Clone)]
pub struct LocalPlacement {
    /// The device.
    pub device: DeviceSpec,
}

impl VariablePlacement for LocalPlacement {
    fn place(&self, _request: &VariableRequest<'_>) -> Result<Placement, VariableError> {
        Ok(Placement::Local {
            device: self.device,
        })
    }
}

/// Mirrors every variable on the replicas of one strategy.
#[derive(Debug, Clone)]
pub struct MirroredPlacement {
    /// The strategy.
    pub strategy: StrategyId,
    /// Its replicas' devices.
    pub devices: Vec<DeviceSpec>,
}

impl VariablePlacement for MirroredPlacement {
    fn place(&self, _request: &VariableRequest<'_>) -> Result<Placement, VariableError> {
        Ok(Placement::Mirrored {
            strategy: self.strategy,
            devices: self.devices.clone(),
        })
    }
}

/// Keeps every variable as one host copy shared by a strategy's replicas.
#[derive(Debug, Clone)]
pub struct CentralPlacement {
    /// The strategy.
    pub strategy: StrategyId,
    /// The host device.
    pub device: DeviceSpec,
    /// Its number of replicas.
    pub num_replicas: usize,
}

impl VariablePlacement for CentralPlacement {
    fn place(&self, _request: &VariableRequest<'_>) -> Result<Placement, VariableError> {
        Ok(Placement::Central {
            strategy: self.strategy,
            device: self.device,
            num_replicas: self.num_replicas,
        })
    }
}

/// Places each variable on the parameter servers by the layout created for its name (a
/// worker building a model whose variables the chief created).
#[derive(Debug, Clone, Default)]
pub struct ParameterServerPlacement {
    layouts: std::collections::BTreeMap<String, Layout>,
}

impl ParameterServerPlacement {
    /// A policy over `layouts` (one per variable, keyed by the variable's name).
    pub fn new(layouts: impl IntoIterator<Item = Layout>) -> Self {
        Self {
            layouts: layouts.into_iter().map(|l| (l.name.clone(), l)).collect(),
        }
    }

    /// Enters a scope of this policy on the calling thread: variables created while the guard
    /// lives are placed on the parameter servers.
    pub fn scope(self) -> Result<PlacementScope, VariableError> {
        PlacementScope::enter(StrategyId::next(), "ParameterServer", Arc::new(self))
    }
}

impl VariablePlacement for ParameterServerPlacement {
    fn place(&self, request: &VariableRequest<'_>) -> Result<Placement, VariableError> {
        let placement_error = |reason: String| VariableError::Placement {
            name: request.name.to_string(),
            reason,
        };
        let layout = self.layouts.get(request.name).ok_or_else(|| {
            placement_error(format!(
                "no variable of that name was created on the parameter servers (known: {:?})",
                self.layouts.keys().collect::<Vec<_>>()
            ))
        })?;
        if layout.shape != request.shape {
            return Err(placement_error(format!(
                "the parameter servers hold it with shape {:?}, the model declares {:?}",
                layout.shape, request.shape
            )));
        }
        if request.dtype != DType::F32 {
            return Err(placement_error(format!(
                "parameter servers hold f32 values, the model declares {:?}",
                request.dtype
            )));
        }
        Ok(Placement::ParameterServer {
            layout: layout.clone(),
        })
    }
}

/// Declares every variable without storage ([`Placement::Declared`]): for listing a model's
/// variables, names, shapes and initializers, without drawing their values.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeclaredPlacement;

impl DeclaredPlacement {
    /// Enters a scope of this policy on the calling thread.
    pub fn scope(self) -> Result<PlacementScope, VariableError> {
        PlacementScope::enter(StrategyId::next(), "Declared", Arc::new(self))
    }
}

impl VariablePlacement for DeclaredPlacement {
    fn place(&self, _request: &VariableRequest<'_>) -> Result<Placement, VariableError> {
        Ok(Placement::Declared)
    }
}

/// While alive, variables created on this thread are placed by its policy. Not `Send`: a scope
/// belongs to the thread that entered it.
#[derive(Debug)]
#[must_use = "the scope ends when this guard is dropped"]
pub struct PlacementScope {
    depth: usize,
    _not_send: PhantomData<*const ()>,
}

impl PlacementScope {
    /// Pushes `policy`, owned by strategy `owner` (named `owner_name` in errors).
    ///
    /// Scopes of the same strategy nest; entering another strategy's scope inside one is an
    /// error, as in TensorFlow ("mixing different strategies").
    pub fn enter(
        owner: StrategyId,
        owner_name: &'static str,
        policy: Arc<dyn VariablePlacement>,
    ) -> Result<Self, VariableError> {
        STACK.with(|stack| {
            let mut stack = stack.borrow_mut();
            if let Some(top) = stack.last() {
                if top.owner != owner {
                    return Err(VariableError::MixedStrategies {
                        active: format!("{} #{}", top.owner_name, top.owner.0),
                        entering: format!("{owner_name} #{}", owner.0),
                    });
                }
            }
            stack.push(Entry {
                owner,
                owner_name,
                policy,
            });
            Ok(Self {
                depth: stack.len(),
                _not_send: PhantomData,
            })
        })
    }
}

impl Drop for PlacementScope {
    fn drop(&mut self) {
        STACK.with(|stack| {
            let mut stack = stack.borrow_mut();
            // Guards dropped out of order (e.g. kept in a struct) still leave the stack as it
            // was before this scope was entered.
            stack.truncate(self.depth.saturating_sub(1));
        });
    }
}

/// The policy of the innermost active scope on this thread, with its owner.
pub fn current_placement() -> Option<(StrategyId, Arc<dyn VariablePlacement>)> {
    STACK.with(|stack| {
        stack
            .borrow()
            .last()
            .map(|e| (e.owner, Arc::clone(&e.policy)))
    })
}

/// Runs `f` (a replica function of the strategy `owner`) with `policy` as the placement of
/// variables it creates: inside `run`, a new variable follows the policy of the strategy
/// running the replica, whatever scope the thread has (TensorFlow's replica-context
/// creation). Restores the previous one after, even if `f` panics.
pub(crate) fn with_replica_placement<R>(
    owner: StrategyId,
    policy: Arc<dyn VariablePlacement>,
    f: impl FnOnce() -> R,
) -> R {
    struct Restore(Option<(StrategyId, Arc<dyn VariablePlacement>)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            REPLICA_POLICY.with(|slot| *slot.borrow_mut() = prev);
        }
    }
    let prev = REPLICA_POLICY.with(|slot| slot.borrow_mut().replace((owner, policy)));
    let _restore = Restore(prev);
    f()
}

/// The placement policy of the strategy whose replica function runs on this thread, with its
/// owner (see [`with_replica_placement`]).
pub(crate) fn replica_placement() -> Option<(StrategyId, Arc<dyn VariablePlacement>)> {
    REPLICA_POLICY.with(|slot| slot.borrow().clone())
}

struct Entry {
    owner: StrategyId,
    owner_name: &'static str,
    policy: Arc<dyn VariablePlacement>,
}

thread_local! {
    static STACK: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
    static REPLICA_POLICY: RefCell<Option<(StrategyId, Arc<dyn VariablePlacement>)>> =
        const { RefCell::new(None) };
}
