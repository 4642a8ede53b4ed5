//! The configuration of a [`MultiWorkerMirrored`](super::MultiWorkerMirrored)
//! ([`MultiWorkerConfig`]), what sums across the workers ([`Communication`]), the defaults of
//! its settings, and the check that every worker of a group chose alike
//! (`check_same_settings`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use candle_core::{Device, Tensor};
use cohort_transport::TransportConfig;

use crate::cluster::ClusterConfig;
use crate::collective::{GroupConfig, ProcessSpan};
use crate::strategy::{StrategyError, DEFAULT_COLLECTIVE_TIMEOUT_MS};

/// How a [`MultiWorkerMirrored`](super::MultiWorkerMirrored) is made: the cluster (workers and
/// an optional chief, as TensorFlow's `TF_CONFIG` gives them) and this process's part in it.
#[derive(Debug, Clone)]
pub struct MultiWorkerConfig {
    /// Every worker (and the chief, if any) with the UDP address its collective endpoint
    /// listens on, and this process's task among them.
    pub cluster: ClusterConfig,
    /// Directory with `ca.pem` and this task's certificate and key (`cohort certs` layout).
    pub certs_dir: PathBuf,
    /// Replicas in this process, on threads (`cpu:0..N`); every worker must run as many.
    pub local_replicas: usize,
    /// The process group's settings (ring chunking, operation and forming timeouts).
    pub group: GroupConfig,
    /// The transport's settings: its idle timeout is the detection budget of a lost worker.
    pub transport: TransportConfig,
    /// Most bytes of one bucket when a list of tensors is all-reduced across workers.
    pub bucket_bytes_max: usize,
    /// How long a collective round among this process's replicas waits for all of them.
    pub collective_timeout: Duration,
    /// Re-forming after a lost worker
    /// ([`MultiWorkerMirrored::recover`](super::MultiWorkerMirrored::recover)): how long a
    /// survivor waits for each other member to answer its probe (a member that does not is
    /// left out).
    pub probe_timeout: Duration,
    /// Re-forming: attempts (probe, form, agree on the state) before giving up.
    pub recover_attempts: usize,
    /// Starting: how long this process waits for the other workers to say whether they formed
    /// a group already (then it joins it) before it takes the job to be starting (then it
    /// forms the first generation with them).
    pub enter_timeout: Duration,
    /// Joining a live group: how long this process waits to be admitted (the members admit
    /// joiners at a step boundary,
    /// [`MultiWorkerMirrored::at_step_boundary`](super::MultiWorkerMirrored::at_step_boundary)).
    pub join_timeout: Duration,
    /// What all-reduces the gradients across the workers: the group's ring (the default) or
    /// NCCL on a GPU of this process.
    pub communication: Communication,
    /// Where to serve this worker's Prometheus metrics and `/healthz` (`metrics_addr`,
    /// `COHORT_METRICS_ADDR`; `None`: not served): its group's generation, workers and step, the
    /// time between step boundaries, and the re-formings, admissions and departures.
    pub metrics_addr: Option<SocketAddr>,
}

/// What sums the workers' tensors across processes: TensorFlow's
/// `CommunicationImplementation` (`RING`, `NCCL`). Every worker must choose alike.
///
/// Parses from `ring`, `nccl` (GPU 0) and `nccl:N` (GPU `N` of this process, as CUDA numbers
/// the visible ones: give each worker on a host its own, or its own `CUDA_VISIBLE_DEVICES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Communication {
    /// cohort's collectives over the process group: a ring for large tensors, a direct
    /// exchange for small ones, over QUIC or the plaintext plane.
    #[default]
    Ring,
    /// NCCL (feature `nccl`) on GPU `device`: f32 and f64 sums (gradients, `reduce`) are
    /// copied to the GPU, all-reduced there and copied back; broadcasts, gathers and other
    /// dtypes stay on the group. One communicator per membership generation, bootstrapped over the
    /// group and aborted when it breaks (`ProcessSpan::with_nccl`). Making the strategy
    /// fails with [`StrategyError::Config`] (key `communication`) when this build has no
    /// NCCL, libnccl or the CUDA driver cannot be loaded, or the GPU is not there.
    Nccl {
        /// The GPU's ordinal among this process's visible ones.
        device: usize,
    },
}

impl std::fmt::Display for Communication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Communication::Ring => write!(f, "ring"),
            Communication::Nccl { device } => write!(f, "nccl:{device}"),
        }
    }
}

/// Why a [`Communication`] cannot be had: its name does not parse, or this process cannot
/// use it ([`Communication::check`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommunicationError {
    /// The name is none of `ring`, `nccl`, `nccl:GPU`.
    #[error("{text:?}: expected \"ring\", \"nccl\" or \"nccl:GPU\"")]
    Unknown {
        /// What was given.
        text: String,
    },
    /// This build has no NCCL (the feature `nccl` is off).
    #[error(
        "nccl:{device}: this build of cohort has no NCCL: build it with `cargo build --features \
         nccl`"
    )]
    NotBuilt {
        /// The GPU asked for.
        device: usize,
    },
    /// libnccl could not be loaded or answered with an error.
    #[error("nccl:{device}: {detail}")]
    NcclUnavailable {
        /// The GPU asked for.
        device: usize,
        /// What NCCL's loader said.
        detail: String,
    },
    /// The CUDA driver could not count the GPUs.
    #[error("nccl:{device}: no GPU ({detail})")]
    NoGpu {
        /// The GPU asked for.
        device: usize,
        /// What the driver said.
        detail: String,
    },
    /// The GPU asked for is not among the visible ones.
    #[error("nccl:{device}: no GPU {device}: this process sees {gpus} GPU(s) (NCCL {version})")]
    NoSuchGpu {
        /// The GPU asked for.
        device: usize,
        /// How many this process sees.
        gpus: usize,
        /// The NCCL version loaded.
        version: String,
    },
}

impl std::str::FromStr for Communication {
    type Err = CommunicationError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || CommunicationError::Unknown {
            text: text.to_string(),
        };
        match text.split_once(':') {
            None if text == "ring" => Ok(Communication::Ring),
            None if text == "nccl" => Ok(Communication::Nccl { device: 0 }),
            Some(("nccl", device)) => device
                .parse()
                .map(|device| Communication::Nccl { device })
                .map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

impl Communication {
    /// Whether this process can use it: for NCCL, a build with the feature, libnccl and the
    /// CUDA driver loaded, and the GPU visible. The error says what is missing.
    pub fn check(&self) -> Result<(), CommunicationError> {
        let Communication::Nccl { device } = *self else {
            return Ok(());
        };
        #[cfg(not(feature = "nccl"))]
        {
            Err(CommunicationError::NotBuilt { device })
        }
        #[cfg(feature = "nccl")]
        {
            let version = crate::collective::nccl_version().map_err(|e| {
                CommunicationError::NcclUnavailable {
                    device,
                    detail: e.to_string(),
                }
            })?;
            // Counted, not opened: another worker may hold its GPU in exclusive mode.
            let gpus = crate::collective::gpu_count().map_err(|e| CommunicationError::NoGpu {
                device,
                detail: e.to_string(),
            })?;
            if device >= gpus {
                return Err(CommunicationError::NoSuchGpu {
                    device,
                    gpus,
                    version: version.to_string(),
                });
            }
            Ok(())
        }
    }
}

impl MultiWorkerConfig {
    /// The defaults for `cluster`, with certificates from `certs_dir` and one local replica.
    pub fn new(cluster: ClusterConfig, certs_dir: impl Into<PathBuf>) -> Self {
        Self {
            cluster,
            certs_dir: certs_dir.into(),
            local_replicas: 1,
            group: GroupConfig::default(),
            transport: TransportConfig::default(),
            bucket_bytes_max: DEFAULT_BUCKET_BYTES_MAX,
            collective_timeout: Duration::from_millis(DEFAULT_COLLECTIVE_TIMEOUT_MS),
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
            recover_attempts: DEFAULT_RECOVER_ATTEMPTS,
            enter_timeout: DEFAULT_ENTER_TIMEOUT,
            join_timeout: DEFAULT_JOIN_TIMEOUT,
            communication: Communication::Ring,
            metrics_addr: None,
        }
    }

    /// `local_replicas` replicas in this process.
    pub fn with_local_replicas(mut self, local_replicas: usize) -> Self {
        self.local_replicas = local_replicas;
        self
    }
}

/// The default bucket of a list all-reduced across workers.
pub const DEFAULT_BUCKET_BYTES_MAX: usize = 4 * 1024 * 1024;
/// The default time a re-forming survivor waits for a member's answer to its probe.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// The default number of re-forming attempts.
pub const DEFAULT_RECOVER_ATTEMPTS: usize = 6;
/// The default time a starting worker waits for the others to say whether a group lives.
pub const DEFAULT_ENTER_TIMEOUT: Duration = Duration::from_secs(2);
/// The default time a joining worker waits to be admitted.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(120);

/// Fails naming a worker whose local replica count, bucket size or kind of communication
/// differs from this one's (by the key of the setting): the group's calls and NCCL's need
/// them alike.
pub(super) fn check_same_settings(
    span: &ProcessSpan,
    local: usize,
    bucket_bytes_max: usize,
    communication: Communication,
) -> Result<(), StrategyError> {
    // The kind of communication only: each worker names its own GPU.
    let nccl = i64::from(matches!(communication, Communication::Nccl { .. }));
    let mine = [local as i64, bucket_bytes_max as i64, nccl];
    let all = span
        .all_gather(&Tensor::new(&mine, &Device::Cpu)?)?
        .to_vec1::<i64>()?;
    let members = span.group().members();
    let me = &members[span.group().rank()];
    for (w, theirs) in all.chunks(mine.len()).enumerate() {
        let (key, detail) = if theirs[0] != mine[0] {
            let n = theirs[0];
            (
                "local_replicas",
                format!(
                    "{} runs {n} replica(s), {me} runs {local}: every worker must run as many",
                    members[w]
                ),
            )
        } else if theirs[1] != mine[1] {
            let b = theirs[1];
            (
                "bucket_bytes_max",
                format!(
                    "{} fuses buckets of {b} bytes, {me} of {bucket_bytes_max}: every worker \
                     must choose alike",
                    members[w]
                ),
            )
        } else if theirs[2] != mine[2] {
            let kind = |nccl: i64| if nccl == 1 { "NCCL" } else { "the ring" };
            (
                "communication",
                format!(
                    "{} sums with {}, {me} with {}: every worker must choose alike",
                    members[w],
                    kind(theirs[2]),
                    kind(nccl)
                ),
            )
        } else {
            continue;
        };
        return Err(StrategyError::Config {
            key: key.into(),
            detail,
        });
    }
    Ok(())
}

/// `COHORT_METRICS_ADDR`, if set (`cohort launch` sets it for every task); an address that does
/// not parse is a [`StrategyError::Config`] naming the variable.
pub(crate) fn metrics_addr_from_env() -> Result<Option<SocketAddr>, StrategyError> {
    let key = crate::cluster::ConfigKey::METRICS_ADDR.env;
    crate::metrics::addr_from_env(key).map_err(|e| StrategyError::Config {
        key: key.into(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn communications_parse_from_their_names_and_print_back() {
        for (text, want) in [
            ("ring", Communication::Ring),
            ("nccl", Communication::Nccl { device: 0 }),
            ("nccl:3", Communication::Nccl { device: 3 }),
        ] {
            let got: Communication = text.parse().unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string().parse::<Communication>().unwrap(), want);
        }
        for bad in ["", "gloo", "ring:1", "nccl:", "nccl:-1", "nccl:x", "NCCL"] {
            let err = bad.parse::<Communication>().unwrap_err();
            assert_eq!(
                err,
                CommunicationError::Unknown {
                    text: bad.to_string()
                }
            );
            assert!(
                err.to_string().contains("expected \"ring\""),
                "{bad}: {err}"
            );
        }
        assert_eq!(Communication::default(), Communication::Ring);
        assert_eq!(Communication::Ring.check(), Ok(()));
    }
}
