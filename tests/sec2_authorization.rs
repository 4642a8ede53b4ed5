//! SEC-2 against the real role actors, over real QUIC on 127.0.0.1: every control message a
//! parameter server or a worker accepts, sent with a worker's certificate, is refused by the
//! receiving gateway with a typed refusal naming the message type and the role, before the
//! handler runs, and leaves the handler's state as it was. One test per control message type.
//! The allowed senders still get through (each test also checks what the refused sender could
//! not do is done when the chief sends it, or that the worker's own traffic still flows).
//!
//! `Retire` and `Shutdown` end the process in `cohort::bootstrap`; here they are
//! registered on the same gateways with recording handlers in their place, since the check
//! under test is the gateway's, made from the message type.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use cohort::optim::Optimizer;
use cohort::roles::coordinator::ClosureId;
use cohort::roles::protocol::{
    f32_blob, BeginRestore, CreateVariable, DatasetPositions, Draining, FenceWorker, FinishedBelow,
    InitSpec, Joining, LeaveAnswer, Leaving, Pull, Push, PushOrigin, PushOutcome, RestoreVariable,
    Retire, RewindWorker, RollBack, RunClosure, SetupWorker, Shutdown, Snapshot, WireGradient,
    COORDINATOR_ACTOR, PS_ACTOR, WORKER_ACTOR,
};
use cohort::roles::protocol::{PsStats, PsStatsReply};
use cohort::roles::ps::{ParameterStore, PsActor};
use cohort::roles::worker::{job_queue, WorkerActor, WorkerJob, WorkerMachine};
use cohort_actors::{
    Gateway, GatewayConfig, HeartbeatConfig, IncarnationId, RefusedReason, Remote, RemoteError,
    RemoteMessage,
};
use cohort_transport::{ClusterCa, Endpoint, NodeId, TransportConfig};

// ---- harness ----

/// A cluster on loopback: a chief, two workers and whatever serves messages under test.
struct Cluster {
    ca: ClusterCa,
    chief: Gateway,
    /// The worker whose certificate the refused messages are sent with.
    rogue: Gateway,
}

impl Cluster {
    fn new() -> anyhow::Result<Self> {
        let ca = ClusterCa::generate("sec2")?;
        let chief = start(&ca, &NodeId::new("chief", 0), 1)?;
        let rogue = start(&ca, &NodeId::new("worker", 0), 1)?;
        Ok(Self { ca, chief, rogue })
    }

    /// Sends `msg` (with `blobs`) to `actor` at `addr` from `from`, and returns its reply.
    async fn call<M: RemoteMessage>(
        from: &Gateway,
        addr: SocketAddr,
        node: &NodeId,
        actor: &str,
        msg: &M,
        blobs: Vec<Bytes>,
    ) -> Result<M::Reply, RemoteError> {
        let r = from.resolve::<M>(addr, node, actor).await?;
        r.call_with_blobs(msg, blobs).await.map(|(reply, _)| reply)
    }

    /// Sends `msg` with the rogue worker's certificate and checks that it is refused by SEC-2.
    async fn refused<M: RemoteMessage>(
        &self,
        addr: SocketAddr,
        node: &NodeId,
        actor: &str,
        msg: &M,
        blobs: Vec<Bytes>,
        gateway: &Gateway,
    ) -> anyhow::Result<()> {
        let before = gateway.stats().sender_not_allowed;
        match Self::call(&self.rogue, addr, node, actor, msg, blobs).await {
            Err(RemoteError::Refused {
                reason: RefusedReason::SenderNotAllowed { tag, role },
                ..
            }) => {
                assert_eq!((tag.as_str(), role.as_str()), (M::TAG, "worker"));
            }
            Err(other) => bail!("{}: expected SenderNotAllowed, got {other}", M::TAG),
            Ok(_) => bail!("{}: a worker's certificate was accepted", M::TAG),
        }
        assert_eq!(gateway.stats().sender_not_allowed, before + 1, "{}", M::TAG);
        Ok(())
    }
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

/// Calls to handlers that stand in for the process exits of `Retire` and `Shutdown`.
#[derive(Clone, Default)]
struct Exits(Arc<AtomicUsize>);

impl Exits {
    fn register(&self, gateway: &Gateway, actor: &str) -> anyhow::Result<()> {
        let n = self.0.clone();
        gateway.register_fn::<Retire, _, _>(actor, move |_: Remote<Retire>| {
            n.fetch_add(1, Ordering::SeqCst);
            async { Ok(()) }
        })?;
        let n = self.0.clone();
        gateway.register_fn::<Shutdown, _, _>(actor, move |_: Remote<Shutdown>| {
            n.fetch_add(1, Ordering::SeqCst);
            async { Ok(()) }
        })?;
        Ok(())
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A real parameter server `ps/0` holding `w` = [0, 0, 0, 0], created by the chief.
struct Ps {
    gateway: Gateway,
    node: NodeId,
    addr: SocketAddr,
    exits: Exits,
}

impl Ps {
    async fn start(cluster: &Cluster) -> anyhow::Result<Self> {
        let node = NodeId::new("ps", 0);
        let gateway = start(&cluster.ca, &node, 1)?;
        PsActor::start(ParameterStore::new(Optimizer::sgd(0.5))?, gateway.clone())?;
        let exits = Exits::default();
        exits.register(&gateway, PS_ACTOR)?;
        let addr = gateway.local_addr()?;
        let ps = Self {
            gateway,
            node,
            addr,
            exits,
        };
        let create = CreateVariable {
            name: "w".into(),
            shape: vec![4],
            init: InitSpec::Zeros,
        };
        ps.chief_sends(cluster, &create, Vec::new())
            .await?
            .map_err(anyhow::Error::msg)?;
        Ok(ps)
    }

    async fn chief_sends<M: RemoteMessage>(
        &self,
        cluster: &Cluster,
        msg: &M,
        blobs: Vec<Bytes>,
    ) -> anyhow::Result<M::Reply> {
        Ok(Cluster::call(&cluster.chief, self.addr, &self.node, PS_ACTOR, msg, blobs).await?)
    }

    async fn refused<M: RemoteMessage>(
        &self,
        cluster: &Cluster,
        msg: &M,
        blobs: Vec<Bytes>,
    ) -> anyhow::Result<()> {
        cluster
            .refused(self.addr, &self.node, PS_ACTOR, msg, blobs, &self.gateway)
            .await
    }

    async fn stats(&self, cluster: &Cluster) -> anyhow::Result<PsStatsReply> {
        self.chief_sends(cluster, &PsStats, Vec::new()).await
    }

    /// The values of `w`, read by the chief.
    async fn w(&self, cluster: &Cluster) -> anyhow::Result<Vec<f32>> {
        let r = cluster
            .chief
            .resolve::<Pull>(self.addr, &self.node, PS_ACTOR)
            .await?;
        let (reply, blobs) = r
            .call_with_blobs(
                &Pull {
                    names: vec!["w".into()],
                },
                Vec::new(),
            )
            .await?;
        reply.map_err(anyhow::Error::msg)?;
        let blob = blobs.first().context("no blob in the pull's reply")?;
        cohort::roles::protocol::bytes_to_f32(blob, "w").map_err(anyhow::Error::msg)
    }

    /// A push of a dense gradient of ones to `w` from `from` as worker `worker` at `incarnation`.
    async fn push(
        &self,
        from: &Gateway,
        worker: u32,
        incarnation: u64,
        closure: u64,
    ) -> anyhow::Result<PushOutcome> {
        let push = Push {
            origin: PushOrigin {
                worker,
                incarnation,
                closure: ClosureId(closure),
                attempt: 0,
                part: 0,
                generation: 0,
                learning_rate: None,
                server: 0,
            },
            gradients: vec![("w".into(), WireGradient::Dense)],
        };
        let reply = Cluster::call(
            from,
            self.addr,
            &self.node,
            PS_ACTOR,
            &push,
            vec![f32_blob(&[1.0; 4])],
        )
        .await?;
        reply.map_err(anyhow::Error::msg)
    }
}

/// A control message to the parameter server, sent with the worker's certificate, is refused
/// and changes nothing the server holds or counts.
async fn ps_refuses<M: RemoteMessage>(
    msg: M,
    blobs: Vec<Bytes>,
) -> anyhow::Result<(Cluster, Ps, PsStatsReply)> {
    let cluster = Cluster::new()?;
    let ps = Ps::start(&cluster).await?;
    let before = ps.stats(&cluster).await?;
    ps.refused(&cluster, &msg, blobs).await?;
    assert_eq!(
        ps.stats(&cluster).await?,
        before,
        "{} changed the server",
        M::TAG
    );
    assert_eq!(ps.w(&cluster).await?, vec![0.0; 4], "{}", M::TAG);
    assert_eq!(ps.exits.count(), 0);
    Ok((cluster, ps, before))
}

/// A real worker `worker/1` whose compute thread is a recorder: it notes every job the worker
/// actor queued for it and answers it.
struct Worker {
    gateway: Gateway,
    node: NodeId,
    addr: SocketAddr,
    jobs: Arc<Mutex<Vec<&'static str>>>,
    exits: Exits,
}

impl Worker {
    fn start(cluster: &Cluster) -> anyhow::Result<Self> {
        let node = NodeId::new("worker", 1);
        let gateway = start(&cluster.ca, &node, 1)?;
        let (tx, rx) = job_queue();
        let machine = Arc::new(Mutex::new(WorkerMachine::new(1, 1, 1)));
        WorkerActor::start(tx, machine, &gateway)?;
        let jobs = Arc::new(Mutex::new(Vec::new()));
        let recorded = jobs.clone();
        std::thread::spawn(move || record_jobs(rx, recorded));
        let exits = Exits::default();
        exits.register(&gateway, WORKER_ACTOR)?;
        let addr = gateway.local_addr()?;
        Ok(Self {
            gateway,
            node,
            addr,
            jobs,
            exits,
        })
    }

    fn jobs(&self) -> Vec<&'static str> {
        self.jobs.lock().unwrap().clone()
    }
}

/// The compute thread's stand-in: ends when the worker actor (its queue's sender) goes.
fn record_jobs(rx: Receiver<WorkerJob>, jobs: Arc<Mutex<Vec<&'static str>>>) {
    while let Ok(job) = rx.recv() {
        let kind = match job {
            WorkerJob::Setup { rewind, reply, .. } => {
                let _ = reply.send(Ok(()));
                if rewind {
                    "rewind"
                } else {
                    "setup"
                }
            }
            WorkerJob::Run(_, _, tx) => {
                let _ = tx.send(Ok(b"ran".to_vec()));
                "run"
            }
            WorkerJob::Positions(tx) => {
                let _ = tx.send(Ok(Vec::new()));
                "positions"
            }
        };
        jobs.lock().unwrap().push(kind);
    }
}

/// A control message to a worker, sent with another worker's certificate, is refused and
/// reaches neither its compute thread nor an exit; from the chief, the same message does.
async fn worker_refuses<M: RemoteMessage>(msg: M, job: Option<&str>) -> anyhow::Result<()> {
    let cluster = Cluster::new()?;
    let worker = Worker::start(&cluster)?;
    cluster
        .refused(
            worker.addr,
            &worker.node,
            WORKER_ACTOR,
            &msg,
            Vec::new(),
            &worker.gateway,
        )
        .await?;
    assert!(worker.jobs().is_empty(), "{}: {:?}", M::TAG, worker.jobs());
    assert_eq!(worker.exits.count(), 0, "{}", M::TAG);

    Cluster::call(
        &cluster.chief,
        worker.addr,
        &worker.node,
        WORKER_ACTOR,
        &msg,
        Vec::new(),
    )
    .await?;
    match job {
        Some(kind) => assert_eq!(worker.jobs(), vec![kind]),
        None => assert_eq!(worker.exits.count(), 1, "{}", M::TAG),
    }
    Ok(())
}

fn setup() -> SetupWorker {
    SetupWorker {
        num_workers: 2,
        layouts: Vec::new(),
        servers: Vec::new(),
        datasets: Vec::new(),
        version: 0,
        generation: 0,
    }
}

// ---- parameter server: control from the chief only ----

#[test]
fn sec2_ps_create_variable_from_a_worker_is_refused() {
    run(async {
        let create = CreateVariable {
            name: "evil".into(),
            shape: vec![2],
            init: InitSpec::Constant(9.0),
        };
        let (cluster, ps, _) = ps_refuses(create, Vec::new()).await?;
        let pull = Pull {
            names: vec!["evil".into()],
        };
        assert!(
            ps.chief_sends(&cluster, &pull, Vec::new()).await?.is_err(),
            "the variable must not exist"
        );
        Ok(())
    });
}

#[test]
fn sec2_ps_restore_variable_from_a_worker_is_refused() {
    run(async {
        let restore = RestoreVariable {
            name: "w".into(),
            shape: vec![4],
            slots: Vec::new(),
            steps: 77,
        };
        ps_refuses(restore, vec![f32_blob(&[9.0; 4])]).await?;
        Ok(())
    });
}

#[test]
fn sec2_ps_fence_worker_from_a_worker_is_refused() {
    run(async {
        let fence = FenceWorker {
            worker: 1,
            incarnation: 1,
        };
        let (cluster, ps, _) = ps_refuses(fence, Vec::new()).await?;
        // worker/1's incarnation 1 was not fenced: its push still applies.
        let victim = start(&cluster.ca, &NodeId::new("worker", 1), 1)?;
        assert_eq!(ps.push(&victim, 1, 1, 0).await?, PushOutcome::Applied);
        assert_eq!(ps.w(&cluster).await?, vec![-0.5; 4]);
        Ok(())
    });
}

#[test]
fn sec2_ps_finished_below_from_a_worker_is_refused() {
    run(async {
        let finished = FinishedBelow {
            closure: 1_000,
            generation: 0,
        };
        let (cluster, ps, before) = ps_refuses(finished, Vec::new()).await?;
        assert_eq!(before.finished_below, 0);
        // Closure 5 is below the refused watermark, and still applies.
        assert_eq!(
            ps.push(&cluster.rogue, 0, 1, 5).await?,
            PushOutcome::Applied
        );
        Ok(())
    });
}

#[test]
fn sec2_ps_begin_restore_from_a_worker_is_refused() {
    run(async {
        let begin = BeginRestore {
            generation: 5,
            fences: vec![(1, 1)],
            afresh: false,
        };
        let (cluster, ps, before) = ps_refuses(begin, Vec::new()).await?;
        assert_eq!(before.generation, 0);
        // The server is not held in a restore: pushes still apply.
        assert_eq!(
            ps.push(&cluster.rogue, 0, 1, 0).await?,
            PushOutcome::Applied
        );
        Ok(())
    });
}

#[test]
fn sec2_ps_roll_back_from_a_worker_is_refused() {
    run(async {
        let cluster = Cluster::new()?;
        let ps = Ps::start(&cluster).await?;
        // Closure 0 applied; a roll-back would forget it and let it apply twice (PS-1).
        assert_eq!(
            ps.push(&cluster.rogue, 0, 1, 0).await?,
            PushOutcome::Applied
        );
        let before = ps.stats(&cluster).await?;
        let roll_back = RollBack {
            finished_below: 0,
            generation: 0,
        };
        ps.refused(&cluster, &roll_back, Vec::new()).await?;
        assert_eq!(ps.stats(&cluster).await?, before);
        assert_eq!(
            ps.push(&cluster.rogue, 0, 1, 0).await?,
            PushOutcome::Duplicate
        );
        assert_eq!(ps.w(&cluster).await?, vec![-0.5; 4]);
        Ok(())
    });
}

#[test]
fn sec2_ps_snapshot_from_a_worker_is_refused() {
    run(async {
        let (cluster, ps, _) = ps_refuses(Snapshot { name: "w".into() }, Vec::new()).await?;
        // The chief's checkpoint read still works.
        let state = ps
            .chief_sends(&cluster, &Snapshot { name: "w".into() }, Vec::new())
            .await?
            .map_err(anyhow::Error::msg)?;
        assert_eq!(state.shape, vec![4]);
        Ok(())
    });
}

#[test]
fn sec2_ps_stats_from_a_worker_is_refused() {
    run(async {
        ps_refuses(PsStats, Vec::new()).await?;
        Ok(())
    });
}

#[test]
fn sec2_ps_retire_from_a_worker_is_refused() {
    run(async {
        let (cluster, ps, _) = ps_refuses(Retire { incarnation: 1 }, Vec::new()).await?;
        ps.chief_sends(&cluster, &Retire { incarnation: 1 }, Vec::new())
            .await?;
        assert_eq!(ps.exits.count(), 1);
        Ok(())
    });
}

#[test]
fn sec2_ps_shutdown_from_a_worker_is_refused() {
    run(async {
        let (cluster, ps, _) = ps_refuses(Shutdown, Vec::new()).await?;
        ps.chief_sends(&cluster, &Shutdown, Vec::new()).await?;
        assert_eq!(ps.exits.count(), 1);
        Ok(())
    });
}

/// What workers do send still flows: pulls and pushes from a worker's certificate, and pulls
/// from the chief's; a push with the chief's certificate is refused (only workers push).
#[test]
fn sec2_ps_data_messages_come_from_their_senders() {
    run(async {
        let cluster = Cluster::new()?;
        let ps = Ps::start(&cluster).await?;
        assert_eq!(
            ps.push(&cluster.rogue, 0, 1, 0).await?,
            PushOutcome::Applied
        );
        let pull = Pull {
            names: vec!["w".into()],
        };
        Cluster::call(&cluster.rogue, ps.addr, &ps.node, PS_ACTOR, &pull, vec![])
            .await?
            .map_err(anyhow::Error::msg)?;
        assert_eq!(ps.w(&cluster).await?, vec![-0.5; 4]);
        match ps.push(&cluster.chief, 0, 1, 1).await {
            Err(e) => assert!(
                e.to_string().contains("may not be sent by role \"chief\""),
                "{e}"
            ),
            Ok(reply) => bail!("the chief pushed: {reply:?}"),
        }
        let evaluator = start(&cluster.ca, &NodeId::new("evaluator", 0), 1)?;
        match Cluster::call(&evaluator, ps.addr, &ps.node, PS_ACTOR, &pull, vec![]).await {
            Err(RemoteError::Refused {
                reason: RefusedReason::SenderNotAllowed { role, .. },
                ..
            }) => assert_eq!(role, "evaluator"),
            other => bail!("expected the evaluator refused, got {other:?}"),
        }
        assert_eq!(ps.w(&cluster).await?, vec![-0.5; 4]);
        Ok(())
    });
}

/// SEC-2: a worker pushes only as itself: a push naming another worker, or another
/// incarnation of itself, is refused and applies nothing (PS-1 and FENCE-1 key on the origin).
#[test]
fn sec2_a_push_under_another_workers_identity_is_refused() {
    run(async {
        let cluster = Cluster::new()?;
        let ps = Ps::start(&cluster).await?;
        for (worker, incarnation) in [(1, 1), (0, 7)] {
            match ps.push(&cluster.rogue, worker, incarnation, 3).await {
                Err(e) => assert!(e.to_string().contains("pushes only as itself"), "{e}"),
                Ok(reply) => {
                    bail!("a push as worker/{worker} incarnation {incarnation} went through: {reply:?}")
                }
            }
        }
        assert_eq!(ps.w(&cluster).await?, vec![0.0; 4]);
        assert_eq!(
            ps.push(&cluster.rogue, 0, 1, 3).await?,
            PushOutcome::Applied
        );
        Ok(())
    });
}

// ---- worker: control from the chief only ----

#[test]
fn sec2_worker_run_closure_from_a_worker_is_refused() {
    run(async {
        let run = RunClosure {
            closure: 1,
            attempt: 0,
            generation: 0,
            function: "step".into(),
            args: Vec::new(),
            servers: Vec::new(),
            learning_rate: None,
        };
        worker_refuses(run, Some("run")).await
    });
}

#[test]
fn sec2_worker_setup_from_a_worker_is_refused() {
    run(async { worker_refuses(setup(), Some("setup")).await });
}

#[test]
fn sec2_worker_rewind_from_a_worker_is_refused() {
    run(async { worker_refuses(RewindWorker { setup: setup() }, Some("rewind")).await });
}

#[test]
fn sec2_worker_dataset_positions_from_a_worker_is_refused() {
    run(async { worker_refuses(DatasetPositions, Some("positions")).await });
}

#[test]
fn sec2_worker_retire_from_a_worker_is_refused() {
    run(async { worker_refuses(Retire { incarnation: 1 }, None).await });
}

#[test]
fn sec2_worker_shutdown_from_a_worker_is_refused() {
    run(async { worker_refuses(Shutdown, None).await });
}

// ---- coordinator: joining and draining from workers and parameter servers only ----

/// [`Joining`] and [`Draining`] reach the coordinator only from a worker's or a parameter
/// server's certificate (whose role and index the coordinator takes as the sender's): an
/// evaluator or another chief cannot make the coordinator dial an address or drop a member.
#[test]
fn sec2_coordinator_joining_and_draining_from_a_non_worker_are_refused() {
    run(async {
        let cluster = Cluster::new()?;
        let heard = Arc::new(AtomicUsize::new(0));
        let joins = heard.clone();
        cluster.chief.register_fn::<Joining, _, _>(
            COORDINATOR_ACTOR,
            move |_: Remote<Joining>| {
                joins.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, RefusedReason>(Ok(())) }
            },
        )?;
        let drains = heard.clone();
        cluster.chief.register_fn::<Draining, _, _>(
            COORDINATOR_ACTOR,
            move |_: Remote<Draining>| {
                drains.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, RefusedReason>(Ok(())) }
            },
        )?;
        let chief_node = NodeId::new("chief", 0);
        let chief_addr = cluster.chief.local_addr()?;
        let joining = Joining {
            incarnation: 1,
            addr: "127.0.0.1:9".into(),
        };
        for role in ["evaluator", "chief"] {
            let sender = start(&cluster.ca, &NodeId::new(role, 1), 1)?;
            match Cluster::call(
                &sender,
                chief_addr,
                &chief_node,
                COORDINATOR_ACTOR,
                &joining,
                vec![],
            )
            .await
            {
                Err(RemoteError::Refused {
                    reason: RefusedReason::SenderNotAllowed { tag, .. },
                    ..
                }) => assert_eq!(tag, Joining::TAG),
                other => bail!("a {role}'s join was not refused: {other:?}"),
            }
            let drain = Draining { incarnation: 1 };
            match Cluster::call(
                &sender,
                chief_addr,
                &chief_node,
                COORDINATOR_ACTOR,
                &drain,
                vec![],
            )
            .await
            {
                Err(RemoteError::Refused {
                    reason: RefusedReason::SenderNotAllowed { tag, .. },
                    ..
                }) => assert_eq!(tag, Draining::TAG),
                other => bail!("a {role}'s drain was not refused: {other:?}"),
            }
        }
        assert_eq!(heard.load(Ordering::SeqCst), 0);
        let answer = Cluster::call(
            &cluster.rogue,
            chief_addr,
            &chief_node,
            COORDINATOR_ACTOR,
            &joining,
            vec![],
        )
        .await?;
        assert_eq!(answer, Ok(()));
        let drained = Cluster::call(
            &cluster.rogue,
            chief_addr,
            &chief_node,
            COORDINATOR_ACTOR,
            &Draining { incarnation: 1 },
            vec![],
        )
        .await?;
        assert_eq!(drained, Ok(()));
        assert_eq!(heard.load(Ordering::SeqCst), 2);
        // A parameter server joins and leaves the job the same way (elastic servers).
        let server = start(&cluster.ca, &NodeId::new("ps", 2), 1)?;
        let joined = Cluster::call(
            &server,
            chief_addr,
            &chief_node,
            COORDINATOR_ACTOR,
            &joining,
            vec![],
        )
        .await?;
        assert_eq!(joined, Ok(()));
        let drained = Cluster::call(
            &server,
            chief_addr,
            &chief_node,
            COORDINATOR_ACTOR,
            &Draining { incarnation: 1 },
            vec![],
        )
        .await?;
        assert_eq!(drained, Ok(()));
        assert_eq!(heard.load(Ordering::SeqCst), 4);
        Ok(())
    })
}

// ---- coordinator: preemption notices from workers and parameter servers only ----

/// A preemption notice ([`Leaving`]) reaches the coordinator only from a worker or a parameter
/// server: the same message from an evaluator's certificate is refused before the handler
/// runs, so no other role can make the chief fence a worker or cut and restore its servers.
#[test]
fn sec2_coordinator_leaving_from_an_evaluator_is_refused() {
    run(async {
        let cluster = Cluster::new()?;
        let heard = Arc::new(AtomicUsize::new(0));
        let counted = heard.clone();
        cluster.chief.register_fn::<Leaving, _, _>(
            COORDINATOR_ACTOR,
            move |_: Remote<Leaving>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, RefusedReason>(LeaveAnswer::Go) }
            },
        )?;
        let chief_node = NodeId::new("chief", 0);
        let chief_addr = cluster.chief.local_addr()?;
        let evaluator = start(&cluster.ca, &NodeId::new("evaluator", 0), 1)?;
        let msg = Leaving { incarnation: 1 };
        match Cluster::call(
            &evaluator,
            chief_addr,
            &chief_node,
            COORDINATOR_ACTOR,
            &msg,
            vec![],
        )
        .await
        {
            Err(RemoteError::Refused {
                reason: RefusedReason::SenderNotAllowed { tag, role },
                ..
            }) => assert_eq!((tag.as_str(), role.as_str()), (Leaving::TAG, "evaluator")),
            other => bail!("an evaluator's notice was not refused: {other:?}"),
        }
        assert_eq!(heard.load(Ordering::SeqCst), 0);
        let ps = start(&cluster.ca, &NodeId::new("ps", 0), 1)?;
        for sender in [&cluster.rogue, &ps] {
            let answer = Cluster::call(
                sender,
                chief_addr,
                &chief_node,
                COORDINATOR_ACTOR,
                &msg,
                vec![],
            )
            .await?;
            assert_eq!(answer, LeaveAnswer::Go);
        }
        assert_eq!(heard.load(Ordering::SeqCst), 2);
        Ok(())
    })
}
