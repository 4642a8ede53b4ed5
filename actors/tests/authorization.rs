//! SEC-2 over real QUIC on 127.0.0.1: a message type reaches its handler only from the roles
//! allowed to send it, checked against the role in the sender's authenticated certificate. A
//! refused call gets a typed refusal naming the message type and the sender's role; a refused
//! one-way message is dropped; both are counted; the handler never runs and the payload is not
//! even decoded. The gateway's own hello and heartbeats stay open to every authenticated peer.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail};
use bincode::{Decode, Encode};
use bytes::Bytes;
use cohort_actors::wire::{Envelope, WireMsg, WireReply};
use cohort_actors::{
    Gateway, GatewayConfig, GatewayStats, HeartbeatConfig, Incarnation, IncarnationId,
    RefusedReason, Remote, RemoteError, RemoteMessage, Senders,
};
use cohort_transport::{codec, ClusterCa, Connection, Endpoint, Frame, NodeId, TransportConfig};
use tokio::sync::mpsc;

/// A call only the role `boss` may send.
#[derive(Debug, Encode, Decode)]
struct Halt {
    code: u32,
}

impl RemoteMessage for Halt {
    const TAG: &'static str = "test.Halt";
    const SENDERS: Senders = Senders::Roles(&["boss"]);
    type Reply = u32;
}

/// A one-way message only the role `boss` may send.
#[derive(Debug, Encode, Decode)]
struct Order(String);

impl RemoteMessage for Order {
    const TAG: &'static str = "test.Order";
    const SENDERS: Senders = Senders::Roles(&["boss"]);
    type Reply = ();
}

/// A call two roles may send.
#[derive(Debug, Encode, Decode)]
struct Read;

impl RemoteMessage for Read {
    const TAG: &'static str = "test.Read";
    const SENDERS: Senders = Senders::Roles(&["boss", "hand"]);
    type Reply = u32;
}

/// A call anyone authenticated may send.
#[derive(Debug, Encode, Decode)]
struct Ping;

impl RemoteMessage for Ping {
    const TAG: &'static str = "test.Ping";
    const SENDERS: Senders = Senders::Any;
    type Reply = ();
}

const ACTOR: &str = "station";
const HEADER_MAX: u32 = 1 << 20;
const PAYLOAD_MAX: usize = 1 << 20;

/// A gateway `station/0` serving every message type above, counting the handlers that ran,
/// and forwarding orders.
struct Station {
    gateway: Gateway,
    ran: Arc<AtomicUsize>,
    orders: mpsc::Receiver<(NodeId, String)>,
}

fn station(ca: &ClusterCa) -> anyhow::Result<Station> {
    let gateway = start(ca, &NodeId::new("station", 0), 1)?;
    let ran = Arc::new(AtomicUsize::new(0));
    let (tx, orders) = mpsc::channel(16);
    let count = ran.clone();
    gateway.register_fn::<Halt, _, _>(ACTOR, move |m: Remote<Halt>| {
        count.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, RefusedReason>(m.msg.code) }
    })?;
    let count = ran.clone();
    gateway.register_fn::<Order, _, _>(ACTOR, move |m: Remote<Order>| {
        count.fetch_add(1, Ordering::SeqCst);
        let tx = tx.clone();
        async move {
            let _ = tx.send((m.from.node, m.msg.0)).await;
            Ok::<_, RefusedReason>(())
        }
    })?;
    let count = ran.clone();
    gateway.register_fn::<Read, _, _>(ACTOR, move |_: Remote<Read>| {
        count.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, RefusedReason>(7) }
    })?;
    let count = ran.clone();
    gateway.register_fn::<Ping, _, _>(ACTOR, move |_: Remote<Ping>| {
        count.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, RefusedReason>(()) }
    })?;
    Ok(Station {
        gateway,
        ran,
        orders,
    })
}

fn start(ca: &ClusterCa, node: &NodeId, incarnation: u64) -> anyhow::Result<Gateway> {
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let endpoint = Endpoint::bind(any, ca.issue(node)?, TransportConfig::for_tests())?;
    Ok(Gateway::start(
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
    ))
}

fn run<F: std::future::Future<Output = anyhow::Result<()>>>(test: F) {
    actix::System::new().block_on(async move {
        tokio::time::timeout(Duration::from_secs(30), test)
            .await
            .expect("test timed out")
            .expect("test failed");
    });
}

fn not_allowed(tag: &str, role: &str) -> RefusedReason {
    RefusedReason::SenderNotAllowed {
        tag: tag.to_string(),
        role: role.to_string(),
    }
}

/// Waits (bounded) until `gateway`'s stats satisfy `done`.
async fn stats_until(
    gateway: &Gateway,
    done: impl Fn(&GatewayStats) -> bool,
) -> anyhow::Result<GatewayStats> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let stats = gateway.stats();
        if done(&stats) {
            return Ok(stats);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("stats never got there: {stats:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn sec2_a_restricted_call_from_another_role_is_refused_before_its_handler_runs() {
    run(async {
        let ca = ClusterCa::generate("test")?;
        let station = station(&ca)?;
        let addr = station.gateway.local_addr()?;
        let at = NodeId::new("station", 0);
        let hand = start(&ca, &NodeId::new("hand", 3), 1)?;
        let boss = start(&ca, &NodeId::new("boss", 0), 1)?;

        let from_hand = hand.resolve::<Halt>(addr, &at, ACTOR).await?;
        for _ in 0..3 {
            match from_hand.call(&Halt { code: 9 }).await {
                Err(RemoteError::Refused { reason, .. }) => {
                    assert_eq!(reason, not_allowed("test.Halt", "hand"));
                    assert_eq!(
                        reason.to_string(),
                        "message type \"test.Halt\" may not be sent by role \"hand\""
                    );
                }
                other => bail!("expected SenderNotAllowed, got {other:?}"),
            }
        }
        assert_eq!(station.ran.load(Ordering::SeqCst), 0, "no handler ran");
        let stats = station.gateway.stats();
        assert_eq!((stats.sender_not_allowed, stats.refused), (3, 3));

        // The allowed role gets through, and a refusal does not spoil the peer's connection.
        let from_boss = boss.resolve::<Halt>(addr, &at, ACTOR).await?;
        assert_eq!(from_boss.call(&Halt { code: 9 }).await?, 9);
        assert_eq!(station.ran.load(Ordering::SeqCst), 1);
        let from_hand = hand.resolve::<Read>(addr, &at, ACTOR).await?;
        assert_eq!(from_hand.call(&Read).await?, 7);
        assert_eq!(station.ran.load(Ordering::SeqCst), 2);
        assert_eq!(station.gateway.stats().sender_not_allowed, 3);
        Ok(())
    });
}

#[test]
fn sec2_a_restricted_one_way_message_from_another_role_is_dropped_and_counted() {
    run(async {
        let ca = ClusterCa::generate("test")?;
        let mut station = station(&ca)?;
        let addr = station.gateway.local_addr()?;
        let at = NodeId::new("station", 0);
        let hand = start(&ca, &NodeId::new("hand", 0), 1)?;
        let boss = start(&ca, &NodeId::new("boss", 0), 1)?;

        let from_hand = hand.resolve::<Order>(addr, &at, ACTOR).await?;
        from_hand.tell(&Order("from hand".into())).await?;
        let stats = stats_until(&station.gateway, |s| s.sender_not_allowed == 1).await?;
        assert_eq!(stats.refused, 1);
        assert_eq!(station.ran.load(Ordering::SeqCst), 0, "no handler ran");
        assert!(station.orders.try_recv().is_err());

        let from_boss = boss.resolve::<Order>(addr, &at, ACTOR).await?;
        from_boss.tell(&Order("from boss".into())).await?;
        let (from, text) = tokio::time::timeout(Duration::from_secs(5), station.orders.recv())
            .await?
            .ok_or_else(|| anyhow!("orders closed"))?;
        assert_eq!((from, text.as_str()), (NodeId::new("boss", 0), "from boss"));
        assert_eq!(station.ran.load(Ordering::SeqCst), 1);
        assert_eq!(station.gateway.stats().sender_not_allowed, 1);
        Ok(())
    });
}

#[test]
fn sec2_hello_heartbeats_and_open_types_reach_every_authenticated_peer() {
    run(async {
        let ca = ClusterCa::generate("test")?;
        let station = station(&ca)?;
        let addr = station.gateway.local_addr()?;
        let at = NodeId::new("station", 0);
        // A role that may send none of the restricted types still connects and is alive.
        let stranger = NodeId::new("stranger", 0);
        let gateway = start(&ca, &stranger, 4)?;
        let target = gateway.connect(addr, &at).await?;
        assert_eq!(target, Incarnation::new(at.clone(), IncarnationId(1)));
        assert_eq!(
            station.gateway.peer_status(&stranger),
            Some((IncarnationId(4), true))
        );
        gateway
            .remote_ref::<Ping>(target.clone(), ACTOR)
            .call(&Ping)
            .await?;
        match gateway.remote_ref::<Read>(target, ACTOR).call(&Read).await {
            Err(RemoteError::Refused { reason, .. }) => {
                assert_eq!(reason, not_allowed("test.Read", "stranger"))
            }
            other => bail!("expected SenderNotAllowed, got {other:?}"),
        }
        assert_eq!(station.ran.load(Ordering::SeqCst), 1);
        let stats = station.gateway.stats();
        assert_eq!((stats.sender_not_allowed, stats.refused), (1, 1));
        Ok(())
    });
}

/// Over a raw connection: the refusal comes before the payload is decoded (garbage from a
/// role that may not send is refused as not allowed, not as a bad message), and the role is
/// the certificate's, whatever the envelope claims.
#[test]
fn sec2_the_check_uses_the_certificate_and_comes_before_decoding() {
    run(async {
        let ca = ClusterCa::generate("test")?;
        let station = station(&ca)?;
        let addr = station.gateway.local_addr()?;
        let at = NodeId::new("station", 0);
        let any: SocketAddr = "127.0.0.1:0".parse()?;

        let hand = NodeId::new("hand", 0);
        let raw = Endpoint::bind(any, ca.issue(&hand)?, TransportConfig::for_tests())?;
        let conn = raw.connect(addr, &at).await?;
        let me = Incarnation::new(hand.clone(), IncarnationId(1));
        assert!(matches!(
            hello(&conn, me.clone()).await?,
            WireReply::Hello { .. }
        ));
        let garbage = Bytes::from_static(&[0xff; 16]);
        assert_eq!(
            ask(&conn, call(me.clone(), Halt::TAG, garbage.clone())?).await?,
            WireReply::Refused(not_allowed("test.Halt", "hand"))
        );
        // Claiming to be the boss in the envelope is a forged sender (SEC-1), not a pass.
        let claimed = Incarnation::new(NodeId::new("boss", 0), IncarnationId(1));
        let payload = codec::encode(&Halt { code: 1 }, PAYLOAD_MAX)?;
        match ask(&conn, call(claimed, Halt::TAG, payload)?).await? {
            WireReply::Refused(RefusedReason::NotAuthenticated(_)) => {}
            other => bail!("expected NotAuthenticated, got {other:?}"),
        }

        // The same garbage from the allowed role passes SEC-2 and fails to decode.
        let boss = NodeId::new("boss", 0);
        let raw_boss = Endpoint::bind(any, ca.issue(&boss)?, TransportConfig::for_tests())?;
        let conn = raw_boss.connect(addr, &at).await?;
        let me = Incarnation::new(boss, IncarnationId(1));
        assert!(matches!(
            hello(&conn, me.clone()).await?,
            WireReply::Hello { .. }
        ));
        match ask(&conn, call(me, Halt::TAG, garbage)?).await? {
            WireReply::Refused(RefusedReason::BadMessage(_)) => {}
            other => bail!("expected BadMessage, got {other:?}"),
        }
        assert_eq!(station.ran.load(Ordering::SeqCst), 0);
        let stats = station.gateway.stats();
        assert_eq!((stats.sender_not_allowed, stats.refused), (1, 3));
        Ok(())
    });
}

fn call(from: Incarnation<NodeId>, tag: &str, payload: Bytes) -> anyhow::Result<Frame> {
    let envelope = Envelope {
        from,
        to_incarnation: IncarnationId(1),
        actor: ACTOR.to_string(),
        tag: tag.to_string(),
        reply_within_ms: 5_000,
    };
    Ok(Frame::encode(
        &WireMsg::Call(envelope),
        vec![payload],
        HEADER_MAX,
    )?)
}

async fn ask(conn: &Connection, frame: Frame) -> anyhow::Result<WireReply> {
    Ok(conn.request(frame).await?.decode(HEADER_MAX)?)
}

async fn hello(conn: &Connection, from: Incarnation<NodeId>) -> anyhow::Result<WireReply> {
    let frame = Frame::encode(&WireMsg::Hello { from }, Vec::new(), HEADER_MAX)?;
    ask(conn, frame).await
}
