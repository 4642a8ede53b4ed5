//! A parameter server's refusals arrive as typed errors over real QUIC on 127.0.0.1 (the
//! `PsRefusal` of `cohort::roles::protocol`), and each reads as a clear message naming what
//! was wrong: the unknown variable, the missing blob, the bad initializer, the shape too large.
//! A refused request changes nothing on the server.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use cohort::optim::Optimizer;
use cohort::roles::coordinator::ClosureId;
use cohort::roles::protocol::{
    f32_blob, BlobError, CreateVariable, InitProblem, InitSpec, PsRefusal, PsStats, Push,
    PushOrigin, PushOutcome, Snapshot, WireGradient, PS_ACTOR,
};
use cohort::roles::ps::{ParameterStore, PsActor, PsError};
use cohort_actors::{Gateway, GatewayConfig, HeartbeatConfig, IncarnationId, RemoteMessage};
use cohort_transport::{ClusterCa, Endpoint, NodeId, TransportConfig};

#[test]
fn a_push_to_an_unknown_variable_is_refused_naming_it() {
    run(|cluster| async move {
        let push = push_to("nope");
        let reply = cluster
            .worker_sends(&push, vec![f32_blob(&[1.0; 4])])
            .await?;
        let refusal = reply.expect_err("a push to an unknown variable applied");
        assert_eq!(
            refusal,
            PsRefusal::Store(PsError::UnknownVariable("nope".into()))
        );
        assert_eq!(
            refusal.to_string(),
            "variable \"nope\" does not exist on this parameter server"
        );
        let stats = cluster.chief_sends(&PsStats, Vec::new()).await?;
        assert_eq!((stats.applied, stats.rejected_invalid), (0, 1));
        // The same push to the variable that exists applies.
        let reply = cluster
            .worker_sends(&push_to("w"), vec![f32_blob(&[1.0; 4])])
            .await?;
        assert_eq!(reply, Ok(PushOutcome::Applied));
        Ok(())
    });
}

#[test]
fn a_push_without_its_gradient_blob_is_refused_naming_the_blob() {
    run(|cluster| async move {
        let reply = cluster.worker_sends(&push_to("w"), Vec::new()).await?;
        let refusal = reply.expect_err("a push without its blob applied");
        assert!(
            matches!(
                &refusal,
                PsRefusal::Blob(BlobError::Missing { what, index: 0, carried: 0 }) if what == "w"
            ),
            "{refusal:?}"
        );
        assert_eq!(refusal.to_string(), "w: missing blob 0 (message carries 0)");
        assert_eq!(cluster.chief_sends(&PsStats, Vec::new()).await?.applied, 0);
        Ok(())
    });
}

#[test]
fn a_bad_initializer_or_shape_is_refused_clearly_and_creates_nothing() {
    run(|cluster| async move {
        let create = CreateVariable {
            name: "b".into(),
            shape: vec![2],
            init: InitSpec::Constant(f32::NAN),
        };
        let refusal = cluster
            .chief_sends(&create, Vec::new())
            .await?
            .expect_err("a NaN constant was accepted");
        assert!(
            matches!(
                &refusal,
                PsRefusal::Initializer { name, problem: InitProblem::NonFiniteConstant(c) }
                    if name == "b" && c.is_nan()
            ),
            "{refusal:?}"
        );
        assert_eq!(
            refusal.to_string(),
            "variable \"b\": constant initializer NaN is not finite"
        );
        let create = CreateVariable {
            name: "big".into(),
            shape: vec![1 << 20, 1 << 20],
            init: InitSpec::Zeros,
        };
        let refusal = cluster
            .chief_sends(&create, Vec::new())
            .await?
            .expect_err("a 2^40-element shard was accepted");
        assert!(
            matches!(refusal, PsRefusal::ShapeTooLarge { .. }),
            "{refusal:?}"
        );
        let refusal = cluster
            .chief_sends(&Snapshot { name: "b".into() }, Vec::new())
            .await?
            .expect_err("a refused variable was created");
        assert_eq!(
            refusal,
            PsRefusal::Store(PsError::UnknownVariable("b".into()))
        );
        Ok(())
    });
}

// ---- harness ----

/// A chief, a worker (incarnation 1) and a real parameter server `ps/0` holding `w` = [0; 4].
struct Cluster {
    chief: Gateway,
    worker: Gateway,
    ps_node: NodeId,
    ps_addr: SocketAddr,
    _ps: Gateway,
}

impl Cluster {
    async fn start() -> anyhow::Result<Self> {
        let ca = ClusterCa::generate("refusals")?;
        let ps_node = NodeId::new("ps", 0);
        let ps = gateway(&ca, &ps_node)?;
        PsActor::start(ParameterStore::new(Optimizer::sgd(0.5))?, ps.clone())?;
        let cluster = Self {
            chief: gateway(&ca, &NodeId::new("chief", 0))?,
            worker: gateway(&ca, &NodeId::new("worker", 0))?,
            ps_node,
            ps_addr: ps.local_addr()?,
            _ps: ps,
        };
        let create = CreateVariable {
            name: "w".into(),
            shape: vec![4],
            init: InitSpec::Zeros,
        };
        cluster.chief_sends(&create, Vec::new()).await??;
        Ok(cluster)
    }

    async fn chief_sends<M: RemoteMessage>(
        &self,
        msg: &M,
        blobs: Vec<Bytes>,
    ) -> anyhow::Result<M::Reply> {
        self.send(&self.chief, msg, blobs).await
    }

    async fn worker_sends<M: RemoteMessage>(
        &self,
        msg: &M,
        blobs: Vec<Bytes>,
    ) -> anyhow::Result<M::Reply> {
        self.send(&self.worker, msg, blobs).await
    }

    async fn send<M: RemoteMessage>(
        &self,
        from: &Gateway,
        msg: &M,
        blobs: Vec<Bytes>,
    ) -> anyhow::Result<M::Reply> {
        let r = from
            .resolve::<M>(self.ps_addr, &self.ps_node, PS_ACTOR)
            .await?;
        Ok(r.call_with_blobs(msg, blobs).await?.0)
    }
}

/// A push of one dense gradient to `name` from worker 0, incarnation 1.
fn push_to(name: &str) -> Push {
    Push {
        origin: PushOrigin {
            worker: 0,
            incarnation: 1,
            closure: ClosureId(1),
            attempt: 0,
            part: 0,
            generation: 0,
            learning_rate: None,
            server: 0,
        },
        gradients: vec![(name.into(), WireGradient::Dense)],
    }
}

fn gateway(ca: &ClusterCa, node: &NodeId) -> anyhow::Result<Gateway> {
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let endpoint = Endpoint::bind(any, ca.issue(node)?, TransportConfig::for_tests())?;
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

/// Runs `test` against a fresh cluster, bounded in time.
fn run<F, Fut>(test: F)
where
    F: FnOnce(Cluster) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    actix::System::new().block_on(async move {
        let body = async move { test(Cluster::start().await?).await };
        tokio::time::timeout(Duration::from_secs(30), body)
            .await
            .expect("test timed out")
            .expect("test failed");
    });
}
