//! The run report: what a task of a job says about its end, as JSON, for the chaos runner to
//! read (in place of scraping the summary it prints for people).
//!
//! `cohort chaos run` sets [`RUN_REPORT_DIR_ENV`] for the job it launches; every task whose
//! program knows the report (the built-in demo workloads; any MultiWorkerMirrored worker, a
//! user's program or a Python script, whose strategy keeps it, its final model from Keras'
//! `fit` or `MultiWorkerMirrored::report_final_model`; a program calling [`write_report`])
//! writes `<dir>/<role>-<index>.json`
//! (written whole, then renamed into place, so a reader never sees half a file), the
//! latest process of a task replacing what an earlier one wrote. Without the variable nothing
//! is written. A parameter-server chief whose program writes none (a user's program, a Python
//! script) has the runtime write its ledger and servers' counts when its program ends
//! (`chief_report`). The runner reads every file once the job has ended
//! ([`read_reports`]); a file it cannot read is named in its result, not skipped silently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

/// The directory the tasks write their reports in (set by `cohort chaos run`).
pub const RUN_REPORT_DIR_ENV: &str = "COHORT_RUN_REPORT_DIR";

/// Reports larger than this are refused on reading (a task writes a few hundred bytes).
const REPORT_BYTES_MAX: u64 = 1 << 20;

/// What one task reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskReport {
    /// The task (`chief/0`, `worker/1`).
    pub task: String,
    /// The job is a MultiWorkerMirrored one (written as it starts, so that a job that fails
    /// early is still known as one).
    #[serde(default)]
    pub collective: bool,
    /// A parameter-server chief's ledger at the end.
    #[serde(default)]
    pub ledger: Option<LedgerCounts>,
    /// A parameter-server chief's per-server counts at the end, by server.
    #[serde(default)]
    pub servers: Vec<ServerCounts>,
    /// Parameter-server restores from a checkpoint while the job ran, where there were any.
    #[serde(default)]
    pub ps_restores: Option<u64>,
    /// Committed closures those restores rolled back (and ran again).
    #[serde(default)]
    pub rolled_back: Option<u64>,
    /// The chief resumed from a checkpoint as it started (it restarted), restoring the servers
    /// there, so closures after that checkpoint were pushed again.
    #[serde(default)]
    pub resumed: bool,
    /// A MultiWorkerMirrored member's final model.
    #[serde(default)]
    pub final_model: Option<FinalModel>,
    /// A MultiWorkerMirrored chief's group generations, in order (`membership_epochs` in
    /// reports written before the rename).
    #[serde(default, alias = "membership_epochs")]
    pub group_generations: Vec<GroupGeneration>,
}

/// A parameter-server chief's ledger.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerCounts {
    /// Scheduled.
    pub scheduled: u64,
    /// Committed.
    pub committed: u64,
    /// Re-dispatched after their worker (or a server) was lost.
    pub redispatched: Option<u64>,
    /// Failed.
    pub failed: u64,
    /// Pending.
    pub pending: u64,
}

/// One parameter server's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServerCounts {
    /// The server's index.
    pub ps: u32,
    /// Pushes applied.
    pub applied: u64,
    /// Pushes refused as duplicates (PS-1).
    pub duplicates: u64,
}

/// A member's final model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalModel {
    /// The steps it trained to.
    pub step: u64,
    /// Its variables' digest (equal on every member: DATA-1).
    pub digest: String,
}

impl FinalModel {
    /// The model of `variables` (each name and its values) after `step` steps. Its digest is
    /// the first 16 hex digits of a SHA-256 of the variables (each name and its f32 bits,
    /// little-endian, in the order given): two members report the same only when they hold the
    /// same model, bit for bit (DATA-1).
    pub fn of<'a>(step: u64, variables: impl IntoIterator<Item = (&'a str, &'a [f32])>) -> Self {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        for (name, values) in variables {
            hash.update((name.len() as u64).to_le_bytes());
            hash.update(name.as_bytes());
            hash.update((values.len() as u64).to_le_bytes());
            for v in values {
                hash.update(v.to_le_bytes());
            }
        }
        Self {
            step,
            digest: hex::encode(&hash.finalize()[..8]),
        }
    }

    /// The model of `variables` after `step` steps ([`FinalModel::of`] of their names and
    /// values, a variable of another type than f32 read as f32), in the order given: a
    /// program's final model as Keras' `fit` and cohort's Python package report it.
    pub fn of_variables(
        step: u64,
        variables: &[crate::variable::Variable],
    ) -> Result<Self, candle_core::Error> {
        let mut values = Vec::with_capacity(variables.len());
        for variable in variables {
            let flat = variable
                .read_value()
                .flatten_all()
                .and_then(|t| t.to_dtype(candle_core::DType::F32))
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|e| {
                    candle_core::Error::Msg(format!("variable {:?}: {e}", variable.name()))
                })?;
            values.push((variable.name().to_string(), flat));
        }
        Ok(Self::of(
            step,
            values.iter().map(|(n, v)| (n.as_str(), v.as_slice())),
        ))
    }
}

/// One generation of a MultiWorkerMirrored group (one formation: its membership epoch), as
/// its chief saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupGeneration {
    /// The generation (`epoch` in reports written before the rename).
    #[serde(alias = "epoch")]
    pub generation: u64,
    /// Its workers.
    pub workers: u64,
    /// The step it trained from.
    pub from_step: u64,
}

/// Why a report could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum RunReportError {
    /// Reading, writing or listing failed.
    #[error("run report {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file that is not a report.
    #[error("run report {}: {detail}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

impl TaskReport {
    /// An empty report of `task`.
    pub fn of(task: impl Into<String>) -> Self {
        Self {
            task: task.into(),
            ..Self::default()
        }
    }

    /// Writes the report where [`RUN_REPORT_DIR_ENV`] says, if it says; returns the file.
    pub fn write_if_asked(&self) -> Result<Option<PathBuf>, RunReportError> {
        match std::env::var_os(RUN_REPORT_DIR_ENV) {
            Some(dir) if !dir.is_empty() => self.write_in(Path::new(&dir)).map(Some),
            _ => Ok(None),
        }
    }

    /// Writes the report in `dir` as `<role>-<index>.json`, whole or not at all.
    pub fn write_in(&self, dir: &Path) -> Result<PathBuf, RunReportError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RunReportError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let name: String = self
            .task
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let path = dir.join(format!("{name}.json"));
        let partial = dir.join(format!(".{name}.json.partial"));
        let json = serde_json::to_vec_pretty(self).map_err(|e| RunReportError::Malformed {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        std::fs::write(&partial, json).map_err(io(&partial))?;
        std::fs::rename(&partial, &path).map_err(io(&path))?;
        Ok(path)
    }
}

/// Writes `report` if the job was asked for reports, logging (not failing on) an error: a
/// report is for the chaos runner, and training does not stop for it.
pub fn write_report(report: &TaskReport) {
    match report.write_if_asked() {
        Ok(Some(_)) => WRITTEN.store(true, Ordering::SeqCst),
        Ok(None) => {}
        Err(e) => tracing::warn!("{e}"),
    }
}

/// Whether this process wrote its report (a program that writes its own, as the demo does, is
/// not written over by the runtime's).
static WRITTEN: AtomicBool = AtomicBool::new(false);

/// Whether this process has written its report.
pub(crate) fn written() -> bool {
    WRITTEN.load(Ordering::SeqCst)
}

/// Whether a report is asked for ([`RUN_REPORT_DIR_ENV`] is set).
pub fn asked() -> bool {
    std::env::var_os(RUN_REPORT_DIR_ENV).is_some_and(|dir| !dir.is_empty())
}

/// A parameter-server chief's report: its ledger at the end and each server's counts (in
/// server order: pushes applied, duplicates refused), with the restores from a checkpoint and
/// what they rolled back where there were any.
pub(crate) fn chief_report(
    ledger: &crate::ledger::Ledger,
    servers: impl IntoIterator<Item = (u64, u64)>,
) -> TaskReport {
    TaskReport {
        ledger: Some(LedgerCounts {
            scheduled: ledger.scheduled,
            committed: ledger.committed,
            redispatched: Some(ledger.redispatched),
            failed: ledger.failed,
            pending: ledger.pending,
        }),
        servers: servers
            .into_iter()
            .enumerate()
            .map(|(ps, (applied, duplicates))| ServerCounts {
                ps: ps as u32,
                applied,
                duplicates,
            })
            .collect(),
        ps_restores: (ledger.ps_restores > 0).then_some(ledger.ps_restores),
        rolled_back: (ledger.ps_restores > 0).then_some(ledger.rolled_back),
        ..TaskReport::of("chief/0")
    }
}

/// Every task's report in `dir`, by task, and the files that could not be read (each with
/// why). A directory that does not exist holds no report.
pub fn read_reports(dir: &Path) -> (BTreeMap<String, TaskReport>, Vec<RunReportError>) {
    let mut reports = BTreeMap::new();
    let mut errors = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (reports, errors),
        Err(source) => {
            errors.push(RunReportError::Io {
                path: dir.to_path_buf(),
                source,
            });
            return (reports, errors);
        }
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    paths.sort();
    for path in paths {
        match read_one(&path) {
            Ok(report) => {
                reports.insert(report.task.clone(), report);
            }
            Err(e) => errors.push(e),
        }
    }
    (reports, errors)
}

fn read_one(path: &Path) -> Result<TaskReport, RunReportError> {
    let io = |source| RunReportError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > REPORT_BYTES_MAX {
        return Err(RunReportError::Malformed {
            path: path.to_path_buf(),
            detail: format!("{len} bytes, more than a report's {REPORT_BYTES_MAX}"),
        });
    }
    let bytes = std::fs::read(path).map_err(io)?;
    let report: TaskReport =
        serde_json::from_slice(&bytes).map_err(|e| RunReportError::Malformed {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    if report.task.is_empty() {
        return Err(RunReportError::Malformed {
            path: path.to_path_buf(),
            detail: "it names no task".into(),
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_final_models_digest_follows_the_variables_bits_and_names() {
        use candle_core::{Device, Tensor};
        let var = |name: &str, values: &[f32]| {
            let tensor = Tensor::new(values, &Device::Cpu).unwrap();
            crate::variable::Variable::new(name, tensor).unwrap()
        };
        let a = FinalModel::of_variables(5, &[var("w", &[1.0, 2.0]), var("b", &[0.5])]).unwrap();
        let same = FinalModel::of_variables(5, &[var("w", &[1.0, 2.0]), var("b", &[0.5])]).unwrap();
        let other_bits =
            FinalModel::of_variables(5, &[var("w", &[1.0, 2.000_001]), var("b", &[0.5])]);
        let other_name = FinalModel::of_variables(5, &[var("v", &[1.0, 2.0]), var("b", &[0.5])]);
        assert_eq!(a, same);
        assert_eq!(a.step, 5);
        assert_ne!(a.digest, other_bits.unwrap().digest);
        assert_ne!(a.digest, other_name.unwrap().digest);
    }

    /// A report written before group generations were so named (`membership_epochs`, each
    /// with an `epoch`) reads as one of today's.
    #[test]
    fn a_report_naming_membership_epochs_reads_as_group_generations() {
        let old = r#"{"task": "chief/0", "collective": true,
            "membership_epochs": [{"epoch": 2, "workers": 3, "from_step": 40}]}"#;
        let report: TaskReport = serde_json::from_str(old).unwrap();
        assert_eq!(
            report.group_generations,
            vec![GroupGeneration {
                generation: 2,
                workers: 3,
                from_step: 40
            }]
        );
    }

    #[test]
    fn reports_read_back_as_written_and_a_bad_file_is_named() {
        let dir = crate::process::new_temp_dir("run-report").unwrap();
        let mut chief = TaskReport::of("chief/0");
        chief.collective = true;
        chief.final_model = Some(FinalModel {
            step: 450,
            digest: "d42fbeb0f86b2b8d".into(),
        });
        chief.group_generations = vec![GroupGeneration {
            generation: 1,
            workers: 3,
            from_step: 0,
        }];
        let path = chief.write_in(dir.as_path()).unwrap();
        assert_eq!(path.file_name().unwrap(), "chief-0.json");
        let mut worker = TaskReport::of("worker/1");
        worker.ledger = Some(LedgerCounts {
            scheduled: 12,
            committed: 12,
            redispatched: Some(1),
            failed: 0,
            pending: 0,
        });
        worker.write_in(dir.as_path()).unwrap();
        // A later process of the same task replaces the earlier one's report.
        chief.final_model = Some(FinalModel {
            step: 451,
            digest: "00".into(),
        });
        chief.write_in(dir.as_path()).unwrap();
        std::fs::write(
            dir.as_path().join("torn.json"),
            b"{\"task\": \"ps/0\", \"ledg",
        )
        .unwrap();
        std::fs::write(dir.as_path().join(".x.json.partial"), b"{").unwrap();
        let (reports, errors) = read_reports(dir.as_path());
        assert_eq!(reports.len(), 2, "{reports:?}");
        assert_eq!(reports["chief/0"], chief);
        assert_eq!(reports["worker/1"], worker);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].to_string().contains("torn.json"), "{}", errors[0]);
        // No directory: no reports, no error.
        let (none, errors) = read_reports(&dir.as_path().join("absent"));
        assert!(none.is_empty() && errors.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
