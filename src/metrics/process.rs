//! The standard `process_*` metrics of a Prometheus client (CPU time, memory, start time, file
//! descriptors, threads), read from `/proc/self` at each scrape, as other exporters name them,
//! so that the usual dashboards and alerts work on cohort's processes. Off Linux (no
//! `/proc/self`) they are left out.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Clock ticks per second of `/proc/<pid>/stat`'s times: Linux's `USER_HZ`, 100 on every
/// architecture Linux runs on (the kernel scales its own HZ to it for user space).
const USER_HZ: f64 = 100.0;

/// Encodes the `process_*` metrics at each scrape.
#[derive(Debug, Default)]
pub(super) struct ProcessCollector;

/// One reading of the process.
#[derive(Debug, Default, PartialEq)]
struct ProcessStats {
    cpu_seconds: f64,
    start_time_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    threads: f64,
    open_fds: f64,
    max_fds: Option<f64>,
}

impl ProcessStats {
    /// This process now, or `None` where `/proc/self` cannot be read.
    fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
        Self::parse(&stat, &status, &boot, &limits, open_fds)
    }

    /// From the texts of `/proc/self/stat`, `/proc/self/status`, `/proc/stat` and
    /// `/proc/self/limits`, and the count of `/proc/self/fd`.
    fn parse(stat: &str, status: &str, boot: &str, limits: &str, open_fds: usize) -> Option<Self> {
        // The fields after the command name, which is in parentheses and may hold anything.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        // Numbered as in proc(5): field 3 (state) is fields[0].
        let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
        let cpu_seconds = (field(14)? + field(15)?) / USER_HZ;
        let boot_time = boot
            .lines()
            .find_map(|line| line.strip_prefix("btime "))?
            .trim()
            .parse::<f64>()
            .ok()?;
        let kib = |key: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(key))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse::<f64>().ok())
        };
        let max_fds = limits
            .lines()
            .find(|line| line.starts_with("Max open files"))
            .and_then(|line| line.split_whitespace().nth(3))
            .and_then(|soft| soft.parse::<f64>().ok());
        Some(Self {
            cpu_seconds,
            start_time_seconds: boot_time + field(22)? / USER_HZ,
            resident_bytes: kib("VmRSS:").unwrap_or(0.0) * 1024.0,
            virtual_bytes: kib("VmSize:").unwrap_or(0.0) * 1024.0,
            threads: kib("Threads:").unwrap_or(0.0),
            open_fds: open_fds as f64,
            max_fds,
        })
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let Some(stats) = ProcessStats::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(stats.cpu_seconds);
        let metric = encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?;
        cpu.encode(metric)?;
        let gauges = [
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                Some(stats.start_time_seconds),
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                Some(stats.resident_bytes),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                Some(stats.virtual_bytes),
            ),
            (
                "process_threads",
                "Number of OS threads",
                Some(stats.threads),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                Some(stats.open_fds),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                stats.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(value);
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_texts_are_read_as_prometheus_process_metrics() {
        // A command name with a space and a parenthesis, as proc(5) allows.
        let stat = "4242 (co hort) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 \
                    9 0 12345 0 0";
        let status = "Name:\tcohort\nVmSize:\t  204800 kB\nVmRSS:\t   10240 kB\nThreads:\t9\n";
        let boot = "cpu  1 2 3\nbtime 1796000000\nprocesses 10\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        let stats = ProcessStats::parse(stat, status, boot, limits, 12).unwrap();
        assert_eq!(
            stats,
            ProcessStats {
                cpu_seconds: 3.0,
                start_time_seconds: 1_796_000_000.0 + 123.45,
                resident_bytes: 10240.0 * 1024.0,
                virtual_bytes: 204800.0 * 1024.0,
                threads: 9.0,
                open_fds: 12.0,
                max_fds: Some(1024.0),
            }
        );
        assert_eq!(
            ProcessStats::parse("garbage", status, boot, limits, 0),
            None
        );
    }

    #[test]
    fn this_process_is_read() {
        let stats = ProcessStats::read().expect("/proc/self on Linux");
        assert!(
            stats.cpu_seconds >= 0.0 && stats.resident_bytes > 0.0,
            "{stats:?}"
        );
        assert!(stats.threads >= 1.0 && stats.open_fds >= 1.0, "{stats:?}");
    }
}
