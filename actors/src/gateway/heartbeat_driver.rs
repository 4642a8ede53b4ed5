//! The task that drives the gateway's heartbeat machine: it sleeps until the machine's next
//! timeout (or until woken by a new incarnation), sends the heartbeats the machine asks for,
//! probes the peers it suspects, and fences, disconnects and reports the peers it declares
//! dead (FENCE-1).

use std::io::ErrorKind;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use cohort_transport::{Frame, NodeId};
use tokio::sync::Notify;

use super::state::Inner;
use super::{lock, now, PeerEvent};
use crate::heartbeat::HeartbeatEvent;
use crate::wire::WireMsg;
use crate::Incarnation;

/// Drives the heartbeat machine: sleeps until its next timeout (or until woken), then sends
/// heartbeats and reports and fences dead peers.
pub(super) async fn run(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let deadline = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let state = lock(&inner.state);
            state.heartbeat.poll_timeout()
        };
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = wake.notified() => {}
            _ = sleep => {}
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let now = now();
        let mut sends = Vec::new();
        let mut published = Vec::new();
        let mut probes = Vec::new();
        {
            let mut state = lock(&inner.state);
            state.heartbeat.handle_timeout(now);
            while let Some(event) = state.heartbeat.poll_event() {
                match event {
                    HeartbeatEvent::SendHeartbeat { peer } => {
                        if let Some(link) = state.peers.get(&peer) {
                            sends.push(link.conn.clone());
                        }
                    }
                    HeartbeatEvent::PeerDead { incarnation, cause } => {
                        // FENCE-1: a silent incarnation is fenced, so it cannot come back.
                        state.fencing.fence(&incarnation);
                        if state
                            .peers
                            .get(&incarnation.node)
                            .is_some_and(|l| l.incarnation.incarnation <= incarnation.incarnation)
                        {
                            if let Some(link) = state.peers.remove(&incarnation.node) {
                                link.conn.close();
                            }
                        }
                        published.push(PeerEvent::Dead { incarnation, cause });
                    }
                    HeartbeatEvent::PeerAlive { incarnation } => {
                        published.push(PeerEvent::Alive(incarnation));
                    }
                    HeartbeatEvent::Probe { incarnation } => {
                        // Where this incarnation was reached; a peer known only by a dial
                        // not made yet has no address to probe.
                        if let Some(link) = state
                            .peers
                            .get(&incarnation.node)
                            .filter(|l| l.incarnation == incarnation)
                        {
                            probes.push((incarnation, link.conn.remote_address()));
                        }
                    }
                }
            }
        }
        probe_for_refusal(&inner, probes);
        for event in published {
            tracing::info!(node = %inner.me, ?event, "peer event");
            inner.publish(event);
        }
        if !sends.is_empty() {
            let header_max = inner.endpoint.config().frame_bytes_max;
            let beat = WireMsg::Heartbeat {
                from: inner.me.clone(),
            };
            let Ok(frame) = Frame::encode(&beat, Vec::new(), header_max) else {
                continue;
            };
            for conn in sends {
                let frame = frame.clone();
                // Bounded by the transport's request timeout; a frozen peer's sends just fail.
                tokio::spawn(async move {
                    let _ = conn.send(frame).await;
                });
            }
        }
    }
}

/// Probes each suspected peer's address (`probes`: the incarnation, where it was reached) in
/// the background; one where nothing listens any more is declared dead at once (a refused
/// probe is evidence, [`refused`]), and the driver woken to act on it.
fn probe_for_refusal(inner: &Arc<Inner>, probes: Vec<(Incarnation<NodeId>, SocketAddr)>) {
    let wait = inner.config.heartbeat.interval;
    for (incarnation, addr) in probes {
        let inner = Arc::downgrade(inner);
        tokio::spawn(async move {
            if !refused(addr, wait).await {
                return;
            }
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let declared = lock(&inner.state).heartbeat.handle_refused(
                super::now(),
                &incarnation.node,
                incarnation.incarnation,
            );
            if declared {
                tracing::info!(
                    node = %inner.me, peer = %incarnation, %addr,
                    "silent, and nothing listens where it was: declared dead"
                );
                inner.wake.notify_one();
            }
        });
    }
}

/// Whether nothing listens at `addr` any more. A datagram sent there from a connected UDP
/// socket draws an ICMP port unreachable when no socket is bound to that port, which the
/// socket's next receive reports as a refused connection (QUIC's own socket is not connected,
/// so quinn never sees it). A live QUIC endpoint drops the one-byte datagram (no QUIC packet
/// is that short); a frozen process still holds its socket and a partitioned or vanished host
/// answers nothing: all "not refused". Bounded by `wait`.
async fn refused(addr: SocketAddr, wait: Duration) -> bool {
    let local: SocketAddr = if addr.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let Ok(socket) = tokio::net::UdpSocket::bind(local).await else {
        return false;
    };
    if socket.connect(addr).await.is_err() {
        return false;
    }
    if let Err(e) = socket.send(&[0]).await {
        return e.kind() == ErrorKind::ConnectionRefused;
    }
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(wait, socket.recv(&mut buf)).await,
        Ok(Err(e)) if e.kind() == ErrorKind::ConnectionRefused
    )
}
