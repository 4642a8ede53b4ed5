//! Peers dialed by name over real QUIC on 127.0.0.1: a name is resolved on every dial, so a
//! name that does not resolve yet is a dial that fails for now (retried by the caller) and
//! succeeds once it resolves, and a peer recreated under the same name at a new address is
//! reached there. Names are looked up by an injected resolver whose answers the test flips.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail};
use bincode::{Decode, Encode};
use cohort_actors::{
    Gateway, GatewayConfig, HeartbeatConfig, IncarnationId, LookupError, PeerAddr, RefusedReason,
    Remote, RemoteError, RemoteMessage, Resolver, Senders,
};
use cohort_transport::{ClusterCa, Endpoint, NodeCredentials, NodeId, TransportConfig};

#[derive(Debug, Encode, Decode)]
struct Ping;

impl RemoteMessage for Ping {
    const TAG: &'static str = "test.Ping";
    const SENDERS: Senders = Senders::Any;
    type Reply = u64;
}

/// A name service the test edits: the name resolves to what it holds, or not at all.
#[derive(Default)]
struct Names(Mutex<Option<SocketAddr>>);

impl Resolver for Names {
    fn lookup(&self, _: &str) -> Result<Vec<SocketAddr>, LookupError> {
        match *self.0.lock().unwrap() {
            Some(addr) => Ok(vec![addr]),
            None => Err(LookupError::NoSuchHost),
        }
    }
}

fn start(creds: NodeCredentials, incarnation: u64) -> anyhow::Result<Gateway> {
    let endpoint = Endpoint::bind("127.0.0.1:0".parse()?, creds, TransportConfig::for_tests())?;
    let gateway = Gateway::start(
        endpoint,
        GatewayConfig {
            incarnation: IncarnationId(incarnation),
            heartbeat: HeartbeatConfig {
                interval: Duration::from_millis(100),
                timeout: Duration::from_secs(5),
            },
            call_timeout: Duration::from_secs(5),
            ..GatewayConfig::default()
        },
    );
    // Answers with its own incarnation, so the caller sees which process it reached.
    gateway.register_fn::<Ping, _, _>("echo", move |_: Remote<Ping>| async move {
        Ok::<_, RefusedReason>(incarnation)
    })?;
    Ok(gateway)
}

fn run(test: impl std::future::Future<Output = anyhow::Result<()>>) {
    actix::System::new().block_on(async move {
        tokio::time::timeout(Duration::from_secs(60), test)
            .await
            .expect("test timed out")
            .expect("test failed");
    });
}

/// Dials `node` at `addr` until it answers, at most `tries` times; the errors seen before.
async fn dial_until_answered(
    gateway: &Gateway,
    addr: &PeerAddr,
    node: &NodeId,
    tries: u32,
) -> anyhow::Result<(u64, Vec<RemoteError>)> {
    let mut errors = Vec::new();
    for _ in 0..tries {
        let answer = match gateway.resolve::<Ping>(addr, node, "echo").await {
            Ok(echo) => echo.call(&Ping).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(incarnation) => return Ok((incarnation, errors)),
            // A link to a process that has just gone fails until it is seen closed.
            Err(e) => errors.push(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("{node} at {addr} never answered: {errors:?}")
}

#[test]
fn a_name_that_resolves_late_is_dialed_once_it_resolves_and_followed_to_a_new_address() {
    run(async {
        let ca = ClusterCa::generate("test")?;
        let (chief, ps) = (NodeId::new("chief", 0), NodeId::new("ps", 0));
        let dialer = start(ca.issue(&chief)?, 1)?;
        let names = Arc::new(Names::default());
        let addr = PeerAddr::with_resolver("ps-0.job.svc:2222", names.clone());

        // The name does not resolve yet: the dial fails as a peer not reachable (transient),
        // saying which name, and the process goes on.
        match dialer.connect(&addr, &ps).await {
            Err(RemoteError::PeerLost { reason, .. }) => {
                assert!(reason.contains("ps-0.job.svc:2222"), "{reason}");
                assert!(reason.contains("does not resolve"), "{reason}");
            }
            other => bail!("expected the unresolved name to be a lost peer, got {other:?}"),
        }

        // The peer comes up and its name starts resolving: the next dial reaches it.
        let first = start(ca.issue(&ps)?, 1)?;
        *names.0.lock().unwrap() = Some(first.local_addr()?);
        let (incarnation, _) = dial_until_answered(&dialer, &addr, &ps, 50).await?;
        assert_eq!(incarnation, 1);
        assert_eq!(addr.last_resolved(), Some(first.local_addr()?));

        // The peer is recreated under the same name at a new address (a new pod IP); the old
        // process is gone. The name now resolves there, and the dialer follows it.
        first.shutdown();
        let second = start(ca.issue(&ps)?, 2)?;
        let new_addr = second.local_addr()?;
        assert_ne!(Some(new_addr), addr.last_resolved());
        *names.0.lock().unwrap() = Some(new_addr);
        let (incarnation, _) = dial_until_answered(&dialer, &addr, &ps, 100).await?;
        assert_eq!(
            incarnation, 2,
            "the recreated peer answers at its new address"
        );
        assert_eq!(addr.last_resolved(), Some(new_addr));
        assert_eq!(dialer.peer_status(&ps), Some((IncarnationId(2), true)));
        second.shutdown();
        dialer.shutdown();
        Ok(())
    })
}

#[test]
fn a_name_that_never_resolves_fails_every_dial_within_the_bound_and_never_panics() {
    run(async {
        let ca = ClusterCa::generate("test")?;
        let dialer = start(ca.issue(&NodeId::new("chief", 0))?, 1)?;
        let addr = PeerAddr::new("never-resolves.invalid:2222");
        let worker = NodeId::new("worker", 3);
        for _ in 0..3 {
            match dialer.connect(&addr, &worker).await {
                Err(RemoteError::PeerLost { reason, .. }) => {
                    assert!(reason.contains("never-resolves.invalid:2222"), "{reason}")
                }
                other => return Err(anyhow!("expected a lost peer, got {other:?}")),
            }
        }
        // A call to it fails the same way, and so does telling a fenced incarnation of it.
        let err = dialer
            .call_fenced::<Ping>(
                &addr,
                &cohort_actors::Incarnation::new(worker.clone(), IncarnationId(1)),
                "echo",
                &Ping,
            )
            .await
            .unwrap_err();
        assert!(matches!(err, RemoteError::PeerLost { .. }), "{err:?}");
        Ok(())
    })
}
