//! The parameter server: holds variable shards and their optimizer slots, applies pushes
//! exactly once (PS-1) and never from a fenced worker incarnation (FENCE-1).

mod actor;
mod machine;

pub use actor::{initial_values, BadPushPanic, PsActor, PushPanic, PUSH_PANIC_SITE};
pub use machine::{
    Gradient, ParameterStore, PsCounters, PsError, PushOrigin, PushOutcome, StoredVariable,
};
