//! The task that drives the gateway's heartbeat machine: it sleeps until the machine's next
//! timeout (or until woken by a new incarnation), sends the heartbeats the machine asks for,
//! and fences, disconnects and reports the peers it declares dead (FENCE-1).

use std::sync::{Arc, Weak};

use cohort_transport::Frame;
use tokio::sync::Notify;

use super::state::Inner;
use super::{lock, now, PeerEvent};
use crate::heartbeat::HeartbeatEvent;
use crate::wire::WireMsg;

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
                            .is_some_and(|l| l.incarnation.epoch <= incarnation.epoch)
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
                }
            }
        }
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
