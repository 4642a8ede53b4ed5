//! Prometheus metrics of a role process: what is counted, and the HTTP endpoint that serves it
//! (`/metrics` in the Prometheus text format, `/healthz`), on the address of the
//! `metrics_addr` key (off by default; `cohort launch` turns it on for every task).
//!
//! Two kinds of values, one registry:
//! - [`Instruments`]: counters and histograms of things nothing else counts (closures run by a
//!   worker, step time, bytes sent to and received from the parameter servers, peers declared
//!   dead). They are process-wide atomics, always counted (an increment costs a few
//!   nanoseconds), exposed only when the endpoint is on.
//! - [`Reading`]s: counters that the roles keep already (the coordinator's ledger and control
//!   counters, a parameter server's push counters), read at scrape time by the exposition's
//!   refresh hook (given by the bootstrap, which knows the roles) rather than counted twice.
//!
//! The chief's endpoint also serves its status page (`/status`, `/status.json`) through a
//! [`StatusSource`] hook given by the bootstrap ([`crate::status`] writes the page); other
//! roles answer 404 there.
//!
//! A MultiWorkerMirrored worker's endpoint, its group's metrics and its status page are made
//! here too (`group_status`), from plain values the strategy gives.
//!
//! Nearly a leaf module: the only other part of cohort it names is [`crate::status`] (a leaf
//! itself), for that status page. The text is written by the `prometheus-client` crate; the
//! server ([`serve`]) is hyper's HTTP/1.1, bounded, GET only.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

mod group_status;
mod http;
mod process;

pub(crate) use group_status::{
    addr_from_env, publish_group_status, record_group, serve_group, GroupEndpointError,
};

pub use http::{
    get as http_get, serve, MetricsServer, CONNECTIONS_MAX, GET_BODY_BYTES_MAX, REQUEST_BYTES_MAX,
    REQUEST_TIMEOUT,
};

/// Counters and histograms counted where things happen (see the module docs).
#[derive(Debug)]
pub struct Instruments {
    /// Peers this process's gateway declared dead (silent past the detection budget, or
    /// superseded by a newer incarnation).
    pub detections: Counter,
    /// Worker: closures run to the end (value computed and gradients pushed).
    pub closures_run: Counter,
    /// Worker: time of one closure, compute and push, in seconds.
    pub step_seconds: Histogram,
    /// Worker: tensor bytes received from parameter servers (pulls).
    pub worker_pulled_bytes: Counter,
    /// Worker: tensor bytes sent to parameter servers (pushes).
    pub worker_pushed_bytes: Counter,
    /// Parameter server: tensor bytes sent to workers in answer to pulls.
    pub ps_pulled_bytes: Counter,
    /// Parameter server: tensor bytes received in pushes.
    pub ps_pushed_bytes: Counter,
    /// Chief: time from a closure's dispatch to a worker to its commit, in seconds (the
    /// attempt that committed: a re-dispatched closure counts from its last dispatch).
    /// Observed through [`Instruments::observe_chief_step`].
    pub chief_step_seconds: Histogram,
    /// The total in microseconds and the count of this process's step times (a chief's
    /// closures, or a MultiWorkerMirrored worker's steps), readable (the histograms' own are
    /// not): the status page's mean step time.
    step_totals: (AtomicU64, AtomicU64),
    /// Chief: checkpoints written, and the time each save took, in seconds.
    pub checkpoint_save_seconds: Histogram,
    /// Chief: the size of the newest checkpoint written, in bytes.
    pub checkpoint_bytes: Gauge,
    /// Evaluator: checkpoints evaluated.
    pub evaluations: Counter,
    /// Evaluator: checkpoints skipped because they did not verify.
    pub evaluations_skipped: Counter,
    /// Evaluator: time of one evaluation (reading the checkpoint included), in seconds.
    pub evaluation_seconds: Histogram,
    /// Evaluator: the step of the newest checkpoint evaluated (-1 before the first).
    pub evaluated_step: Gauge,
    /// MultiWorkerMirrored worker: its group's generation (one per formation; 0 before the first).
    pub group_generation: Gauge,
    /// MultiWorkerMirrored worker: the workers of its group.
    pub group_workers: Gauge,
    /// MultiWorkerMirrored worker: the steps the group completed, as agreed at the last step
    /// boundary or re-forming.
    pub group_step: Gauge,
    /// MultiWorkerMirrored worker: time from one step boundary to the next, in seconds.
    pub group_step_seconds: Histogram,
    /// MultiWorkerMirrored worker: re-formings after lost workers.
    pub group_reformed: Counter,
    /// MultiWorkerMirrored worker: workers admitted to its group (restarted or added).
    pub group_admitted: Counter,
    /// MultiWorkerMirrored worker: workers that left its group on a preemption notice.
    pub group_departed: Counter,
}

static INSTRUMENTS: LazyLock<Instruments> = LazyLock::new(|| Instruments {
    detections: Counter::default(),
    closures_run: Counter::default(),
    // 100µs to ~100s.
    step_seconds: Histogram::new(exponential_buckets(1e-4, 2.0, 21)),
    worker_pulled_bytes: Counter::default(),
    worker_pushed_bytes: Counter::default(),
    ps_pulled_bytes: Counter::default(),
    ps_pushed_bytes: Counter::default(),
    // 100µs to ~100s, as the workers' step time.
    chief_step_seconds: Histogram::new(exponential_buckets(1e-4, 2.0, 21)),
    step_totals: (AtomicU64::new(0), AtomicU64::new(0)),
    // 1ms to ~500s.
    checkpoint_save_seconds: Histogram::new(exponential_buckets(1e-3, 2.0, 20)),
    checkpoint_bytes: Gauge::default(),
    evaluations: Counter::default(),
    evaluations_skipped: Counter::default(),
    // 1ms to ~500s, as a checkpoint save.
    evaluation_seconds: Histogram::new(exponential_buckets(1e-3, 2.0, 20)),
    evaluated_step: {
        let gauge = Gauge::default();
        gauge.set(-1);
        gauge
    },
    group_generation: Gauge::default(),
    group_workers: Gauge::default(),
    group_step: Gauge::default(),
    // 100µs to ~100s, as a worker's step time.
    group_step_seconds: Histogram::new(exponential_buckets(1e-4, 2.0, 21)),
    group_reformed: Counter::default(),
    group_admitted: Counter::default(),
    group_departed: Counter::default(),
});

/// This process's instruments.
pub fn instruments() -> &'static Instruments {
    &INSTRUMENTS
}

impl Instruments {
    /// Chief: one closure committed `took` after its dispatch.
    pub fn observe_chief_step(&self, took: Duration) {
        self.chief_step_seconds.observe(took.as_secs_f64());
        self.add_step_total(took);
    }

    /// MultiWorkerMirrored worker: one step took `took` (boundary to boundary).
    pub fn observe_group_step(&self, took: Duration) {
        self.group_step_seconds.observe(took.as_secs_f64());
        self.add_step_total(took);
    }

    fn add_step_total(&self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.step_totals.0.fetch_add(micros, Ordering::Relaxed);
        self.step_totals.1.fetch_add(1, Ordering::Relaxed);
    }

    /// The total time (microseconds) and the count of the steps observed so far (a chief's
    /// closures, or a MultiWorkerMirrored worker's steps).
    pub fn step_totals(&self) -> (u64, u64) {
        (
            self.step_totals.0.load(Ordering::Relaxed),
            self.step_totals.1.load(Ordering::Relaxed),
        )
    }
}

/// Which role's metrics a process exposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The chief (coordinator).
    Chief,
    /// A worker.
    Worker,
    /// A parameter server.
    Ps,
    /// An evaluator.
    Evaluator,
}

impl Role {
    fn label(self) -> &'static str {
        match self {
            Role::Chief => "chief",
            Role::Worker => "worker",
            Role::Ps => "ps",
            Role::Evaluator => "evaluator",
        }
    }
}

/// A value read at scrape time from a counter a role keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// The metric's name (a counter's without `_total`: the encoder adds it).
    pub name: &'static str,
    /// Its help text.
    pub help: &'static str,
    /// A counter (only grows) or a gauge.
    pub kind: ReadingKind,
}

/// The kind and value of a [`Reading`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReadingKind {
    /// A count that only grows.
    Counter(u64),
    /// A value that goes up and down.
    Gauge(f64),
}

impl Reading {
    /// A counter reading.
    pub fn counter(name: &'static str, help: &'static str, value: u64) -> Self {
        Self {
            name,
            help,
            kind: ReadingKind::Counter(value),
        }
    }

    /// A gauge reading.
    pub fn gauge(name: &'static str, help: &'static str, value: f64) -> Self {
        Self {
            name,
            help,
            kind: ReadingKind::Gauge(value),
        }
    }
}

/// What a refresh hook returns: the readings of this scrape (none if the role did not
/// answer in time).
pub type ReadingsFuture = Pin<Box<dyn Future<Output = Vec<Reading>> + Send>>;
/// Reads the role's own counters at scrape time.
pub type Refresh = Arc<dyn Fn() -> ReadingsFuture + Send + Sync>;

/// Which form of the status page is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFormat {
    /// `/status`: the HTML page.
    Html,
    /// `/status.json`: the same data as JSON.
    Json,
}

/// What a status hook returns: the page's text (`None` if the role did not answer in time).
pub type StatusFuture = Pin<Box<dyn Future<Output = Option<String>> + Send>>;
/// Makes the status page at request time (the chief's only).
pub type StatusSource = Arc<dyn Fn(StatusFormat) -> StatusFuture + Send + Sync>;

/// Bound on a refresh hook: a role that does not answer in time is scraped without its
/// readings (the instruments still are).
pub const REFRESH_TIMEOUT: Duration = Duration::from_secs(2);

/// The readings of the last refresh, encoded by the registry.
#[derive(Debug, Default)]
struct Readings(Mutex<Vec<Reading>>);

impl Collector for Readings {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let readings = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for reading in readings.iter() {
            match reading.kind {
                ReadingKind::Counter(value) => {
                    let counter = ConstCounter::new(value);
                    let metric = encoder.encode_descriptor(
                        reading.name,
                        reading.help,
                        None,
                        counter.metric_type(),
                    )?;
                    counter.encode(metric)?;
                }
                ReadingKind::Gauge(value) => {
                    let gauge = ConstGauge::new(value);
                    let metric = encoder.encode_descriptor(
                        reading.name,
                        reading.help,
                        None,
                        gauge.metric_type(),
                    )?;
                    gauge.encode(metric)?;
                }
            }
        }
        Ok(())
    }
}

/// One process's metrics: its registry, and the hook that reads its role's counters.
pub struct Exposition {
    registry: Registry,
    readings: Arc<Readings>,
    refresh: Option<Refresh>,
    status: Option<StatusSource>,
    /// Serialises scrapes, so that the readings encoded are those of the same scrape.
    scrape: tokio::sync::Mutex<()>,
}

impl fmt::Debug for Exposition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exposition").finish_non_exhaustive()
    }
}

impl Exposition {
    /// The metrics of `role` `index` running as incarnation `incarnation`: the instruments that
    /// role counts, and `refresh` for the counters it keeps itself.
    pub fn new(role: Role, index: u32, incarnation: u64, refresh: Option<Refresh>) -> Self {
        let mut registry = Self::registry_of(role, index, incarnation);
        let m = instruments();
        match role {
            Role::Worker => {
                registry.register(
                    "cohort_worker_closures_run",
                    "Closures this worker ran to the end (computed and pushed)",
                    m.closures_run.clone(),
                );
                registry.register(
                    "cohort_worker_step_seconds",
                    "Time of one closure on this worker, compute and push",
                    m.step_seconds.clone(),
                );
                registry.register(
                    "cohort_worker_pulled_bytes",
                    "Tensor bytes this worker received from parameter servers",
                    m.worker_pulled_bytes.clone(),
                );
                registry.register(
                    "cohort_worker_pushed_bytes",
                    "Tensor bytes this worker sent to parameter servers",
                    m.worker_pushed_bytes.clone(),
                );
            }
            Role::Ps => {
                registry.register(
                    "cohort_ps_pulled_bytes",
                    "Tensor bytes this parameter server sent in answer to pulls",
                    m.ps_pulled_bytes.clone(),
                );
                registry.register(
                    "cohort_ps_pushed_bytes",
                    "Tensor bytes this parameter server received in pushes",
                    m.ps_pushed_bytes.clone(),
                );
            }
            Role::Chief => {
                registry.register(
                    "cohort_chief_step_seconds",
                    "Time from a closure's dispatch to a worker to its commit at the chief",
                    m.chief_step_seconds.clone(),
                );
                registry.register(
                    "cohort_checkpoint_save_seconds",
                    "Time of one checkpoint save by the chief",
                    m.checkpoint_save_seconds.clone(),
                );
                registry.register(
                    "cohort_checkpoint_bytes",
                    "Size of the newest checkpoint the chief wrote",
                    m.checkpoint_bytes.clone(),
                );
            }
            Role::Evaluator => {
                registry.register(
                    "cohort_evaluator_evaluations",
                    "Checkpoints this evaluator evaluated",
                    m.evaluations.clone(),
                );
                registry.register(
                    "cohort_evaluator_skipped",
                    "Checkpoints this evaluator skipped because they did not verify",
                    m.evaluations_skipped.clone(),
                );
                registry.register(
                    "cohort_evaluator_evaluation_seconds",
                    "Time of one evaluation, reading the checkpoint included",
                    m.evaluation_seconds.clone(),
                );
                registry.register(
                    "cohort_evaluator_step",
                    "Step of the newest checkpoint this evaluator evaluated (-1 before the first)",
                    m.evaluated_step.clone(),
                );
            }
        }
        Self::with_registry(registry, refresh)
    }

    /// The metrics of a MultiWorkerMirrored worker (`role`: the chief or a worker, `index`)
    /// running as incarnation `incarnation`: its group's generation, workers and step, the time
    /// between step boundaries, and the re-formings, admissions and departures it saw.
    pub fn for_group(role: Role, index: u32, incarnation: u64) -> Self {
        let mut registry = Self::registry_of(role, index, incarnation);
        let m = instruments();
        registry.register(
            "cohort_group_generation",
            "The generation of this worker's group: one per formation (0 before the first forms)",
            m.group_generation.clone(),
        );
        registry.register(
            "cohort_group_workers",
            "The workers of this worker's group",
            m.group_workers.clone(),
        );
        registry.register(
            "cohort_group_step",
            "Steps the group completed, as agreed at the last step boundary or re-forming",
            m.group_step.clone(),
        );
        registry.register(
            "cohort_group_step_seconds",
            "Time from one step boundary of this worker to the next",
            m.group_step_seconds.clone(),
        );
        registry.register(
            "cohort_group_reformed",
            "Re-formings of this worker's group after lost workers",
            m.group_reformed.clone(),
        );
        registry.register(
            "cohort_group_admitted",
            "Workers admitted to this worker's group (restarted or added)",
            m.group_admitted.clone(),
        );
        registry.register(
            "cohort_group_departed",
            "Workers that left this worker's group on a preemption notice",
            m.group_departed.clone(),
        );
        Self::with_registry(registry, None)
    }

    /// A registry with what every process exposes: its incarnation, by role and index, and
    /// the peers it declared dead.
    fn registry_of(role: Role, index: u32, incarnation: u64) -> Registry {
        let mut registry = Registry::default();
        let labels = vec![
            ("role".to_string(), role.label().to_string()),
            ("index".to_string(), index.to_string()),
        ];
        let incarnations = Family::<Vec<(String, String)>, Gauge<i64>>::default();
        // Incarnations are milliseconds since 1970: they fit an i64 for 290 million years.
        incarnations
            .get_or_create(&labels)
            .set(i64::try_from(incarnation).unwrap_or(i64::MAX));
        registry.register(
            "cohort_incarnation",
            "This process's incarnation (FENCE-1), by role and index",
            incarnations,
        );
        registry.register(
            "cohort_detections",
            "Peers this process declared dead (silent past the detection budget, or superseded)",
            instruments().detections.clone(),
        );
        let build = Family::<Vec<(String, String)>, Gauge<i64>>::default();
        build
            .get_or_create(&vec![
                ("version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
                ("nccl".to_string(), cfg!(feature = "nccl").to_string()),
            ])
            .set(1);
        registry.register(
            "cohort_build_info",
            "cohort's version and features in this binary (always 1)",
            build,
        );
        registry.register_collector(Box::new(process::ProcessCollector));
        registry
    }

    fn with_registry(mut registry: Registry, refresh: Option<Refresh>) -> Self {
        let readings = Arc::new(Readings::default());
        registry.register_collector(Box::new(Arc::clone(&readings)));
        Self {
            registry,
            readings,
            refresh,
            status: None,
            scrape: tokio::sync::Mutex::new(()),
        }
    }

    /// Serves the status page made by `status` too (`/status`, `/status.json`).
    pub fn with_status(mut self, status: StatusSource) -> Self {
        self.status = Some(status);
        self
    }

    /// The status page in `format` (within [`REFRESH_TIMEOUT`]): `None` when this role serves
    /// none, `Some(None)` when it did not answer in time.
    pub async fn status(&self, format: StatusFormat) -> Option<Option<String>> {
        let status = self.status.as_ref()?;
        Some(
            tokio::time::timeout(REFRESH_TIMEOUT, status(format))
                .await
                .ok()
                .flatten(),
        )
    }

    /// The metrics now, in the Prometheus text format: the role's counters are read first
    /// (within [`REFRESH_TIMEOUT`]).
    pub async fn render(&self) -> String {
        let _one_at_a_time = self.scrape.lock().await;
        if let Some(refresh) = &self.refresh {
            let fresh = tokio::time::timeout(REFRESH_TIMEOUT, refresh())
                .await
                .unwrap_or_default();
            *self
                .readings
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = fresh;
        }
        let mut text = String::new();
        // Writing into a String cannot fail; an error would be an encoder bug, answered as an
        // empty page rather than a panic.
        if prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry).is_err()
        {
            text.clear();
        }
        text
    }
}

/// The `Content-Type` of [`Exposition::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readings_and_instruments_are_encoded_with_their_types() {
        let refresh: Refresh = Arc::new(|| {
            Box::pin(async {
                vec![
                    Reading::counter("cohort_ledger_committed", "committed", 7),
                    Reading::gauge("cohort_ledger_pending", "pending", 2.0),
                ]
            })
        });
        let exposition = Exposition::new(Role::Chief, 0, 42, Some(refresh));
        let text = exposition.render().await;
        assert!(
            text.contains("# TYPE cohort_ledger_committed_total counter"),
            "{text}"
        );
        assert!(text.contains("cohort_ledger_committed_total 7\n"), "{text}");
        assert!(text.contains("cohort_ledger_pending 2"), "{text}");
        assert!(
            text.contains("cohort_incarnation{role=\"chief\",index=\"0\"} 42"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE cohort_checkpoint_save_seconds histogram"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_multi_worker_mirrored_worker_exposes_its_group_not_the_parameter_servers() {
        let m = instruments();
        m.group_generation.set(3);
        m.group_workers.set(2);
        let text = Exposition::for_group(Role::Worker, 1, 9).render().await;
        assert!(text.contains("cohort_group_generation 3\n"), "{text}");
        assert!(text.contains("cohort_group_workers 2\n"), "{text}");
        for name in [
            "# TYPE cohort_group_step gauge",
            "# TYPE cohort_group_step_seconds histogram",
            "# TYPE cohort_group_reformed_total counter",
            "# TYPE cohort_group_admitted_total counter",
            "# TYPE cohort_group_departed_total counter",
            "cohort_incarnation{role=\"worker\",index=\"1\"} 9",
        ] {
            assert!(text.contains(name), "{name}: {text}");
        }
        assert!(!text.contains("cohort_worker_closures_run"), "{text}");
    }
}
