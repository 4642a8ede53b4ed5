//! cohort-actors: the actor runtime cohort's roles run on. It knows nothing of training.
//!
//! - [`restart`]: the pure [`RestartPolicy`] (at most N restarts in a sliding window,
//!   exponential backoff with a cap, then escalate).
//! - [`heartbeat`]: the pure per-peer [`HeartbeatMachine`] failure detector.
//! - [`supervisor`]: crash-only supervision inside a process: [`install_crash_hook`] makes a
//!   panic end the process with a code of its own (the process supervisor restarts it, under a
//!   [`RestartPolicy`]); [`contain_panic`] marks the few places where a panic is a value.
//! - [`gateway`]: the per-node [`Gateway`] (delivers remote messages to local actors by
//!   name, runs heartbeats for every peer, fences dead incarnations, refuses message types a
//!   sender's role may not send: SEC-2) and typed [`RemoteRef`]s.
//! - [`fencing`]: [`IncarnationId`], [`Incarnation`] and the [`FencingTable`] that enforces FENCE-1.
//! - [`wire`]: the gateway protocol's frame headers.
//!
//! Every decision is a pure machine (time passed in, no IO); the gateway is a thin shell that
//! feeds them events and does the IO they ask for. The crate must never name a
//! training concept, and it reaches the network only through `cohort-transport`.

pub mod fencing;
pub mod gateway;
pub mod heartbeat;
pub mod restart;
pub mod supervisor;
pub mod wire;

pub use fencing::{Admission, FencingTable, Incarnation, IncarnationId, Stale};
pub use gateway::{
    Gateway, GatewayConfig, GatewayStats, LookupError, PeerAddr, PeerEvent, RefusedReason,
    RegisterError, Remote, RemoteError, RemoteMessage, RemoteRef, ResolveError, Resolver, Senders,
    SystemResolver,
};
pub use heartbeat::{DeathCause, Heard, HeartbeatConfig, HeartbeatEvent, HeartbeatMachine};
pub use restart::{RestartDecision, RestartLimits, RestartPolicy};
pub use supervisor::{
    contain_panic, crash_exit_code, crash_report, install_crash_hook, panic_message,
};
