//! The cluster spec: jobs (chief, worker, ps, evaluator), each a list of `host:port` addresses.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use super::ClusterError;

/// A job in the cluster, as TensorFlow names them. Kubeflow's training operator may name the
/// chief `master` (its TFJob replica type `Master`): that name is read as [`TaskType::Chief`]
/// wherever a task type is read, and always written `chief`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskType {
    /// The coordinator: owns the ClusterCoordinator, checkpoints and the ledger.
    Chief,
    /// Runs scheduled closures (steps) on its data.
    Worker,
    /// Holds variables and applies optimizer updates.
    Ps,
    /// Evaluates checkpoints side by side with training.
    Evaluator,
}

impl TaskType {
    /// Every task type, in the order TF_CONFIG lists them.
    pub const ALL: [TaskType; 4] = [
        TaskType::Chief,
        TaskType::Worker,
        TaskType::Ps,
        TaskType::Evaluator,
    ];

    /// The job name used in TF_CONFIG and certificates (`chief`, `worker`, `ps`, `evaluator`).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskType::Chief => "chief",
            TaskType::Worker => "worker",
            TaskType::Ps => "ps",
            TaskType::Evaluator => "evaluator",
        }
    }

    /// Parses a job name (`master` is the chief); `key` names the config key in the error.
    pub fn parse(key: &str, value: &str) -> Result<Self, ClusterError> {
        value.parse().map_err(|()| ClusterError::UnknownTaskType {
            key: key.to_string(),
            value: value.to_string(),
        })
    }
}

impl FromStr for TaskType {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            // `master`: the chief as Kubeflow's training operator names it.
            "chief" | "master" => Ok(TaskType::Chief),
            "worker" => Ok(TaskType::Worker),
            "ps" => Ok(TaskType::Ps),
            "evaluator" => Ok(TaskType::Evaluator),
            _ => Err(()),
        }
    }
}

impl fmt::Display for TaskType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One task of the cluster: a job and an index into its list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct TaskId {
    /// The job.
    #[serde(rename = "type")]
    pub task_type: TaskType,
    /// The index within the job's address list.
    pub index: u32,
}

impl TaskId {
    /// A task of `task_type` with `index`.
    pub fn new(task_type: TaskType, index: u32) -> Self {
        Self { task_type, index }
    }
}

/// The node id a task's certificate carries (`<task type>-<index>` as the transport names it):
/// the identity by which every other node knows it.
pub fn node_id(task: TaskId) -> cohort_transport::NodeId {
    cohort_transport::NodeId::new(task.task_type.as_str(), task.index)
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.task_type, self.index)
    }
}

/// The strategies whose cluster needs differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategyKind {
    /// Parameter-server training: a chief, at least one worker and at least one PS.
    ParameterServer,
    /// All-reduce among workers: at least one worker, no PS.
    MultiWorkerMirrored,
}

/// Which tasks exist and where. Validated on construction: every address is `host:port`, no
/// address is shared, at most one chief.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct ClusterSpec {
    jobs: BTreeMap<TaskType, Vec<String>>,
}

impl ClusterSpec {
    /// Builds and validates a spec from job → addresses.
    pub fn new(jobs: BTreeMap<TaskType, Vec<String>>) -> Result<Self, ClusterError> {
        let spec = Self {
            jobs: jobs
                .into_iter()
                .filter(|(_, addrs)| !addrs.is_empty())
                .collect(),
        };
        spec.validate()?;
        Ok(spec)
    }

    /// A cluster on 127.0.0.1 with the given counts, on consecutive ports from `base_port`
    /// (chief first, then PS, then workers).
    pub fn local(num_workers: u32, num_ps: u32, base_port: u16) -> Result<Self, ClusterError> {
        let mut port = u32::from(base_port);
        let mut jobs = BTreeMap::new();
        for (task_type, count) in [
            (TaskType::Chief, 1),
            (TaskType::Ps, num_ps),
            (TaskType::Worker, num_workers),
        ] {
            let mut addrs = Vec::new();
            for _ in 0..count {
                let p = u16::try_from(port).map_err(|_| ClusterError::BadValue {
                    key: "base_port".into(),
                    detail: format!(
                        "{base_port} leaves no room for {} tasks",
                        1 + num_ps + num_workers
                    ),
                })?;
                addrs.push(format!("127.0.0.1:{p}"));
                port += 1;
            }
            jobs.insert(task_type, addrs);
        }
        Self::new(jobs)
    }

    /// The addresses of `task_type`'s tasks (empty if the job is absent).
    pub fn addresses(&self, task_type: TaskType) -> &[String] {
        self.jobs.get(&task_type).map(Vec::as_slice).unwrap_or(&[])
    }

    /// How many tasks `task_type` has.
    pub fn num_tasks(&self, task_type: TaskType) -> usize {
        self.addresses(task_type).len()
    }

    /// The address of one task, or `NoSuchTask`.
    pub fn address(&self, task: TaskId) -> Result<&str, ClusterError> {
        let addrs = self.addresses(task.task_type);
        addrs
            .get(task.index as usize)
            .map(String::as_str)
            .ok_or_else(|| ClusterError::NoSuchTask {
                task: task.to_string(),
                job: task.task_type.to_string(),
                count: addrs.len(),
            })
    }

    /// Every task in the cluster, chief first.
    pub fn tasks(&self) -> impl Iterator<Item = TaskId> + '_ {
        self.jobs.iter().flat_map(|(task_type, addrs)| {
            (0..addrs.len()).map(move |i| TaskId::new(*task_type, i as u32))
        })
    }

    /// Checks that the cluster has what `strategy` needs, naming what is missing.
    pub fn require(&self, strategy: StrategyKind) -> Result<(), ClusterError> {
        let needs: &[(TaskType, usize)] = match strategy {
            StrategyKind::ParameterServer => &[
                (TaskType::Chief, 1),
                (TaskType::Worker, 1),
                (TaskType::Ps, 1),
            ],
            StrategyKind::MultiWorkerMirrored => &[(TaskType::Worker, 1)],
        };
        for &(job, needed) in needs {
            let count = self.num_tasks(job);
            if count < needed {
                return Err(ClusterError::MissingRole {
                    strategy: format!("{strategy:?}"),
                    job: job.to_string(),
                    needed,
                    count,
                });
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), ClusterError> {
        let chiefs = self.num_tasks(TaskType::Chief);
        if chiefs > 1 {
            return Err(ClusterError::BadValue {
                key: "cluster.chief".into(),
                detail: format!("at most one chief, got {chiefs}"),
            });
        }
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        for (task_type, addrs) in &self.jobs {
            for (i, addr) in addrs.iter().enumerate() {
                let key = format!("cluster.{task_type}[{i}]");
                check_host_port(&key, addr)?;
                let normalized = addr.trim().to_ascii_lowercase();
                if let Some(first) = seen.insert(normalized, key.clone()) {
                    return Err(ClusterError::DuplicateAddress {
                        first,
                        second: key,
                        address: addr.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

fn check_host_port(key: &str, addr: &str) -> Result<(), ClusterError> {
    let bad = || ClusterError::BadAddress {
        key: key.to_string(),
        value: addr.to_string(),
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(bad());
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(entries: &[(TaskType, &[&str])]) -> BTreeMap<TaskType, Vec<String>> {
        entries
            .iter()
            .map(|(t, a)| (*t, a.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn local_cluster_has_distinct_ports() {
        let spec = ClusterSpec::local(2, 2, 40000).unwrap();
        assert_eq!(spec.num_tasks(TaskType::Worker), 2);
        assert_eq!(
            spec.address(TaskId::new(TaskType::Chief, 0)).unwrap(),
            "127.0.0.1:40000"
        );
        assert_eq!(
            spec.address(TaskId::new(TaskType::Worker, 1)).unwrap(),
            "127.0.0.1:40004"
        );
        assert_eq!(spec.tasks().count(), 5);
        spec.require(StrategyKind::ParameterServer).unwrap();
    }

    #[test]
    fn duplicate_addresses_are_named() {
        let err = ClusterSpec::new(jobs(&[
            (TaskType::Worker, &["h:1", "h:2"]),
            (TaskType::Ps, &["h:2"]),
        ]))
        .unwrap_err();
        assert!(
            matches!(err, ClusterError::DuplicateAddress { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("h:2"), "{err}");
    }

    #[test]
    fn bad_addresses_are_named() {
        for addr in ["nohost", "h:0", "h:70000", ":80", "h:x"] {
            let err = ClusterSpec::new(jobs(&[(TaskType::Worker, &[addr])])).unwrap_err();
            assert_eq!(
                err,
                ClusterError::BadAddress {
                    key: "cluster.worker[0]".into(),
                    value: addr.into()
                }
            );
        }
    }

    #[test]
    fn parameter_server_needs_ps() {
        let spec = ClusterSpec::new(jobs(&[
            (TaskType::Chief, &["h:1"]),
            (TaskType::Worker, &["h:2"]),
        ]))
        .unwrap();
        let err = spec.require(StrategyKind::ParameterServer).unwrap_err();
        assert!(err.to_string().contains("needs at least 1 ps"), "{err}");
    }
}
