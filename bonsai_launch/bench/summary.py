"""From raw measurements to the report's numbers: aggregates, comparisons and verdicts.

Pure: a BenchData in, one JSON-ready dict out (the document `schema.json` describes). The
terminal table, the Markdown and the chart are all drawn from that dict, so they cannot
disagree with the JSON.
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from bonsai_launch.bench.data import BenchData
from bonsai_launch.bench.measure import RequestResult
from bonsai_launch.bench.stats import NOISE_RULE, first_difference, paired_ratios, piece_index, spread, verdict

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


def _sum(values: Iterable[float | int | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(sum(vals)) if vals else None


def _ok(requests: Iterable[RequestResult]) -> list[RequestResult]:
    return [r for r in requests if not r.error]


def aggregate(requests: list[RequestResult]) -> dict[str, Any]:
    """One repeat of one (configuration, category, temperature): token-weighted rates."""
    ok = _ok(requests)
    out: dict[str, Any] = {"requests": len(requests), "errors": len(requests) - len(ok)}
    tokens = _sum(r.completion_tokens if r.completion_tokens is not None else len(r.pieces) for r in ok) or 0
    out["tokens"] = int(tokens)
    timed = [r for r in ok if r.predicted_n is not None and r.predicted_ms]
    server = (
        sum(r.predicted_n or 0 for r in timed) / (sum(r.predicted_ms or 0.0 for r in timed) / 1000.0)
        if timed and len(timed) == len(ok)
        else None
    )
    decoded = [(r.completion_tokens or len(r.pieces)) - 1 for r in ok if r.client_decode_tps]
    decode_time = [
        ((r.completion_tokens or len(r.pieces)) - 1) / r.client_decode_tps for r in ok if r.client_decode_tps
    ]
    client = sum(decoded) / sum(decode_time) if decode_time and sum(decode_time) > 0 else None
    prefill = [r for r in ok if r.prompt_n and r.prompt_ms]
    out["server_decode_tps"] = server
    out["client_decode_tps"] = client
    out["decode_tps"] = server if server is not None else client
    out["prefill_tps"] = (
        (sum(r.prompt_n or 0 for r in prefill) / (sum(r.prompt_ms or 0.0 for r in prefill) / 1000.0))
        if prefill
        else None
    )
    walls = _sum(r.wall_s for r in ok)
    out["e2e_tps"] = tokens / walls if walls else None
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    out["ttft_s"] = statistics.median(ttfts) if ttfts else None
    drafted = _sum(r.drafted for r in ok)
    accepted = _sum(r.accepted for r in ok)
    steps = _sum(r.verify_steps for r in ok)
    out["drafted"] = int(drafted) if drafted is not None else None
    out["accepted"] = int(accepted) if accepted is not None else None
    out["verify_steps"] = int(steps) if steps is not None else None
    out["acceptance_rate"] = accepted / drafted if drafted and accepted is not None else None
    out["mean_acceptance_length"] = 1 + accepted / steps if steps and accepted is not None else None
    return out


def _spread_json(values: Iterable[float | None]) -> dict | None:
    s = spread(values)
    return s.to_json() if s else None


def _group(requests: Iterable[RequestResult], *keys: str) -> dict[tuple, list[RequestResult]]:
    groups: dict[tuple, list[RequestResult]] = defaultdict(list)
    for r in requests:
        groups[tuple(getattr(r, k) for k in keys)].append(r)
    return groups


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
    for (config, category, temp, repeat), reqs in _group(
        suite_requests, "config", "category", "temperature", "repeat"
    ).items():
        per_repeat[(config, category, temp)][repeat] = aggregate(reqs)
    for (config, temp, repeat), reqs in _group(suite_requests, "config", "temperature", "repeat").items():
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
                        "decode_tps": _spread_json(x["decode_tps"] for x in rows),
                        "server_decode_tps": _spread_json(x["server_decode_tps"] for x in rows),
                        "client_decode_tps": _spread_json(x["client_decode_tps"] for x in rows),
                        "prefill_tps": _spread_json(x["prefill_tps"] for x in rows),
                        "e2e_tps": _spread_json(x["e2e_tps"] for x in rows),
                        "ttft_s": _spread_json(x["ttft_s"] for x in rows),
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
                            "output_equality": _equality(suite_requests, config, baseline, category)
                            if temp == 0
                            else None,
                        }
                    )

    verdicts = _verdict_lines(comparisons, categories, temps, data)
    concurrency = _concurrency(data, baseline)
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
        "multi_turn": _multi_turn(data, baseline),
        "concurrency": concurrency,
        "users": users_verdicts(concurrency, [c.to_json() for c in data.configs], data.options.repeats),
        "memory": _memory(data, baseline),
        "servers": [s.to_json() for s in data.servers],
        "requests": [r.to_json() for r in data.requests],
        "notes": list(data.notes),
    }


def _equality(requests: list[RequestResult], config: str, baseline: str, category: str) -> dict[str, Any] | None:
    """Temperature 0: the candidate's answers against the baseline's, prompt by prompt and
    repeat by repeat. Also whether the baseline agrees with itself across repeats, which says
    how much divergence is normal on this machine."""
    base = {
        (r.prompt_id, r.repeat): r
        for r in requests
        if r.config == baseline and r.temperature == 0 and not r.error and (category == "all" or r.category == category)
    }
    cand = {
        (r.prompt_id, r.repeat): r
        for r in requests
        if r.config == config and r.temperature == 0 and not r.error and (category == "all" or r.category == category)
    }
    keys = sorted(set(base) & set(cand))
    if not keys:
        return None
    chars, pieces = [], []
    for key in keys:
        pos = first_difference(base[key].text, cand[key].text)
        if pos is not None:
            chars.append(pos)
            pieces.append(piece_index(base[key].pieces, pos))
    by_prompt: dict[str, set[str]] = defaultdict(set)
    for (pid, _), r in base.items():
        by_prompt[pid].add(r.text)
    return {
        "compared": len(keys),
        "identical": len(keys) - len(chars),
        "first_diff_char": _spread_json(chars),
        "first_diff_piece": _spread_json(pieces),
        "baseline_self_consistent": all(len(texts) == 1 for texts in by_prompt.values()),
    }


def _verdict_lines(comparisons: list[dict], categories: list[str], temps: list[float], data: BenchData) -> list[dict]:
    labels = {c.name: c.label for c in data.configs}
    lines = []
    for temp in temps:
        for category in categories + ["all"]:
            rows = [c for c in comparisons if c["category"] == category and c["temperature"] == temp]
            if not rows:
                continue
            ranked = sorted(rows, key=lambda c: (c["verdict"]["ratio"] or {}).get("median", 0), reverse=True)
            faster = [c for c in ranked if c["verdict"]["kind"] == "faster"]
            slower = [c for c in ranked if c["verdict"]["kind"] == "slower"]
            inconclusive = all(c["verdict"]["kind"] == "inconclusive" for c in rows)
            where = f"{category} (T={temp:g})"
            if faster:
                best = faster[0]
                kind, advice = "faster", "turn it on"
                others = [c for c in slower]
                if others:
                    advice += "; slower: " + ", ".join(labels.get(c["config"], c["config"]) for c in others)
            elif inconclusive:
                best, kind, advice = ranked[0], "inconclusive", "too few repeats to tell (use --repeats 3 or more)"
            elif len(slower) == len(rows):
                best, kind, advice = ranked[0], "slower", "speculation is slower here: leave it off"
            else:
                best, kind, advice = ranked[0], "noise", "no gain beyond noise: leave it off"
            ratio = (best["verdict"]["ratio"] or {}).get("median")
            r_text = f"{ratio:.2f}x" if ratio is not None else "-"
            rng = best["verdict"]["ratio"] or {}
            if rng.get("n", 0) > 1:
                r_text += f" ({rng['min']:.2f}-{rng['max']:.2f})"
            line = f"{where}: {labels.get(best['config'], best['config'])} {r_text}, {advice}"
            lines.append(
                {
                    "category": category,
                    "temperature": temp,
                    "config": best["config"],
                    "kind": kind,
                    "ratio": ratio,
                    "line": line,
                }
            )
    return lines


def _multi_turn(data: BenchData, baseline: str | None) -> dict[str, Any]:
    reqs = [r for r in data.requests if r.phase == "multi-turn" and not r.error]
    turns = []
    for (config, turn), group in sorted(_group(reqs, "config", "turn").items(), key=lambda kv: (kv[0][0], kv[0][1])):
        turns.append(
            {
                "config": config,
                "turn": turn,
                "ttft_s": _spread_json(r.ttft_s for r in group),
                "prompt_n": _spread_json(r.prompt_n for r in group),
                "cache_n": _spread_json(r.cache_n for r in group),
            }
        )
    # Per repeat: median TTFT over turns 2+ of every conversation; then paired against the baseline.
    later: dict[str, dict[int, float | None]] = defaultdict(dict)
    for (config, repeat), group in _group([r for r in reqs if (r.turn or 0) >= 2], "config", "repeat").items():
        ttfts = [r.ttft_s for r in group if r.ttft_s is not None]
        later[config][repeat] = statistics.median(ttfts) if ttfts else None
    comparisons = []
    if baseline and baseline in later:
        for config, values in later.items():
            if config == baseline:
                continue
            # baseline / candidate: above 1 means the candidate's first token comes sooner.
            ratios = paired_ratios(later[baseline], values)
            v = verdict(ratios, spread(later[baseline].values()), spread(values.values()))
            comparisons.append(
                {
                    "config": config,
                    "baseline": baseline,
                    "ttft_later_turns_s": _spread_json(values.values()),
                    "baseline_ttft_later_turns_s": _spread_json(later[baseline].values()),
                    "ratios": ratios,
                    "verdict": v.to_json(),
                }
            )
    return {"turns": turns, "comparisons": comparisons}


def _concurrency(data: BenchData, baseline: str | None) -> list[dict[str, Any]]:
    """One row per configuration, slot count and client count: aggregate throughput (median
    of repeats), what one client sees (per-stream decode rate), and time to first token p50/p95
    over every request of the row."""
    by: dict[tuple[str, int | None, int], dict[int, float | None]] = defaultdict(dict)
    for load in data.loads:
        by[(load.config, load.slots, load.level)][load.repeat] = load.throughput
    reqs = _group([r for r in data.requests if r.phase == "concurrency" and not r.error], "config", "slots", "level")
    out = []
    for (config, slots, level), values in by.items():
        group = reqs.get((config, slots, level), [])
        ttfts = [r.ttft_s for r in group if r.ttft_s is not None]
        row: dict[str, Any] = {
            "config": config,
            "slots": slots,
            "level": level,
            "throughput_tps": _spread_json(values.values()),
            "per_stream_tps": _spread_json(r.client_decode_tps for r in group),
            "ttft_s": _spread_json(ttfts),
            "ttft_p50_s": percentile(ttfts, 50),
            "ttft_p95_s": percentile(ttfts, 95),
            "ratios": None,
            "verdict": None,
        }
        base_key = _baseline_key(by, baseline, slots, level) if baseline and config != baseline else None
        row["baseline_slots"] = base_key[1] if base_key else None
        if base_key:
            base = by[base_key]
            ratios = paired_ratios(values, base)
            row["ratios"] = ratios
            row["verdict"] = verdict(ratios, spread(base.values()), spread(values.values())).to_json()
        out.append(row)
    order = {c.name: i for i, c in enumerate(data.configs)}
    return sorted(out, key=lambda r: (r["level"], order.get(r["config"], 99), r["slots"] or 0))


def _baseline_key(by: dict, baseline: str, slots: int | None, level: int) -> tuple | None:
    """The baseline row to compare with: the same slot count when the baseline ran it
    (--parallel), else the baseline's only server at this client count (its own slots: a
    plain server's auto 4 against a speculative server's 1, as each would run by default)."""
    if (baseline, slots, level) in by:
        return (baseline, slots, level)
    own = [k for k in by if k[0] == baseline and k[2] == level]
    return own[0] if len(own) == 1 else None


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile (p95 of 20 values is the 19th smallest); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


USERS_TIE = 0.05  # totals within 5% of the best count as a tie, broken by the sooner first token


def setting_for(config: dict[str, Any], slots: int | None) -> str:
    """The environment that reproduces a configuration with `bonsai start`."""
    name, spec_type = config["name"], config.get("spec_type")
    if name in ("plain", "baseline"):
        env = "BONSAI_SPECULATIVE=0"
    elif name == "speculative" or not spec_type:
        env = "BONSAI_SPECULATIVE=1"
    else:
        env = f"BONSAI_SPECULATIVE=1 BONSAI_SPEC_TYPE={spec_type}"
    return env + (f" BONSAI_PARALLEL={slots}" if slots else "")


def users_verdicts(rows: list[dict[str, Any]], configs: list[dict[str, Any]], repeats: int) -> list[dict[str, Any]]:
    """For each client count K: the configuration and slot count that serve K simultaneous users
    best. Best = the highest aggregate tok/s (median of repeats); candidates within 5% of it
    count as a tie, and the one whose first token comes soonest at p95 wins the tie."""
    by_name = {c["name"]: c for c in configs}
    out = []
    for level in sorted({r["level"] for r in rows}):
        candidates = [r for r in rows if r["level"] == level and r["throughput_tps"]]
        if not candidates:
            continue
        top = max(r["throughput_tps"]["median"] for r in candidates)
        tied = [r for r in candidates if r["throughput_tps"]["median"] >= top * (1 - USERS_TIE)]
        best = min(
            tied,
            key=lambda r: (
                r["ttft_p95_s"] if r["ttft_p95_s"] is not None else math.inf,
                -r["throughput_tps"]["median"],
            ),
        )
        others = sorted((r for r in candidates if r is not best), key=lambda r: -r["throughput_tps"]["median"])
        config = by_name.get(best["config"], {"name": best["config"], "label": best["config"]})
        slots = best["slots"]
        what = config.get("label", best["config"]) + (f" with {slots} slot{'s' if slots != 1 else ''}" if slots else "")
        per = best["per_stream_tps"]["median"] if best["per_stream_tps"] else None
        line = (
            f"for {level} simultaneous user{'s' if level != 1 else ''}, use {what}: "
            f"{best['throughput_tps']['median']:.1f} tok/s total"
            + (f", {per:.1f} tok/s per user" if per is not None else "")
            + (f", first token p95 {best['ttft_p95_s']:.2f} s" if best["ttft_p95_s"] is not None else "")
        )
        if others:
            nxt = others[0]
            nxt_label = by_name.get(nxt["config"], {}).get("label", nxt["config"])
            nxt_slots = f" {nxt['slots']} slot{'s' if nxt['slots'] != 1 else ''}" if nxt["slots"] else ""
            line += f" (next: {nxt_label}{nxt_slots}, {nxt['throughput_tps']['median']:.1f} tok/s)"
        if repeats < 3:
            line += "; fewer than 3 repeats: indicative only"
        out.append(
            {
                "clients": level,
                "config": best["config"],
                "slots": slots,
                "settings": setting_for(config, slots),
                "throughput_tps": best["throughput_tps"]["median"],
                "per_stream_tps": per,
                "ttft_p95_s": best["ttft_p95_s"],
                "tied": len(tied) > 1,
                "line": line,
            }
        )
    return out


def _memory(data: BenchData, baseline: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    base_rss = None
    for spec in data.configs:
        runs = [s for s in data.servers if s.config == spec.name]
        rss = spread(s.peak_rss_bytes for s in runs)
        row: dict[str, Any] = {
            "config": spec.name,
            "peak_rss_bytes": rss.to_json() if rss else None,
            "peak_gpu_bytes": _spread_json(s.peak_gpu_bytes for s in runs),
            "startup_s": _spread_json(s.startup_s for s in runs),
            "servers": len(runs),
            "rss_delta_bytes": None,
        }
        if spec.name == baseline:
            base_rss = rss
        out.append(row)
    if base_rss is not None:
        for row in out:
            if row["peak_rss_bytes"] and row["config"] != baseline:
                row["rss_delta_bytes"] = row["peak_rss_bytes"]["median"] - base_rss.median
    return out
