"""From raw measurements to the report's numbers: aggregates, comparisons and verdicts.

Pure: a BenchData in, one JSON-ready dict out (the document `schema.json` describes). The
terminal table, the Markdown and the chart are all drawn from that dict, so they cannot
disagree with the JSON.
"""

from __future__ import annotations

import datetime as _dt
from collections import defaultdict
from typing import Any

from bonsai_launch.bench.data import BenchData
from bonsai_launch.bench.stats import (
    NOISE_RULE,
    aggregate,
    group_by,
    paired_ratios,
    spread,
    spread_json,
    verdict,
)
from bonsai_launch.bench.verdicts import (
    concurrency_summary,
    equality,
    memory_summary,
    multi_turn_summary,
    users_verdicts,
    verdict_lines,
)

SCHEMA_ID = "bonsai-bench/1"

DEFINITIONS = {
    "decode_tps": "server-reported decode speed: sum of timings.predicted_n / sum of timings.predicted_ms over the "
    "category's requests (llama.cpp excludes the first token); falls back to client_decode_tps when "
    "the server sends no timings",
    "client_decode_tps": "client-measured decode speed: (completion tokens - 1) / (arrival of last streamed piece - "
    "arrival of first), summed over the category's requests",
    "prefill_tps": "server-reported prompt processing speed: sum of timings.prompt_n / sum of timings.prompt_ms",
    "e2e_tps": "end to end: completion tokens / client wall time from sending the request to the end of the stream",
    "ttft_s": "time to first token: client time from sending the request to the first streamed text piece (median over "
    "the category's requests)",
    "acceptance_rate": "accepted / drafted: draft tokens the target accepted over draft tokens proposed (llama.cpp "
    "timings.draft_n_accepted / timings.draft_n; vLLM /metrics counters)",
    "mean_acceptance_length": "1 + accepted / verify steps: tokens produced per target verification step, counting "
    "the target's own token (/metrics spec_decode_num_drafts_total); the number vLLM and "
    "SGLang report",
    "ratio": "candidate / baseline of the same repeat (paired); above 1 means faster",
    "noise_rule": NOISE_RULE,
    "output_equality": "temperature 0 only: each candidate answer compared with the baseline's answer to the same prompt "
    "in the same repeat; first_diff_char is the first differing character, first_diff_piece the "
    "streamed piece (about one token) that holds it",
    "multi_turn_ttft": "time to first token on turns 2+ of a conversation that carries the earlier answers; ratio = "
    "baseline TTFT / candidate TTFT per repeat, so above 1 means the first token comes sooner",
    "concurrency_throughput": "all clients' completion tokens / wall time from the first request sent to the last "
    "stream closed, with `level` clients at once (2 x level requests), on a server with "
    "`slots` slots; median over repeats",
    "per_stream_tps": "what one client sees once its answer streams: client decode rate of each concurrent request "
    "(median, min-max over the requests)",
    "ttft_p50_s / ttft_p95_s": "time to first token of the concurrent requests, nearest-rank percentiles over every "
    "request of the row (queueing behind busy slots included)",
    "users": "for K simultaneous users: the configuration and slot count with the highest total tok/s; totals within "
    "5% of the best tie, and the tie goes to the sooner first token (p95)",
}


def _iso(ts: float | None) -> str | None:
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="seconds") if ts else None


def summarize(data: BenchData) -> dict[str, Any]:
    suite_requests = [r for r in data.requests if r.phase == "suite"]
    categories = list(dict.fromkeys(p.category for p in data.prompts))
    config_names = [c.name for c in data.configs]
    baseline = data.baseline.name if data.baseline else None
    temps = list(data.options.temps)

    # Per (config, category, temperature): one aggregate per repeat, then medians and ranges.
    # The "all" category pools every prompt of a repeat.
    per_repeat: dict[tuple[str, str, float], dict[int, dict[str, Any]]] = defaultdict(dict)
    for (config, category, temp, repeat), reqs in group_by(
        suite_requests, "config", "category", "temperature", "repeat"
    ).items():
        per_repeat[(config, category, temp)][repeat] = aggregate(reqs)
    for (config, temp, repeat), reqs in group_by(suite_requests, "config", "temperature", "repeat").items():
        per_repeat[(config, "all", temp)][repeat] = aggregate(reqs)

    results = []
    for config in config_names:
        for temp in temps:
            for category in categories + ["all"]:
                reps = per_repeat.get((config, category, temp))
                if not reps:
                    continue
                rows = [dict(repeat=r, **reps[r]) for r in sorted(reps)]
                pooled = aggregate(
                    [
                        r
                        for r in suite_requests
                        if r.config == config
                        and r.temperature == temp
                        and (category == "all" or r.category == category)
                    ]
                )
                results.append(
                    {
                        "config": config,
                        "category": category,
                        "temperature": temp,
                        "decode_tps": spread_json(x["decode_tps"] for x in rows),
                        "server_decode_tps": spread_json(x["server_decode_tps"] for x in rows),
                        "client_decode_tps": spread_json(x["client_decode_tps"] for x in rows),
                        "prefill_tps": spread_json(x["prefill_tps"] for x in rows),
                        "e2e_tps": spread_json(x["e2e_tps"] for x in rows),
                        "ttft_s": spread_json(x["ttft_s"] for x in rows),
                        "acceptance_rate": pooled["acceptance_rate"],
                        "mean_acceptance_length": pooled["mean_acceptance_length"],
                        "drafted": pooled["drafted"],
                        "accepted": pooled["accepted"],
                        "verify_steps": pooled["verify_steps"],
                        "tokens": pooled["tokens"],
                        "requests": pooled["requests"],
                        "errors": pooled["errors"],
                        "repeats": rows,
                    }
                )

    comparisons = []
    if baseline:
        for config in config_names:
            if config == baseline:
                continue
            for temp in temps:
                for category in categories + ["all"]:
                    cand = per_repeat.get((config, category, temp), {})
                    base = per_repeat.get((baseline, category, temp), {})
                    if not cand or not base:
                        continue
                    metric = "decode_tps"
                    ratios = paired_ratios(
                        {r: v[metric] for r, v in cand.items()}, {r: v[metric] for r, v in base.items()}
                    )
                    v = verdict(
                        ratios, spread(v[metric] for v in base.values()), spread(v[metric] for v in cand.values())
                    )
                    comparisons.append(
                        {
                            "config": config,
                            "baseline": baseline,
                            "category": category,
                            "temperature": temp,
                            "metric": metric,
                            "ratios": ratios,
                            "verdict": v.to_json(),
                            "output_equality": equality(suite_requests, config, baseline, category)
                            if temp == 0
                            else None,
                        }
                    )

    verdicts = verdict_lines(comparisons, categories, temps, data)
    concurrency = concurrency_summary(data, baseline)
    return {
        "schema": SCHEMA_ID,
        "mode": data.mode,
        "created": _iso(data.started),
        "duration_s": round((data.finished or data.started) - data.started, 1),
        "options": data.options.to_json(),
        "environment": data.environment,
        "configs": [c.to_json() for c in data.configs],
        "baseline": baseline,
        "categories": categories,
        "definitions": DEFINITIONS,
        "results": results,
        "comparisons": comparisons,
        "verdicts": verdicts,
        "multi_turn": multi_turn_summary(data, baseline),
        "concurrency": concurrency,
        "users": users_verdicts(concurrency, [c.to_json() for c in data.configs], data.options.repeats),
        "memory": memory_summary(data, baseline),
        "servers": [s.to_json() for s in data.servers],
        "requests": [r.to_json() for r in data.requests],
        "notes": list(data.notes),
    }
