//! What a MultiWorkerMirrored worker says of its job in its run report
//! ([`crate::run_report`], which `cohort chaos run` reads): that the job is a collective one
//! (written as the strategy is made, so that a job that fails early is still known as one),
//! the group's generations this process saw (each with its workers and the step it trained
//! from), and, once training ended here, the final model, whose digest every member must share
//! (DATA-1). The strategy keeps it for every program, a user's included: Keras' `fit` reports
//! the final model itself, a custom loop calls
//! [`MultiWorkerMirrored::report_final_model`](super::MultiWorkerMirrored::report_final_model).
//! Nothing is written where no report is asked for ([`crate::run_report::RUN_REPORT_DIR_ENV`]
//! unset).

use crate::run_report::{write_report, FinalModel, GroupGeneration, TaskReport};

/// This worker's run report as it grows (see the module doc).
#[derive(Debug)]
pub(super) struct GroupReport {
    report: TaskReport,
    /// This worker left the group (preempted or drained): it has no final model to report.
    left: bool,
}

impl GroupReport {
    /// The report of `task`, written at once as a collective job's; the first generation is
    /// recorded from step 0 where this process formed it (a process admitted to a live group,
    /// at a later generation, records the generations from its admission on).
    pub(super) fn start(task: String, generation: u64, workers: usize) -> Self {
        let mut keeper = Self {
            report: TaskReport {
                collective: true,
                ..TaskReport::of(task)
            },
            left: false,
        };
        write_report(&keeper.report);
        if generation <= 1 {
            keeper.generation(generation, workers, 0);
        }
        keeper
    }

    /// The group of `generation` with `workers` trains from `from_step` on. A generation no
    /// later than the last one recorded is not recorded again (the first boundary notes the
    /// first generation that [`GroupReport::start`] recorded already).
    pub(super) fn generation(&mut self, generation: u64, workers: usize, from_step: u64) {
        let generations = &mut self.report.group_generations;
        if generations
            .last()
            .is_some_and(|g| g.generation >= generation)
        {
            return;
        }
        generations.push(GroupGeneration {
            generation,
            workers: workers as u64,
            from_step,
        });
    }

    /// This worker left the group: it reports no final model.
    pub(super) fn left(&mut self) {
        self.left = true;
    }

    /// Writes `model` as this worker's final model, with the group's generations where
    /// `chief` (the runner checks the chief's); nothing where this worker left the group.
    pub(super) fn final_model(&mut self, model: FinalModel, chief: bool) {
        if self.left {
            return;
        }
        let mut report = self.report.clone();
        report.final_model = Some(model);
        if !chief {
            report.group_generations.clear();
        }
        write_report(&report);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_is_recorded_once_and_only_going_forward() {
        let mut report = GroupReport::start("worker/1".into(), 1, 3);
        report.generation(1, 3, 0);
        report.generation(3, 2, 40);
        report.generation(2, 3, 41);
        let recorded: Vec<(u64, u64, u64)> = report
            .report
            .group_generations
            .iter()
            .map(|g| (g.generation, g.workers, g.from_step))
            .collect();
        assert_eq!(recorded, vec![(1, 3, 0), (3, 2, 40)]);
        assert!(report.report.collective);
    }

    #[test]
    fn a_joiner_records_the_generations_from_its_admission() {
        let mut report = GroupReport::start("worker/2".into(), 4, 3);
        assert!(report.report.group_generations.is_empty());
        report.generation(4, 3, 120);
        assert_eq!(report.report.group_generations.len(), 1);
    }
}
