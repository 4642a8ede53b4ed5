//! The role actors of parameter-server training: coordinator (chief), parameter server,
//! worker; and the evaluator, which only reads checkpoints. Each role keeps its decisions in a
//! pure `machine` (no IO, time passed in) and does its IO in an actor shell (DESIGN §2).
//!
//! A role never decides how its process starts or ends: starting a process as a role is
//! [`crate::bootstrap`], exit codes and stop signals are [`crate::process`].

pub mod blob;
pub mod coordinator;
pub mod eval_fn;
pub mod evaluator;
pub mod node;
pub mod parameter_server_strategy;
pub mod protocol;
pub mod ps;
pub mod ps_client;
pub mod push;
pub mod registry;
pub mod server_model;
pub mod step;
#[cfg(test)]
mod test_support;
pub mod worker;
