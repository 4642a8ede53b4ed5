//! SEC-2 receive budgets seen through the gateway, over real QUIC on 127.0.0.1: a call that
//! finds no room in the receiver's in-flight byte budget, or whose reply finds none in the
//! caller's, fails as [`RemoteError::Busy`] (transient: the same call goes through once there
//! is room), never as a refusal of the message or a codec error.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context as _};
use bincode::{Decode, Encode};
use bytes::Bytes;
use cohort_actors::{
    Gateway, GatewayConfig, HeartbeatConfig, IncarnationId, RefusedReason, Remote, RemoteError,
    RemoteMessage, Senders,
};
use cohort_transport::connection::RawRequest;
use cohort_transport::{ClusterCa, Endpoint, NodeId, TransportConfig};

/// A call that carries blobs and is answered with `reply_bytes` bytes in one blob.
#[derive(Debug, Encode, Decode)]
struct Load {
    reply_bytes: u32,
}

impl RemoteMessage for Load {
    const TAG: &'static str = "test.Load";
    const SENDERS: Senders = Senders::Any;
    /// The bytes of blobs received.
    type Reply = u64;
}

const ACTOR: &str = "store";
const MIB: u64 = 1024 * 1024;
/// Every node's receive budget, per connection and in all.
const BUDGET: u64 = 4 * MIB;
/// What the hog holds of a budget: less than all of it, so small frames (hellos,
/// heartbeats) still fit, but too much for a 2 MiB frame.
const HELD: u64 = 3 * MIB;
const BIG: usize = 2 * MIB as usize;
/// How long a frame waits for room before it is refused.
const ROOM_WAIT: Duration = Duration::from_millis(300);
/// Bound on waiting for a claim to be taken or given back.
const SETTLE_MAX: Duration = Duration::from_secs(10);

#[test]
fn sec2_a_call_into_a_full_receive_budget_is_busy_and_goes_through_later() {
    run(async {
        let ca = ClusterCa::generate("test")?;
        let store_id = NodeId::new("store", 0);
        let store = start(&ca, &store_id)?;
        serve_loads(&store)?;
        let addr = store.local_addr()?;
        let caller = start(&ca, &NodeId::new("caller", 0))?;
        let load = caller.resolve::<Load>(addr, &store_id, ACTOR).await?;
        let big = || vec![Bytes::from(vec![7u8; BIG])];
        assert_eq!(
            load.call_with_blobs(&Load { reply_bytes: 0 }, big())
                .await?
                .0,
            BIG as u64,
            "the call fits while the budget is free"
        );

        // Another node holds most of the store's node budget with a frame it never finishes.
        let (hog, held) = hog(&ca, addr, &store_id).await?;
        let err = call_until_err(&load, &Load { reply_bytes: 0 }, big).await?;
        match &err {
            RemoteError::Busy { peer, reason } => {
                assert_eq!(peer, &store_id);
                assert!(reason.contains("in-flight byte budget is full"), "{reason}");
            }
            other => bail!("expected Busy, got {other:?}"),
        }
        assert!(err.to_string().starts_with("store/0 is busy"), "{err}");

        // Room again: the same call goes through.
        drop(held);
        let passed = call_until_ok(&load, &Load { reply_bytes: 0 }, big).await?;
        assert_eq!(passed, BIG as u64);
        drop(hog);
        Ok(())
    });
}

#[test]
fn sec2_a_reply_without_room_in_the_callers_budget_is_busy_not_a_codec_error() {
    run(async {
        let ca = ClusterCa::generate("test")?;
        let store_id = NodeId::new("store", 0);
        let store = start(&ca, &store_id)?;
        serve_loads(&store)?;
        let caller_id = NodeId::new("caller", 0);
        let caller = start(&ca, &caller_id)?;
        let load = caller
            .resolve::<Load>(store.local_addr()?, &store_id, ACTOR)
            .await?;
        let ask = Load {
            reply_bytes: BIG as u32,
        };
        assert_eq!(
            load.call(&ask).await?,
            0,
            "the reply fits while the budget is free"
        );

        // The caller's own budget is held, so the 2 MiB reply finds no room on the way back.
        let (hog, held) = hog(&ca, caller.local_addr()?, &caller_id).await?;
        let err = call_until_err(&load, &ask, Vec::new).await?;
        match &err {
            RemoteError::Busy { peer, reason } => {
                assert_eq!(peer, &store_id);
                assert!(reason.contains("receive budget"), "{reason}");
            }
            other => bail!("expected Busy, got {other:?}"),
        }

        drop(held);
        assert_eq!(call_until_ok(&load, &ask, Vec::new).await?, 0);
        drop(hog);
        Ok(())
    });
}

// ---- harness ----

fn start(ca: &ClusterCa, node: &NodeId) -> anyhow::Result<Gateway> {
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let endpoint = Endpoint::bind(any, ca.issue(node)?, budgets())?;
    Ok(Gateway::start(
        endpoint,
        GatewayConfig {
            incarnation: IncarnationId(1),
            heartbeat: HeartbeatConfig {
                interval: Duration::from_millis(100),
                timeout: Duration::from_secs(5),
            },
            call_timeout: Duration::from_secs(5),
            ..GatewayConfig::default()
        },
    ))
}

fn budgets() -> TransportConfig {
    TransportConfig {
        connection_in_flight_bytes_max: BUDGET,
        node_in_flight_bytes_max: BUDGET,
        in_flight_wait_timeout: ROOM_WAIT,
        ..TransportConfig::for_tests()
    }
}

/// Answers every [`Load`] with the bytes it received, and a blob of the size it asks for.
fn serve_loads(gateway: &Gateway) -> anyhow::Result<()> {
    gateway.register_fn_with_blobs::<Load, _, _>(ACTOR, |m: Remote<Load>| {
        let received = m.blobs.iter().map(|b| b.len() as u64).sum::<u64>();
        let reply = vec![Bytes::from(vec![1u8; m.msg.reply_bytes as usize])];
        async move { Ok::<_, RefusedReason>((received, reply)) }
    })?;
    Ok(())
}

/// A node `hog/0` connected to `addr`, holding [`HELD`] bytes of its budget with a frame
/// whose prefix declares them and which it never finishes (until the request is dropped).
async fn hog(
    ca: &ClusterCa,
    addr: SocketAddr,
    node: &NodeId,
) -> anyhow::Result<(Endpoint, RawRequest)> {
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let endpoint = Endpoint::bind(any, ca.issue(&NodeId::new("hog", 0))?, budgets())?;
    let conn = endpoint.connect(addr, node).await?;
    let mut raw = conn.raw_open().await?;
    // Frame prefix: header length, blob count, each blob's length (little endian).
    let mut prefix = 1u32.to_le_bytes().to_vec();
    prefix.extend_from_slice(&1u32.to_le_bytes());
    prefix.extend_from_slice(&(HELD - 1).to_le_bytes());
    prefix.extend_from_slice(&[0, 1, 2, 3]);
    raw.write(Bytes::from(prefix)).await?;
    Ok((endpoint, raw))
}

/// Calls until the call fails (the hog's claim is taken asynchronously), within
/// [`SETTLE_MAX`].
async fn call_until_err(
    load: &cohort_actors::RemoteRef<Load>,
    msg: &Load,
    blobs: impl Fn() -> Vec<Bytes>,
) -> anyhow::Result<RemoteError> {
    let deadline = tokio::time::Instant::now() + SETTLE_MAX;
    loop {
        match load.call_with_blobs(msg, blobs()).await {
            Err(e) => return Ok(e),
            Ok(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(_) => bail!("the call still fits after {SETTLE_MAX:?}: the budget was not held"),
        }
    }
}

/// Calls until the call goes through (the claim is given back asynchronously), within
/// [`SETTLE_MAX`]; every failure on the way must be `Busy`.
async fn call_until_ok(
    load: &cohort_actors::RemoteRef<Load>,
    msg: &Load,
    blobs: impl Fn() -> Vec<Bytes>,
) -> anyhow::Result<u64> {
    let deadline = tokio::time::Instant::now() + SETTLE_MAX;
    loop {
        match load.call_with_blobs(msg, blobs()).await {
            Ok((received, _)) => return Ok(received),
            Err(RemoteError::Busy { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e).context("the call did not go through once there was room"),
        }
    }
}

fn run<F: std::future::Future<Output = anyhow::Result<()>>>(test: F) {
    actix::System::new().block_on(async move {
        tokio::time::timeout(Duration::from_secs(60), test)
            .await
            .expect("test timed out")
            .expect("test failed");
    });
}
