//! Helpers for the roles' unit tests: a node's gateway on 127.0.0.1 with test timings.

use std::net::SocketAddr;
use std::time::Duration;

use cohort_actors::{Gateway, GatewayConfig, HeartbeatConfig, IncarnationId};
use cohort_transport::{ClusterCa, Endpoint, NodeId, TransportConfig};

/// A gateway for `node` (certificate from `ca`, incarnation `incarnation`) bound to an ephemeral port
/// on 127.0.0.1: heartbeats every 100 ms, a peer silent for 2 s is lost, and a call not answered
/// within `call_timeout` fails.
pub(crate) fn loopback_gateway(
    ca: &ClusterCa,
    node: &NodeId,
    incarnation: u64,
    call_timeout: Duration,
) -> Gateway {
    let any: SocketAddr = "127.0.0.1:0".parse().expect("a socket address");
    let endpoint = Endpoint::bind(
        any,
        ca.issue(node).expect("a node certificate"),
        TransportConfig::for_tests(),
    )
    .expect("an endpoint on 127.0.0.1");
    Gateway::start(
        endpoint,
        GatewayConfig {
            incarnation: IncarnationId(incarnation),
            heartbeat: HeartbeatConfig {
                interval: Duration::from_millis(100),
                timeout: Duration::from_secs(2),
            },
            call_timeout,
            ..GatewayConfig::default()
        },
    )
}
