//! A worker's view of the parameter servers: pull and push by variable, routed to the shards
//! of each variable's layout. Called from the worker's compute thread; the remote calls run on
//! the node's runtime and the compute thread waits for them (each bounded by the gateway's
//! call timeout).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use cohort_actors::{Gateway, RemoteMessage, RemoteRef};
use cohort_transport::NodeId;
use tokio::runtime::Handle;

use super::{PendingGradient, StepError};
use bytes::Bytes;

use crate::optim::first_non_finite;
use crate::roles::protocol::{
    blob, decode_f32_into, f32_vec_blob, f32_view, u64_vec_blob, Pull, PullRows, Push, PushReply,
    WireGradient, PS_ACTOR,
};
use crate::variable::ShardLayout;

/// Calls into every parameter server of the cluster.
pub struct PsClient {
    gateway: Gateway,
    runtime: Handle,
    servers: Vec<(NodeId, SocketAddr)>,
}

/// What the parameter servers said to one closure's pushes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushSummary {
    /// Servers that applied the push.
    pub applied: u32,
    /// Servers that refused it as a duplicate (PS-1) or stale (FENCE-1).
    pub refused: u32,
}

impl PsClient {
    /// A client over the parameter servers `servers` (index = PS task index).
    pub fn new(gateway: Gateway, runtime: Handle, servers: Vec<(NodeId, SocketAddr)>) -> Self {
        Self {
            gateway,
            runtime,
            servers,
        }
    }

    /// The whole value of a variable, gathered from its shards in row order.
    pub fn pull(&self, layout: &ShardLayout) -> Result<Vec<f32>, StepError> {
        Ok(self.pull_many(&[layout])?.pop().unwrap_or_default())
    }

    /// The whole values of several variables: one request per parameter server, all at
    /// once, naming every shard it holds among them; each variable is assembled from the
    /// replies with one copy.
    pub fn pull_many(&self, layouts: &[&ShardLayout]) -> Result<Vec<Vec<f32>>, StepError> {
        let mut per_ps: BTreeMap<u32, ShardRequest> = BTreeMap::new();
        for (v, layout) in layouts.iter().enumerate() {
            for (i, shard) in layout.shards.iter().enumerate() {
                let entry = per_ps.entry(shard.ps).or_default();
                entry.0.push(layout.shard_name(i));
                entry.1.push((v, i));
            }
        }
        let (calls, wanted): (Vec<_>, Vec<_>) = per_ps
            .into_iter()
            .map(|(ps, (names, shards))| ((ps, Pull { names }, Vec::new()), shards))
            .unzip();
        // Every shard's blob, by (variable, shard); then each variable is assembled in row
        // order with one copy (no zero-fill first: pulls are megabytes per step).
        let mut received: BTreeMap<(usize, usize), Bytes> = BTreeMap::new();
        for ((reply, blobs), shards) in self.call_all(calls)?.into_iter().zip(wanted) {
            reply.map_err(StepError::Ps)?;
            for (k, key) in shards.into_iter().enumerate() {
                let bytes = blob(&blobs, k, &layouts[key.0].name).map_err(StepError::Ps)?;
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
                        .ok_or_else(|| StepError::Ps(format!("{name}: no reply")))?;
                    let expected = shard.rows.len() * width;
                    if bytes.len() != expected * 4 {
                        return Err(StepError::Ps(format!(
                            "{name}: {} bytes where {expected} f32 values were expected",
                            bytes.len()
                        )));
                    }
                    values.extend_from_slice(&f32_view(bytes, &name).map_err(StepError::Ps)?);
                }
                Ok(values)
            })
            .collect()
    }

    /// Rows `ids` (of the full variable) concatenated in the order of `ids`.
    pub fn pull_rows(&self, layout: &ShardLayout, ids: &[u64]) -> Result<Vec<f32>, StepError> {
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
            reply.map_err(StepError::Ps)?;
            let bytes = blob(&blobs, 0, &layout.name).map_err(StepError::Ps)?;
            if bytes.len() != positions.len() * width * 4 {
                return Err(StepError::Ps(format!(
                    "{}: pulled {} bytes for {} rows of {width} f32",
                    layout.name,
                    bytes.len(),
                    positions.len()
                )));
            }
            for (row, &pos) in bytes.chunks_exact((width * 4).max(1)).zip(positions) {
                decode_f32_into(&mut out[pos * width..(pos + 1) * width], row, &layout.name)
                    .map_err(StepError::Ps)?;
            }
        }
        Ok(out)
    }

    /// Sends a closure's gradients: one push per parameter server, all at once.
    pub fn push(
        &self,
        layouts: &BTreeMap<String, ShardLayout>,
        origin: (u32, u64, u64, u32),
        gradients: Vec<(String, PendingGradient)>,
    ) -> Result<PushSummary, StepError> {
        let (worker, epoch, closure, attempt) = origin;
        let mut per_ps: BTreeMap<u32, PushParts> = BTreeMap::new();
        // Servers whose part of the push holds a NaN or Inf.
        let mut non_finite: std::collections::BTreeSet<u32> = std::collections::BTreeSet::new();
        for (name, gradient) in gradients {
            let layout = layouts
                .get(&name)
                .ok_or_else(|| StepError::UnknownVariable(name.clone()))?;
            match gradient {
                PendingGradient::Dense(values) => {
                    let width = layout.row_len();
                    let expected: usize = layout.shape.iter().product();
                    if values.len() != expected {
                        return Err(StepError::Step(format!(
                            "gradient for {name:?} has {} values, the variable has {expected} (shape {:?})",
                            values.len(),
                            layout.shape
                        )));
                    }
                    for shard in &layout.shards {
                        let part = &values[shard.rows.start * width..shard.rows.end * width];
                        if first_non_finite(part).is_some() {
                            non_finite.insert(shard.ps);
                        }
                    }
                    // One buffer for the whole gradient; each shard's blob is a view of it.
                    let whole = f32_vec_blob(values);
                    for (i, shard) in layout.shards.iter().enumerate() {
                        let part =
                            whole.slice(shard.rows.start * width * 4..shard.rows.end * width * 4);
                        let entry = per_ps.entry(shard.ps).or_default();
                        entry.0.push((layout.shard_name(i), WireGradient::Dense));
                        entry.1.push(part);
                    }
                }
                PendingGradient::Rows { ids, values } => {
                    let width = layout.row_len();
                    if values.len() != ids.len() * width {
                        return Err(StepError::Step(format!(
                            "row gradient for {name:?}: {} values for {} rows of width {width}",
                            values.len(),
                            ids.len()
                        )));
                    }
                    for (shard, (local_ids, positions)) in route_rows(layout, &ids)? {
                        let mut part = Vec::with_capacity(positions.len() * width);
                        for pos in positions {
                            part.extend_from_slice(&values[pos * width..(pos + 1) * width]);
                        }
                        if first_non_finite(&part).is_some() {
                            non_finite.insert(layout.shards[shard].ps);
                        }
                        let entry = per_ps.entry(layout.shards[shard].ps).or_default();
                        entry.0.push((layout.shard_name(shard), WireGradient::Rows));
                        entry
                            .1
                            .extend([u64_vec_blob(local_ids), f32_vec_blob(part)]);
                    }
                }
            }
        }
        if !non_finite.is_empty() {
            // All or nothing across servers: each server screens only its own part, so the
            // finite parts must not go out, or a sharded variable would be half updated. The
            // servers holding a non-finite part apply their policy (skip and count, or error).
            per_ps.retain(|ps, _| non_finite.contains(ps));
        }
        let calls = per_ps
            .into_iter()
            .map(|(ps, (gradients, blobs))| {
                (
                    ps,
                    Push {
                        worker,
                        epoch,
                        closure,
                        attempt,
                        gradients,
                    },
                    blobs,
                )
            })
            .collect();
        let mut summary = PushSummary::default();
        for (reply, _) in self.call_all(calls)? {
            match reply.map_err(StepError::Ps)? {
                PushReply::Applied | PushReply::SkippedNonFinite => summary.applied += 1,
                PushReply::Duplicate | PushReply::Stale => summary.refused += 1,
            }
        }
        Ok(summary)
    }

    /// Sends every `(ps, message, blobs)` concurrently and waits for all replies (with their
    /// blobs), in order.
    fn call_all<M: RemoteMessage + Sync>(
        &self,
        calls: Vec<(u32, M, Vec<Bytes>)>,
    ) -> Result<Vec<WithBlobs<M::Reply>>, StepError> {
        let refs = calls
            .iter()
            .map(|(ps, _, _)| {
                let (node, _) = self
                    .servers
                    .get(*ps as usize)
                    .ok_or_else(|| StepError::Ps(format!("no parameter server {ps}")))?;
                Ok(self.reference::<M>(node))
            })
            .collect::<Result<Vec<_>, StepError>>()?;
        let gateway = self.gateway.clone();
        let servers = self.servers.clone();
        // The calls run as a task of the node's runtime, next to the connection that carries
        // them: reading a reply chunk by chunk there costs no thread switch per chunk, and
        // this compute thread wakes once, when every reply is in.
        let calls = self.runtime.spawn(async move {
            let futures = refs.into_iter().zip(calls).map(|(r, (ps, msg, blobs))| {
                let gateway = gateway.clone();
                let (node, addr) = servers[ps as usize].clone();
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
            futures::future::try_join_all(futures).await
        });
        self.runtime
            .block_on(calls)
            .map_err(|e| StepError::Ps(format!("parameter-server calls did not finish: {e}")))?
    }

    /// A reference to the PS actor on `node` if the gateway already knows its live incarnation.
    fn reference<M: RemoteMessage>(&self, node: &NodeId) -> Option<RemoteRef<M>> {
        let (epoch, alive) = self.gateway.peer_status(node)?;
        alive.then(|| {
            self.gateway.remote_ref(
                cohort_actors::Incarnation::new(node.clone(), epoch),
                PS_ACTOR,
            )
        })
    }
}

/// What one server is asked for in a pull: the shard names and, for each, (variable index,
/// shard index).
type ShardRequest = (Vec<String>, Vec<(usize, usize)>);

/// A reply and the blobs that came with it.
type WithBlobs<R> = (R, Vec<Bytes>);

/// One server's part of a push: gradient names and kinds, and their blobs in order.
type PushParts = (Vec<(String, WireGradient)>, Vec<Bytes>);

/// For one shard: shard-local row ids, and where each came from in the caller's id list.
type RoutedRows = (Vec<u64>, Vec<usize>);

/// Groups full-variable row ids by shard: for each shard that holds any of them (in shard
/// order), the shard-local ids and the positions in `ids` they came from.
fn route_rows(layout: &ShardLayout, ids: &[u64]) -> Result<Vec<(usize, RoutedRows)>, StepError> {
    let mut routed: Vec<RoutedRows> = vec![Default::default(); layout.shards.len()];
    let per_shard = ids.len() / layout.shards.len().max(1) + 1;
    for entry in &mut routed {
        entry.0.reserve(per_shard);
        entry.1.reserve(per_shard);
    }
    for (pos, &id) in ids.iter().enumerate() {
        let (shard, local) = usize::try_from(id)
            .ok()
            .and_then(|row| layout.locate(row))
            .ok_or_else(|| {
                StepError::Step(format!(
                    "row {id} outside {} (shape {:?})",
                    layout.name, layout.shape
                ))
            })?;
        let entry = &mut routed[shard];
        entry.0.push(local as u64);
        entry.1.push(pos);
    }
    Ok(routed
        .into_iter()
        .enumerate()
        .filter(|(_, (local, _))| !local.is_empty())
        .collect())
}
