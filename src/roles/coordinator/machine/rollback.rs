//! The coordinator machine's rollback line: the checkpoint cut a parameter-server recovery rolls
//! back to, the cut before it kept as a fallback, the closures committed since (kept to run
//! again after a rollback, within `rollback_retained_max` closures and
//! `rollback_retained_bytes_max` bytes of their functions and arguments), and the program's save whose
//! checkpoint is being written (a recovery with no cut yet waits for it).
//!
//! [`RollbackLine`] owns that state and every rule on it; the [`Scheduler`](super::Scheduler)
//! asks it where a restore starts and what to queue again, and tells it when a cut is marked,
//! a closure commits or a save's write ends. Pure: no IO, no clock.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::save::CutBeingWritten;
use super::{ClosureId, PsLossCause};
use crate::roles::push::LearningRate;

/// A closure committed since the cut, kept to run it again after a rollback.
#[derive(Debug)]
pub(super) struct Retained {
    pub(super) function: String,
    pub(super) args: Vec<u8>,
    /// The attempts it has had (attempt numbers never restart).
    pub(super) attempts: u32,
    /// Its rate: run again, it applies at the rate it was scheduled with.
    pub(super) learning_rate: Option<LearningRate>,
}

impl Retained {
    /// What keeping it costs, as the byte bound counts it: its function's name and its
    /// arguments (what grows with the program's data), plus a fixed allowance for the entry.
    fn bytes(&self) -> usize {
        const ENTRY_BYTES: usize = 64;
        self.function.len() + self.args.len() + ENTRY_BYTES
    }
}

/// The bounds on what a rollback line keeps (`SchedulerConfig::rollback_retained_max` and
/// `rollback_retained_bytes_max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RetainedBounds {
    /// Closures kept at most.
    pub(super) closures: usize,
    /// Bytes of their functions and arguments kept at most ([`Retained::bytes`]).
    pub(super) bytes: usize,
}

/// A checkpoint cut: where the variables were, and the checkpoint that holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KeptCut {
    /// The cut (every closure below it was finished when it was taken).
    pub(super) cut: ClosureId,
    /// The cut its checkpoint records (its ledger's next closure id), by which a recovery
    /// finds it: the cut itself, except after a restore at start-up over servers that had
    /// gone on past the checkpoint (the cut is then above it: the ids between were burned).
    pub(super) stored_at: ClosureId,
    /// Where that checkpoint lives.
    pub(super) root: PathBuf,
}

/// What stands in the way of a restore when a server's state is lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RestoreBlocker {
    /// The first checkpoint was read before the loss and is being written: the restore
    /// begins once it is marked.
    FirstCutBeingWritten,
    /// No restore can succeed: the recovery fails for this cause.
    Cannot(PsLossCause),
}

/// The rollback line (see the module doc).
#[derive(Debug)]
pub(super) struct RollbackLine {
    /// At most this many closures, and bytes of them, are kept to run again.
    bounds: RetainedBounds,
    /// The bytes `since_cut` holds ([`Retained::bytes`] summed).
    since_cut_bytes: usize,
    /// The last checkpoint's cut.
    last: Option<KeptCut>,
    /// The cut before the last one, while every closure committed since it is kept: a
    /// recovery rolls back to it when the last cut's checkpoint cannot be read.
    fallback: Option<KeptCut>,
    /// Closures committed at or above the rollback floor, with what it takes to run them
    /// again.
    since_cut: BTreeMap<ClosureId, Retained>,
    /// More closures committed since the cut than the bounds keep: a rollback would lose
    /// some. Which bound was passed.
    overflowed: Option<PsLossCause>,
    /// The largest id of a closure not kept because the line had overflowed: a new cut at or
    /// below it (a save read before that closure committed, marked after) would still lose
    /// it, so the line stays overflowed.
    dropped_max: Option<ClosureId>,
    /// The program's last save, read and not yet marked or abandoned: its checkpoint is being
    /// written, and the closures committed meanwhile are kept to run again after a rollback
    /// to it.
    being_written: Option<CutBeingWritten>,
    /// Why the program's last save that was read never became the cut, if it did not: a
    /// recovery that cannot restore says so.
    write_failed: Option<String>,
}

impl RollbackLine {
    /// An empty line: no cut yet, keeping at most `bounds` of closures to run again.
    pub(super) fn new(bounds: RetainedBounds) -> Self {
        Self {
            bounds,
            since_cut_bytes: 0,
            last: None,
            fallback: None,
            since_cut: BTreeMap::new(),
            overflowed: None,
            dropped_max: None,
            being_written: None,
            write_failed: None,
        }
    }

    /// The last checkpoint cut, if any.
    pub(super) fn cut(&self) -> Option<ClosureId> {
        self.last.as_ref().map(|k| k.cut)
    }

    /// The last cut with its checkpoint: where a restore starts.
    pub(super) fn restore_point(&self) -> Option<&KeptCut> {
        self.last.as_ref()
    }

    /// The program's save being written, if one was read in restore generation `generation`
    /// (one read before a restore is stale: its mark is refused).
    pub(super) fn being_written(&self, generation: u64) -> Option<CutBeingWritten> {
        self.being_written.filter(|w| w.generation == generation)
    }

    /// The cut a recovery would roll back to in restore generation `generation`: the last
    /// one, or else the first checkpoint, read and being written now (a recovery waits for
    /// it to be marked). Closures committed at or above it are kept to run again.
    pub(super) fn floor(&self, generation: u64) -> Option<ClosureId> {
        self.cut()
            .or_else(|| self.being_written(generation).map(|w| w.cut))
    }

    /// Whether a restore can roll back to a cut now, in restore generation `generation`.
    pub(super) fn restore_blocker(&self, generation: u64) -> Option<RestoreBlocker> {
        if self.last.is_none() {
            if self.being_written(generation).is_some() {
                return Some(RestoreBlocker::FirstCutBeingWritten);
            }
            let cause = match &self.write_failed {
                Some(why) => PsLossCause::FirstCheckpointNeverCut { why: why.clone() },
                None => PsLossCause::NoCheckpoint,
            };
            return Some(RestoreBlocker::Cannot(cause));
        }
        self.overflowed.clone().map(RestoreBlocker::Cannot)
    }

    /// The variables are at cut `cut` now, as the checkpoint under `root` that records cut
    /// `stored_at` holds them. The cut it replaces becomes the fallback if every closure
    /// committed since it is kept.
    pub(super) fn set(&mut self, cut: ClosureId, stored_at: ClosureId, root: PathBuf) {
        let replaced = self.last.take().filter(|old| old.cut < cut);
        self.fallback = replaced.filter(|_| self.overflowed.is_none());
        self.last = Some(KeptCut {
            cut,
            stored_at,
            root,
        });
        let kept_from = self.fallback.as_ref().map_or(cut, |f| f.cut);
        self.keep_from(kept_from);
        if self.past_bounds(0).is_some() {
            self.drop_fallback();
        }
        // A closure at or above the new cut that was not kept (it committed after the save was
        // read, while the line had overflowed) keeps the line overflowed: a rollback to the
        // new cut would lose it.
        if self.dropped_max.is_some_and(|dropped| dropped >= cut) {
            return;
        }
        self.dropped_max = None;
        self.overflowed = self.past_bounds(0);
    }

    /// The bound that keeping `more` bytes in one more closure would pass, as the cause a
    /// recovery then fails for; `more == 0`: the bound the line is past already.
    fn past_bounds(&self, more: usize) -> Option<PsLossCause> {
        let closures = self.since_cut.len() + usize::from(more > 0);
        if closures > self.bounds.closures {
            return Some(PsLossCause::RetentionOverflow {
                retained_max: self.bounds.closures,
            });
        }
        if self.since_cut_bytes.saturating_add(more) > self.bounds.bytes {
            return Some(PsLossCause::RetentionBytesOverflow {
                retained_bytes_max: self.bounds.bytes,
            });
        }
        None
    }

    /// Forgets the closures kept below `cut`.
    fn keep_from(&mut self, cut: ClosureId) {
        self.since_cut.retain(|id, _| *id >= cut);
        self.since_cut_bytes = self.since_cut.values().map(Retained::bytes).sum();
    }

    /// The last cut's checkpoint could not be read: the fallback becomes the cut. `false` if
    /// there is none (nothing changes).
    pub(super) fn fall_back(&mut self) -> bool {
        match self.fallback.take() {
            Some(fallback) => {
                self.last = Some(fallback);
                true
            }
            None => false,
        }
    }

    /// Whether a closure committing as `id` in restore generation `generation` is to be kept
    /// ([`Self::retain`]): it commits at or above the rollback floor.
    pub(super) fn keeps(&self, id: ClosureId, generation: u64) -> bool {
        self.floor(generation).is_some_and(|floor| id >= floor)
    }

    /// Keeps closure `id`, committing at or above the floor ([`Self::keeps`]), to run it again
    /// after a rollback; `retained` is asked for once the line is known not to have
    /// overflowed. The fallback's closures give way first: a rollback to the last cut must
    /// stay possible. Past either bound the line overflows and a recovery fails instead of
    /// losing an update.
    pub(super) fn retain(&mut self, id: ClosureId, retained: impl FnOnce() -> Option<Retained>) {
        if self.overflowed.is_some() {
            self.dropped(id);
            return;
        }
        let Some(retained) = retained() else {
            return;
        };
        let bytes = retained.bytes();
        if self.past_bounds(bytes).is_some() {
            self.drop_fallback();
        }
        if let Some(cause) = self.past_bounds(bytes) {
            self.overflowed = Some(cause);
            self.dropped(id);
            return;
        }
        self.since_cut_bytes += bytes;
        if let Some(replaced) = self.since_cut.insert(id, retained) {
            self.since_cut_bytes -= replaced.bytes();
        }
    }

    /// Closure `id` was not kept: the line overflowed.
    fn dropped(&mut self, id: ClosureId) {
        self.dropped_max = self.dropped_max.max(Some(id));
    }

    /// The closures committed at or above `cut`, in id order, taken out to run again after a
    /// rollback to it; what committed between the fallback cut and `cut` stays kept for a
    /// later rollback to the fallback.
    pub(super) fn take_replay(&mut self, cut: ClosureId) -> BTreeMap<ClosureId, Retained> {
        let replay = self.since_cut.split_off(&cut);
        let taken: usize = replay.values().map(Retained::bytes).sum();
        self.since_cut_bytes -= taken;
        replay
    }

    /// The program's save of cut `written.cut` was read: its checkpoint is being written.
    pub(super) fn write_began(&mut self, written: CutBeingWritten) {
        self.being_written = Some(written);
    }

    /// The shell is done with the save of cut `cut`: marked (`refused` is `None`), refused or
    /// abandoned. `false` if that save is not the one being written (nothing changes).
    pub(super) fn write_ended(&mut self, cut: ClosureId, refused: Option<String>) -> bool {
        if self.being_written.is_none_or(|w| w.cut != cut) {
            return false;
        }
        self.being_written = None;
        match refused {
            None => self.write_failed = None,
            Some(why) => {
                if self.last.is_none() {
                    // Kept for a rollback to it, which will never come.
                    self.since_cut.clear();
                    self.since_cut_bytes = 0;
                    self.overflowed = None;
                    self.dropped_max = None;
                }
                self.write_failed = Some(why);
            }
        }
        true
    }

    /// Gives up the fallback cut (to keep within the bounds): only what committed since the
    /// last cut stays kept.
    fn drop_fallback(&mut self) {
        if self.fallback.take().is_some() {
            if let Some(cut) = self.cut() {
                self.keep_from(cut);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bounds of `max` closures and bytes to spare.
    fn closures(max: usize) -> RetainedBounds {
        RetainedBounds {
            closures: max,
            bytes: usize::MAX,
        }
    }

    fn with_args(id: u64, bytes: usize) -> Retained {
        Retained {
            function: format!("f{id}"),
            args: vec![0; bytes],
            attempts: 1,
            learning_rate: None,
        }
    }

    fn kept(line: &mut RollbackLine, ids: std::ops::Range<u64>) {
        for id in ids {
            if line.keeps(ClosureId(id), 0) {
                line.retain(ClosureId(id), || {
                    Some(Retained {
                        function: format!("f{id}"),
                        args: vec![],
                        attempts: 1,
                        learning_rate: None,
                    })
                });
            }
        }
    }

    #[test]
    fn without_a_cut_nothing_is_kept_and_a_restore_cannot_begin() {
        let mut line = RollbackLine::new(closures(8));
        kept(&mut line, 0..5);
        assert!(line.take_replay(ClosureId(0)).is_empty());
        assert_eq!(
            line.restore_blocker(0),
            Some(RestoreBlocker::Cannot(PsLossCause::NoCheckpoint))
        );
    }

    #[test]
    fn a_new_cut_keeps_the_old_one_as_fallback_with_what_committed_since_it() {
        let mut line = RollbackLine::new(closures(8));
        line.set(ClosureId(2), ClosureId(2), "a".into());
        kept(&mut line, 2..5);
        line.set(ClosureId(5), ClosureId(5), "b".into());
        kept(&mut line, 5..7);
        assert_eq!(line.restore_blocker(0), None);
        assert_eq!(line.restore_point().map(|k| k.cut), Some(ClosureId(5)));
        // The last cut's checkpoint is unreadable: back to the fallback, whose replay holds
        // everything committed since it.
        assert!(line.fall_back());
        assert_eq!(line.cut(), Some(ClosureId(2)));
        let replay: Vec<u64> = line.take_replay(ClosureId(2)).keys().map(|c| c.0).collect();
        assert_eq!(replay, vec![2, 3, 4, 5, 6]);
        assert!(!line.fall_back(), "one fallback only");
    }

    #[test]
    fn the_fallback_gives_way_before_the_line_overflows() {
        let mut line = RollbackLine::new(closures(3));
        line.set(ClosureId(0), ClosureId(0), "a".into());
        kept(&mut line, 0..2);
        line.set(ClosureId(2), ClosureId(2), "b".into());
        kept(&mut line, 2..4);
        // Four kept would pass the limit: the fallback's closures went first.
        assert!(!line.fall_back());
        assert_eq!(line.restore_blocker(0), None);
        kept(&mut line, 4..6);
        assert_eq!(
            line.restore_blocker(0),
            Some(RestoreBlocker::Cannot(PsLossCause::RetentionOverflow {
                retained_max: 3
            }))
        );
        // A newer cut forgets what came before it, and the line fits again.
        line.set(ClosureId(6), ClosureId(6), "c".into());
        assert_eq!(line.restore_blocker(0), None);
    }

    #[test]
    fn a_first_save_being_written_holds_a_restore_until_it_is_marked_or_abandoned() {
        let mut line = RollbackLine::new(closures(8));
        line.write_began(CutBeingWritten {
            cut: ClosureId(3),
            generation: 0,
        });
        assert_eq!(
            line.restore_blocker(0),
            Some(RestoreBlocker::FirstCutBeingWritten)
        );
        // A restore since (generation 1) makes that save stale.
        assert_eq!(line.floor(1), None);
        kept(&mut line, 3..5);
        assert!(!line.write_ended(ClosureId(2), None), "another save");
        assert!(line.write_ended(ClosureId(3), Some("disk full".into())));
        assert_eq!(
            line.restore_blocker(0),
            Some(RestoreBlocker::Cannot(
                PsLossCause::FirstCheckpointNeverCut {
                    why: "disk full".into()
                }
            ))
        );
        assert!(line.take_replay(ClosureId(0)).is_empty());
    }

    #[test]
    fn arguments_past_the_byte_bound_overflow_the_line_and_a_new_cut_makes_room() {
        // Each kept closure costs its function's name ("f" and one digit), its arguments and
        // 64 bytes: 1,066 bytes for 1,000 of arguments.
        let mut line = RollbackLine::new(RetainedBounds {
            closures: 100,
            bytes: 3_000,
        });
        line.set(ClosureId(0), ClosureId(0), "a".into());
        for id in 0..2 {
            line.retain(ClosureId(id), || Some(with_args(id, 1_000)));
        }
        assert_eq!(line.restore_blocker(0), None);
        line.retain(ClosureId(2), || Some(with_args(2, 1_000)));
        assert_eq!(
            line.restore_blocker(0),
            Some(RestoreBlocker::Cannot(
                PsLossCause::RetentionBytesOverflow {
                    retained_bytes_max: 3_000
                }
            ))
        );
        // Nothing more is asked for once the line overflowed.
        line.retain(ClosureId(3), || panic!("not asked"));
        // A new cut forgets what came before it (the old cut is no fallback: the line
        // overflowed since it), and the line has room again.
        line.set(ClosureId(4), ClosureId(4), "b".into());
        assert_eq!(line.restore_blocker(0), None);
        assert!(!line.fall_back());
        line.retain(ClosureId(4), || Some(with_args(4, 1_000)));
        line.retain(ClosureId(5), || Some(with_args(5, 1_000)));
        let replay: Vec<u64> = line.take_replay(ClosureId(4)).keys().map(|c| c.0).collect();
        assert_eq!(replay, vec![4, 5]);
        // What was taken out to run again no longer counts: two more fit.
        line.retain(ClosureId(6), || Some(with_args(6, 1_000)));
        line.retain(ClosureId(7), || Some(with_args(7, 1_000)));
        assert_eq!(line.restore_blocker(0), None);
    }

    #[test]
    fn the_fallback_gives_way_to_the_byte_bound_before_the_line_overflows() {
        let mut line = RollbackLine::new(RetainedBounds {
            closures: 100,
            bytes: 2_200,
        });
        line.set(ClosureId(0), ClosureId(0), "a".into());
        line.retain(ClosureId(0), || Some(with_args(0, 1_000)));
        line.set(ClosureId(1), ClosureId(1), "b".into());
        line.retain(ClosureId(1), || Some(with_args(1, 1_000)));
        // Closure 0 (kept for the fallback) gives way to closure 2.
        line.retain(ClosureId(2), || Some(with_args(2, 1_000)));
        assert_eq!(line.restore_blocker(0), None);
        assert!(!line.fall_back(), "the fallback was given up");
        let replay: Vec<u64> = line.take_replay(ClosureId(1)).keys().map(|c| c.0).collect();
        assert_eq!(replay, vec![1, 2]);
    }

    #[test]
    fn a_closure_dropped_above_a_cut_being_written_keeps_the_line_overflowed_after_its_mark() {
        let mut line = RollbackLine::new(closures(2));
        line.set(ClosureId(0), ClosureId(0), "a".into());
        kept(&mut line, 0..2);
        // A save is read at cut 2; closures 2 and 3 commit before it is marked, and the line
        // has no room for them.
        kept(&mut line, 2..4);
        assert!(line.restore_blocker(0).is_some());
        // Marked: a rollback to cut 2 would have to run 2 and 3 again, and they were not
        // kept, so the line stays overflowed...
        line.set(ClosureId(2), ClosureId(2), "b".into());
        assert_eq!(
            line.restore_blocker(0),
            Some(RestoreBlocker::Cannot(PsLossCause::RetentionOverflow {
                retained_max: 2
            }))
        );
        // ...until a cut above every closure dropped.
        line.set(ClosureId(4), ClosureId(4), "c".into());
        assert_eq!(line.restore_blocker(0), None);
        kept(&mut line, 4..6);
        let replay: Vec<u64> = line.take_replay(ClosureId(4)).keys().map(|c| c.0).collect();
        assert_eq!(replay, vec![4, 5]);
    }
}
