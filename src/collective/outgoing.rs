//! A chunk queued to a member's link (QUIC or plaintext TCP) and the count of chunks not yet
//! answered: what a process group hands its links, shared by the group and the plaintext
//! plane (`plain`) so that neither names the other's types for it.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::landing::Blob;
use super::wire::Call;

/// Chunks queued or sent to any peer and not yet answered (a group's flush waits for none).
pub(crate) type Unanswered = Arc<AtomicUsize>;

/// One chunk of call `seq` (its `tag` within the call) queued to a member's link.
pub(crate) struct Outgoing {
    pub(crate) seq: u64,
    pub(crate) tag: u64,
    pub(crate) call: Call,
    pub(crate) blob: Blob,
}
