//! The receive budget (SEC-2): bounds the bytes of incoming frames a node holds, per connection
//! and per node, from the moment a frame's lengths are known until the frame is handed to the
//! application ([`Connection::accept_incoming`](crate::Connection::accept_incoming) returns it,
//! or a request returns its response).
//!
//! What it owns: the two byte budgets every metered frame read draws on, the counters behind
//! [`InFlightStats`], and `InFlight`, what one frame holds. It never allocates anything.
//!
//! Calling protocol, for each frame read:
//! 1. `ReceiveBudget::start` gives an empty `InFlight`.
//! 2. Once the prefix is read and checked, `InFlight::reserve` takes the frame's declared
//!    length (header plus blobs) from the connection's budget, then from the node's, waiting in
//!    arrival order at most `in_flight_wait_timeout` in all; then it fails with
//!    [`FrameError::OverBudget`]. A frame declaring more than a whole budget takes all of it,
//!    so it still passes when it is alone.
//! 3. The reader reports the bytes it keeps with `InFlight::add` / `InFlight::sub`; they
//!    follow what arrived, never the declared length ([`crate::frame`]).
//! 4. Dropping the `InFlight` gives back both the reservation and the held bytes.
//!
//! Budget is reserved by declared length rather than byte by byte as data arrives: two
//! half-received frames that each wait for the other's bytes would otherwise stall until both
//! time out, under ordinary load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::TransportConfig;
use crate::connection::duration_ms;
use crate::frame::FrameError;

/// Counters of one receive budget: a connection's or a node's (SEC-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlightStats {
    /// Bytes of incoming frames held now, as they arrived: received chunks kept plus buffers
    /// allocated for frames not yet handed to the application.
    pub bytes_held: u64,
    /// Highest `bytes_held` so far.
    pub bytes_held_peak: u64,
    /// Budget reserved now by frames being received or queued: their declared lengths.
    pub bytes_reserved: u64,
    /// Highest `bytes_reserved` so far; never above `bytes_max`.
    pub bytes_reserved_peak: u64,
    /// The budget: `connection_in_flight_bytes_max` or `node_in_flight_bytes_max`.
    pub bytes_max: u64,
    /// Frames refused because this budget had no room within `in_flight_wait_timeout`.
    pub frames_over_budget: u64,
}

/// One byte budget (a connection's or a node's) and its counters.
#[derive(Debug)]
pub(crate) struct ByteBudget {
    scope: &'static str,
    permits: Arc<Semaphore>,
    bytes_max: u64,
    held: AtomicU64,
    held_peak: AtomicU64,
    reserved: AtomicU64,
    reserved_peak: AtomicU64,
    over_budget: AtomicU64,
}

impl ByteBudget {
    /// A budget of `bytes_max` bytes for `scope` (`connection` or `node`, named in errors).
    /// `bytes_max` was checked by [`check_config`].
    pub(crate) fn new(scope: &'static str, bytes_max: u64) -> Arc<Self> {
        let permits = usize::try_from(bytes_max)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Arc::new(Self {
            scope,
            permits: Arc::new(Semaphore::new(permits)),
            bytes_max: permits as u64,
            held: AtomicU64::new(0),
            held_peak: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            reserved_peak: AtomicU64::new(0),
            over_budget: AtomicU64::new(0),
        })
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> InFlightStats {
        InFlightStats {
            bytes_held: self.held.load(Ordering::Relaxed),
            bytes_held_peak: self.held_peak.load(Ordering::Relaxed),
            bytes_reserved: self.reserved.load(Ordering::Relaxed),
            bytes_reserved_peak: self.reserved_peak.load(Ordering::Relaxed),
            bytes_max: self.bytes_max,
            frames_over_budget: self.over_budget.load(Ordering::Relaxed),
        }
    }

    fn add_held(&self, bytes: u64) {
        let now = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.held_peak.fetch_max(now, Ordering::Relaxed);
    }

    fn sub_held(&self, bytes: u64) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The budgets a connection's incoming frames draw on: its own and its node's.
#[derive(Debug, Clone)]
pub(crate) struct ReceiveBudget {
    connection: Arc<ByteBudget>,
    node: Arc<ByteBudget>,
    wait: Duration,
}

impl ReceiveBudget {
    /// A fresh connection budget under `node`'s, sized by `config`.
    pub(crate) fn new(node: Arc<ByteBudget>, config: &TransportConfig) -> Self {
        Self {
            connection: ByteBudget::new("connection", config.connection_in_flight_bytes_max),
            node,
            wait: config.in_flight_wait_timeout,
        }
    }

    /// The connection's own budget.
    pub(crate) fn connection(&self) -> &ByteBudget {
        &self.connection
    }

    /// An empty [`InFlight`] for one frame about to be read.
    pub(crate) fn start(&self) -> InFlight {
        InFlight {
            shares: vec![
                Share::new(self.connection.clone()),
                Share::new(self.node.clone()),
            ],
            wait: self.wait,
            held: 0,
        }
    }
}

/// What one frame holds of its budgets: a reservation and the bytes it keeps. Dropping it gives
/// both back.
#[derive(Debug)]
pub(crate) struct InFlight {
    shares: Vec<Share>,
    wait: Duration,
    held: u64,
}

impl InFlight {
    /// Draws on no budget: for the identity hello, whose limits are a few hundred bytes.
    pub(crate) fn unmetered() -> Self {
        Self {
            shares: Vec::new(),
            wait: Duration::ZERO,
            held: 0,
        }
    }

    /// Reserves `bytes` (a frame's declared length) from each budget in turn, all within the
    /// wait bound. A reservation larger than a budget takes the whole budget.
    pub(crate) async fn reserve(&mut self, bytes: u64) -> Result<(), FrameError> {
        let deadline = tokio::time::Instant::now() + self.wait;
        for share in &mut self.shares {
            let budget = &share.budget;
            // acquire_many counts in u32; a budget above 4 GiB still bounds by the sum.
            let take = bytes.min(budget.bytes_max).min(u64::from(u32::MAX)) as u32;
            let acquire = budget.permits.clone().acquire_many_owned(take);
            let permit = match tokio::time::timeout_at(deadline, acquire).await {
                Ok(Ok(permit)) => permit,
                Ok(Err(_closed)) => {
                    return Err(FrameError::Stream("receive budget closed".into()));
                }
                Err(_) => {
                    budget.over_budget.fetch_add(1, Ordering::Relaxed);
                    return Err(FrameError::OverBudget {
                        scope: budget.scope,
                        len: bytes,
                        max: budget.bytes_max,
                        waited_ms: duration_ms(self.wait),
                    });
                }
            };
            let reserved = u64::from(take);
            let now = budget.reserved.fetch_add(reserved, Ordering::Relaxed) + reserved;
            budget.reserved_peak.fetch_max(now, Ordering::Relaxed);
            share.reserved += reserved;
            share.permits.push(permit);
        }
        Ok(())
    }

    /// Counts `bytes` more held for this frame.
    pub(crate) fn add(&mut self, bytes: u64) {
        self.held += bytes;
        for share in &self.shares {
            share.budget.add_held(bytes);
        }
    }

    /// Counts `bytes` fewer held for this frame.
    pub(crate) fn sub(&mut self, bytes: u64) {
        debug_assert!(bytes <= self.held, "frame releases more than it held");
        let bytes = bytes.min(self.held);
        self.held -= bytes;
        for share in &self.shares {
            share.budget.sub_held(bytes);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        for share in &self.shares {
            share.budget.sub_held(self.held);
            // Counted down before the permits go back, so `reserved` never exceeds the budget.
            share
                .budget
                .reserved
                .fetch_sub(share.reserved, Ordering::Relaxed);
        }
    }
}

/// One budget's part of an [`InFlight`].
#[derive(Debug)]
struct Share {
    budget: Arc<ByteBudget>,
    permits: Vec<OwnedSemaphorePermit>,
    reserved: u64,
}

impl Share {
    fn new(budget: Arc<ByteBudget>) -> Self {
        Self {
            budget,
            permits: Vec::new(),
            reserved: 0,
        }
    }
}

/// Why the budget settings of a [`TransportConfig`] are refused; each names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BudgetConfigError {
    /// A budget is zero or above what a semaphore can count.
    #[error("{key} {value} outside 1..={max}")]
    OutOfRange {
        /// The key.
        key: &'static str,
        /// Its value.
        value: u64,
        /// The largest value a budget may have.
        max: u64,
    },
    /// A connection's budget is above the node's, which every connection shares.
    #[error("connection_in_flight_bytes_max {connection} above node_in_flight_bytes_max {node}")]
    ConnectionAboveNode {
        /// `connection_in_flight_bytes_max`.
        connection: u64,
        /// `node_in_flight_bytes_max`.
        node: u64,
    },
}

/// Checks the budget settings of `config`; the error names the key.
pub(crate) fn check_config(config: &TransportConfig) -> Result<(), BudgetConfigError> {
    let max = Semaphore::MAX_PERMITS as u64;
    for (key, value) in [
        (
            "connection_in_flight_bytes_max",
            config.connection_in_flight_bytes_max,
        ),
        ("node_in_flight_bytes_max", config.node_in_flight_bytes_max),
    ] {
        if value == 0 || value > max {
            return Err(BudgetConfigError::OutOfRange { key, value, max });
        }
    }
    if config.connection_in_flight_bytes_max > config.node_in_flight_bytes_max {
        return Err(BudgetConfigError::ConnectionAboveNode {
            connection: config.connection_in_flight_bytes_max,
            node: config.node_in_flight_bytes_max,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(connection: u64, node: u64, wait_ms: u64) -> ReceiveBudget {
        let config = TransportConfig {
            connection_in_flight_bytes_max: connection,
            node_in_flight_bytes_max: node,
            in_flight_wait_timeout: Duration::from_millis(wait_ms),
            ..TransportConfig::for_tests()
        };
        ReceiveBudget::new(ByteBudget::new("node", node), &config)
    }

    #[tokio::test]
    async fn sec2_reservations_wait_for_room_then_fail_naming_the_budget() {
        let b = budget(100, 150, 50);
        let mut first = b.start();
        first.reserve(80).await.unwrap();
        assert_eq!(b.connection().stats().bytes_reserved, 80);
        assert_eq!(b.node.stats().bytes_reserved, 80);

        let mut second = b.start();
        let err = second.reserve(30).await.unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::OverBudget {
                    scope: "connection",
                    len: 30,
                    max: 100,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(b.connection().stats().frames_over_budget, 1);

        // Room frees when the first frame is handed on; a waiter then gets it.
        let waiter = tokio::spawn({
            let b = b.clone();
            async move {
                let mut f = b.start();
                f.reserve(30).await.map(|()| f)
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(first);
        let held = waiter.await.unwrap().unwrap();
        assert_eq!(b.connection().stats().bytes_reserved, 30);
        assert_eq!(b.connection().stats().bytes_reserved_peak, 80);
        drop(held);
        assert_eq!(b.connection().stats().bytes_reserved, 0);
        assert_eq!(b.node.stats().bytes_reserved, 0);
    }

    #[tokio::test]
    async fn sec2_a_frame_larger_than_the_budget_takes_all_of_it_and_passes_alone() {
        let b = budget(100, 100, 50);
        let mut big = b.start();
        big.reserve(1_000).await.unwrap();
        assert_eq!(b.connection().stats().bytes_reserved, 100);
        let mut other = b.start();
        assert!(other.reserve(1).await.is_err());
    }

    #[tokio::test]
    async fn sec2_node_budget_bounds_the_sum_over_connections() {
        let node = ByteBudget::new("node", 100);
        let config = TransportConfig {
            connection_in_flight_bytes_max: 100,
            node_in_flight_bytes_max: 100,
            in_flight_wait_timeout: Duration::from_millis(50),
            ..TransportConfig::for_tests()
        };
        let (a, b) = (
            ReceiveBudget::new(node.clone(), &config),
            ReceiveBudget::new(node.clone(), &config),
        );
        let mut on_a = a.start();
        on_a.reserve(70).await.unwrap();
        let err = b.start().reserve(70).await.unwrap_err();
        assert!(
            matches!(err, FrameError::OverBudget { scope: "node", .. }),
            "{err:?}"
        );
        // The failed frame gave back its connection share.
        assert_eq!(b.connection().stats().bytes_reserved, 0);
        assert_eq!(node.stats().frames_over_budget, 1);
    }

    #[test]
    fn held_bytes_are_counted_on_both_budgets_and_returned_on_drop() {
        let b = budget(100, 100, 50);
        let mut f = b.start();
        f.add(40);
        f.sub(10);
        f.add(5);
        assert_eq!(b.connection().stats().bytes_held, 35);
        assert_eq!(b.node.stats().bytes_held, 35);
        assert_eq!(b.node.stats().bytes_held_peak, 40);
        drop(f);
        assert_eq!(b.connection().stats().bytes_held, 0);
        assert_eq!(b.node.stats().bytes_held, 0);
    }

    #[test]
    fn budgets_out_of_range_are_refused_naming_the_key() {
        let mut config = TransportConfig {
            connection_in_flight_bytes_max: 0,
            ..TransportConfig::default()
        };
        let err = check_config(&config).unwrap_err();
        assert!(
            matches!(
                err,
                BudgetConfigError::OutOfRange {
                    key: "connection_in_flight_bytes_max",
                    value: 0,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("connection_in_flight_bytes_max"));
        config.connection_in_flight_bytes_max = config.node_in_flight_bytes_max + 1;
        let err = check_config(&config).unwrap_err();
        assert!(
            matches!(err, BudgetConfigError::ConnectionAboveNode { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("above node_in_flight_bytes_max"));
        assert!(check_config(&TransportConfig::default()).is_ok());
    }
}
