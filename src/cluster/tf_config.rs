//! `TF_CONFIG` (TensorFlow's exact format) and the `[cluster]`/`[task]` tables of `cohort.toml`.
//!
//! ```json
//! {"cluster": {"chief": ["host:port"], "worker": ["host:port", ...], "ps": [...]},
//!  "task": {"type": "worker", "index": 0}}
//! ```
//!
//! Kubeflow's training operator writes exactly this, with two differences this module accepts:
//! the chief may be named `master` (in the cluster map and in `task.type`; it is the chief, see
//! [`TaskType`]), and an `environment` key (`"cloud"`). TensorFlow's optional `environment` and
//! `rpc_layer` keys are accepted (as strings) and ignored; any other key is refused by name.
//! A cluster map naming both `chief` and `master`, or more than one chief address, is refused.

use std::collections::BTreeMap;

use super::{ClusterError, ClusterSpec, TaskId, TaskType};

/// The environment variable TensorFlow reads the cluster from.
pub const TF_CONFIG_ENV: &str = "TF_CONFIG";

/// A cluster and this process's task in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Every task and its address.
    pub cluster: ClusterSpec,
    /// The task this process runs; guaranteed to exist in `cluster`.
    pub task: TaskId,
}

impl ClusterConfig {
    /// Pairs a spec with a task, checking that the task exists in it. An evaluator may stand
    /// outside the spec (TensorFlow's sidecar evaluator is not part of the training cluster and
    /// never connects to it); when the spec does list evaluators, its index must be one of them.
    pub fn new(cluster: ClusterSpec, task: TaskId) -> Result<Self, ClusterError> {
        let outside =
            task.task_type == TaskType::Evaluator && cluster.num_tasks(TaskType::Evaluator) == 0;
        if !outside {
            cluster.address(task)?;
        }
        Ok(Self { cluster, task })
    }

    /// Parses a `TF_CONFIG` JSON value.
    pub fn from_tf_config(json: &str) -> Result<Self, ClusterError> {
        let (cluster, task) = parse_json_parts(TF_CONFIG_ENV, TF_CONFIG_ENV, json)?;
        let task = task.ok_or_else(|| ClusterError::MissingKey {
            key: format!("{TF_CONFIG_ENV}.task"),
        })?;
        Self::new(cluster, task)
    }

    /// Reads `TF_CONFIG` from the environment; `Ok(None)` when it is unset or empty.
    pub fn from_env() -> Result<Option<Self>, ClusterError> {
        match std::env::var(TF_CONFIG_ENV) {
            Ok(text) if !text.trim().is_empty() => Self::from_tf_config(&text).map(Some),
            _ => Ok(None),
        }
    }

    /// Parses the `[cluster]` and `[task]` tables of a `cohort.toml`; other tables are left to
    /// their own readers. `source_name` (the file path) prefixes parse errors.
    pub fn from_toml(source_name: &str, text: &str) -> Result<Self, ClusterError> {
        let value = parse_toml(source_name, text)?;
        let cluster = parse_cluster_toml(value.get("cluster"))?;
        let task = parse_task(source_name, value.get("task").map(Toml))?;
        Self::new(cluster, task)
    }

    /// The TF_CONFIG JSON for this config (what a launcher hands a child process).
    pub fn to_tf_config(&self) -> String {
        let mut cluster = serde_json::Map::new();
        for task_type in TaskType::ALL {
            let addrs = self.cluster.addresses(task_type);
            if !addrs.is_empty() {
                cluster.insert(task_type.to_string(), serde_json::json!(addrs));
            }
        }
        serde_json::json!({
            "cluster": cluster,
            "task": {"type": self.task.task_type.as_str(), "index": self.task.index},
        })
        .to_string()
    }
}

impl ClusterSpec {
    /// Reads the `[cluster]` table of a `cohort.toml` (no `[task]` needed).
    pub fn from_toml(source_name: &str, text: &str) -> Result<Self, ClusterError> {
        parse_cluster_toml(parse_toml(source_name, text)?.get("cluster"))
    }
}

fn parse_toml(source_name: &str, text: &str) -> Result<toml::Table, ClusterError> {
    text.parse()
        .map_err(|e: toml::de::Error| ClusterError::Malformed {
            source_name: source_name.into(),
            detail: e.to_string(),
        })
}

/// Parses a TF_CONFIG-style JSON text: its cluster (required) and its task (optional).
/// `source_name` names the text in parse errors; keys are prefixed with `prefix` (`TF_CONFIG`,
/// or empty for a cluster file).
pub(super) fn parse_json_parts(
    source_name: &str,
    prefix: &str,
    json: &str,
) -> Result<(ClusterSpec, Option<TaskId>), ClusterError> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| ClusterError::Malformed {
            source_name: source_name.into(),
            detail: e.to_string(),
        })?;
    let root = value.as_object().ok_or_else(|| ClusterError::Malformed {
        source_name: source_name.into(),
        detail: "expected a JSON object with \"cluster\" and \"task\"".into(),
    })?;
    for (key, value) in root {
        match key.as_str() {
            "cluster" | "task" => {}
            // Read by TensorFlow only (`"cloud"`, `"grpc"`), never by cohort.
            "environment" | "rpc_layer" if value.is_string() => {}
            "environment" | "rpc_layer" => {
                return Err(ClusterError::BadValue {
                    key: join_key(prefix, key),
                    detail: format!("expected a string, got {value}"),
                })
            }
            _ => {
                return Err(ClusterError::BadValue {
                    key: join_key(prefix, key),
                    detail: "unknown key (expected cluster, task, environment, rpc_layer)".into(),
                })
            }
        }
    }
    let cluster = parse_cluster_json(prefix, root.get("cluster"))?;
    let task = root
        .get("task")
        .map(|t| parse_task(prefix, Some(Json(t))))
        .transpose()?;
    Ok((cluster, task))
}

/// Parses the `[cluster]` table of a cohort.toml (keys `cluster.<job>`).
pub(super) fn parse_toml_cluster(cluster: &toml::Value) -> Result<ClusterSpec, ClusterError> {
    parse_cluster_toml(Some(cluster))
}

/// `prefix.name`, or `name` alone when there is no prefix.
pub(super) fn join_key(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// A read-only view over JSON or TOML values, so both formats share one parser.
trait ConfigValue {
    fn as_str(&self) -> Option<&str>;
    fn as_u64(&self) -> Option<u64>;
    fn get(&self, key: &str) -> Option<Self>
    where
        Self: Sized;
    fn keys(&self) -> Option<Vec<String>>;
}

#[derive(Clone, Copy)]
struct Json<'a>(&'a serde_json::Value);

impl Json<'_> {
    fn as_str_list(&self) -> Option<Vec<Option<String>>> {
        self.0.as_array().map(|items| {
            items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect()
        })
    }
}

impl<'a> ConfigValue for Json<'a> {
    fn as_str(&self) -> Option<&str> {
        self.0.as_str()
    }
    fn as_u64(&self) -> Option<u64> {
        self.0.as_u64()
    }
    fn get(&self, key: &str) -> Option<Self> {
        self.0.get(key).map(Json)
    }
    fn keys(&self) -> Option<Vec<String>> {
        self.0.as_object().map(|m| m.keys().cloned().collect())
    }
}

#[derive(Clone, Copy)]
struct Toml<'a>(&'a toml::Value);

impl<'a> ConfigValue for Toml<'a> {
    fn as_str(&self) -> Option<&str> {
        self.0.as_str()
    }
    fn as_u64(&self) -> Option<u64> {
        self.0.as_integer().and_then(|i| u64::try_from(i).ok())
    }
    fn get(&self, key: &str) -> Option<Self> {
        self.0.get(key).map(Toml)
    }
    fn keys(&self) -> Option<Vec<String>> {
        self.0.as_table().map(|t| t.keys().cloned().collect())
    }
}

fn parse_cluster_json(
    prefix: &str,
    cluster: Option<&serde_json::Value>,
) -> Result<ClusterSpec, ClusterError> {
    let key = join_key(prefix, "cluster");
    let cluster = cluster.ok_or_else(|| ClusterError::MissingKey { key: key.clone() })?;
    let map = cluster.as_object().ok_or_else(|| ClusterError::BadValue {
        key: key.clone(),
        detail: "expected an object of job name → list of addresses".into(),
    })?;
    let mut jobs = Jobs::default();
    for (job, addrs) in map {
        jobs.add(&key, job, Json(addrs).as_str_list())?;
    }
    jobs.into_spec()
}

fn parse_cluster_toml(cluster: Option<&toml::Value>) -> Result<ClusterSpec, ClusterError> {
    let key = "cluster";
    let cluster = cluster.ok_or_else(|| ClusterError::MissingKey { key: key.into() })?;
    let table = cluster.as_table().ok_or_else(|| ClusterError::BadValue {
        key: key.into(),
        detail: "expected a table of job name → list of addresses".into(),
    })?;
    let mut jobs = Jobs::default();
    for (job, addrs) in table {
        let list = addrs.as_array().map(|items| {
            items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect()
        });
        jobs.add(key, job, list)?;
    }
    jobs.into_spec()
}

/// The jobs of a cluster map as they are read, JSON or TOML alike: each job's task type and
/// addresses, and the name it was spelled with (`chief` or `master` for the chief).
#[derive(Default)]
struct Jobs(BTreeMap<TaskType, (String, Vec<String>)>);

impl Jobs {
    /// Adds job `job` of the cluster map at `cluster_key`, with its list of addresses (`None`
    /// when the value is not a list; an item `None` when it is not a string).
    fn add(
        &mut self,
        cluster_key: &str,
        job: &str,
        list: Option<Vec<Option<String>>>,
    ) -> Result<(), ClusterError> {
        let job_key = format!("{cluster_key}.{job}");
        let task_type = TaskType::parse(&job_key, job)?;
        let list = list.ok_or_else(|| ClusterError::BadValue {
            key: job_key.clone(),
            detail: "expected a list of \"host:port\" strings".into(),
        })?;
        let addrs = strings(&job_key, list)?;
        if task_type == TaskType::Chief && addrs.len() > 1 {
            return Err(ClusterError::BadValue {
                key: job_key,
                detail: format!(
                    "at most one chief address, got {} (the chief is one task, named chief or master)",
                    addrs.len()
                ),
            });
        }
        if let Some((first, _)) = self.0.get(&task_type) {
            // Only the chief has two names; any other repeat is a parser's duplicate key.
            return Err(ClusterError::BadValue {
                key: cluster_key.to_string(),
                detail: format!(
                    "names both {first:?} and {job:?}, which are the same task type ({task_type}): keep one"
                ),
            });
        }
        self.0.insert(task_type, (job.to_string(), addrs));
        Ok(())
    }

    fn into_spec(self) -> Result<ClusterSpec, ClusterError> {
        ClusterSpec::new(
            self.0
                .into_iter()
                .map(|(task_type, (_, addrs))| (task_type, addrs))
                .collect(),
        )
    }
}

fn strings(key: &str, list: Vec<Option<String>>) -> Result<Vec<String>, ClusterError> {
    list.into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.ok_or_else(|| ClusterError::BadValue {
                key: format!("{key}[{i}]"),
                detail: "expected a \"host:port\" string".into(),
            })
        })
        .collect()
}

fn parse_task<V: ConfigValue>(prefix: &str, task: Option<V>) -> Result<TaskId, ClusterError> {
    let key = join_key(prefix, "task");
    let task = task.ok_or_else(|| ClusterError::MissingKey { key: key.clone() })?;
    let keys = task.keys().ok_or_else(|| ClusterError::BadValue {
        key: key.clone(),
        detail: "expected an object with \"type\" and \"index\"".into(),
    })?;
    for k in keys {
        if k != "type" && k != "index" {
            return Err(ClusterError::BadValue {
                key: format!("{key}.{k}"),
                detail: "unknown key (expected type, index)".into(),
            });
        }
    }
    let type_key = format!("{key}.type");
    let task_type = task.get("type").ok_or_else(|| ClusterError::MissingKey {
        key: type_key.clone(),
    })?;
    let task_type = task_type.as_str().ok_or_else(|| ClusterError::BadValue {
        key: type_key.clone(),
        detail: "expected a string".into(),
    })?;
    let task_type = TaskType::parse(&type_key, task_type)?;
    let index_key = format!("{key}.index");
    let index = match task.get("index") {
        // TensorFlow defaults a missing index to 0.
        None => 0,
        Some(v) => v
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| ClusterError::BadValue {
                key: index_key,
                detail: "expected a non-negative integer".into(),
            })?,
    };
    Ok(TaskId::new(task_type, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_evaluator_may_stand_outside_the_spec_but_not_past_its_listed_tasks() {
        let spec = |evaluators: &[&str]| {
            let mut jobs = BTreeMap::new();
            jobs.insert(TaskType::Chief, vec!["h:1".to_string()]);
            jobs.insert(TaskType::Ps, vec!["h:2".to_string()]);
            if !evaluators.is_empty() {
                jobs.insert(
                    TaskType::Evaluator,
                    evaluators.iter().map(|a| a.to_string()).collect(),
                );
            }
            ClusterSpec::new(jobs).unwrap()
        };
        let evaluator = |i| TaskId::new(TaskType::Evaluator, i);
        assert!(ClusterConfig::new(spec(&[]), evaluator(0)).is_ok());
        assert!(ClusterConfig::new(spec(&["h:3"]), evaluator(0)).is_ok());
        assert!(matches!(
            ClusterConfig::new(spec(&["h:3"]), evaluator(1)),
            Err(ClusterError::NoSuchTask { .. })
        ));
        // Only the evaluator: a worker missing from the spec is still an error.
        assert!(matches!(
            ClusterConfig::new(spec(&[]), TaskId::new(TaskType::Worker, 0)),
            Err(ClusterError::NoSuchTask { .. })
        ));
    }

    const GOOD: &str = r#"{"cluster": {"chief": ["127.0.0.1:7000"], "worker": ["127.0.0.1:7001", "127.0.0.1:7002"],
        "ps": ["127.0.0.1:7003"]}, "task": {"type": "worker", "index": 1}, "environment": "cloud"}"#;

    #[test]
    fn parses_tensorflow_format() {
        let cfg = ClusterConfig::from_tf_config(GOOD).unwrap();
        assert_eq!(cfg.task, TaskId::new(TaskType::Worker, 1));
        assert_eq!(cfg.cluster.num_tasks(TaskType::Worker), 2);
        assert_eq!(cfg.cluster.address(cfg.task).unwrap(), "127.0.0.1:7002");
    }

    #[test]
    fn round_trips_through_to_tf_config() {
        let cfg = ClusterConfig::from_tf_config(GOOD).unwrap();
        assert_eq!(
            ClusterConfig::from_tf_config(&cfg.to_tf_config()).unwrap(),
            cfg
        );
    }

    #[test]
    fn malformed_inputs_name_the_problem() {
        let cases: &[(&str, &str)] = &[
            ("{", "TF_CONFIG: malformed"),
            ("[]", "TF_CONFIG: malformed"),
            (
                r#"{"task": {"type": "worker"}}"#,
                "TF_CONFIG.cluster: missing",
            ),
            (
                r#"{"cluster": {"wrker": ["h:1"]}, "task": {"type": "worker"}}"#,
                "TF_CONFIG.cluster.wrker: unknown task type",
            ),
            (
                r#"{"cluster": {"worker": "h:1"}, "task": {"type": "worker"}}"#,
                "TF_CONFIG.cluster.worker: expected a list",
            ),
            (
                r#"{"cluster": {"worker": [1]}, "task": {"type": "worker"}}"#,
                "TF_CONFIG.cluster.worker[0]",
            ),
            (
                r#"{"cluster": {"worker": ["h:1"]}}"#,
                "TF_CONFIG.task: missing",
            ),
            (
                r#"{"cluster": {"worker": ["h:1"]}, "task": {"type": "boss"}}"#,
                "TF_CONFIG.task.type: unknown task type",
            ),
            (
                r#"{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": -1}}"#,
                "TF_CONFIG.task.index",
            ),
            (
                r#"{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 3}}"#,
                "worker/3 does not exist",
            ),
            (
                r#"{"cluster": {"worker": ["h:1"]}, "task": {"type": "ps"}}"#,
                "ps/0 does not exist",
            ),
            (
                r#"{"cluster": {"worker": ["h:1", "h:1"]}, "task": {"type": "worker"}}"#,
                "share the address h:1",
            ),
            (
                r#"{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker"}, "tsk": 1}"#,
                "TF_CONFIG.tsk: unknown key",
            ),
        ];
        for (json, expected) in cases {
            let err = ClusterConfig::from_tf_config(json).unwrap_err().to_string();
            assert!(
                err.contains(expected),
                "{json}: got {err:?}, want {expected:?}"
            );
        }
    }

    /// TF_CONFIG as Kubeflow's training operator writes it for a TFJob with a `Master`
    /// replica: service host names, `master` for the chief, and `"environment": "cloud"`.
    fn operator_tf_config(task_type: &str, index: u32) -> String {
        format!(
            r#"{{"cluster":{{"master":["job-master-0.ns.svc:2222"],
                "worker":["job-worker-0.ns.svc:2222","job-worker-1.ns.svc:2222"],
                "ps":["job-ps-0.ns.svc:2222"],"evaluator":["job-evaluator-0.ns.svc:2222"]}},
                "task":{{"type":"{task_type}","index":{index}}},"environment":"cloud"}}"#
        )
    }

    #[test]
    fn the_training_operators_tf_config_is_accepted_for_every_task_type() {
        let cases = [
            ("master", 0, TaskType::Chief, "job-master-0.ns.svc:2222"),
            ("chief", 0, TaskType::Chief, "job-master-0.ns.svc:2222"),
            ("worker", 1, TaskType::Worker, "job-worker-1.ns.svc:2222"),
            ("ps", 0, TaskType::Ps, "job-ps-0.ns.svc:2222"),
            (
                "evaluator",
                0,
                TaskType::Evaluator,
                "job-evaluator-0.ns.svc:2222",
            ),
        ];
        for (spelled, index, task_type, address) in cases {
            let cfg = ClusterConfig::from_tf_config(&operator_tf_config(spelled, index))
                .unwrap_or_else(|e| panic!("{spelled}/{index}: {e}"));
            assert_eq!(cfg.task, TaskId::new(task_type, index), "{spelled}");
            assert_eq!(cfg.cluster.address(cfg.task).unwrap(), address);
            assert_eq!(cfg.cluster.num_tasks(TaskType::Chief), 1);
            assert_eq!(cfg.cluster.num_tasks(TaskType::Worker), 2);
        }
        // The chief the operator calls master is written back as cohort and TensorFlow name it.
        let cfg = ClusterConfig::from_tf_config(&operator_tf_config("master", 0)).unwrap();
        let written = cfg.to_tf_config();
        assert!(
            written.contains(r#""chief":["job-master-0.ns.svc:2222"]"#),
            "{written}"
        );
        assert!(!written.contains(r#""master""#), "{written}");
        assert_eq!(ClusterConfig::from_tf_config(&written).unwrap(), cfg);
    }

    #[test]
    fn environment_and_rpc_layer_are_ignored_when_they_are_strings() {
        for extra in [
            r#""environment": "cloud""#,
            r#""environment": "google""#,
            r#""environment": """#,
            r#""rpc_layer": "grpc""#,
        ] {
            let json = format!(
                r#"{{"cluster": {{"chief": ["h:1"], "worker": ["h:2"]}},
                    "task": {{"type": "worker", "index": 0}}, {extra}}}"#
            );
            let cfg =
                ClusterConfig::from_tf_config(&json).unwrap_or_else(|e| panic!("{extra}: {e}"));
            assert_eq!(cfg.task, TaskId::new(TaskType::Worker, 0));
        }
    }

    #[test]
    fn what_the_operator_never_writes_is_refused_by_name() {
        let cases: &[(&str, &str)] = &[
            (
                r#"{"cluster": {"chief": ["h:1"], "master": ["h:2"]}, "task": {"type": "master"}}"#,
                r#"TF_CONFIG.cluster: names both "chief" and "master", which are the same task type (chief)"#,
            ),
            (
                r#"{"cluster": {"master": ["h:1", "h:2"]}, "task": {"type": "master"}}"#,
                "TF_CONFIG.cluster.master: at most one chief address, got 2",
            ),
            (
                r#"{"cluster": {"chief": ["h:1", "h:2"]}, "task": {"type": "chief"}}"#,
                "TF_CONFIG.cluster.chief: at most one chief address, got 2",
            ),
            (
                r#"{"cluster": {"master": ["h:1"]}, "task": {"type": "master", "index": 1}}"#,
                "task: chief/1 does not exist in the cluster (chief has 1 task(s))",
            ),
            (
                r#"{"cluster": {"master": ["h:1"], "worker": ["h:2", "h:3"]}, "task": {"type": "worker", "index": 2}}"#,
                "task: worker/2 does not exist in the cluster (worker has 2 task(s))",
            ),
            (
                r#"{"cluster": {"master": ["h:1"]}, "task": {"type": "ps", "index": 0}}"#,
                "task: ps/0 does not exist in the cluster (ps has 0 task(s))",
            ),
            (
                r#"{"cluster": {"master": ["h:1"]}, "task": {"type": "master"}, "environment": 1}"#,
                "TF_CONFIG.environment: expected a string, got 1",
            ),
            (
                r#"{"cluster": {"master": ["h:1"]}, "task": {"type": "master"}, "rpc_layer": null}"#,
                "TF_CONFIG.rpc_layer: expected a string, got null",
            ),
            (
                r#"{"cluster": {"master": ["h:1"]}, "task": {"type": "master"}, "env": "cloud"}"#,
                "TF_CONFIG.env: unknown key (expected cluster, task, environment, rpc_layer)",
            ),
            (
                r#"{"cluster": {"Master": ["h:1"]}, "task": {"type": "master"}}"#,
                r#"TF_CONFIG.cluster.Master: unknown task type "Master" (expected one of chief, master, worker, ps, evaluator)"#,
            ),
            (
                r#"{"cluster": {"master": ["h:1"]}, "task": {"type": "boss"}}"#,
                r#"TF_CONFIG.task.type: unknown task type "boss""#,
            ),
            (
                r#"{"cluster": {"master": ["h:1"]}, "task": {"type": "master", "replica": 0}}"#,
                "TF_CONFIG.task.replica: unknown key (expected type, index)",
            ),
        ];
        for (json, expected) in cases {
            let err = ClusterConfig::from_tf_config(json).unwrap_err().to_string();
            assert!(
                err.contains(expected),
                "{json}: got {err:?}, want {expected:?}"
            );
        }
    }

    #[test]
    fn the_toml_form_reads_master_as_the_chief_with_the_same_checks() {
        let cfg = ClusterConfig::from_toml(
            "cohort.toml",
            "[cluster]\nmaster = [\"h:1\"]\nworker = [\"h:2\"]\n[task]\ntype = \"master\"\n",
        )
        .unwrap();
        assert_eq!(cfg.task, TaskId::new(TaskType::Chief, 0));
        assert_eq!(cfg.cluster.address(cfg.task).unwrap(), "h:1");
        let cases: &[(&str, &str)] = &[
            (
                "[cluster]\nchief = [\"h:1\"]\nmaster = [\"h:2\"]\n[task]\ntype = \"chief\"\n",
                r#"cluster: names both "chief" and "master""#,
            ),
            (
                "[cluster]\nmaster = [\"h:1\", \"h:2\"]\n[task]\ntype = \"master\"\n",
                "cluster.master: at most one chief address, got 2",
            ),
            (
                "[cluster]\nmaster = [\"h:1\"]\n[task]\ntype = \"master\"\nindex = 1\n",
                "task: chief/1 does not exist in the cluster (chief has 1 task(s))",
            ),
        ];
        for (text, expected) in cases {
            let err = ClusterConfig::from_toml("cohort.toml", text)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(expected),
                "{text}: got {err:?}, want {expected:?}"
            );
        }
    }

    #[test]
    fn parses_toml() {
        let text = r#"
            [cluster]
            chief = ["127.0.0.1:7000"]
            worker = ["127.0.0.1:7001"]
            ps = ["127.0.0.1:7002"]
            [task]
            type = "ps"
            index = 0
        "#;
        let cfg = ClusterConfig::from_toml("cohort.toml", text).unwrap();
        assert_eq!(cfg.task, TaskId::new(TaskType::Ps, 0));
        let err = ClusterConfig::from_toml(
            "cohort.toml",
            "[cluster]\nworker = 3\n[task]\ntype='worker'",
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("cluster.worker:"), "{err}");
        let err = ClusterConfig::from_toml("cohort.toml", "cluster = [").unwrap_err();
        assert!(
            err.to_string().starts_with("cohort.toml: malformed"),
            "{err}"
        );
    }
}
