//! A worker's view of the parameter servers: pull and push by variable, routed to the shards
//! of each variable's layout. Called from the worker's compute thread; the remote calls run on
//! the node's runtime and the compute thread waits for them (each bounded by the gateway's
//! call timeout).

use std::collections::BTreeMap;
use std::sync::Arc;

use cohort_actors::{Gateway, PeerAddr, RemoteMessage, RemoteRef};
use cohort_transport::NodeId;
use tokio::runtime::Handle;

use crate::roles::step::{PsFailure, StepError};
use bytes::Bytes;

use crate::cluster::{TaskId, TaskType};
use crate::layout::Layout;
use crate::roles::protocol::{
    blob, decode_f32_into, f32_view, u64_vec_blob, Pull, PullRows, Push, PS_ACTOR,
};
use crate::roles::push::{route_rows, PlannedPush, PushOutcome};

/// Calls into every parameter server of the cluster.
pub struct PsClient {
    gateway: Gateway,
    runtime: Handle,
    /// Every server known, by index: the cluster spec's, and those that joined the job since
    /// ([`Self::learn_servers`]).
    servers: BTreeMap<u32, (NodeId, PeerAddr)>,
    /// Per server, the newest incarnation the chief named serving (0: none named).
    expected: Vec<u64>,
    /// The server list [`Self::learn_servers`] took last.
    learned: Option<Arc<Vec<(u32, String)>>>,
}

impl PsClient {
    /// A client over the parameter servers `servers` (index = PS task index).
    pub fn new(gateway: Gateway, runtime: Handle, servers: Vec<(NodeId, PeerAddr)>) -> Self {
        // A call to an incarnation the chief named dials it where the cluster places it.
        for (node, addr) in &servers {
            gateway.set_address(node, addr.clone());
        }
        Self {
            gateway,
            runtime,
            servers: (0..).zip(servers).collect(),
            expected: Vec::new(),
            learned: None,
        }
    }

    /// The chief named these incarnations serving (per server index, 0 for none known), with
    /// a closure to run: calls go to them (or newer ones). A server restored under a new
    /// incarnation is then dialed at once, rather than called on its predecessor's connection
    /// until that idles out.
    pub fn expect_incarnations(&mut self, incarnations: &[u64]) {
        if self.expected.len() < incarnations.len() {
            self.expected.resize(incarnations.len(), 0);
        }
        for (known, named) in self.expected.iter_mut().zip(incarnations) {
            *known = (*known).max(*named);
        }
    }

    /// Adds (or replaces) servers by index, with where to dial each.
    pub fn know_servers(&mut self, servers: impl IntoIterator<Item = (u32, (NodeId, PeerAddr))>) {
        for (ps, (node, addr)) in servers {
            self.gateway.set_address(&node, addr.clone());
            self.servers.insert(ps, (node, addr));
        }
    }

    /// Every parameter server of the job with the `host:port` it serves on, as the chief's
    /// setup names them (servers may have joined since this worker's cluster spec): calls to
    /// them dial there.
    /// Called with every closure: a list already learned (the same setup's) costs nothing.
    pub fn learn_servers(&mut self, servers: &Arc<Vec<(u32, String)>>) {
        if self
            .learned
            .as_ref()
            .is_some_and(|known| Arc::ptr_eq(known, servers))
        {
            return;
        }
        self.learned = Some(Arc::clone(servers));
        for (ps, addr) in servers.iter() {
            let known = self.servers.get(ps).map(|(_, a)| a.to_string());
            if known.as_deref() == Some(addr.as_str()) {
                continue;
            }
            let node = crate::roles::node::peer(TaskId::new(TaskType::Ps, *ps));
            let addr = PeerAddr::new(addr);
            self.gateway.set_address(&node, addr.clone());
            self.servers.insert(*ps, (node, addr));
        }
    }

    /// The whole value of a variable, gathered from its shards in row order.
    pub fn pull(&self, layout: &Layout) -> Result<Vec<f32>, StepError> {
        Ok(self.pull_many(&[layout])?.pop().unwrap_or_default())
    }

    /// The whole values of several variables: one request per parameter server (more when
    /// its shards add up to more than `PULL_REPLY_BYTES_MAX`), all at once, naming every
    /// shard it holds among them; each variable is assembled from the replies with one copy.
    pub fn pull_many(&self, layouts: &[&Layout]) -> Result<Vec<Vec<f32>>, StepError> {
        let (calls, wanted): (Vec<_>, Vec<_>) = plan_pulls(layouts, PULL_REPLY_BYTES_MAX)
            .into_iter()
            .map(|(ps, (names, shards))| ((ps, Pull { names }, Vec::new()), shards))
            .unzip();
        // Every shard's blob, by (variable, shard); then each variable is assembled in row
        // order with one copy (no zero-fill first: pulls are megabytes per step).
        let mut received: BTreeMap<(usize, usize), Bytes> = BTreeMap::new();
        for ((reply, blobs), shards) in self.call_all(calls)?.into_iter().zip(wanted) {
            reply.map_err(StepError::ps)?;
            for (k, key) in shards.into_iter().enumerate() {
                let bytes = blob(&blobs, k, &layouts[key.0].name).map_err(StepError::ps)?;
                received.insert(key, bytes.clone());
            }
        }
        layouts
            .iter()
            .enumerate()
            .map(|(v, layout)| {
                let width = layout.row_len();
                let mut values = Vec::with_capacity(layout.shape.iter().product());
                for (i, shard) in layout.shards.iter().enumerate() {
                    let name = layout.shard_name(i);
                    let bytes = received
                        .get(&(v, i))
                        .ok_or_else(|| StepError::ps(PsFailure::NoReply(name.clone())))?;
                    let expected = shard.rows.len() * width;
                    if bytes.len() != expected * 4 {
                        return Err(StepError::ps(PsFailure::ShardLength {
                            shard: name,
                            bytes: bytes.len() as u64,
                            expected: expected as u64,
                        }));
                    }
                    values.extend_from_slice(&f32_view(bytes, &name).map_err(StepError::ps)?);
                }
                Ok(values)
            })
            .collect()
    }

    /// Rows `ids` (of the full variable) concatenated in the order of `ids`.
    pub fn pull_rows(&self, layout: &Layout, ids: &[u64]) -> Result<Vec<f32>, StepError> {
        let width = layout.row_len();
        let (calls, positions): (Vec<_>, Vec<_>) = route_rows(layout, ids)?
            .into_iter()
            .map(|(shard, (local_ids, positions))| {
                (
                    (
                        layout.shards[shard].ps,
                        PullRows {
                            name: layout.shard_name(shard),
                        },
                        vec![u64_vec_blob(local_ids)],
                    ),
                    positions,
                )
            })
            .unzip();
        let replies = self.call_all(calls)?;
        let mut out = vec![0.0f32; ids.len() * width];
        for (positions, (reply, blobs)) in positions.iter().zip(replies) {
            reply.map_err(StepError::ps)?;
            let bytes = blob(&blobs, 0, &layout.name).map_err(StepError::ps)?;
            if bytes.len() != positions.len() * width * 4 {
                return Err(StepError::ps(PsFailure::ShardLength {
                    shard: layout.name.clone(),
                    bytes: bytes.len() as u64,
                    expected: (positions.len() * width) as u64,
                }));
            }
            for (row, &pos) in bytes.chunks_exact((width * 4).max(1)).zip(positions) {
                decode_f32_into(&mut out[pos * width..(pos + 1) * width], row, &layout.name)
                    .map_err(StepError::ps)?;
            }
        }
        Ok(out)
    }

    /// Sends a closure's planned pushes ([`crate::roles::push::plan_push`]), all at once,
    /// and waits until every one has settled: each server's outcome, in the plan's order, or
    /// the first server found unavailable (else the first failure).
    pub fn push(&self, plan: Vec<PlannedPush>) -> Result<Vec<(u32, PushOutcome)>, StepError> {
        let calls: Vec<(u32, Push, Vec<Bytes>)> =
            plan.into_iter().map(|p| (p.ps, p.push, p.blobs)).collect();
        let targets: Vec<u32> = calls.iter().map(|(ps, _, _)| *ps).collect();
        self.call_all(calls)?
            .into_iter()
            .zip(targets)
            .map(|((reply, _), ps)| Ok((ps, reply.map_err(StepError::ps)?)))
            .collect()
    }

    /// Sends every `(ps, message, blobs)` concurrently and waits for all replies (with their
    /// blobs), in order. Every call settles (answered, failed or timed out) before this
    /// returns, even when one fails early: a worker reports a closure only once nothing it
    /// sent for it is still in flight, so the coordinator never starts a recovery under a push
    /// that may still apply (PS-1). On failure, the first server found unavailable is
    /// reported, else the first error.
    fn call_all<M: RemoteMessage + Sync>(
        &self,
        calls: Vec<(u32, M, Vec<Bytes>)>,
    ) -> Result<Vec<WithBlobs<M::Reply>>, StepError> {
        for (ps, _, _) in &calls {
            if let Some(reason) = self.cut_off(*ps) {
                return Err(StepError::CutOff { ps: *ps, reason });
            }
        }
        let refs = calls
            .iter()
            .map(|(ps, _, _)| {
                let (node, _) = self
                    .servers
                    .get(ps)
                    .ok_or_else(|| StepError::ps(PsFailure::NoSuchServer(*ps)))?;
                Ok(self.reference::<M>(*ps, node))
            })
            .collect::<Result<Vec<_>, StepError>>()?;
        let sent: u64 = calls
            .iter()
            .flat_map(|(_, _, blobs)| blobs.iter().map(|b| b.len() as u64))
            .sum();
        crate::metrics::instruments()
            .worker_pushed_bytes
            .inc_by(sent);
        let gateway = self.gateway.clone();
        let servers = self.servers.clone();
        // The calls run as a task of the node's runtime, next to the connection that carries
        // them: reading a reply chunk by chunk there costs no thread switch per chunk, and
        // this compute thread wakes once, when every reply is in.
        let calls = self.runtime.spawn(async move {
            let futures = refs.into_iter().zip(calls).map(|(r, (ps, msg, blobs))| {
                let gateway = gateway.clone();
                let (node, addr) = servers[&ps].clone();
                async move {
                    let r = match r {
                        Some(r) => r,
                        None => gateway
                            .resolve::<M>(addr, &node, PS_ACTOR)
                            .await
                            .map_err(|e| StepError::from_ps_call(ps, e))?,
                    };
                    r.call_with_blobs(&msg, blobs)
                        .await
                        .map_err(|e| StepError::from_ps_call(ps, e))
                }
            });
            futures::future::join_all(futures).await
        });
        let results = self
            .runtime
            .block_on(calls)
            .map_err(|e| StepError::ps(PsFailure::Abandoned(e)))?;
        let mut replies = Vec::with_capacity(results.len());
        let mut failed: Option<StepError> = None;
        for result in results {
            match result {
                Ok(reply) => {
                    crate::metrics::instruments()
                        .worker_pulled_bytes
                        .inc_by(reply.1.iter().map(|b| b.len() as u64).sum());
                    replies.push(reply)
                }
                Err(e) => {
                    let unavailable = matches!(e, StepError::PsUnavailable(_));
                    if failed.is_none()
                        || (unavailable && !matches!(failed, Some(StepError::PsUnavailable(_))))
                    {
                        failed = Some(e);
                    }
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(replies),
        }
    }

    /// Why this worker cannot reach server `ps` any more, if its gateway declared dead the
    /// very incarnation the chief names serving ([`StepError::CutOff`]).
    fn cut_off(&self, ps: u32) -> Option<String> {
        let named = self.expected.get(ps as usize).copied().filter(|e| *e > 0)?;
        let (node, _) = self.servers.get(&ps)?;
        match self.gateway.peer_status(node) {
            Some((incarnation, false)) if incarnation.0 == named => Some(format!(
                "this worker declared {node} ({incarnation}) dead (silent past the detection budget), \
                 while the chief names that incarnation serving: FENCE-1 keeps it out of this \
                 incarnation for good"
            )),
            _ => None,
        }
    }

    /// A reference to the PS actor of server `ps` on `node`: the live incarnation the gateway
    /// knows, unless the chief named a newer one (then that one, dialed afresh); `None` when
    /// neither is known (the caller dials).
    fn reference<M: RemoteMessage>(&self, ps: u32, node: &NodeId) -> Option<RemoteRef<M>> {
        let expected = self.expected.get(ps as usize).copied().unwrap_or(0);
        let incarnation = match self.gateway.peer_status(node) {
            Some((incarnation, alive)) if incarnation.0 >= expected => {
                alive.then_some(incarnation)?
            }
            _ if expected > 0 => cohort_actors::IncarnationId(expected),
            _ => return None,
        };
        Some(self.gateway.remote_ref(
            cohort_actors::Incarnation::new(node.clone(), incarnation),
            PS_ACTOR,
        ))
    }
}

/// Most bytes one pull request asks a server for when it names several shards: half the
/// node's message payload bound, so replies stay well inside it (a single shard larger than
/// this still goes alone, bounded by the server's own limit).
pub const PULL_REPLY_BYTES_MAX: usize = 64 << 20;

/// The pull requests for `layouts`: for each server, its shards among them in as few
/// requests as keep each reply within `bytes_max` (a larger shard goes alone).
fn plan_pulls(layouts: &[&Layout], bytes_max: usize) -> Vec<(u32, ShardRequest)> {
    // Per server, its requests so far and the bytes each asks for.
    let mut per_ps: BTreeMap<u32, Vec<(ShardRequest, usize)>> = BTreeMap::new();
    for (v, layout) in layouts.iter().enumerate() {
        let width = layout.row_len();
        for (i, shard) in layout.shards.iter().enumerate() {
            let bytes = shard.rows.len().saturating_mul(width).saturating_mul(4);
            let requests = per_ps.entry(shard.ps).or_default();
            let fits = requests
                .last()
                .is_some_and(|(_, total)| total.saturating_add(bytes) <= bytes_max);
            if !fits {
                requests.push(Default::default());
            }
            if let Some(((names, shards), total)) = requests.last_mut() {
                names.push(layout.shard_name(i));
                shards.push((v, i));
                *total = total.saturating_add(bytes);
            }
        }
    }
    per_ps
        .into_iter()
        .flat_map(|(ps, requests)| requests.into_iter().map(move |(request, _)| (ps, request)))
        .collect()
}

/// What one server is asked for in a pull: the shard names and, for each, (variable index,
/// shard index).
type ShardRequest = (Vec<String>, Vec<(usize, usize)>);

/// A reply and the blobs that came with it.
type WithBlobs<R> = (R, Vec<Bytes>);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Dtype, Shard};

    fn layout(name: &str, rows: usize, width: usize, shards: &[(u32, usize, usize)]) -> Layout {
        Layout {
            name: name.into(),
            dtype: Dtype::F32,
            shape: vec![rows, width],
            shards: shards
                .iter()
                .map(|&(ps, start, end)| Shard {
                    ps,
                    rows: start..end,
                })
                .collect(),
        }
    }

    #[test]
    fn one_pull_per_server_names_every_shard_it_holds() {
        let a = layout("a", 4, 2, &[(0, 0, 2), (1, 2, 4)]);
        let b = layout("b", 1, 3, &[(0, 0, 1)]);
        let plan = plan_pulls(&[&a, &b], 1 << 20);
        assert_eq!(
            plan,
            vec![
                (
                    0,
                    (vec!["a/part_0".into(), "b".into()], vec![(0, 0), (1, 0)])
                ),
                (1, (vec!["a/part_1".into()], vec![(0, 1)])),
            ]
        );
    }

    #[test]
    fn a_server_gets_several_pulls_when_its_shards_exceed_the_reply_bound() {
        // Each shard is 2 rows x 4 floats = 32 bytes; the bound fits two of them.
        let a = layout("a", 6, 4, &[(0, 0, 2), (0, 2, 4), (0, 4, 6)]);
        let big = layout("big", 100, 4, &[(0, 0, 100)]);
        let plan = plan_pulls(&[&a, &big], 64);
        let names: Vec<Vec<String>> = plan.into_iter().map(|(_, (n, _))| n).collect();
        assert_eq!(
            names,
            vec![
                vec!["a/part_0".to_string(), "a/part_1".to_string()],
                vec!["a/part_2".to_string()],
                vec!["big".to_string()],
            ]
        );
    }
}

#[cfg(test)]
mod call_all_tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use cohort_actors::{RefusedReason, Remote};
    use cohort_transport::ClusterCa;

    use crate::layout::Dtype;
    use crate::ledger::ClosureId;
    use crate::roles::push::{plan_push, Gradient, PushOrigin};

    fn gateway(ca: &ClusterCa, node: &NodeId) -> Gateway {
        crate::roles::test_support::loopback_gateway(ca, node, 1, Duration::from_secs(10))
    }

    fn scalar(name: &str, ps: u32) -> Layout {
        Layout::unsharded(name, Dtype::F32, vec![1], ps)
    }

    /// Two fake parameter servers and a client over them: ps/0 answers a push with `reply`
    /// after `delay` (then sets `settled`), ps/1 with `second` at once, or serves no
    /// parameter-server actor at all (`None`: unavailable). Runs until `stop` is sent.
    fn cluster(
        delay: Duration,
        reply: PushOutcome,
        second: Option<PushOutcome>,
        settled: Arc<AtomicBool>,
    ) -> (
        PsClient,
        tokio::sync::oneshot::Sender<()>,
        std::thread::JoinHandle<()>,
    ) {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let system = std::thread::spawn(move || {
            actix::System::new().block_on(async move {
                let ca = ClusterCa::generate("test").unwrap();
                let first = NodeId::new("ps", 0);
                let first_gateway = gateway(&ca, &first);
                first_gateway
                    .register_fn::<Push, _, _>(PS_ACTOR, move |_: Remote<Push>| {
                        let settled = Arc::clone(&settled);
                        async move {
                            tokio::time::sleep(delay).await;
                            settled.store(true, Ordering::SeqCst);
                            Ok::<_, RefusedReason>(Ok(reply))
                        }
                    })
                    .unwrap();
                let other = NodeId::new("ps", 1);
                let other_gateway = gateway(&ca, &other);
                if let Some(second) = second {
                    other_gateway
                        .register_fn::<Push, _, _>(PS_ACTOR, move |_: Remote<Push>| async move {
                            Ok::<_, RefusedReason>(Ok(second))
                        })
                        .unwrap();
                }
                let servers = vec![
                    (first, first_gateway.local_addr().unwrap().into()),
                    (other, other_gateway.local_addr().unwrap().into()),
                ];
                let worker = gateway(&ca, &NodeId::new("worker", 0));
                ready_tx
                    .send(PsClient::new(worker, Handle::current(), servers))
                    .unwrap();
                let _ = stop_rx.await;
            })
        });
        (ready_rx.recv().unwrap(), stop_tx, system)
    }

    fn push_both(client: &PsClient) -> Result<Vec<(u32, PushOutcome)>, StepError> {
        let layouts: BTreeMap<String, Layout> = [
            ("a".to_string(), scalar("a", 0)),
            ("b".to_string(), scalar("b", 1)),
        ]
        .into_iter()
        .collect();
        let gradients = vec![
            ("a".to_string(), Gradient::Dense(vec![1.0].into())),
            ("b".to_string(), Gradient::Dense(vec![1.0].into())),
        ];
        let origin = PushOrigin {
            worker: 0,
            incarnation: 1,
            closure: ClosureId(7),
            attempt: 1,
            part: 0,
            generation: 0,
            learning_rate: None,
            server: 0,
        };
        client.push(plan_push(&layouts, origin, gradients).unwrap())
    }

    /// PS-1: when one server fails a push at once, the worker still waits for the push it
    /// sent to the other server to settle before reporting the closure, so the coordinator
    /// never starts a recovery under a push that may still apply.
    #[test]
    fn ps_1_a_failed_push_is_reported_only_after_every_push_sent_has_settled() {
        let settled = Arc::new(AtomicBool::new(false));
        let (client, stop, system) = cluster(
            Duration::from_millis(300),
            PushOutcome::Applied,
            None,
            Arc::clone(&settled),
        );
        let result = push_both(&client);
        assert!(
            matches!(result, Err(StepError::PsUnavailable(ref u)) if u.ps == 1),
            "{result:?}"
        );
        assert!(
            settled.load(Ordering::SeqCst),
            "the push to ps/0 was still in flight when the failure was reported"
        );
        let _ = stop.send(());
        system.join().unwrap();
    }

    /// A server incarnation this worker's gateway declared dead (here by a report; in a run,
    /// silent past the budget across a partition between the two alone) while the chief
    /// still names it serving: the worker is cut off from it for good (FENCE-1), and says so
    /// before sending anything, rather than failing as "unavailable" closure after closure
    /// (the chief would retry it against a server it reaches, until it gave up on the job).
    #[test]
    fn a_server_incarnation_this_worker_declared_dead_while_the_chief_names_it_cuts_it_off() {
        let settled = Arc::new(AtomicBool::new(false));
        let (mut client, stop, system) = cluster(
            Duration::ZERO,
            PushOutcome::Applied,
            Some(PushOutcome::Applied),
            settled,
        );
        assert_eq!(
            push_both(&client).unwrap(),
            vec![(0, PushOutcome::Applied), (1, PushOutcome::Applied)]
        );
        let ps0 =
            cohort_actors::Incarnation::new(NodeId::new("ps", 0), cohort_actors::IncarnationId(1));
        assert!(client.gateway.report_dead(&ps0));
        // Unnamed by the chief, it is only unavailable (a restore may bring a newer one).
        let err = push_both(&client).unwrap_err();
        assert!(
            matches!(err, StepError::PsUnavailable(ref u) if u.ps == 0),
            "{err}"
        );
        // Named serving by the chief: cut off.
        client.expect_incarnations(&[1, 1]);
        let err = push_both(&client).unwrap_err();
        match err {
            StepError::CutOff { ps: 0, ref reason } => {
                assert!(reason.contains("ps/0"), "{reason}")
            }
            other => panic!("expected cut off from ps/0, got {other}"),
        }
        let _ = stop.send(());
        system.join().unwrap();
    }

    /// LEDGER-1: every server's outcome comes back as it answered, a stale refusal included
    /// (the worker's machine turns it into the server's unavailability: never a silent
    /// success), and a duplicate as a duplicate.
    #[test]
    fn ledger_1_each_servers_outcome_comes_back_as_it_answered() {
        let settled = Arc::new(AtomicBool::new(false));
        let (client, stop, system) = cluster(
            Duration::ZERO,
            PushOutcome::Applied,
            Some(PushOutcome::Stale),
            Arc::clone(&settled),
        );
        assert_eq!(
            push_both(&client).unwrap(),
            vec![(0, PushOutcome::Applied), (1, PushOutcome::Stale)]
        );
        let _ = stop.send(());
        system.join().unwrap();
        let (client, stop, system) = cluster(
            Duration::ZERO,
            PushOutcome::Applied,
            Some(PushOutcome::Duplicate),
            settled,
        );
        assert_eq!(
            push_both(&client).unwrap(),
            vec![(0, PushOutcome::Applied), (1, PushOutcome::Duplicate)]
        );
        let _ = stop.send(());
        system.join().unwrap();
    }
}
