//! Distributed input through the public API, reproducing TensorFlow's documented behaviour
//! (`tf.distribute.DistributedDataset` / `DistributedIterator`, auto-sharding, input contexts).
//! Two replicas unless said. Every test runs under a watchdog so a stuck prefetch thread
//! fails the test instead of hanging the suite.

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use cohort::data::{
    AutoShardPolicy, CsvFormat, DataError, Dataset, DistributeOptions, DistributedDataset, Element,
    InputContext, IteratorPosition, TensorSpec,
};
use cohort::strategy::PerReplica;

#[test]
fn slices_repeat_batch_4_gives_1_2_and_3_4() -> Result<()> {
    bounded(|| {
        let ds = Dataset::from_tensor_slices(vec![i64s(&[1, 2, 3, 4])?])?
            .repeat(None)
            .batch(4, false);
        let dist = distribute(ds, 2)?;
        let mut it = dist.iter();
        for _ in 0..3 {
            let step = it.get_next()?;
            assert_eq!(replica_ints(&step), vec![vec![1, 2], vec![3, 4]]);
        }
        Ok(())
    })
}

#[test]
fn range_batch_2_after_five_steps_gives_10_and_11() -> Result<()> {
    bounded(|| {
        let dist = distribute(Dataset::range(0, 100, 1).batch(2, false), 2)?;
        let mut it = dist.iter();
        for _ in 0..5 {
            it.get_next()?;
        }
        let step = it.get_next()?;
        assert_eq!(replica_ints(&step), vec![vec![10], vec![11]]);
        assert_eq!(
            it.position(),
            IteratorPosition {
                steps: 6,
                elements: 12
            }
        );
        Ok(())
    })
}

#[test]
fn global_batch_4_over_range_5_ends_with_an_empty_replica_then_out_of_range() -> Result<()> {
    bounded(|| {
        let dist = distribute(Dataset::range(0, 5, 1).batch(4, false), 2)?;
        let mut it = dist.iter();
        let first = it.get_next_as_optional()?.expect("first step");
        assert_eq!(replica_ints(&first), vec![vec![0, 1], vec![2, 3]]);
        let second = it.get_next_as_optional()?.expect("second step");
        assert_eq!(replica_ints(&second), vec![vec![4], vec![]]);
        assert_eq!(second.values()[1][0].dims(), &[0]);
        assert_eq!(second.values()[1][0].dtype(), DType::I64);
        assert!(it.get_next_as_optional()?.is_none());
        assert!(matches!(it.get_next(), Err(DataError::OutOfRange)));
        assert!(it.get_next().unwrap_err().is_out_of_range());
        Ok(())
    })
}

#[test]
fn features_and_labels_split_two_rows_per_replica() -> Result<()> {
    bounded(|| {
        let one = Tensor::new(&[1f32], &Device::Cpu)?;
        let ds = Dataset::from_tensors(vec![one.clone(), one])
            .repeat(Some(4))
            .batch(4, false);
        let dist = distribute(ds, 2)?;
        let mut steps = 0;
        for step in &dist {
            let step = step?;
            steps += 1;
            for element in step.values() {
                let (features, labels) = (&element[0], &element[1]);
                assert_eq!(features.to_vec2::<f32>()?, vec![vec![1.], vec![1.]]);
                assert_eq!(labels.to_vec2::<f32>()?, vec![vec![1.], vec![1.]]);
                let loss = (labels - (features * 0.3)?)?;
                for row in loss.to_vec2::<f32>()? {
                    assert!((row[0] - 0.7).abs() < 1e-6);
                }
            }
        }
        assert_eq!(steps, 1);
        Ok(())
    })
}

#[test]
fn twos_repeat_100_batch_4_give_two_rows_per_replica() -> Result<()> {
    bounded(|| {
        let ds = Dataset::from_tensors(vec![Tensor::new(&[2f32], &Device::Cpu)?])
            .repeat(Some(100))
            .batch(4, false);
        let dist = distribute(ds, 2)?;
        let step = dist.iter().get_next()?;
        for element in step.values() {
            assert_eq!(element[0].to_vec2::<f32>()?, vec![vec![2.], vec![2.]]);
            assert_eq!(
                element[0].sqr()?.to_vec2::<f32>()?,
                vec![vec![4.], vec![4.]]
            );
        }
        assert_eq!(dist.iter().count(), 25);
        Ok(())
    })
}

#[test]
fn element_spec_has_unknown_batch_dimension_per_replica() -> Result<()> {
    bounded(|| {
        let ds = Dataset::from_tensors(vec![
            Tensor::new(&[1f32], &Device::Cpu)?,
            Tensor::new(&[2i64], &Device::Cpu)?,
        ])
        .repeat(Some(100))
        .batch(16, false);
        let dist = distribute(ds, 2)?;
        let want = vec![
            TensorSpec::new(vec![None, Some(1)], DType::F32),
            TensorSpec::new(vec![None, Some(1)], DType::I64),
        ];
        assert_eq!(
            dist.element_spec(),
            PerReplica::new(vec![want.clone(), want.clone()])
        );
        let it = dist.iter();
        assert_eq!(it.element_spec(), dist.element_spec());
        Ok(())
    })
}

#[test]
fn an_even_split_with_drop_remainder_gives_a_static_per_replica_batch() -> Result<()> {
    bounded(|| {
        let ds = |global: usize, drop_remainder: bool| -> Result<Dataset> {
            Ok(
                Dataset::from_tensors(vec![Tensor::new(&[1f32, 2., 3.], &Device::Cpu)?])
                    .repeat(Some(40))
                    .batch(global, drop_remainder),
            )
        };
        let outer = |dist: &DistributedDataset| -> Vec<Option<usize>> {
            dist.element_spec()
                .values()
                .iter()
                .map(|spec| spec[0].shape[0])
                .collect()
        };
        // 2 pipelines × 2 replicas, global 8: 2 rows each, known before the first step, and
        // every element has them.
        for (pipeline, policy) in [(0, AutoShardPolicy::Auto), (1, AutoShardPolicy::Data)] {
            let dist = DistributedDataset::from_dataset(
                ds(8, true)?,
                DistributeOptions::with_policy(policy),
                4,
                2,
                pipeline,
            )?;
            assert_eq!(outer(&dist), [Some(2), Some(2)], "{policy:?}");
            assert_eq!(dist.element_spec().values()[0][0].shape, [Some(2), Some(3)]);
            for element in dist.iter().take(3) {
                for replica in element?.values() {
                    assert_eq!(replica[0].dims(), [2, 3]);
                }
            }
        }
        // Unknown where it is: an uneven split, or a last batch that may be partial.
        let one = |global, drop_remainder| -> Result<Vec<Option<usize>>> {
            Ok(outer(&DistributedDataset::from_dataset(
                ds(global, drop_remainder)?,
                DistributeOptions::default(),
                2,
                1,
                0,
            )?))
        };
        assert_eq!(one(7, true)?, [None, None]);
        assert_eq!(one(8, false)?, [None, None]);
        assert_eq!(one(8, true)?, [Some(4), Some(4)]);
        Ok(())
    })
}

#[test]
fn partial_batch_of_6_of_global_8_splits_4_and_2() -> Result<()> {
    bounded(|| {
        let dist = distribute(Dataset::range(0, 14, 1).batch(8, false), 2)?;
        let steps = collect_ints(&dist)?;
        assert_eq!(
            steps,
            vec![
                vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]],
                vec![vec![8, 9, 10, 11], vec![12, 13]],
            ]
        );
        Ok(())
    })
}

#[test]
fn uneven_global_batch_gives_earlier_replicas_more() -> Result<()> {
    bounded(|| {
        // Global batch 7 over 4 replicas: 2, 2, 2, 1.
        let dist = distribute(Dataset::range(0, 7, 1).batch(7, false), 4)?;
        let steps = collect_ints(&dist)?;
        assert_eq!(
            steps,
            vec![vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6]]]
        );
        Ok(())
    })
}

#[test]
fn one_replica_passes_batches_through() -> Result<()> {
    bounded(|| {
        let dist = distribute(Dataset::range(0, 5, 1).batch(4, false), 1)?;
        assert!(!dist.is_rebatched());
        assert_eq!(
            collect_ints(&dist)?,
            vec![vec![vec![0, 1, 2, 3]], vec![vec![4]]]
        );
        Ok(())
    })
}

#[test]
fn distributed_dataset_is_reiterable_and_resumable() -> Result<()> {
    bounded(|| {
        let ds = Dataset::range(0, 40, 1).shuffle(16, 7).batch(4, false);
        let dist = distribute(ds, 2)?;
        let epoch1 = collect_ints(&dist)?;
        let epoch2 = collect_ints(&dist)?;
        assert_eq!(epoch1.len(), 10);
        assert_ne!(epoch1, epoch2, "each epoch reshuffles");
        // Resume the first epoch of a fresh copy at step 4 (checkpoint restore).
        let again = distribute(Dataset::range(0, 40, 1).shuffle(16, 7).batch(4, false), 2)?;
        let mut it = again.iter_at(IteratorPosition {
            steps: 4,
            elements: 8,
        })?;
        assert_eq!(it.position().steps, 4);
        assert_eq!(replica_ints(&it.get_next()?), epoch1[4]);
        let too_far = again.iter_at(IteratorPosition {
            steps: 11,
            elements: 0,
        });
        assert!(matches!(too_far, Err(DataError::InvalidArgument { .. })));
        Ok(())
    })
}

#[test]
fn data_1_same_seed_same_batches_different_seed_different() -> Result<()> {
    bounded(|| {
        let pipeline = |seed| {
            Dataset::range(0, 200, 1)
                .shuffle(64, seed)
                .repeat(Some(2))
                .batch(8, false)
        };
        let a = collect_ints(&distribute(pipeline(42), 2)?)?;
        let b = collect_ints(&distribute(pipeline(42), 2)?)?;
        let c = collect_ints(&distribute(pipeline(43), 2)?)?;
        assert_eq!(a, b, "DATA-1: same seed, same batches in the same order");
        assert_ne!(a, c, "a different seed gives a different order");
        // Each repetition is a permutation of the range, and the two differ.
        let flat: Vec<i64> = a.iter().flatten().flatten().copied().collect();
        let (first, second) = flat.split_at(200);
        assert_ne!(first, second);
        for half in [first, second] {
            let mut sorted = half.to_vec();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..200).collect::<Vec<_>>());
        }
        Ok(())
    })
}

#[test]
fn data_1_shuffle_without_reshuffle_repeats_the_same_order() -> Result<()> {
    bounded(|| {
        let ds = Dataset::range(0, 30, 1)
            .shuffle_with_options(30, 5, false)
            .batch(6, false);
        let dist = distribute(ds, 2)?;
        assert_eq!(collect_ints(&dist)?, collect_ints(&dist)?);
        Ok(())
    })
}

#[test]
fn failing_map_surfaces_as_an_error_and_iteration_goes_on() -> Result<()> {
    bounded(|| {
        let ds = Dataset::range(0, 10, 1)
            .map(|e| {
                if e[0].to_scalar::<i64>()? == 5 {
                    Err(DataError::function("element 5 is poisoned"))
                } else {
                    Ok(e)
                }
            })?
            .batch(2, false);
        let dist = distribute(ds, 2)?;
        let mut it = dist.iter();
        assert_eq!(replica_ints(&it.get_next()?), vec![vec![0], vec![1]]);
        assert_eq!(replica_ints(&it.get_next()?), vec![vec![2], vec![3]]);
        let err = it.get_next().unwrap_err();
        assert!(
            matches!(&err, DataError::Function(m) if m.contains("poisoned")),
            "{err}"
        );
        assert_eq!(replica_ints(&it.get_next()?), vec![vec![6], vec![7]]);
        Ok(())
    })
}

#[test]
fn panicking_map_in_the_producer_is_an_error_not_a_panic() -> Result<()> {
    bounded(|| {
        let ds = Dataset::range(0, 10, 1)
            .map_with_spec(vec![TensorSpec::new(vec![], DType::I64)], |e| {
                if e[0].to_scalar::<i64>()? == 3 {
                    panic!("bug in a user function");
                }
                Ok(e)
            })
            .batch(2, false);
        let dist = distribute(ds, 2)?;
        let results: Vec<_> = dist.iter().collect();
        assert!(matches!(
            results.last(),
            Some(Err(DataError::Producer(m))) if m.contains("bug in a user function")
        ));
        Ok(())
    })
}

#[test]
fn invalid_arguments_are_clear_errors() -> Result<()> {
    bounded(|| {
        let batched = || Dataset::range(0, 8, 1).batch(2, false);
        let opts = DistributeOptions::default();
        let err = DistributedDataset::from_dataset(batched(), opts, 3, 2, 0).unwrap_err();
        assert!(err.to_string().contains("same number of replicas"), "{err}");
        let err = DistributedDataset::from_dataset(batched(), opts, 2, 2, 2).unwrap_err();
        assert!(err.to_string().contains("input_pipeline_id"), "{err}");
        let err = DistributedDataset::from_dataset(
            Dataset::range(0, 8, 1).batch(0, false),
            opts,
            2,
            1,
            0,
        )
        .unwrap_err();
        assert!(err.to_string().contains("batch_size"), "{err}");
        let err = DistributedDataset::from_dataset(
            batched(),
            DistributeOptions {
                per_replica_buffer_size: 0,
                ..opts
            },
            2,
            1,
            0,
        )
        .unwrap_err();
        assert!(err.to_string().contains("per_replica_buffer_size"), "{err}");
        // A huge buffer is refused, not allocated.
        let err = DistributedDataset::from_dataset(
            batched(),
            DistributeOptions {
                per_replica_buffer_size: usize::MAX,
                ..opts
            },
            2,
            1,
            0,
        )
        .unwrap_err();
        assert!(err.to_string().contains("prefetch"), "{err}");
        Ok(())
    })
}

// ---- auto-sharding across input pipelines ----

#[test]
fn file_policy_gives_each_pipeline_whole_files() -> Result<()> {
    bounded(|| {
        let dir = TempDir::new("file-policy")?;
        let files = four_files(&dir)?;
        let mut seen = Vec::new();
        for id in 0..2 {
            let ds = Dataset::csv_files(files.clone(), CsvFormat::scalars(&[DType::I64]))
                .batch(2, false);
            let dist = DistributedDataset::from_dataset(
                ds,
                DistributeOptions::with_policy(AutoShardPolicy::File),
                2,
                2,
                id,
            )?;
            assert_eq!(dist.applied_shard_policy(), Some(AutoShardPolicy::File));
            assert_eq!(dist.num_local_replicas(), 1);
            seen.push(flat_ints(&dist)?);
        }
        // Pipeline 0 reads files 0 and 2 whole, pipeline 1 files 1 and 3.
        assert_eq!(seen[0], vec![0, 1, 2, 3, 20, 21, 22, 23]);
        assert_eq!(seen[1], vec![10, 11, 12, 13, 30, 31, 32, 33]);
        Ok(())
    })
}

#[test]
fn data_policy_gives_each_pipeline_every_other_element() -> Result<()> {
    bounded(|| {
        let dir = TempDir::new("data-policy")?;
        let files = four_files(&dir)?;
        for (id, want) in [
            (0, vec![0, 2, 10, 12, 20, 22, 30, 32]),
            (1, vec![1, 3, 11, 13, 21, 23, 31, 33]),
        ] {
            let ds = Dataset::csv_files(files.clone(), CsvFormat::scalars(&[DType::I64]))
                .batch(2, false);
            let dist = DistributedDataset::from_dataset(
                ds,
                DistributeOptions::with_policy(AutoShardPolicy::Data),
                2,
                2,
                id,
            )?;
            assert_eq!(dist.applied_shard_policy(), Some(AutoShardPolicy::Data));
            assert_eq!(flat_ints(&dist)?, want);
        }
        Ok(())
    })
}

#[test]
fn off_policy_gives_every_pipeline_everything() -> Result<()> {
    bounded(|| {
        let dir = TempDir::new("off-policy")?;
        let files = four_files(&dir)?;
        let all: Vec<i64> = (0..4)
            .flat_map(|f| (0..4).map(move |i| 10 * f + i))
            .collect();
        for id in 0..2 {
            let ds = Dataset::csv_files(files.clone(), CsvFormat::scalars(&[DType::I64]))
                .batch(2, false);
            let dist = DistributedDataset::from_dataset(
                ds,
                DistributeOptions::with_policy(AutoShardPolicy::Off),
                2,
                2,
                id,
            )?;
            assert_eq!(dist.applied_shard_policy(), Some(AutoShardPolicy::Off));
            assert_eq!(flat_ints(&dist)?, all);
        }
        Ok(())
    })
}

#[test]
fn auto_policy_picks_file_for_files_and_data_otherwise() -> Result<()> {
    bounded(|| {
        let dir = TempDir::new("auto-policy")?;
        let files = four_files(&dir)?;
        let opts = DistributeOptions::default();
        assert_eq!(opts.auto_shard_policy, AutoShardPolicy::Auto);
        let from_files =
            Dataset::csv_files(files.clone(), CsvFormat::scalars(&[DType::I64])).batch(2, false);
        let dist = DistributedDataset::from_dataset(from_files, opts, 2, 2, 0)?;
        assert_eq!(dist.applied_shard_policy(), Some(AutoShardPolicy::File));
        assert_eq!(flat_ints(&dist)?, vec![0, 1, 2, 3, 20, 21, 22, 23]);

        let in_memory = Dataset::range(0, 8, 1).batch(2, false);
        let dist = DistributedDataset::from_dataset(in_memory, opts, 2, 2, 1)?;
        assert_eq!(dist.applied_shard_policy(), Some(AutoShardPolicy::Data));
        assert_eq!(flat_ints(&dist)?, vec![1, 3, 5, 7]);

        // Fewer files than pipelines: AUTO falls back to DATA, FILE refuses.
        let two = Dataset::csv_files(files[..2].to_vec(), CsvFormat::scalars(&[DType::I64]))
            .batch(2, false);
        let dist = DistributedDataset::from_dataset(two.clone(), opts, 4, 4, 3)?;
        assert_eq!(dist.applied_shard_policy(), Some(AutoShardPolicy::Data));
        let err = DistributedDataset::from_dataset(
            two,
            DistributeOptions::with_policy(AutoShardPolicy::File),
            4,
            4,
            3,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                DataError::NotEnoughFiles {
                    num_files: 2,
                    num_input_pipelines: 4
                }
            ),
            "{err}"
        );
        Ok(())
    })
}

#[test]
fn file_policy_on_in_memory_data_falls_back_to_data_with_a_warning() -> Result<()> {
    bounded(|| {
        let log = CapturedLog::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(log.clone())
            .with_ansi(false)
            .finish();
        let dist = tracing::subscriber::with_default(subscriber, || {
            DistributedDataset::from_dataset(
                Dataset::range(0, 8, 1).batch(2, false),
                DistributeOptions::with_policy(AutoShardPolicy::File),
                2,
                2,
                0,
            )
        })?;
        assert_eq!(dist.applied_shard_policy(), Some(AutoShardPolicy::Data));
        assert_eq!(flat_ints(&dist)?, vec![0, 2, 4, 6]);
        let text = log.text();
        assert!(text.contains("WARN") && text.contains("DATA"), "{text}");
        Ok(())
    })
}

#[test]
fn two_pipelines_of_two_replicas_split_a_global_batch_of_7_as_tensorflow() -> Result<()> {
    bounded(|| {
        // TF's `batch_sizes_for_worker` example: two files of 7, FILE sharding, G = 7.
        let dir = TempDir::new("g7")?;
        let a = dir.write(
            "a.csv",
            &(0..7).map(|i| format!("{i}\n")).collect::<String>(),
        )?;
        let b = dir.write(
            "b.csv",
            &(100..107).map(|i| format!("{i}\n")).collect::<String>(),
        )?;
        let mut per_pipeline = Vec::new();
        for id in 0..2 {
            let ds = Dataset::csv_files(
                vec![a.clone(), b.clone()],
                CsvFormat::scalars(&[DType::I64]),
            )
            .batch(7, false);
            let dist = DistributedDataset::from_dataset(
                ds,
                DistributeOptions::with_policy(AutoShardPolicy::File),
                4,
                2,
                id,
            )?;
            per_pipeline.push(collect_ints(&dist)?);
        }
        assert_eq!(
            per_pipeline[0],
            vec![vec![vec![0, 1], vec![2, 3]], vec![vec![4, 5], vec![6]]]
        );
        assert_eq!(
            per_pipeline[1],
            vec![
                vec![vec![100, 101], vec![102]],
                vec![vec![103, 104], vec![105, 106]]
            ]
        );
        // Each global step (both pipelines) consumes exactly 7 elements.
        for step in 0..2 {
            let total: usize = per_pipeline
                .iter()
                .flat_map(|pipeline| pipeline[step].iter().map(Vec::len))
                .sum();
            assert_eq!(total, 7);
        }
        Ok(())
    })
}

#[test]
fn input_context_fields_and_per_replica_batch_size() -> Result<()> {
    let ctx = InputContext::new(2, 1, 4);
    assert_eq!(ctx.num_input_pipelines, 2);
    assert_eq!(ctx.input_pipeline_id, 1);
    assert_eq!(ctx.num_replicas_in_sync, 4);
    assert_eq!(ctx.get_per_replica_batch_size(64)?, 16);
    let err = ctx.get_per_replica_batch_size(65).unwrap_err();
    assert!(matches!(
        err,
        DataError::NotDivisible {
            global_batch_size: 65,
            num_replicas_in_sync: 4
        }
    ));
    assert!(err.to_string().contains("not divisible"), "{err}");
    assert_eq!(InputContext::default(), InputContext::new(1, 0, 1));
    Ok(())
}

#[test]
fn from_function_gets_each_pipelines_context_and_is_not_rebatched() -> Result<()> {
    bounded(|| {
        let calls: Arc<Mutex<Vec<InputContext>>> = Arc::default();
        let mut per_pipeline = Vec::new();
        for id in 0..2 {
            let calls = calls.clone();
            let dist = DistributedDataset::from_function(
                move |ctx: &InputContext| {
                    calls.lock().expect("lock").push(*ctx);
                    let per_replica = ctx.get_per_replica_batch_size(64)?;
                    assert_eq!(per_replica, 16);
                    // Batches of 3 stay batches of 3: nothing is rebatched.
                    Ok(Dataset::range(0, 16, 1)
                        .shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
                        .batch(3, false))
                },
                DistributeOptions::default(),
                4,
                2,
                id,
            )?;
            assert_eq!(dist.input_context(), InputContext::new(2, id, 4));
            assert_eq!(dist.num_local_replicas(), 2);
            assert!(!dist.is_rebatched());
            assert_eq!(dist.applied_shard_policy(), None);
            per_pipeline.push(collect_ints(&dist)?);
        }
        assert_eq!(
            *calls.lock().expect("lock"),
            vec![InputContext::new(2, 0, 4), InputContext::new(2, 1, 4)]
        );
        assert_eq!(
            per_pipeline[0],
            vec![
                vec![vec![0, 2, 4], vec![6, 8, 10]],
                vec![vec![12, 14], vec![]]
            ]
        );
        assert_eq!(
            per_pipeline[1],
            vec![
                vec![vec![1, 3, 5], vec![7, 9, 11]],
                vec![vec![13, 15], vec![]]
            ]
        );
        Ok(())
    })
}

#[test]
fn from_function_errors_are_returned() {
    let err = DistributedDataset::from_function(
        |ctx: &InputContext| {
            ctx.get_per_replica_batch_size(5)?;
            Ok(Dataset::range(0, 1, 1))
        },
        DistributeOptions::default(),
        2,
        1,
        0,
    )
    .unwrap_err();
    assert!(matches!(err, DataError::NotDivisible { .. }));
}

#[test]
fn distributed_types_are_send() {
    fn send<T: Send + 'static>() {}
    fn sync<T: Sync>() {}
    send::<Dataset>();
    sync::<Dataset>();
    send::<DistributedDataset>();
    sync::<DistributedDataset>();
    send::<cohort::data::DistributedIterator>();
}

// ---- helpers ----

/// Runs `body` on its own thread and fails if it takes longer than 60 s.
fn bounded(body: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(body());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(result) => result,
        Err(mpsc::RecvTimeoutError::Timeout) => anyhow::bail!("test timed out after 60 s"),
        Err(mpsc::RecvTimeoutError::Disconnected) => anyhow::bail!("test body panicked"),
    }
}

fn distribute(ds: Dataset, replicas: usize) -> Result<DistributedDataset, DataError> {
    DistributedDataset::from_dataset(ds, DistributeOptions::default(), replicas, 1, 0)
}

fn i64s(values: &[i64]) -> candle_core::Result<Tensor> {
    Tensor::new(values, &Device::Cpu)
}

fn replica_ints(step: &PerReplica<Element>) -> Vec<Vec<i64>> {
    step.values()
        .iter()
        .map(|e| e[0].to_vec1::<i64>().expect("a rank-1 i64 batch"))
        .collect()
}

fn collect_ints(dist: &DistributedDataset) -> Result<Vec<Vec<Vec<i64>>>> {
    dist.iter().map(|step| Ok(replica_ints(&step?))).collect()
}

fn flat_ints(dist: &DistributedDataset) -> Result<Vec<i64>> {
    Ok(collect_ints(dist)?
        .into_iter()
        .flatten()
        .flatten()
        .collect())
}

/// Four CSV files of one i64 column: file `f` holds `10f .. 10f + 3`.
fn four_files(dir: &TempDir) -> Result<Vec<PathBuf>> {
    (0..4)
        .map(|f| {
            let body: String = (0..4).map(|i| format!("{}\n", 10 * f + i)).collect();
            dir.write(&format!("part-{f}.csv"), &body)
        })
        .collect()
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Result<Self> {
        let path =
            std::env::temp_dir().join(format!("cohort-data-test-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&path)?;
        Ok(Self(path))
    }

    fn write(&self, name: &str, body: &str) -> Result<PathBuf> {
        let path = self.0.join(name);
        std::fs::write(&path, body)?;
        Ok(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Clone, Default)]
struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl CapturedLog {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLog {
    type Writer = CapturedLog;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
