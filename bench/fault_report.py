"""The numbers and the table of a fault run: ``analyse`` turns the samples recorded around
one fault into its record (first clear answer, statuses and worst latencies during the
outage against the deadlines' bounds, answers that were not normal after the restore);
``render`` writes the run's result as the markdown table and lines ``bench.fault_run``
prints.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench.bench_load import Recorder
from bench.common import markdown_table
from bench.fault_specs import FaultSpec, is_clear


def analyse(
    rec: Recorder,
    bounds: dict[str, float],
    spec: FaultSpec,
    t_fault: float,
    t_restore: float,
    t_end: float,
) -> dict[str, Any]:
    """One fault's numbers from ``rec``'s samples: the outage is ``t_fault`` to
    ``t_restore``, the watch after it ends at ``t_end``; ``bounds`` per endpoint kind."""
    during = [s for s in rec.samples if t_fault <= s.sent < t_restore]
    # Requests sent just before the fault and answered during it count for latency.
    overlapping = [s for s in rec.samples if s.sent < t_restore and s.done >= t_fault]
    clear = [s for s in rec.samples if s.done >= t_fault and is_clear(s, spec)]
    first_clear = min(clear, key=lambda s: s.done) if clear else None
    statuses: dict[str, Counter] = {}
    for s in during:
        statuses.setdefault(s.kind, Counter())[str(s.status)] += 1
    worst: dict[str, float] = {}
    for s in overlapping:
        worst[s.kind] = max(worst.get(s.kind, 0.0), s.latency_s)
    violations = [
        {**s.brief(t_fault), "bound_s": bounds.get(s.kind)}
        for s in overlapping
        if s.latency_s > bounds.get(s.kind, 130.0) or s.status == "timeout"
    ]
    server_errors = [
        s
        for s in overlapping
        if (isinstance(s.status, int) and s.status >= 500 and s.status != 503)
        or str(s.status).startswith("transport")
    ]
    after = [s for s in rec.samples if t_restore <= s.sent < t_end]
    abnormal_after = Counter(
        f"{s.kind}:{s.status}" + (":degraded" if s.degraded else "") for s in after if not s.normal
    )
    out: dict[str, Any] = {
        "time_to_first_clear_s": (round(first_clear.done - t_fault, 2) if first_clear else None),
        "first_clear": first_clear.brief(t_fault) if first_clear else None,
        "statuses_during": {k: dict(sorted(v.items())) for k, v in statuses.items()},
        "degraded_during": dict(
            Counter(r.split(": ")[0][:100] for s in during for r in s.degraded).most_common(8)
        ),
        "cache_during": dict(Counter(s.cache.split(":")[0] for s in during if s.cache)),
        "worst_latency_ms": {k: round(v * 1000, 1) for k, v in sorted(worst.items())},
        "bound_s": bounds,
        "within_bounds": not violations,
        "bound_violations": violations[:10],
        "server_errors_during": len(server_errors),
        # Anything but 200 and 503 (a 4xx for a request that was valid before the fault).
        "unexpected_answers": [s.brief(t_fault) for s in overlapping if s.status not in (200, 503)][
            :10
        ],
        "server_error_samples": [s.brief(t_fault) for s in server_errors[:10]],
        "not_normal_after_restore": dict(abnormal_after),
        "not_normal_after_restore_samples": [s.brief(t_restore) for s in after if not s.normal][:8],
        "requests_during": len(during),
    }
    if spec.name == "nats":
        out["time_to_first_clear_s"] = None
        out["first_clear"] = "n/a: the gateway does not use NATS (see bus)"
    return out


def fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def render(result: dict[str, Any]) -> str:
    rows = []
    for f in result.get("faults", []):
        if "skipped" in f:
            rows.append([f["fault"], "skipped: " + f["skipped"]] + ["–"] * 6)
            continue
        if "failed_to_run" in f:
            rows.append([f["fault"], "failed to run: " + f["failed_to_run"][:80]] + ["–"] * 6)
            continue
        clear = f.get("first_clear")
        if isinstance(clear, dict):
            what = f"{clear['kind']} {clear['status']}"
            text = clear["error"] or "; ".join(clear["degraded"]) or clear["cache"]
            what += f" ({text[:60]})"
        else:
            what = str(clear or "none")
        if f["fault"] == "nats":
            bus = f.get("bus", {})
            what = (
                f"publish fails after {fmt(f.get('time_to_first_clear_s_bus'))} s "
                f"(gateway unaffected)"
            )
            normal = f"{fmt(bus.get('indexed_after_restore_s'))} (event indexed)"
        else:
            normal = fmt(f.get("time_to_first_normal_s"))
            if f.get("time_to_all_normal_s") != f.get("time_to_first_normal_s"):
                normal += f" / all {fmt(f.get('time_to_all_normal_s'))}"
        worst = ", ".join(f"{k} {v:.0f}" for k, v in f.get("worst_latency_ms", {}).items())
        statuses = "; ".join(
            f"{k}: " + " ".join(f"{s}×{n}" for s, n in v.items())
            for k, v in f.get("statuses_during", {}).items()
        )
        rows.append(
            [
                f["fault"],
                fmt(f.get("time_to_first_clear_s")),
                what,
                worst + ("" if f.get("within_bounds") else " **over bound**"),
                statuses,
                f.get("server_errors_during"),
                normal,
                "yes" if f.get("recovered_without_redeploy") else "**no**",
            ]
        )
    parts = [
        markdown_table(
            [
                "fault",
                "first clear answer s",
                "clear answer",
                "worst latency ms (outage)",
                "statuses during outage",
                "500s",
                "first normal after restore s",
                "recovered w/o redeploy",
            ],
            rows,
        )
    ]
    for f in result.get("faults", []):
        ri = f.get("refused_ingest")
        if ri and "first" in ri:
            parts.append(
                f"Milvus outage ingest of {ri['doc_id']}: {ri['first']['status']} "
                f"({ri['first']['error'][:80]}); retried: {ri.get('retries')}; stored "
                f"{ri.get('stored_chunks')} chunks of {ri.get('expected_chunks')} expected, "
                f"exactly once: {ri.get('indexed_exactly_once')}"
            )
        if f.get("replicas_replaced"):
            parts.append(f"{f['fault']}: Serve replaced {f['replicas_replaced']}")
    ch = result.get("chunks")
    if ch:
        parts.append(
            f"Chunks of {ch['team']}: {ch['count_after']} stored, "
            f"{ch['expected_from_acknowledged']} expected ({'exact' if ch['exact'] else 'MISMATCH'}"
            f", {ch['mismatched_documents']} documents mismatched, uncertain "
            f"{ch['uncertain_documents'] or 0})"
        )
    load = result.get("load", {}).get("endpoints", {}).get("all")
    if load:
        parts.append(
            f"Load: {load['answered']} answers, statuses {load['statuses']}, p50 "
            f"{load['latency'].get('p50_ms')} ms, max {load['latency'].get('max_ms')} ms, "
            f"missed schedule {load['missed_schedule']['total']}"
        )
    return "\n\n".join(parts)
