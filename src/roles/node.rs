//! Bringing up one node of a cluster: its credentials, its QUIC endpoint on its port from the
//! cluster spec (under network fault rules when `COHORT_NET_FAULTS` names a file:
//! `cohort_chaos::rules`), its actor gateway with its incarnation, and where its peers are dialed
//! ([`peer_addr`]: names resolved on every dial, never once at start-up). Every role starts
//! here.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use cohort_actors::{Gateway, GatewayConfig, HeartbeatConfig, IncarnationId, PeerAddr};
use cohort_transport::{NodeCredentials, NodeId, TransportConfig};

use crate::cluster::{node_id, ClusterConfig, TaskId};

/// What a node needs to join its cluster.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The cluster and this node's task.
    pub cluster: ClusterConfig,
    /// Directory holding `ca.pem` and this node's certificate and key.
    pub certs_dir: PathBuf,
    /// This process's incarnation (larger after every restart; FENCE-1).
    pub incarnation: u64,
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
///
/// The node binds its own port without resolving its own name: a literal loopback address is
/// bound as it is (local clusters stay on loopback), anything else binds `0.0.0.0` on its port
/// (a pod's name may not resolve, or not to itself, while it starts).
pub fn start_gateway(config: &NodeConfig) -> Result<Gateway, NodeError> {
    let me = node_id(config.cluster.task);
    let creds = NodeCredentials::load(&config.certs_dir, &me).map_err(|e| NodeError::Certs {
        dir: config.certs_dir.display().to_string(),
        reason: e.to_string(),
    })?;
    let bind_addr = bind_addr(config, config.cluster.task)?;
    let transport = transport_config(config.detection_budget);
    // Under `cohort chaos run` (COHORT_NET_FAULTS names a rules file) the socket drops what
    // the runner's partitions and loss say; otherwise it is the plain socket, untouched.
    let bound = cohort_chaos::rules::bind_endpoint(bind_addr, creds, transport);
    let endpoint = bound.map_err(|e| NodeError::Bind {
        addr: bind_addr,
        reason: e.to_string(),
    })?;
    // Certificates rotated in the directory (a renewed Secret) serve the handshakes that
    // follow, without a restart.
    cohort_transport::reload::watch_credentials(
        &endpoint,
        config.certs_dir.clone(),
        cohort_transport::reload::RELOAD_EVERY,
    );
    let gateway_config = GatewayConfig {
        incarnation: IncarnationId(config.incarnation),
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

/// The address this node binds for `task`: its own address when that is a literal loopback
/// one, else the unspecified address on its port. Never a name lookup.
fn bind_addr(config: &NodeConfig, task: TaskId) -> Result<SocketAddr, NodeError> {
    let addr = address(config, task)?;
    let bad = |reason: &str| NodeError::Address {
        task,
        addr: addr.to_string(),
        reason: reason.to_string(),
    };
    if let Ok(literal) = addr.parse::<SocketAddr>() {
        if literal.ip().is_loopback() {
            return Ok(literal);
        }
        return Ok(SocketAddr::new(
            Ipv4Addr::UNSPECIFIED.into(),
            literal.port(),
        ));
    }
    let (_, port) = addr.rsplit_once(':').ok_or_else(|| bad("not host:port"))?;
    let port = port
        .parse::<u16>()
        .map_err(|_| bad("the port is not a number from 1 to 65535"))?;
    Ok(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port))
}

/// Where to dial `task`: its `host:port` from the cluster spec. A literal address is used as
/// it is; a name is looked up again on every dial (a peer recreated under the same name with
/// a new IP is reached there), bounded in time, and one that does not resolve yet is a peer
/// not reachable yet, not a configuration error.
pub fn peer_addr(config: &NodeConfig, task: TaskId) -> Result<PeerAddr, NodeError> {
    Ok(PeerAddr::new(address(config, task)?))
}

fn address(config: &NodeConfig, task: TaskId) -> Result<&str, NodeError> {
    config
        .cluster
        .cluster
        .address(task)
        .map_err(|e| NodeError::Address {
            task,
            addr: String::new(),
            reason: e.to_string(),
        })
}

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
    use crate::cluster::{ClusterSpec, TaskType};

    fn config(task: TaskId, chief: &str, worker: &str) -> NodeConfig {
        let spec = ClusterSpec::new(
            [
                (TaskType::Chief, vec![chief.to_string()]),
                (TaskType::Worker, vec![worker.to_string()]),
                (TaskType::Ps, vec!["ps-0.job.svc:2222".to_string()]),
            ]
            .into(),
        )
        .unwrap();
        NodeConfig {
            cluster: ClusterConfig::new(spec, task).unwrap(),
            certs_dir: PathBuf::from("/nonexistent"),
            incarnation: 1,
            detection_budget: Duration::from_secs(3),
        }
    }

    #[test]
    fn a_node_binds_its_port_without_resolving_its_own_name() {
        let chief = TaskId::new(TaskType::Chief, 0);
        let worker = TaskId::new(TaskType::Worker, 0);
        let c = config(chief, "127.0.0.1:7000", "no-such-host.invalid:7001");
        // A literal loopback address is bound as it is (local clusters stay on loopback).
        assert_eq!(
            bind_addr(&c, chief).unwrap(),
            "127.0.0.1:7000".parse().unwrap()
        );
        // A name that does not resolve binds the unspecified address on its port.
        assert_eq!(
            bind_addr(&c, worker).unwrap(),
            "0.0.0.0:7001".parse().unwrap()
        );
        let c = config(chief, "10.1.2.3:7000", "w:7001");
        assert_eq!(
            bind_addr(&c, chief).unwrap(),
            "0.0.0.0:7000".parse().unwrap()
        );
    }

    #[test]
    fn a_peer_name_that_does_not_resolve_yet_is_not_an_error_at_start_up() {
        let chief = TaskId::new(TaskType::Chief, 0);
        let c = config(chief, "127.0.0.1:7000", "no-such-host.invalid:7001");
        let worker = peer_addr(&c, TaskId::new(TaskType::Worker, 0)).unwrap();
        assert!(worker.is_name());
        assert_eq!(worker.to_string(), "no-such-host.invalid:7001");
        assert_eq!(worker.last_resolved(), None);
        let chief = peer_addr(&c, chief).unwrap();
        assert_eq!(
            chief.last_resolved(),
            Some("127.0.0.1:7000".parse().unwrap())
        );
    }
}
