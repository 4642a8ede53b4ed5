//! Remote references and the node gateway over real QUIC on 127.0.0.1: typed request/response
//! and one-way messages, refusals, failure detection, and FENCE-1 across a frozen process.
//!
//! The SIGSTOP scenario re-executes this test binary as a child process: `child_process_node`
//! does nothing unless `COHORT_ACTORS_CHILD_DIR` is set, in which case it runs a node that
//! calls the parent over and over and prints each outcome on stdout.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use anyhow::{anyhow, bail, Context as _};
use bincode::{Decode, Encode};
use bytes::Bytes;
use cohort_actors::{
    DeathCause, Gateway, GatewayConfig, HeartbeatConfig, Incarnation, IncarnationId, PeerEvent,
    RefusedReason, Remote, RemoteError, RemoteMessage, Senders,
};
use cohort_chaos::process::ChildProcess;
use cohort_transport::{ClusterCa, Endpoint, NodeCredentials, NodeId, TransportConfig};
use tokio::sync::mpsc;

// ---- messages and the actor that serves them ----

#[derive(Debug, Encode, Decode)]
struct Add {
    a: i64,
    b: i64,
}

impl RemoteMessage for Add {
    const TAG: &'static str = "test.Add";
    const SENDERS: Senders = Senders::Any;
    type Reply = i64;
}

#[derive(Debug, Encode, Decode)]
struct Note(String);

impl RemoteMessage for Note {
    const TAG: &'static str = "test.Note";
    const SENDERS: Senders = Senders::Any;
    type Reply = ();
}

/// A message type no actor registers.
#[derive(Debug, Encode, Decode)]
struct Unknown;

impl RemoteMessage for Unknown {
    const TAG: &'static str = "test.Unknown";
    const SENDERS: Senders = Senders::Any;
    type Reply = ();
}

/// Adds, records who asked, and forwards notes.
struct Calc {
    callers: Arc<Mutex<Vec<Incarnation<NodeId>>>>,
    notes: mpsc::Sender<(Incarnation<NodeId>, String)>,
}

impl Actor for Calc {
    type Context = Context<Self>;
}

impl Handler<Remote<Add>> for Calc {
    type Result = MessageResult<Remote<Add>>;

    fn handle(&mut self, msg: Remote<Add>, _ctx: &mut Context<Self>) -> Self::Result {
        self.callers.lock().unwrap().push(msg.from);
        MessageResult(msg.msg.a + msg.msg.b)
    }
}

impl Handler<Remote<Note>> for Calc {
    type Result = ();

    fn handle(&mut self, msg: Remote<Note>, _ctx: &mut Context<Self>) {
        let _ = self.notes.try_send((msg.from, msg.msg.0));
    }
}

struct CalcHandle {
    callers: Arc<Mutex<Vec<Incarnation<NodeId>>>>,
    notes: mpsc::Receiver<(Incarnation<NodeId>, String)>,
}

fn serve_calc(gateway: &Gateway) -> CalcHandle {
    let callers = Arc::new(Mutex::new(Vec::new()));
    let (tx, notes) = mpsc::channel(64);
    let calc = Calc {
        callers: callers.clone(),
        notes: tx,
    }
    .start();
    gateway
        .register::<Add>("calc", calc.clone().recipient())
        .unwrap();
    gateway.register::<Note>("calc", calc.recipient()).unwrap();
    CalcHandle { callers, notes }
}

// ---- harness ----

/// The detection budget of the failure-detection scenarios.
const HEARTBEAT: HeartbeatConfig = HeartbeatConfig {
    interval: Duration::from_millis(100),
    timeout: Duration::from_millis(600),
};

/// For scenarios about something else: slack enough that a loaded machine never makes a peer
/// look dead.
const RELAXED: HeartbeatConfig = HeartbeatConfig {
    interval: Duration::from_millis(100),
    timeout: Duration::from_secs(5),
};

fn start_gateway_with(
    creds: NodeCredentials,
    incarnation: u64,
    heartbeat: HeartbeatConfig,
) -> anyhow::Result<Gateway> {
    let addr: SocketAddr = "127.0.0.1:0".parse()?;
    // The connection's idle timeout is at least the heartbeat's budget, as on a node: a
    // scenario with relaxed detection must not lose its connection when a loaded machine
    // stalls a large transfer for a second.
    let tests = TransportConfig::for_tests();
    let transport = TransportConfig {
        idle_timeout: heartbeat.timeout.max(tests.idle_timeout),
        ..tests
    };
    let endpoint = Endpoint::bind(addr, creds, transport)?;
    let config = GatewayConfig {
        incarnation: IncarnationId(incarnation),
        heartbeat,
        call_timeout: Duration::from_secs(5),
        ..GatewayConfig::default()
    };
    Ok(Gateway::start(endpoint, config))
}

fn start_gateway(creds: NodeCredentials, incarnation: u64) -> anyhow::Result<Gateway> {
    start_gateway_with(creds, incarnation, RELAXED)
}

fn start_detecting_gateway(creds: NodeCredentials, incarnation: u64) -> anyhow::Result<Gateway> {
    start_gateway_with(creds, incarnation, HEARTBEAT)
}

fn node(role: &str, index: u32) -> NodeId {
    NodeId::new(role, index)
}

/// Runs `test` in an actix system, bounded by `limit`.
fn run<F: std::future::Future<Output = anyhow::Result<()>>>(limit: Duration, test: F) {
    actix::System::new().block_on(async move {
        tokio::time::timeout(limit, test)
            .await
            .expect("test timed out")
            .expect("test failed");
    });
}

async fn next_peer_event(
    events: &mut mpsc::Receiver<PeerEvent>,
    within: Duration,
) -> anyhow::Result<PeerEvent> {
    tokio::time::timeout(within, events.recv())
        .await
        .map_err(|_| anyhow!("no peer event within {within:?}"))?
        .ok_or_else(|| anyhow!("peer event channel closed"))
}

// ---- scenarios in one process ----

/// A dial whose caller stops waiting (its timeout fires, or it took another link) at any
/// point, including just after the peer answered its hello and linked the connection: what
/// the peer then sends on that connection is still served. The caller's wait is cut at every
/// point of the dial in turn, each time by a new incarnation of the dialer: 100 cuts from 0 to
/// 50 ms, spaced as the squares (5 µs apart at first, 1 ms at the end), so that the first
/// steps of a dial are cut densely and the last cuts reach past a whole dial even on a busy
/// machine, whose dial can take well over 10 ms in a debug build.
#[test]
fn a_dial_whose_caller_stopped_waiting_still_serves_what_the_peer_sends_on_it() {
    run(Duration::from_secs(120), async {
        let ca = ClusterCa::generate("test")?;
        let (w, ps) = (node("worker", 0), node("ps", 0));
        let server = start_gateway(ca.issue(&ps)?, 1)?;
        let creds = ca.issue(&w)?;
        let mut linked_before_the_cut = 0;
        for i in 0..100u64 {
            let worker = start_gateway(creds.clone(), 1 + i)?;
            let _calc = serve_calc(&worker);
            let cut = Duration::from_micros(5 * i * i);
            let dial = tokio::time::timeout(cut, worker.connect(server.local_addr()?, &ps)).await;
            if dial.is_ok() {
                linked_before_the_cut += 1;
            }
            // The server calls the dialer back: over the link the dial's hello gave it, if it
            // got that far, else over a dial of its own.
            let add = server
                .resolve::<Add>(worker.local_addr()?, &w, "calc")
                .await
                .map_err(|e| anyhow!("cut after {cut:?}: {e}"))?;
            let i = i as i64;
            let sum = add
                .call(&Add { a: i, b: 1 })
                .await
                .map_err(|e| anyhow!("cut after {cut:?}: {e}"))?;
            assert_eq!(sum, i + 1);
            worker.shutdown();
        }
        // The sweep reached past a whole dial (else it proved nothing about the late cuts).
        assert!(linked_before_the_cut > 0, "no dial finished within 50 ms");
        Ok(())
    });
}

#[test]
fn request_response_and_one_way_between_two_gateways() {
    run(Duration::from_secs(20), async {
        let ca = ClusterCa::generate("test")?;
        let (w, ps) = (node("worker", 0), node("ps", 0));
        let worker = start_gateway(ca.issue(&w)?, 1)?;
        let server = start_gateway(ca.issue(&ps)?, 7)?;
        let mut calc = serve_calc(&server);

        let add = worker
            .resolve::<Add>(server.local_addr()?, &ps, "calc")
            .await?;
        assert_eq!(
            add.target(),
            &Incarnation::new(ps.clone(), IncarnationId(7))
        );
        assert_eq!(add.call(&Add { a: 2, b: 40 }).await?, 42);
        for i in 0..50 {
            assert_eq!(add.call(&Add { a: i, b: i }).await?, 2 * i);
        }
        // The receiver sees the sender's authenticated incarnation.
        assert!(calc
            .callers
            .lock()
            .unwrap()
            .iter()
            .all(|c| c == worker.incarnation()));

        let note = worker.remote_ref::<Note>(add.target().clone(), "calc");
        note.tell(&Note("hello".to_string())).await?;
        let (from, text) = tokio::time::timeout(Duration::from_secs(5), calc.notes.recv())
            .await?
            .ok_or_else(|| anyhow!("notes closed"))?;
        assert_eq!(
            (from, text.as_str()),
            (worker.incarnation().clone(), "hello")
        );

        // Replies travel both ways: the server can call back over the same connection.
        let back = server.remote_ref::<Add>(worker.incarnation().clone(), "calc");
        match back.call(&Add { a: 1, b: 1 }).await {
            Err(RemoteError::Refused {
                reason: RefusedReason::NoSuchActor(name),
                ..
            }) => assert_eq!(name, "calc"),
            other => bail!("expected NoSuchActor from the worker, got {other:?}"),
        }
        let _worker_calc = serve_calc(&worker);
        assert_eq!(back.call(&Add { a: 1, b: 1 }).await?, 2);
        worker.shutdown();
        server.shutdown();
        Ok(())
    });
}

#[test]
fn unknown_actor_or_message_type_is_refused() {
    run(Duration::from_secs(20), async {
        let ca = ClusterCa::generate("test")?;
        let (w, ps) = (node("worker", 0), node("ps", 0));
        let worker = start_gateway(ca.issue(&w)?, 1)?;
        let server = start_gateway(ca.issue(&ps)?, 1)?;
        let _calc = serve_calc(&server);
        let target = worker.connect(server.local_addr()?, &ps).await?;

        let nobody = worker.remote_ref::<Add>(target.clone(), "nobody");
        match nobody.call(&Add { a: 1, b: 2 }).await {
            Err(RemoteError::Refused {
                reason: RefusedReason::NoSuchActor(name),
                ..
            }) => assert_eq!(name, "nobody"),
            other => bail!("expected NoSuchActor, got {other:?}"),
        }
        let wrong_type = worker.remote_ref::<Unknown>(target.clone(), "calc");
        match wrong_type.call(&Unknown).await {
            Err(RemoteError::Refused {
                reason: RefusedReason::UnknownMessage { actor, tag },
                ..
            }) => assert_eq!((actor.as_str(), tag.as_str()), ("calc", "test.Unknown")),
            other => bail!("expected UnknownMessage, got {other:?}"),
        }
        assert_eq!(server.stats().refused, 2);
        // Refusals do not disturb the connection.
        let calc = worker.remote_ref::<Add>(target, "calc");
        assert_eq!(calc.call(&Add { a: 1, b: 2 }).await?, 3);
        Ok(())
    });
}

#[test]
fn fence1_reference_to_a_restarted_node_is_stale() {
    run(Duration::from_secs(20), async {
        let ca = ClusterCa::generate("test")?;
        let (w, ps) = (node("worker", 0), node("ps", 0));
        let worker = start_gateway(ca.issue(&w)?, 1)?;
        let mut events = worker.subscribe();
        let old = start_gateway(ca.issue(&ps)?, 1)?;
        let _old_calc = serve_calc(&old);
        let old_ref = worker
            .resolve::<Add>(old.local_addr()?, &ps, "calc")
            .await?;
        assert_eq!(old_ref.call(&Add { a: 1, b: 1 }).await?, 2);
        assert_eq!(
            next_peer_event(&mut events, Duration::from_secs(5)).await?,
            PeerEvent::Alive(Incarnation::new(ps.clone(), IncarnationId(1)))
        );

        // The node restarts as incarnation 2, elsewhere; the worker reconnects to it.
        old.shutdown();
        let new = start_gateway(ca.issue(&ps)?, 2)?;
        let _new_calc = serve_calc(&new);
        let new_ref = worker
            .resolve::<Add>(new.local_addr()?, &ps, "calc")
            .await?;
        assert_eq!(new_ref.target().incarnation, IncarnationId(2));
        assert_eq!(new_ref.call(&Add { a: 2, b: 2 }).await?, 4);
        // The old incarnation is reported gone, superseded.
        loop {
            match next_peer_event(&mut events, Duration::from_secs(5)).await? {
                PeerEvent::Dead { incarnation, cause } => {
                    assert_eq!(incarnation, Incarnation::new(ps.clone(), IncarnationId(1)));
                    assert_eq!(cause, DeathCause::Superseded);
                    break;
                }
                PeerEvent::Alive(_) | PeerEvent::Outdated { .. } => {}
            }
        }
        // A reference bound to the old incarnation must not reach the new one.
        match old_ref.call(&Add { a: 1, b: 1 }).await {
            Err(RemoteError::Stale { .. }) => {}
            other => bail!("expected Stale, got {other:?}"),
        }
        Ok(())
    });
}

#[test]
fn silent_peer_is_declared_dead_and_fenced() {
    run(Duration::from_secs(20), async {
        let ca = ClusterCa::generate("test")?;
        let (w, ps) = (node("worker", 0), node("ps", 0));
        let worker = start_detecting_gateway(ca.issue(&w)?, 1)?;
        let mut events = worker.subscribe();
        let server = start_gateway(ca.issue(&ps)?, 3)?;
        let _calc = serve_calc(&server);
        let calc = worker
            .resolve::<Add>(server.local_addr()?, &ps, "calc")
            .await?;
        assert_eq!(calc.call(&Add { a: 1, b: 1 }).await?, 2);
        next_peer_event(&mut events, Duration::from_secs(5)).await?;

        server.shutdown();
        let budget = HEARTBEAT.timeout + HEARTBEAT.interval + Duration::from_secs(1);
        match next_peer_event(&mut events, budget).await? {
            PeerEvent::Dead { incarnation, cause } => {
                assert_eq!(incarnation, Incarnation::new(ps.clone(), IncarnationId(3)));
                assert!(matches!(cause, DeathCause::Silent { .. }));
            }
            other => bail!("expected PeerDead, got {other:?}"),
        }
        assert_eq!(worker.peer_status(&ps), Some((IncarnationId(3), false)));
        match calc.call(&Add { a: 1, b: 1 }).await {
            Err(RemoteError::Stale { .. }) | Err(RemoteError::PeerLost { .. }) => {}
            other => bail!("expected the dead peer to be unreachable, got {other:?}"),
        }
        Ok(())
    });
}

/// Asks for the blobs back, reversed, with their total length.
#[derive(Debug, Encode, Decode)]
struct Reverse;

impl RemoteMessage for Reverse {
    const TAG: &'static str = "test.Reverse";
    const SENDERS: Senders = Senders::Any;
    type Reply = u64;
}

#[test]
fn blobs_travel_beside_messages_and_replies_intact() {
    run(Duration::from_secs(30), async {
        let ca = ClusterCa::generate("test")?;
        let (w, ps) = (node("worker", 0), node("ps", 0));
        let worker = start_gateway(ca.issue(&w)?, 1)?;
        let server = start_gateway(ca.issue(&ps)?, 1)?;
        server.register_fn_with_blobs::<Reverse, _, _>("rev", |m: Remote<Reverse>| async move {
            let total: u64 = m.blobs.iter().map(|b| b.len() as u64).sum();
            let mut blobs = m.blobs;
            blobs.reverse();
            Ok::<_, RefusedReason>((total, blobs))
        })?;
        let rev = worker
            .resolve::<Reverse>(server.local_addr()?, &ps, "rev")
            .await?;
        // 16 MiB of little-endian f32s: as large as the whole encoded-payload limit.
        let big: Vec<u8> = (0..4 * 1024 * 1024u32)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        let small = Bytes::from_static(b"tiny");
        let (total, back) = rev
            .call_with_blobs(&Reverse, vec![Bytes::from(big.clone()), small.clone()])
            .await?;
        assert_eq!(total, big.len() as u64 + 4);
        assert_eq!(back.len(), 2);
        assert_eq!(back[0], small);
        assert!(back[1] == big.as_slice(), "big blob corrupted");
        // Without blobs, a plain call still works and gets no blobs.
        assert_eq!(rev.call(&Reverse).await?, 0);
        Ok(())
    });
}

#[test]
fn a_call_within_a_longer_bound_outlives_the_call_timeout_at_both_ends() {
    run(Duration::from_secs(30), async {
        let ca = ClusterCa::generate("test")?;
        let (w, c) = (node("worker", 0), node("chief", 0));
        let short = |creds| -> anyhow::Result<Gateway> {
            let endpoint =
                Endpoint::bind("127.0.0.1:0".parse()?, creds, TransportConfig::for_tests())?;
            Ok(Gateway::start(
                endpoint,
                GatewayConfig {
                    incarnation: IncarnationId(1),
                    heartbeat: RELAXED,
                    call_timeout: Duration::from_millis(300),
                    ..GatewayConfig::default()
                },
            ))
        };
        let worker = short(ca.issue(&w)?)?;
        let chief = short(ca.issue(&c)?)?;
        // A step that takes longer than either side's call timeout.
        worker.register_fn::<Add, _, _>("slow", |m: Remote<Add>| async move {
            tokio::time::sleep(Duration::from_millis(900)).await;
            Ok::<_, RefusedReason>(m.msg.a + m.msg.b)
        })?;
        let slow = chief
            .resolve::<Add>(worker.local_addr()?, &w, "slow")
            .await?;
        match slow.call(&Add { a: 1, b: 2 }).await {
            Err(RemoteError::Timeout { .. }) => {}
            other => bail!("expected the plain call to time out, got {other:?}"),
        }
        // The receiver delivers for as long as the caller said it waits.
        let sum = slow
            .call_within(&Add { a: 1, b: 2 }, Duration::from_secs(10))
            .await?;
        assert_eq!(sum, 3);
        Ok(())
    });
}

#[test]
fn fence1_a_fenced_incarnation_can_still_be_told_so_and_only_that_one() {
    run(Duration::from_secs(30), async {
        let ca = ClusterCa::generate("test")?;
        let (w, c) = (node("worker", 0), node("chief", 0));
        let chief = start_gateway(ca.issue(&c)?, 1)?;
        let old = start_gateway(ca.issue(&w)?, 1)?;
        let mut old_calc = serve_calc(&old);
        let old_ref = chief.resolve::<Note>(old.local_addr()?, &w, "calc").await?;
        // A newer incarnation of the worker supersedes the old one, which stays alive.
        let new = start_gateway(ca.issue(&w)?, 2)?;
        let _new_calc = serve_calc(&new);
        chief.resolve::<Note>(new.local_addr()?, &w, "calc").await?;
        match old_ref.call(&Note("hello".into())).await {
            Err(RemoteError::Stale { .. }) => {}
            other => bail!("FENCE-1: expected the old incarnation to be stale, got {other:?}"),
        }
        // The fenced incarnation can still be told, at its own address.
        let target = Incarnation::new(w.clone(), IncarnationId(1));
        chief
            .call_fenced(old.local_addr()?, &target, "calc", &Note("retire".into()))
            .await?;
        let (from, note) = tokio::time::timeout(Duration::from_secs(5), old_calc.notes.recv())
            .await?
            .ok_or_else(|| anyhow!("no note"))?;
        assert_eq!((from.node, note.as_str()), (c.clone(), "retire"));
        // Not a newer incarnation in its place: that one is not the target.
        match chief
            .call_fenced(new.local_addr()?, &target, "calc", &Note("retire".into()))
            .await
        {
            Err(RemoteError::Stale { .. }) => {}
            other => bail!("expected the newer incarnation to be refused, got {other:?}"),
        }
        Ok(())
    });
}

// ---- the SIGSTOP scenario, with a child process ----

const CHILD_DIR: &str = "COHORT_ACTORS_CHILD_DIR";
const CHILD_INCARNATION: &str = "COHORT_ACTORS_CHILD_EPOCH";
const PARENT_ADDR: &str = "COHORT_ACTORS_PARENT_ADDR";
/// The child gives up on its own after this long, so it can never outlive a broken test.
const CHILD_LIFETIME: Duration = Duration::from_secs(30);

/// The child node: not a test on its own (it returns at once unless spawned by
/// `fence1_sigstopped_peer_is_declared_dead_and_its_old_incarnation_rejected`).
#[test]
fn child_process_node() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let incarnation: u64 = std::env::var(CHILD_INCARNATION)
        .expect("child incarnation")
        .parse()
        .expect("child incarnation is a number");
    let parent_addr: SocketAddr = std::env::var(PARENT_ADDR)
        .expect("parent address")
        .parse()
        .expect("parent address parses");
    actix::System::new().block_on(async move {
        let _ =
            tokio::time::timeout(CHILD_LIFETIME, child_main(dir, incarnation, parent_addr)).await;
    });
}

async fn child_main(dir: String, incarnation: u64, parent_addr: SocketAddr) {
    let me = node("worker", 1);
    let creds = NodeCredentials::load(Path::new(&dir), &me).expect("child credentials");
    let gateway = start_detecting_gateway(creds, incarnation).expect("child gateway");
    let parent = node("chief", 0);
    let mut calc = None;
    for i in 0i64.. {
        if calc.is_none() {
            match gateway.resolve::<Add>(parent_addr, &parent, "calc").await {
                Ok(r) => calc = Some(r),
                Err(e) => report(&format!("connect {} {e}", outcome(&e))),
            }
        }
        if let Some(r) = &calc {
            match r.call(&Add { a: i, b: 0 }).await {
                Ok(_) => report(&format!("call ok {i}")),
                Err(e) => {
                    report(&format!("call {} {e}", outcome(&e)));
                    calc = None;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn outcome(e: &RemoteError) -> &'static str {
    match e {
        RemoteError::Stale { .. } => "stale",
        RemoteError::Outdated { .. } => "outdated",
        RemoteError::PeerLost { .. } => "lost",
        RemoteError::Timeout { .. } => "timeout",
        RemoteError::Busy { .. } => "busy",
        RemoteError::Refused { .. } => "refused",
        RemoteError::Codec { .. } => "codec",
    }
}

fn report(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "CHILD {line}");
    let _ = out.flush();
}

/// A child node process and the lines it reports.
struct ChildNode {
    process: ChildProcess,
    lines: mpsc::UnboundedReceiver<String>,
}

impl ChildNode {
    fn spawn(dir: &Path, incarnation: u64, parent: SocketAddr) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut process = ChildProcess::spawn(
            Command::new(exe)
                .args(["--exact", "child_process_node", "--nocapture"])
                .env(CHILD_DIR, dir)
                .env(CHILD_INCARNATION, incarnation.to_string())
                .env(PARENT_ADDR, parent.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::null()),
        )?;
        let stdout = process.child_mut().stdout.take().context("child stdout")?;
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Some(report) = line.strip_prefix("CHILD ") {
                    if tx.send(report.to_string()).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Self { process, lines })
    }

    /// Waits for a reported line starting with `prefix`; returns it.
    async fn expect_line(&mut self, prefix: &str, within: Duration) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.recv())
                .await
                .map_err(|_| anyhow!("child never reported {prefix:?} within {within:?}"))?
                .ok_or_else(|| anyhow!("child exited before reporting {prefix:?}"))?;
            if line.starts_with(prefix) {
                return Ok(line);
            }
        }
    }
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos();
        let path =
            std::env::temp_dir().join(format!("cohort-actors-test-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path)?;
        Ok(Self(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// FENCE-1 semantics proven here: when the heartbeat machine declares a silent incarnation dead,
/// the gateway fences that incarnation. A frozen process that wakes up (SIGCONT) is still the old
/// incarnation, so everything it sends is rejected as stale, and it never reaches an actor again;
/// the node comes back only as a restarted process with a higher incarnation.
#[test]
fn fence1_sigstopped_peer_is_declared_dead_and_its_old_incarnation_rejected() {
    run(Duration::from_secs(60), async {
        let ca = ClusterCa::generate("test")?;
        let dir = TempDir::new()?;
        let child_id = node("worker", 1);
        ca.issue(&child_id)?.save(&dir.0)?;
        let parent = start_detecting_gateway(ca.issue(&node("chief", 0))?, 1)?;
        let mut events = parent.subscribe();
        let calc = serve_calc(&parent);
        let parent_addr = parent.local_addr()?;

        let mut child = ChildNode::spawn(&dir.0, 1, parent_addr)?;
        child
            .expect_line("call ok", Duration::from_secs(20))
            .await?;
        let old = Incarnation::new(child_id.clone(), IncarnationId(1));
        assert_eq!(
            next_peer_event(&mut events, Duration::from_secs(5)).await?,
            PeerEvent::Alive(old.clone())
        );

        child.process.pause()?;
        let budget = HEARTBEAT.timeout + HEARTBEAT.interval + Duration::from_secs(1);
        match next_peer_event(&mut events, budget).await? {
            PeerEvent::Dead { incarnation, cause } => {
                assert_eq!(incarnation, old);
                assert!(matches!(cause, DeathCause::Silent { .. }), "{cause:?}");
            }
            other => bail!("expected the frozen child declared dead, got {other:?}"),
        }
        let calls_before_resume = calc.callers.lock().unwrap().len();
        let stale_before_resume = parent.stats().stale_rejected;

        child.process.resume()?;
        // Its hello is refused: its own incarnation is outdated (fenced), and it is told so.
        let line = child
            .expect_line("connect outdated", Duration::from_secs(10))
            .await?;
        assert!(
            line.contains("fenced") && line.contains("knows incarnation 1"),
            "{line}"
        );
        assert!(parent.stats().stale_rejected > stale_before_resume);
        // Give the woken child time to try more, then check nothing of it got through.
        child
            .expect_line("connect outdated", Duration::from_secs(5))
            .await?;
        assert_eq!(calc.callers.lock().unwrap().len(), calls_before_resume);
        assert_eq!(
            parent.peer_status(&child_id),
            Some((IncarnationId(1), false))
        );

        // The restarted process, with the next incarnation, is accepted.
        let mut restarted = ChildNode::spawn(&dir.0, 2, parent_addr)?;
        restarted
            .expect_line("call ok", Duration::from_secs(20))
            .await?;
        let callers = calc.callers.lock().unwrap().clone();
        assert!(callers[calls_before_resume..]
            .iter()
            .all(|c| c == &Incarnation::new(child_id.clone(), IncarnationId(2))));
        assert_eq!(
            parent.peer_status(&child_id),
            Some((IncarnationId(2), true))
        );

        child.process.kill()?;
        restarted.process.kill()?;
        Ok(())
    });
}
