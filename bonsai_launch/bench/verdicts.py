"""The summary's judgements: where speculative output first differs from plain, the verdict lines
per category and temperature, multi-turn and concurrency rows, memory, and which setting serves K users."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from bonsai_launch.bench.data import BenchData
from bonsai_launch.bench.format import label_on
from bonsai_launch.bench.measure import RequestResult
from bonsai_launch.bench.stats import (
    first_difference,
    group_by,
    paired_ratios,
    percentile,
    piece_index,
    spread,
    spread_json,
    verdict,
)


def equality(requests: list[RequestResult], config: str, baseline: str, category: str) -> dict[str, Any] | None:
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
        "first_diff_char": spread_json(chars),
        "first_diff_piece": spread_json(pieces),
        "baseline_self_consistent": all(len(texts) == 1 for texts in by_prompt.values()),
    }


def verdict_lines(comparisons: list[dict], categories: list[str], temps: list[float], data: BenchData) -> list[dict]:
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


def multi_turn_summary(data: BenchData, baseline: str | None) -> dict[str, Any]:
    reqs = [r for r in data.requests if r.phase == "multi-turn" and not r.error]
    turns = []
    for (config, turn), group in sorted(group_by(reqs, "config", "turn").items(), key=lambda kv: (kv[0][0], kv[0][1])):
        turns.append(
            {
                "config": config,
                "turn": turn,
                "ttft_s": spread_json(r.ttft_s for r in group),
                "prompt_n": spread_json(r.prompt_n for r in group),
                "cache_n": spread_json(r.cache_n for r in group),
            }
        )
    # Per repeat: median TTFT over turns 2+ of every conversation; then paired against the baseline.
    later: dict[str, dict[int, float | None]] = defaultdict(dict)
    for (config, repeat), group in group_by([r for r in reqs if (r.turn or 0) >= 2], "config", "repeat").items():
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
                    "ttft_later_turns_s": spread_json(values.values()),
                    "baseline_ttft_later_turns_s": spread_json(later[baseline].values()),
                    "ratios": ratios,
                    "verdict": v.to_json(),
                }
            )
    return {"turns": turns, "comparisons": comparisons}


def concurrency_summary(data: BenchData, baseline: str | None) -> list[dict[str, Any]]:
    """One row per configuration, slot count and client count: aggregate throughput (median
    of repeats), what one client sees (per-stream decode rate), and time to first token p50/p95
    over every request of the row."""
    by: dict[tuple[str, int | None, int], dict[int, float | None]] = defaultdict(dict)
    for load in data.loads:
        by[(load.config, load.slots, load.level)][load.repeat] = load.throughput
    reqs = group_by([r for r in data.requests if r.phase == "concurrency" and not r.error], "config", "slots", "level")
    out = []
    for (config, slots, level), values in by.items():
        group = reqs.get((config, slots, level), [])
        ttfts = [r.ttft_s for r in group if r.ttft_s is not None]
        row: dict[str, Any] = {
            "config": config,
            "slots": slots,
            "level": level,
            "throughput_tps": spread_json(values.values()),
            "per_stream_tps": spread_json(r.client_decode_tps for r in group),
            "ttft_s": spread_json(ttfts),
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


USERS_TIE = 0.05  # totals within 5% of the best count as a tie, broken by the sooner first token


def setting_for(config: dict[str, Any], slots: int | None) -> str:
    """The environment that reproduces a configuration with `bonsai start`."""
    name, spec_type = config["name"], config.get("spec_type")
    if name in ("plain", "baseline"):
        env = "BONSAI_SPECULATIVE=0"
    elif name == "auto":  # the decision tuned for these slots, whichever type that is
        env = "BONSAI_SPECULATIVE=auto"
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
        what = label_on(config, slots) + (f" with {slots} slot{'s' if slots != 1 else ''}" if slots else "")
        per = best["per_stream_tps"]["median"] if best["per_stream_tps"] else None
        line = (
            f"for {level} simultaneous user{'s' if level != 1 else ''}, use {what}: "
            f"{best['throughput_tps']['median']:.1f} tok/s total"
            + (f", {per:.1f} tok/s per user" if per is not None else "")
            + (f", first token p95 {best['ttft_p95_s']:.2f} s" if best["ttft_p95_s"] is not None else "")
        )
        if others:
            nxt = others[0]
            nxt_label = label_on(by_name.get(nxt["config"], {"name": nxt["config"]}), nxt["slots"])
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


def memory_summary(data: BenchData, baseline: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    base_rss = None
    for spec in data.configs:
        runs = [s for s in data.servers if s.config == spec.name]
        rss = spread(s.peak_rss_bytes for s in runs)
        row: dict[str, Any] = {
            "config": spec.name,
            "peak_rss_bytes": rss.to_json() if rss else None,
            "peak_gpu_bytes": spread_json(s.peak_gpu_bytes for s in runs),
            "startup_s": spread_json(s.startup_s for s in runs),
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
