//! One link per peer, over real QUIC on 127.0.0.1 with real processes: a peer that dies
//! (SIGKILL, so its connection is never closed) and comes back on a new connection takes its
//! link over at once. Heartbeats move to the new connection, so the restarted process never
//! sees a live peer as silent; a newer incarnation is reported dead-superseded at once; and a
//! peer that knows a newer incarnation refuses an older one's hello as outdated, saying which
//! incarnation it knows.
//!
//! The restarted process is this test binary re-executed (`takeover_child`): it dials the
//! parent, says what its own failure detector makes of the parent for a few detection
//! budgets, and reports on stdout.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use cohort_actors::{
    DeathCause, Gateway, GatewayConfig, HeartbeatConfig, Incarnation, IncarnationId, PeerEvent,
    RemoteError,
};
use cohort_chaos::process::ChildProcess;
use cohort_transport::{ClusterCa, Endpoint, NodeCredentials, NodeId, TransportConfig};
use tokio::sync::mpsc;

const CHILD_DIR: &str = "COHORT_TAKEOVER_CHILD_DIR";
const CHILD_INCARNATION: &str = "COHORT_TAKEOVER_CHILD_EPOCH";
const PARENT_ADDR: &str = "COHORT_TAKEOVER_PARENT_ADDR";

/// The child's (restarted process's) detection budget: short, so that a peer whose heartbeats
/// do not arrive is declared dead quickly.
const DETECTING: HeartbeatConfig = HeartbeatConfig {
    interval: Duration::from_millis(100),
    timeout: Duration::from_millis(600),
};

/// The parent's: long, so that it does not declare the killed child dead (and fence it)
/// before its successor says hello.
const PATIENT: HeartbeatConfig = HeartbeatConfig {
    interval: Duration::from_millis(100),
    timeout: Duration::from_secs(8),
};

/// How many of its budgets the child watches the parent after connecting.
const WATCHED_BUDGETS: u32 = 5;

fn start(
    creds: NodeCredentials,
    incarnation: u64,
    heartbeat: HeartbeatConfig,
) -> anyhow::Result<Gateway> {
    let tests = TransportConfig::for_tests();
    let transport = TransportConfig {
        idle_timeout: heartbeat.timeout.max(tests.idle_timeout),
        ..tests
    };
    let endpoint = Endpoint::bind("127.0.0.1:0".parse()?, creds, transport)?;
    Ok(Gateway::start(
        endpoint,
        GatewayConfig {
            incarnation: IncarnationId(incarnation),
            heartbeat,
            call_timeout: Duration::from_secs(5),
            ..GatewayConfig::default()
        },
    ))
}

fn parent_node() -> NodeId {
    NodeId::new("worker", 0)
}

fn child_node() -> NodeId {
    NodeId::new("chief", 0)
}

/// The child process: not a test on its own (it returns at once unless spawned by a test
/// below).
#[test]
fn takeover_child() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let incarnation: u64 = std::env::var(CHILD_INCARNATION).unwrap().parse().unwrap();
    let parent: SocketAddr = std::env::var(PARENT_ADDR).unwrap().parse().unwrap();
    actix::System::new().block_on(async move {
        let _ = tokio::time::timeout(
            Duration::from_secs(60),
            child_main(dir, incarnation, parent),
        )
        .await;
    });
}

async fn child_main(dir: String, incarnation: u64, parent_addr: SocketAddr) {
    let creds = NodeCredentials::load(Path::new(&dir), &child_node()).unwrap();
    let gateway = start(creds, incarnation, DETECTING).unwrap();
    let mut events = gateway.subscribe();
    let parent = parent_node();
    loop {
        match gateway.connect(parent_addr, &parent).await {
            Ok(_) => break,
            Err(RemoteError::Outdated { known, .. }) => {
                report(&format!("outdated {}", known.0));
                return;
            }
            Err(e) => {
                report(&format!("retry {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    report("connected");
    let watch = DETECTING.timeout * WATCHED_BUDGETS;
    let deadline = tokio::time::Instant::now() + watch;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Err(_) => break,
            Ok(None) => return,
            Ok(Some(PeerEvent::Dead { incarnation, cause })) => {
                report(&format!("dead {incarnation} {cause:?}"));
                return;
            }
            Ok(Some(_)) => {}
        }
    }
    match gateway.peer_status(&parent) {
        Some((_, true)) => report(&format!("alive after {WATCHED_BUDGETS} budgets")),
        other => report(&format!("not alive: {other:?}")),
    }
    // Stay up until killed, so that the parent's view of this incarnation stays alive.
    std::future::pending::<()>().await;
}

fn report(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "CHILD {line}");
    let _ = out.flush();
}

struct Child {
    process: ChildProcess,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Child {
    fn spawn(dir: &Path, incarnation: u64, parent: SocketAddr) -> anyhow::Result<Self> {
        let mut process = ChildProcess::spawn(
            Command::new(std::env::current_exe()?)
                .args(["--exact", "takeover_child", "--nocapture"])
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

    /// The next reported line that does not start with "retry", within `within`.
    async fn next(&mut self, within: Duration) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.recv())
                .await
                .map_err(|_| anyhow!("the child reported nothing within {within:?}"))?
                .ok_or_else(|| anyhow!("the child exited"))?;
            if !line.starts_with("retry") {
                return Ok(line);
            }
        }
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos();
        let path = std::env::temp_dir().join(format!(
            "cohort-takeover-test-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path)?;
        Ok(Self(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(test: impl std::future::Future<Output = anyhow::Result<()>>) {
    actix::System::new().block_on(async move {
        tokio::time::timeout(Duration::from_secs(90), test)
            .await
            .expect("test timed out")
            .expect("test failed");
    });
}

/// The child is the chief, the parent a live task (worker/0). The chief stops (SIGSTOP: its
/// connection stays open on the worker's side, and its socket too, so no probe of it is
/// refused and only a hello can tell the worker anything) and comes back as the same
/// incarnation on a new connection, as a pod restarted with a fixed incarnation would: its hello takes the
/// worker's link over, the worker's heartbeats go to it, and it sees the worker alive for
/// several of its detection budgets instead of declaring it dead one budget after
/// reconnecting (as it did while the heartbeats still went to the dead chief's connection).
#[test]
fn a_restarted_chief_back_on_a_new_connection_takes_the_link_over_and_declares_no_live_task_dead() {
    run(async {
        let ca = ClusterCa::generate("test")?;
        let dir = TempDir::new()?;
        ca.issue(&child_node())?.save(&dir.0)?;
        let parent = start(ca.issue(&parent_node())?, 1, PATIENT)?;
        let addr = parent.local_addr()?;

        let mut first = Child::spawn(&dir.0, 5, addr)?;
        assert_eq!(first.next(Duration::from_secs(20)).await?, "connected");
        // Heartbeats flow to the first process: it sees the parent alive.
        let line = first.next(Duration::from_secs(20)).await?;
        assert!(line.starts_with("alive"), "first chief: {line}");
        first.process.pause()?;

        let mut second = Child::spawn(&dir.0, 5, addr)?;
        assert_eq!(second.next(Duration::from_secs(20)).await?, "connected");
        let line = second.next(Duration::from_secs(20)).await?;
        assert!(
            line.starts_with("alive"),
            "the restarted chief must hear the worker's heartbeats on its own connection: {line}"
        );
        assert_eq!(
            parent.peer_status(&child_node()),
            Some((IncarnationId(5), true)),
            "the parent hears the restarted process"
        );
        second.process.kill()?;
        first.process.kill()?;
        Ok(())
    });
}

/// A newer incarnation's hello is evidence that the old one is dead: the parent reports the
/// old one (stopped, so that its socket refuses no probe and only the hello can tell) dead
/// (superseded) at once, well inside its detection budget, and the new one
/// alive; the newer process sees the parent alive. A process that then comes back with an
/// older incarnation is refused as outdated and told the incarnation the parent knows.
#[test]
fn a_newer_incarnation_supersedes_at_once_and_an_older_one_is_told_it_is_outdated() {
    run(async {
        let ca = ClusterCa::generate("test")?;
        let dir = TempDir::new()?;
        ca.issue(&child_node())?.save(&dir.0)?;
        let parent = start(ca.issue(&parent_node())?, 1, PATIENT)?;
        let mut events = parent.subscribe();
        let addr = parent.local_addr()?;

        let mut first = Child::spawn(&dir.0, 10, addr)?;
        assert_eq!(first.next(Duration::from_secs(20)).await?, "connected");
        first.process.pause()?;
        let mut second = Child::spawn(&dir.0, 11, addr)?;
        assert_eq!(second.next(Duration::from_secs(20)).await?, "connected");
        let old = Incarnation::new(child_node(), IncarnationId(10));
        let dead = next_death(&mut events, Duration::from_secs(20)).await?;
        // Superseded, not silent: the parent's budget (8 s) had no part in it.
        assert_eq!(dead, (old, DeathCause::Superseded));
        first.process.kill()?;
        let line = second.next(Duration::from_secs(20)).await?;
        assert!(line.starts_with("alive"), "newer process: {line}");

        // A process whose clock stepped back: an incarnation older than the one the parent knows.
        let mut older = Child::spawn(&dir.0, 9, addr)?;
        match older.next(Duration::from_secs(20)).await? {
            line if line == "outdated 11" => {}
            line => bail!("expected the older incarnation refused as outdated (11), got {line}"),
        }
        assert!(parent.stats().stale_rejected >= 1);
        assert_eq!(
            parent.peer_status(&child_node()),
            Some((IncarnationId(11), true))
        );
        second.process.kill()?;
        // Refused, the older process may have exited by itself already.
        let _ = older.process.kill();
        Ok(())
    });
}

#[derive(Debug, bincode::Encode, bincode::Decode)]
struct Retire;

impl cohort_actors::RemoteMessage for Retire {
    const TAG: &'static str = "test.Retire";
    const SENDERS: cohort_actors::Senders = cohort_actors::Senders::Any;
    type Reply = ();
}

/// A short-lived connection takes the link over only while it lives: the chief tells a
/// fenced incarnation of a worker to retire (`call_fenced`, a connection of its own, closed
/// after the answer) and a newer incarnation answers instead. The worker's link to the chief
/// falls back to the chief's ordinary connection when that one closes, so its heartbeats keep
/// reaching the chief, which does not declare it dead over several detection budgets.
#[test]
fn a_fenced_call_answered_by_a_newer_incarnation_leaves_the_links_working() {
    run(async {
        let ca = ClusterCa::generate("test")?;
        let (chief_id, worker_id) = (NodeId::new("chief", 0), NodeId::new("worker", 0));
        let chief = start(ca.issue(&chief_id)?, 1, DETECTING)?;
        let worker = start(ca.issue(&worker_id)?, 2, DETECTING)?;
        let mut events = chief.subscribe();
        let at = worker.local_addr()?;
        chief.connect(at, &worker_id).await?;
        let fenced = Incarnation::new(worker_id.clone(), IncarnationId(1));
        match chief.call_fenced(at, &fenced, "worker", &Retire).await {
            Err(RemoteError::Stale { .. }) => {}
            other => {
                bail!("expected the newer incarnation to answer instead (stale), got {other:?}")
            }
        }
        let watch = DETECTING.timeout * WATCHED_BUDGETS;
        let dead = tokio::time::timeout(watch, async {
            loop {
                match events.recv().await {
                    Some(PeerEvent::Dead { incarnation, cause }) => return (incarnation, cause),
                    Some(_) => {}
                    None => std::future::pending().await,
                }
            }
        })
        .await;
        if let Ok((incarnation, cause)) = dead {
            bail!("the chief declared {incarnation} dead ({cause:?}): its heartbeats stopped");
        }
        assert_eq!(
            chief.peer_status(&worker_id),
            Some((IncarnationId(2), true))
        );
        Ok(())
    });
}

/// A dial to a node declared dead gives way to its successor's own hello: the chief knew
/// worker incarnation 6, its supervisor reported it dead, and the chief dials the worker again
/// at an address where nothing will ever answer (a port its predecessor left closed stands for
/// it); the worker's new incarnation dials the chief meanwhile, and the chief's dial returns
/// that link instead of waiting out its timeout (`call_timeout` is 5 s here; only the hello
/// can end the dial with the worker's incarnation).
#[test]
fn a_dial_to_a_dead_node_gives_way_to_its_successors_hello() {
    run(async {
        let ca = ClusterCa::generate("test")?;
        let (chief_id, worker_id) = (NodeId::new("chief", 0), NodeId::new("worker", 0));
        let chief = start(ca.issue(&chief_id)?, 1, PATIENT)?;
        let old = start(ca.issue(&worker_id)?, 6, PATIENT)?;
        chief.connect(old.local_addr()?, &worker_id).await?;
        old.shutdown();
        assert!(chief.report_dead(&Incarnation::new(worker_id.clone(), IncarnationId(6))));
        let worker = start(ca.issue(&worker_id)?, 7, PATIENT)?;
        // An address nobody listens on: a bound, never-read UDP socket holds the port.
        let silent = std::net::UdpSocket::bind("127.0.0.1:0")?;
        let nowhere: SocketAddr = silent.local_addr()?;
        let dialing = {
            let chief = chief.clone();
            let worker_id = worker_id.clone();
            tokio::spawn(async move { chief.connect(nowhere, &worker_id).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        worker.connect(chief.local_addr()?, &chief_id).await?;
        let linked = dialing
            .await?
            .map_err(|e| anyhow!("the dial failed: {e}"))?;
        assert_eq!(linked, Incarnation::new(worker_id, IncarnationId(7)));
        drop(silent);
        Ok(())
    });
}

/// The first of `events` that declares a peer dead, within `within`.
async fn next_death(
    events: &mut mpsc::Receiver<PeerEvent>,
    within: Duration,
) -> anyhow::Result<(Incarnation<NodeId>, DeathCause)> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .map_err(|_| anyhow!("no peer declared dead within {within:?}"))?
            .ok_or_else(|| anyhow!("events closed"))?;
        if let PeerEvent::Dead { incarnation, cause } = event {
            return Ok((incarnation, cause));
        }
    }
}

/// A peer SIGKILLed (no supervisor to report it, its connection left open) is known dead from
/// a refused probe of its address a couple of heartbeat intervals into its silence, not after
/// the detection budget (8 s here). A peer frozen instead (SIGSTOP) still holds its socket:
/// its probes are never refused, and only its silence past the budget declares it dead.
#[test]
fn a_killed_peer_is_known_dead_from_a_refused_probe_and_a_frozen_one_only_from_its_silence() {
    run(async {
        let ca = ClusterCa::generate("test")?;
        let dir = TempDir::new()?;
        ca.issue(&child_node())?.save(&dir.0)?;
        let parent = start(ca.issue(&parent_node())?, 1, PATIENT)?;
        let mut events = parent.subscribe();
        let addr = parent.local_addr()?;

        let mut killed = Child::spawn(&dir.0, 20, addr)?;
        assert_eq!(killed.next(Duration::from_secs(20)).await?, "connected");
        killed.process.kill()?;
        let (incarnation, cause) = next_death(&mut events, Duration::from_secs(20)).await?;
        assert_eq!(
            incarnation,
            Incarnation::new(child_node(), IncarnationId(20))
        );
        assert_eq!(cause, DeathCause::Refused, "known from its silence instead");

        let mut frozen = Child::spawn(&dir.0, 21, addr)?;
        assert_eq!(frozen.next(Duration::from_secs(20)).await?, "connected");
        frozen.process.pause()?;
        let (incarnation, cause) = next_death(&mut events, Duration::from_secs(30)).await?;
        assert_eq!(
            incarnation,
            Incarnation::new(child_node(), IncarnationId(21))
        );
        assert!(
            matches!(cause, DeathCause::Silent { .. }),
            "a frozen process holds its socket: {cause:?}"
        );
        frozen.process.resume()?;
        frozen.process.kill()?;
        Ok(())
    });
}
