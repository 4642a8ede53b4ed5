//! The parameter server: holds variable shards and their optimizer slots, applies pushes
//! exactly once (PS-1) and never from a fenced worker incarnation (FENCE-1).

mod actor;
mod machine;

pub use actor::{BadPushPanic, LocalStats, PsActor, PushPanic, PUSH_PANIC_SITE};
pub use machine::{
    initial_values, Gradient, ParameterStore, PsCounters, PsError, PushOrigin, PushOutcome,
    StoredVariable, ELEMENTS_MAX,
};
