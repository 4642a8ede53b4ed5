//! cohort-chaos: fault injection for tests and the `chaos` command.
//!
//! - [`plan`] and [`socket`]: a seeded fault plan and a UDP socket under QUIC that drops,
//!   delays, duplicates, reorders and partitions datagrams per that plan.
//! - [`rules`]: a real process's socket under a rules file that the chaos runner rewrites
//!   while the process runs (`COHORT_NET_FAULTS`).
//! - [`process`]: SIGKILL, SIGSTOP/SIGCONT and SIGTERM for a test's child processes.
//!
//! It depends only on `cohort-transport` and `cohort-actors` and injects faults through their
//! seams; it never imports quinn directly.

pub mod plan;
pub mod process;
pub mod rules;
pub mod socket;
