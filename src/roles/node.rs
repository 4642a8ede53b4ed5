//! Bringing up one node of a cluster: its credentials, its QUIC endpoint at its address from
//! the cluster spec, and its actor gateway with its incarnation epoch. Every role starts here.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use cohort_actors::{Epoch, Gateway, GatewayConfig, HeartbeatConfig};
use cohort_transport::{Endpoint, NodeCredentials, NodeId, TransportConfig};

use crate::cluster::{node_id, ClusterConfig, TaskId};

/// What a node needs to join its cluster.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The cluster and this node's task.
    pub cluster: ClusterConfig,
    /// Directory holding `ca.pem` and this node's certificate and key.
    pub certs_dir: PathBuf,
    /// This process's incarnation (larger after every restart; FENCE-1).
    pub epoch: u64,
    /// How long a silent peer may stay silent before it is declared dead.
    pub detection_budget: Duration,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The certificates could not be loaded.
    #[error("certificates in {dir}: {reason}")]
    Certs {
        /// The directory.
        dir: String,
        /// What went wrong.
        reason: String,
    },
    /// A task's address does not resolve.
    #[error("address of {task} ({addr}): {reason}")]
    Address {
        /// The task.
        task: TaskId,
        /// Its address.
        addr: String,
        /// Why it does not resolve.
        reason: String,
    },
    /// The endpoint could not bind.
    #[error("binding {addr}: {reason}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
}

/// Loads credentials, binds the endpoint and starts the gateway. Call inside the actix system
/// (a tokio runtime) of the node.
pub fn start_gateway(config: &NodeConfig) -> Result<Gateway, NodeError> {
    let me = node_id(config.cluster.task);
    let creds = NodeCredentials::load(&config.certs_dir, &me).map_err(|e| NodeError::Certs {
        dir: config.certs_dir.display().to_string(),
        reason: e.to_string(),
    })?;
    let addr = resolve(config, config.cluster.task)?;
    let bind_addr = SocketAddr::new(
        if addr.ip().is_loopback() {
            addr.ip()
        } else {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        },
        addr.port(),
    );
    let transport = transport_config(config.detection_budget);
    let endpoint = Endpoint::bind(bind_addr, creds, transport).map_err(|e| NodeError::Bind {
        addr: bind_addr,
        reason: e.to_string(),
    })?;
    let gateway_config = GatewayConfig {
        epoch: Epoch(config.epoch),
        heartbeat: HeartbeatConfig {
            interval: config.detection_budget / 4,
            timeout: config.detection_budget,
        },
        payload_bytes_max: PAYLOAD_BYTES_MAX,
        call_timeout: CALL_TIMEOUT,
        ..GatewayConfig::default()
    };
    Ok(Gateway::start(endpoint, gateway_config))
}

/// The socket address of `task`.
pub fn resolve(config: &NodeConfig, task: TaskId) -> Result<SocketAddr, NodeError> {
    let addr = config
        .cluster
        .cluster
        .address(task)
        .map_err(|e| NodeError::Address {
            task,
            addr: String::new(),
            reason: e.to_string(),
        })?;
    resolve_within(addr.to_string(), RESOLVE_TIMEOUT).map_err(|reason| NodeError::Address {
        task,
        addr: addr.to_string(),
        reason,
    })
}

/// The first socket address `addr` (`host:port`) resolves to, within `timeout`. Name lookup
/// blocks in the system resolver with no bound of its own, so it runs on a thread of its own
/// that is abandoned if it does not answer in time (the process then refuses to start).
fn resolve_within(addr: String, timeout: Duration) -> Result<SocketAddr, String> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("resolve".into())
        .spawn(move || {
            let resolved = addr
                .to_socket_addrs()
                .map_err(|e| e.to_string())
                .and_then(|mut addrs| addrs.next().ok_or_else(|| "no address".to_string()));
            let _ = tx.send(resolved);
        })
        .map_err(|e| format!("cannot start the name lookup: {e}"))?;
    rx.recv_timeout(timeout)
        .map_err(|_| format!("name lookup did not answer within {timeout:?}"))?
}

/// Bound on resolving one task's address.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The node id of `task` (what its certificate names).
pub fn peer(task: TaskId) -> NodeId {
    node_id(task)
}

/// Transport settings whose idle timeout matches the failure-detection budget.
fn transport_config(detection_budget: Duration) -> TransportConfig {
    TransportConfig {
        idle_timeout: detection_budget,
        keep_alive_interval: detection_budget / 4,
        request_timeout: CALL_TIMEOUT,
        blob_bytes_max: PAYLOAD_BYTES_MAX as u64,
        ..TransportConfig::default()
    }
}

/// Largest message payload: a checkpoint snapshot of a 500,000 × 16 shard is 32 MiB.
const PAYLOAD_BYTES_MAX: usize = 128 * 1024 * 1024;
/// Bound on a remote call, except a closure's run on a worker: that one is bounded by the
/// coordinator's step timeout (`SchedulerConfig::step_timeout`) instead.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_resolves_within_its_bound() {
        let addr = resolve_within("127.0.0.1:7000".into(), Duration::from_secs(5)).unwrap();
        assert_eq!(addr, SocketAddr::from(([127, 0, 0, 1], 7000)));
    }

    #[test]
    fn a_name_that_does_not_resolve_is_an_error_within_the_bound() {
        // Either the resolver says no or the bound expires: both are errors, never a hang.
        let err =
            resolve_within("no-such-host.invalid:1".into(), Duration::from_secs(3)).unwrap_err();
        assert!(!err.is_empty());
        let err = resolve_within("not an address".into(), Duration::from_secs(3)).unwrap_err();
        assert!(!err.is_empty());
    }
}
