//! `scope()` and variables: mirrored per replica inside `Mirrored.scope`, one host copy under
//! `CentralStorage`, plain outside any scope; updates keep mirrored components equal.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use cohort::strategy::{
    CentralStorage, DefaultStrategy, Mirrored, OneDevice, ReduceOp, Strategy, StrategyError,
    StrategyExt,
};
use cohort::variable::{Placement, Variable, VariableAggregation, VariableError};

fn t(values: &[f32]) -> Tensor {
    Tensor::new(values, &Device::Cpu).expect("tensor")
}

fn components(v: &Variable) -> Vec<Vec<f32>> {
    v.components()
        .iter()
        .map(|c| c.to_vec1::<f32>().expect("f32 vector"))
        .collect()
}

#[test]
fn variable_inside_mirrored_scope_has_one_component_per_replica() -> Result<()> {
    let s = Mirrored::new(2)?;
    let inside = {
        let _scope = s.scope();
        Variable::new("inside", t(&[1., 2.]))?
    };
    let outside = Variable::new("outside", t(&[1., 2.]))?;

    assert!(inside.is_mirrored());
    assert_eq!(inside.num_components(), 2);
    assert!(
        matches!(inside.placement(), Placement::Mirrored { strategy, devices }
        if *strategy == s.id() && devices.len() == 2)
    );
    assert!(!outside.is_mirrored());
    assert_eq!(outside.num_components(), 1);
    assert!(matches!(outside.placement(), Placement::Local { .. }));
    Ok(())
}

#[test]
fn cross_replica_updates_apply_to_every_component() -> Result<()> {
    let s = Mirrored::new(2)?;
    let v = {
        let _scope = s.scope();
        Variable::new("v", t(&[1., 2.]))?
    };
    v.assign_add(&t(&[1., 1.]))?;
    assert_eq!(components(&v), vec![vec![2., 3.]; 2]);
    v.assign_sub(&t(&[0.5, 0.5]))?;
    assert_eq!(components(&v), vec![vec![1.5, 2.5]; 2]);
    v.assign(&t(&[7., 8.]))?;
    assert_eq!(components(&v), vec![vec![7., 8.]; 2]);
    assert_eq!(v.read_value().to_vec1::<f32>()?, vec![7., 8.]);
    Ok(())
}

#[test]
fn replica_updates_are_aggregated_and_keep_components_equal() -> Result<()> {
    let s = Mirrored::new(2)?;
    let (sum, mean, first) = {
        let _scope = s.scope();
        (
            Variable::builder("sum", t(&[0.]))
                .aggregation(VariableAggregation::Sum)
                .build()?,
            Variable::builder("mean", t(&[0.]))
                .aggregation(VariableAggregation::Mean)
                .build()?,
            Variable::builder("first", t(&[0.]))
                .aggregation(VariableAggregation::OnlyFirstReplica)
                .build()?,
        )
    };
    let vars = (sum.clone(), mean.clone(), first.clone());
    let out = s.run(
        move |ctx, ()| -> Result<Vec<f32>, StrategyError> {
            let (sum, mean, first) = &vars;
            // Replica 0 adds 1, replica 1 adds 3.
            let delta = t(&[1. + 2. * ctx.replica_id_in_sync_group() as f32]);
            sum.assign_add(&delta)?;
            mean.assign_add(&delta)?;
            first.assign_add(&delta)?;
            // Each replica reads its own component.
            Ok(sum.read_value().to_vec1::<f32>()?)
        },
        (),
    )?;
    assert_eq!(out.transpose()?.into_values(), vec![vec![4.], vec![4.]]);
    assert_eq!(components(&sum), vec![vec![4.]; 2]);
    assert_eq!(components(&mean), vec![vec![2.]; 2]);
    assert_eq!(components(&first), vec![vec![1.]; 2]);
    Ok(())
}

#[test]
fn replica_update_without_aggregation_is_an_error() -> Result<()> {
    let s = Mirrored::new(2)?;
    let v = {
        let _scope = s.scope();
        Variable::new("v", t(&[0.]))?
    };
    let var = v.clone();
    let out = s.run(move |_ctx, ()| var.assign_add(&t(&[1.])), ())?;
    for r in out.into_values() {
        assert!(
            matches!(r, Err(VariableError::AggregationRequired { .. })),
            "{r:?}"
        );
    }
    assert_eq!(components(&v), vec![vec![0.]; 2]);
    Ok(())
}

#[test]
fn update_in_sync_applies_all_reduced_gradients_on_each_replica() -> Result<()> {
    let s = Mirrored::new(2)?;
    let w = {
        let _scope = s.scope();
        Variable::new("w", t(&[1., 1.]))?
    };
    let var = w.clone();
    s.run(
        move |ctx, ()| -> Result<(), StrategyError> {
            let grad = t(&[ctx.replica_id_in_sync_group() as f32, 1.]);
            let grad = ctx.all_reduce(ReduceOp::Sum, &grad)?;
            var.update_in_sync(|current| current - (&grad * 0.5)?)?;
            Ok(())
        },
        (),
    )?
    .transpose()?;
    assert_eq!(components(&w), vec![vec![0.5, 0.]; 2]);
    Ok(())
}

#[test]
fn central_storage_keeps_one_host_copy_updated_once_per_step() -> Result<()> {
    let s = CentralStorage::new(2)?;
    let v = {
        let _scope = s.scope();
        Variable::builder("c", t(&[10.]))
            .aggregation(VariableAggregation::Sum)
            .build()?
    };
    assert_eq!(v.num_components(), 1);
    assert!(matches!(
        v.placement(),
        Placement::Central {
            num_replicas: 2,
            ..
        }
    ));
    let var = v.clone();
    let seen = s.run(
        move |_ctx, ()| -> Result<Vec<f32>, StrategyError> {
            var.assign_add(&t(&[1.]))?;
            // Every replica sees the single write (1 + 1 summed, applied once).
            Ok(var.read_value().to_vec1::<f32>()?)
        },
        (),
    )?;
    assert_eq!(seen.transpose()?.into_values(), vec![vec![12.], vec![12.]]);
    assert_eq!(components(&v), vec![vec![12.]]);

    let var = v.clone();
    s.run(
        move |_ctx, ()| var.update_in_sync(|c| c.affine(1.0, -2.0)),
        (),
    )?
    .transpose()?;
    assert_eq!(components(&v), vec![vec![10.]]);
    Ok(())
}

#[test]
fn one_replica_strategies_make_plain_variables() -> Result<()> {
    for s in [
        Box::new(DefaultStrategy::new()) as Box<dyn Strategy>,
        Box::new(OneDevice::new("cpu:0")?),
    ] {
        let v = {
            let _scope = s.scope();
            Variable::new("p", t(&[1.]))?
        };
        assert_eq!(v.num_components(), 1);
        assert!(matches!(v.placement(), Placement::Local { .. }));
        let var = v.clone();
        s.run(move |_ctx, ()| var.assign_add(&t(&[1.])), ())?
            .transpose()?;
        assert_eq!(components(&v), vec![vec![2.]]);
    }
    Ok(())
}

#[test]
fn updates_must_keep_shape_and_dtype() -> Result<()> {
    let v = Variable::new("v", t(&[1., 2.]))?;
    assert!(matches!(
        v.assign(&t(&[1.])),
        Err(VariableError::ShapeMismatch { .. })
    ));
    let ints = Tensor::new(&[1i64, 2], &Device::Cpu)?;
    assert!(matches!(
        v.assign_add(&ints),
        Err(VariableError::DTypeMismatch {
            expected: DType::F32,
            got: DType::I64,
            ..
        })
    ));
    assert_eq!(v.read_value().to_vec1::<f32>()?, vec![1., 2.]);
    Ok(())
}

#[test]
fn scopes_nest_for_one_strategy_and_refuse_a_second() -> Result<()> {
    let a = Mirrored::new(2)?;
    let b = Mirrored::new(2)?;
    let _outer = a.scope();
    {
        let _inner = a.scope();
        assert!(Variable::new("x", t(&[0.]))?.is_mirrored());
    }
    assert!(matches!(
        b.try_scope(),
        Err(StrategyError::Variable(
            VariableError::MixedStrategies { .. }
        ))
    ));
    assert!(Variable::new("y", t(&[0.]))?.is_mirrored());
    drop(_outer);
    assert!(!Variable::new("z", t(&[0.]))?.is_mirrored());
    Ok(())
}

#[test]
fn read_value_of_a_trainable_variable_can_be_differentiated() -> Result<()> {
    let s = Mirrored::new(2)?;
    let w = {
        let _scope = s.scope();
        Variable::new("w", t(&[1., 2.]))?
    };
    let var = w.clone();
    let grads = s.run(
        move |ctx, ()| -> Result<Vec<f32>, StrategyError> {
            let value = var.read_value();
            let scale = 1. + ctx.replica_id_in_sync_group() as f32;
            let loss = (value.sqr()? * scale as f64)?.sum_all()?;
            let grads = loss.backward()?;
            let g = grads.get(&value).expect("the variable is in the graph");
            Ok(g.to_vec1::<f32>()?)
        },
        (),
    )?;
    // d/dw sum(scale * w^2) = 2 * scale * w
    assert_eq!(
        grads.transpose()?.into_values(),
        vec![vec![2., 4.], vec![4., 8.]]
    );

    // Updates store detached copies: a snapshot read before an update keeps its value.
    let before = w.read_value();
    w.assign_add(&t(&[1., 1.]))?;
    assert_eq!(before.to_vec1::<f32>()?, vec![1., 2.]);
    assert_eq!(w.read_value().to_vec1::<f32>()?, vec![2., 3.]);
    Ok(())
}
