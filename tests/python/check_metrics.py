"""Parses every task's scraped /metrics text with the Prometheus parser of the
`prometheus_client` package and checks the values against the run's own summary.

Usage: check_metrics.py SCRAPE_DIR EXPECTED_JSON

SCRAPE_DIR holds `<role>-<index>.txt`, one scrape per task. EXPECTED_JSON holds the chief's
report (`ledger`, and `ps`: every server's PsStats in index order) and `incarnations`
(`"<role>-<index>"` -> the incarnation the launcher started). Prints one OK line per check
and exits 1 on the first mismatch.
"""

import json
import os
import sys

from prometheus_client.parser import text_string_to_metric_families


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def parse(path):
    """The samples of one scrape: {sample name: [(labels, value)]}, and family types."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    samples, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples, types


def value(samples, name, task):
    found = samples.get(name)
    if not found:
        fail(f"{task}: no sample {name}")
    return found[0][1]


def expect_equal(task, name, got, want):
    if got != want:
        fail(f"{task}: {name} is {got}, the run's summary says {want}")
    print(f"OK: {task} {name} = {want}")


def main():
    scrape_dir, expected_path = sys.argv[1], sys.argv[2]
    with open(expected_path, encoding="utf-8") as f:
        expected = json.load(f)
    ledger = expected["ledger"]
    scrapes = {}
    for name in sorted(os.listdir(scrape_dir)):
        if name.endswith(".txt"):
            scrapes[name[:-4]] = parse(os.path.join(scrape_dir, name))
    if not scrapes:
        fail(f"no scrape in {scrape_dir}")

    for task, (samples, _) in scrapes.items():
        role, index = task.rsplit("-", 1)
        incarnations = samples.get("cohort_incarnation", [])
        if len(incarnations) != 1:
            fail(f"{task}: expected one cohort_incarnation sample, got {incarnations}")
        labels, got = incarnations[0]
        if labels != {"role": role, "index": index}:
            fail(f"{task}: cohort_incarnation labelled {labels}")
        expect_equal(task, "cohort_incarnation", int(got), expected["incarnations"][task])
        value(samples, "cohort_detections_total", task)
        build = samples.get("cohort_build_info", [])
        if len(build) != 1 or build[0][1] != 1 or "version" not in build[0][0]:
            fail(f"{task}: cohort_build_info is {build}")
        # The standard process metrics, with values a live process has.
        for name, least in [
            ("process_cpu_seconds_total", 0),
            ("process_start_time_seconds", 1e9),
            ("process_resident_memory_bytes", 1),
            ("process_threads", 1),
            ("process_open_fds", 1),
        ]:
            got = value(samples, name, task)
            if got < least:
                fail(f"{task}: {name} = {got}, below {least}")
        print(f"OK: {task} cohort_build_info and process_* metrics")

    chief, types = scrapes["chief-0"]
    if types.get("cohort_ledger_committed") != "counter":
        fail(f"chief-0: cohort_ledger_committed is a {types.get('cohort_ledger_committed')}")
    for key in ["scheduled", "committed", "failed", "redispatched", "rolled_back"]:
        name = f"cohort_ledger_{key}_total"
        expect_equal("chief-0", name, int(value(chief, name, "chief-0")), ledger[key])
    expect_equal(
        "chief-0", "cohort_ledger_pending", int(value(chief, "cohort_ledger_pending", "chief-0")),
        ledger["pending"],
    )
    expect_equal(
        "chief-0", "cohort_ps_restores_total",
        int(value(chief, "cohort_ps_restores_total", "chief-0")), ledger["ps_restores"],
    )
    # One dispatch-to-commit time per commit (a closure rolled back commits again).
    chief_types = scrapes["chief-0"][1]
    if chief_types.get("cohort_chief_step_seconds") != "histogram":
        fail("chief-0: cohort_chief_step_seconds is not a histogram")
    if ledger["rolled_back"] == 0:
        expect_equal(
            "chief-0", "cohort_chief_step_seconds_count",
            int(value(chief, "cohort_chief_step_seconds_count", "chief-0")), ledger["committed"],
        )

    servers = [t for t in scrapes if t.startswith("ps-")]
    if len(servers) != len(expected["ps"]):
        fail(f"{len(servers)} server scrapes for {len(expected['ps'])} servers in the report")
    pulled = 0
    for task in servers:
        samples, _ = scrapes[task]
        stats = expected["ps"][int(task.split("-")[1])]
        for name, key in [
            ("cohort_ps_pushes_applied_total", "applied"),
            ("cohort_ps_pushes_duplicate_total", "rejected_duplicate"),
            ("cohort_ps_pushes_stale_total", "rejected_stale"),
            ("cohort_ps_pushes_non_finite_total", "skipped_non_finite"),
        ]:
            expect_equal(task, name, int(value(samples, name, task)), stats[key])
        pulled += int(value(samples, "cohort_ps_pulled_bytes_total", task))

    workers = [t for t in scrapes if t.startswith("worker-")]
    run = 0
    worker_pulled = 0
    for task in workers:
        samples, types = scrapes[task]
        if types.get("cohort_worker_step_seconds") != "histogram":
            fail(f"{task}: cohort_worker_step_seconds is not a histogram")
        closures = int(value(samples, "cohort_worker_closures_run_total", task))
        expect_equal(
            task, "cohort_worker_step_seconds_count",
            int(value(samples, "cohort_worker_step_seconds_count", task)), closures,
        )
        run += closures
        worker_pulled += int(value(samples, "cohort_worker_pulled_bytes_total", task))
        if closures and int(value(samples, "cohort_worker_pushed_bytes_total", task)) <= 0:
            fail(f"{task}: ran {closures} closures but pushed no bytes")
    if ledger["redispatched"] == 0:
        expect_equal("workers", "sum of cohort_worker_closures_run_total", run, ledger["committed"])
    expect_equal("servers", "sum of cohort_ps_pulled_bytes_total", pulled, worker_pulled)
    print(f"OK: {len(scrapes)} scrapes parsed, every counter matches the run")


if __name__ == "__main__":
    main()
