"""The report: the Markdown table, the targets and the last line."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bench.serving.common import Report


def targets(r: dict[str, Any]) -> list[tuple[str, bool | None]]:
    """The done-when targets: (what, met); met is None when something was not measured."""
    rules: list[tuple[str, tuple[str, ...], Callable[..., bool]]] = [
        (
            "batching on >= 0.9x off in req/s at c1, p50 <= 1.2x",
            ("batching_c1", "batching_c1_p50"),
            lambda rps, p50: rps >= 0.9 and p50 <= 1.2,
        ),
        ("batching on >= 1.0x off in req/s at c16", ("batching_c16",), lambda rps: rps >= 1.0),
        (
            "compute-bound: server >= 0.95x OpenVINO's best (THROUGHPUT hint, async; median of "
            "the rounds)",
            ("ratio_vs_runtime_best",),
            lambda ratio: ratio >= 0.95,
        ),
        (
            "compute-bound: server >= 0.95x in-process, one synchronous request (median of the "
            "rounds)",
            ("ratio_vs_inprocess",),
            lambda ratio: ratio >= 0.95,
        ),
        (
            "C++ (batching off) >= 5x the FastAPI baseline at c16",
            ("ratio_vs_python",),
            lambda ratio: ratio >= 5.0,
        ),
        (
            "good clients among slow ones: p99 < 50 ms, no errors",
            ("slow_clients_p99_ms", "slow_clients_errors"),
            lambda p99, errors: p99 < 50 and errors == 0,
        ),
        (
            "gRPC >= REST binary in req/s at c16 and c1 (digits, batching off, one process)",
            ("grpc_vs_rest_c16", "grpc_vs_rest_c1"),
            lambda c16, c1: c16 >= 1.0 and c1 >= 1.0,
        ),
        (
            "warm from the first request: first request after a swap <= 2x the median "
            "(worst batch size, median of the swaps)",
            ("first_request_vs_p50",),
            lambda ratio: ratio <= 2.0,
        ),
        (
            "serving-config search >= 0.95x the exhaustive grid's best (same objective, same "
            "run; medians of the rounds), searched within package.tune.budget_s (plus the "
            "one trial begun inside it)",
            ("tuned_vs_grid_best", "tuning_within_budget"),
            lambda ratio, within: ratio >= 0.95 and within,
        ),
        (
            "server RSS < 64 KiB per idle connection",
            ("rss_per_idle_conn_kib",),
            lambda kib: kib < 64,
        ),
    ]
    out: list[tuple[str, bool | None]] = []
    for what, keys, rule in rules:
        values = [r.get(k) for k in keys]
        out.append((what, None if None in values else bool(rule(*values))))
    return out


def render(report: Report) -> str:
    cpus = report.machine["cpus"]
    lines = [
        f"serving benchmark: {report.arch} 224x224 (compute-bound) and digits 28x28 "
        f"(overhead-bound), fp32, OpenVINO CPU, f32 precision hint",
        f"machine: {cpus} CPUs ({report.machine['cpu_model']}); load generator: wrk (REST) / "
        "h2load (gRPC), 1 thread, keep-alive, binary tensors, batch-1 requests; CPU% = CPU time "
        "/ wall time, 100% = one core",
    ]
    if report.inprocess:
        lines += [
            "",
            "in-process OpenVINO (one compiled model, synchronous calls):",
            "  when    batch  threads   images/s   ms/call   other%",
        ]
    for r in report.inprocess:
        lines.append(
            f"  {r.when:<6}  {r.batch:>5}  {r.threads:>7}  {r.images_per_s:>9.1f}"
            f"  {r.latency_ms_p50:>8.2f}  {r.other_cpu_pct:>7.0f}"
        )
    if report.runtime:
        lines += [
            "OpenVINO's own best (THROUGHPUT hint, async infer requests; the limit):",
            "  streams (used)  batch  requests  threads   images/s",
        ]
        for c in report.runtime:
            lines.append(
                f"  {c['streams']:>7} ({c['streams_used']:>2})  {c['batch']:>5}  "
                f"{c['requests']:>8}  {c['threads']:>7}  {c['images_per_s']:>9.1f}"
            )
    lines += [
        "",
        f"{'regime':<9}{'target':<7}{'model':<9}{'WxT':>4}{'batching':>9}{'proto':>6}"
        f"{'bg':>10}{'conc':>5}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'err':>4}{'batch':>6}"
        f"{'busy%':>6}{'gen CPU%':>9}{'srv CPU%':>9}{'other%':>7}  req/s of each round",
    ]
    for c in report.cells:
        batch = "-" if c.mean_batch is None else f"{c.mean_batch:.1f}"
        busy = "-" if c.compute_busy_pct is None else f"{c.compute_busy_pct:.0f}"
        each = " ".join(f"{x:.0f}" for x in c.rps_samples) if len(c.rps_samples) > 1 else ""
        lines.append(
            f"{c.regime:<9}{c.target:<7}{c.model:<9}{c.layout:>4}{c.batching:>9}"
            f"{c.protocol:>6}{c.background:>10}{c.concurrency:>5}{c.throughput:>9.1f}"
            f"{c.p50_ms:>9.2f}{c.p99_ms:>9.2f}{c.errors:>4}{batch:>6}{busy:>6}"
            f"{c.generator_cpu_pct:>9.0f}{c.server_cpu_pct:>9.0f}{c.other_cpu_pct:>7.0f}"
            f"  {each}".rstrip()
        )
    lines += [
        "",
        "batch = mean samples per executed batch, busy% = backend compute time / (wall x "
        "workers) (C++ /metrics; batches straddling the window count whole); gen = wrk or "
        "h2load, srv = server process, other = the rest of the machine (noise: should be ~0; "
        "the slow-clients helper's CPU is not in it); bg = background load (slowN: N slow "
        "clients held; log-outs / log-in0.1: the prediction log, outputs only / with inputs at "
        "rate 0.1, against the same server without a log, regime predlog); a cell measured "
        "in several rounds shows the median of each number and every round's req/s",
    ]
    r = report.ratios
    if r.get("batching"):
        lines += [
            "",
            "digits, C++ server, dynamic batching on vs off (REST binary; medians; a ratio is "
            "the median of the rounds' on / off ratios, each round's in [ ]):",
            f"  {'conc':>4}{'on req/s':>10}{'off req/s':>11}{'ratio':>7}{'on p50':>8}"
            f"{'off p50':>9}{'ratio':>7}{'on p99':>8}{'off p99':>9}{'ratio':>7}",
        ]
        for b in r["batching"]:
            lines.append(
                f"  {b['concurrency']:>4}{b['on_rps']:>10.1f}{b['off_rps']:>11.1f}"
                f"{_fmt(b['rps_ratio']):>7}{b['on_p50_ms']:>8.2f}{b['off_p50_ms']:>9.2f}"
                f"{_fmt(b['p50_ratio']):>7}{b['on_p99_ms']:>8.2f}{b['off_p99_ms']:>9.2f}"
                f"{_fmt(b['p99_ratio']):>7}"
            )
            if len(b["rps_ratio_rounds"]) > 1:
                lines.append(
                    f"        req/s ratio each round {_rounds(b['rps_ratio_rounds'])}, "
                    f"p50 ratio each round {_rounds(b['p50_ratio_rounds'])}"
                )
    if r.get("grpc"):
        lines += [
            "",
            "digits, C++ server, batching off, one process: gRPC (h2load) vs REST binary (wrk):",
            f"  {'conc':>4}{'gRPC req/s':>12}{'REST req/s':>12}{'ratio':>7}{'gRPC p50':>10}"
            f"{'REST p50':>10}{'gRPC p99':>10}{'REST p99':>10}{'gRPC err':>10}",
        ]
        for g in r["grpc"]:
            lines.append(
                f"  {g['concurrency']:>4}{g['grpc_rps']:>12.1f}{g['rest_rps']:>12.1f}"
                f"{_fmt(g['ratio']):>7}{g['grpc_p50_ms']:>10.2f}{g['rest_p50_ms']:>10.2f}"
                f"{g['grpc_p99_ms']:>10.2f}{g['rest_p99_ms']:>10.2f}{g['grpc_errors']:>10}"
            )
    for key in ("log_overhead_outputs", "log_overhead_inputs_10pct"):
        if r.get(key) is not None:
            lines.append(
                f"{key} = {_fmt(r[key])} (req/s with the log / without, median of the rounds "
                f"{_rounds(r[key + '_rounds'])}; p99 ms with / without {r[key + '_p99_ms']})"
            )
    if r.get("prediction_log"):
        lines.append(f"prediction log records: {r['prediction_log']}")
    s = report.slow_clients
    if s:
        with_cell, without = r.get("slow_cell"), r.get("slow_baseline")
        lines += [
            "",
            f"slow clients (digits, C++ server, batching off, --header-timeout-ms="
            f"{s['header_timeout_ms']}, --http-threads={s['http_threads']}, "
            f"--max-connections={s['max_connections']}): {s['connections']} connections from "
            f"bench/slow_clients.py, {s['idle']} idle + {s['trickling']} trickling a header "
            f"1 byte / {s['interval_ms']:.0f} ms, reopened when the server closes them",
        ]
        for label, c in (("without", without), ("with", with_cell)):
            if c is not None:
                lines.append(
                    f"  good clients (wrk c{c['concurrency']}) {label + ' slow clients:':<22}"
                    f"{c['throughput']:>9.1f} req/s  p50 {c['p50_ms']:.2f} ms  "
                    f"p99 {c['p99_ms']:.2f} ms  errors {c['errors']}"
                )
        per_conn = s["rss_per_idle_conn_kib"]
        helper_cpu = "-" if s["helper_cpu_pct"] is None else f"{s['helper_cpu_pct']:.0f}"
        lines += [
            f"  during the cell ({s['window_s']:.0f} s incl. warm-up): at least "
            f"{s.get('held_min')} held, {s.get('reconnects')} reconnects after the server "
            f"closed them, {s.get('connect_errors')} connect errors, answers to slow clients "
            f"{s.get('statuses') or 'none'}; helper CPU "
            f"{helper_cpu}%",
            f"  server RSS {s['rss_before_kib'] / 1024:.1f} MiB with "
            f"{s['server_connections_before']} connections -> {s['rss_open_kib'] / 1024:.1f} MiB "
            f"with {s['server_connections_open']} ({'-' if per_conn is None else f'{per_conn:.1f}'}"
            f" KiB per connection); {s['rss_after_load_kib'] / 1024:.1f} MiB after the load",
        ]
    noisy = [c for c in report.cells if c.other_cpu_pct > report.settings["noise_threshold"]]
    noisy_inprocess = [
        x for x in report.inprocess if x.other_cpu_pct > report.settings["noise_threshold"]
    ]
    if noisy or noisy_inprocess:
        lines.append(
            f"WARNING: {len(noisy) + len(noisy_inprocess)} measurement(s) shared the CPU with "
            "other processes (other% above the threshold even after retries): rerun on a quiet "
            "machine"
        )
    for note in report.notes:
        lines.append(f"NOTE: {note}")
    lines.append("")
    if report.compute_rounds:
        lines.append(
            f"compute-bound, in alternation: the {len(report.compute_rounds[0]['cells'])} best "
            f"server cells of the table vs in-process batch {report.compute_rounds[0]['batch']}:"
        )
        for i, x in enumerate(report.compute_rounds, 1):
            servers = ", ".join(
                f"[{c['cell']}] {c['server']:.1f} ({c['ratio']:.3f})" for c in x["cells"]
            )
            lines.append(f"  round {i}: in-process {x['inprocess']:.1f} images/s; server {servers}")
        for cell, m in r.get("ratio_vs_inprocess_candidates", {}).items():
            lines.append(f"  median ratio [{cell}]: {m:.3f}")
    if r.get("ratio_vs_inprocess") is not None:
        if r.get("ratio_vs_inprocess_from") == "rounds":
            lines.append(
                f"ratio_vs_inprocess = median of the rounds of [{r['server_rounds_cell']}] "
                f"{_rounds(r['ratio_vs_inprocess_rounds'])}"
                f" = {r['ratio_vs_inprocess']:.3f} (from the table alone: best C++ "
                f"{r['server_best']:.1f} / best in-process {r['inprocess_best']:.1f} = "
                f"{_fmt(r.get('ratio_vs_inprocess_table'))})"
            )
        else:
            lines.append(
                f"ratio_vs_inprocess = best C++ server images/s {r['server_best']:.1f} "
                f"({r['server_best_cell']}) / best in-process {r['inprocess_best']:.1f} "
                f"(batch {r['inprocess_best_batch']}, {r['inprocess_best_when']}) = "
                f"{r['ratio_vs_inprocess']:.3f}"
            )
    if r.get("ratio_vs_runtime_best") is not None:
        rounds = r.get("ratio_vs_runtime_best_rounds")
        lines.append(
            f"ratio_vs_runtime_best = C++ server / OpenVINO's best ({r['runtime_best_cell']}, "
            f"{r['runtime_best']:.1f} images/s in the search)"
            + (f", median of the rounds {_rounds(rounds)}" if rounds else ", from the table")
            + f" = {r['ratio_vs_runtime_best']:.3f}"
        )
    if r.get("ratio_vs_python") is not None:
        lines.append(
            f"ratio_vs_python = C++ (batching off) / Python req/s at concurrency "
            f"{r['overhead_concurrency']}, median of the rounds "
            f"{_rounds(r['ratio_vs_python_rounds'])} = {r['ratio_vs_python']:.3f} "
            f"(medians {r['cpp_rps']:.1f} / {r['python_rps']:.1f} req/s)"
        )
    if r.get("ratio_vs_python_batching_on") is not None:
        lines.append(
            f"  (C++ with dynamic batching on: {r['cpp_rps_batching_on']:.1f} req/s, "
            f"{r['ratio_vs_python_batching_on']:.3f}x the Python baseline, rounds "
            f"{_rounds(r['ratio_vs_python_batching_on_rounds'])})"
        )
    if r.get("tuned_vs_grid_best") is not None:
        t = report.tune
        lines.append(
            f"tuned_vs_grid_best = the searched config ({t['tuned']}; {t['tuning_trials']} "
            f"trials in {t['tuning_s']:.1f} s, budget {t['budget_s']:g} s) / the best of the "
            f"exhaustive grid ({t['grid_best']}; {t['grid_cells']} configs x "
            f"{t['grid_rounds']} rounds), {t['objective']} objective at c="
            f"{t['concurrencies']}, medians = {r['tuned_vs_grid_best']:.3f}; the written "
            f"config ({t['written']}): {_fmt(r.get('written_vs_grid_best'))}"
        )
        for key, cell in sorted(t["grid"].items(), key=lambda kv: -kv[1]["median"]):
            lines.append(
                f"  {key:<28} median {cell['median']:10.1f}  rounds {_rounds(cell['scores'])}"
                + ("  (searched)" if key == t["tuned"] else "")
            )
    if r.get("first_request_vs_p50") is not None:
        warm = report.warmup
        lines.append(
            f"first_request_vs_p50 = first request after a swap / median of the same size "
            f"(worst of batches {warm['batches']}, {warm['layout']}, max batch "
            f"{warm['max_batch_size']}), median of the swaps "
            f"{_rounds([x['ratio'] for x in warm['rounds']['warm']])} = "
            f"{r['first_request_vs_p50']:.3f}; without the bundle's warm-up "
            f"{_rounds([x['ratio'] for x in warm['rounds']['cold']])} = "
            f"{r['first_request_vs_p50_cold']:.3f}; swap {warm['swap_s']:.2f} s "
            f"(cold {warm['swap_s_cold']:.2f} s)"
        )
        lines.append(
            f"first_request_vs_pause = first request after a swap / the same request on the "
            f"warm version after as long a pause (worst batch, median of the swaps) = "
            f"{r['first_request_vs_pause']:.3f}; without the bundle's warm-up "
            f"{r['first_request_vs_pause_cold']:.3f}"
        )
    lines += ["", "targets:"]
    for what, met in targets(r):
        verdict = "not measured" if met is None else "met" if met else "NOT met"
        lines.append(f"  {verdict:<13} {what}")
    lines.append(f"elapsed {report.elapsed_s:.0f} s")
    return "\n".join(lines)


def _rounds(values: Sequence[float]) -> str:
    return "[" + " ".join(f"{v:.3f}" for v in values) + "]"


def _fmt(x: float | None) -> str:
    return "nan" if x is None else f"{x:.3f}"


def last_line(r: dict[str, Any]) -> str:
    """The machine-readable summary (the first two keys keep their place and meaning)."""
    errors = r.get("slow_clients_errors")
    return (
        f"ratio_vs_inprocess={_fmt(r.get('ratio_vs_inprocess'))} "
        f"ratio_vs_python={_fmt(r.get('ratio_vs_python'))} "
        f"batching_c1={_fmt(r.get('batching_c1'))} "
        f"batching_c16={_fmt(r.get('batching_c16'))} "
        f"slow_clients_p99_ms={_fmt(r.get('slow_clients_p99_ms'))} "
        f"batching_c1_p50={_fmt(r.get('batching_c1_p50'))} "
        f"grpc_vs_rest_c16={_fmt(r.get('grpc_vs_rest_c16'))} "
        f"rss_per_idle_conn_kib={_fmt(r.get('rss_per_idle_conn_kib'))} "
        f"slow_clients_errors={'nan' if errors is None else errors} "
        f"log_overhead_outputs={_fmt(r.get('log_overhead_outputs'))} "
        f"log_overhead_inputs_10pct={_fmt(r.get('log_overhead_inputs_10pct'))} "
        f"ratio_vs_runtime_best={_fmt(r.get('ratio_vs_runtime_best'))} "
        f"first_request_vs_p50={_fmt(r.get('first_request_vs_p50'))} "
        f"grpc_vs_rest_c1={_fmt(r.get('grpc_vs_rest_c1'))} "
        f"tuned_vs_grid_best={_fmt(r.get('tuned_vs_grid_best'))} "
        f"tuning_s={_fmt(r.get('tuning_s'))}"
    )
