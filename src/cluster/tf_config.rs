//! `TF_CONFIG` (TensorFlow's exact format) and the `[cluster]`/`[task]` tables of `cohort.toml`.
//!
//! ```json
//! {"cluster": {"chief": ["host:port"], "worker": ["host:port", ...], "ps": [...]},
//!  "task": {"type": "worker", "index": 0}}
//! ```
//!
//! TensorFlow's optional `environment` and `rpc_layer` keys are accepted and ignored.

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
    for key in root.keys() {
        if !matches!(
            key.as_str(),
            "cluster" | "task" | "environment" | "rpc_layer"
        ) {
            return Err(ClusterError::BadValue {
                key: join_key(prefix, key),
                detail: "unknown key (expected cluster, task, environment, rpc_layer)".into(),
            });
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
    let mut jobs = BTreeMap::new();
    for (job, addrs) in map {
        let job_key = format!("{key}.{job}");
        let task_type = TaskType::parse(&job_key, job)?;
        let list = Json(addrs)
            .as_str_list()
            .ok_or_else(|| ClusterError::BadValue {
                key: job_key.clone(),
                detail: "expected a list of \"host:port\" strings".into(),
            })?;
        jobs.insert(task_type, strings(&job_key, list)?);
    }
    ClusterSpec::new(jobs)
}

fn parse_cluster_toml(cluster: Option<&toml::Value>) -> Result<ClusterSpec, ClusterError> {
    let key = "cluster";
    let cluster = cluster.ok_or_else(|| ClusterError::MissingKey { key: key.into() })?;
    let table = cluster.as_table().ok_or_else(|| ClusterError::BadValue {
        key: key.into(),
        detail: "expected a table of job name → list of addresses".into(),
    })?;
    let mut jobs = BTreeMap::new();
    for (job, addrs) in table {
        let job_key = format!("{key}.{job}");
        let task_type = TaskType::parse(&job_key, job)?;
        let list = addrs
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .ok_or_else(|| ClusterError::BadValue {
                key: job_key.clone(),
                detail: "expected a list of \"host:port\" strings".into(),
            })?;
        jobs.insert(task_type, strings(&job_key, list)?);
    }
    ClusterSpec::new(jobs)
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
