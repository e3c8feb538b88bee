"""The decision rule: plain, unless a speculative configuration is faster beyond noise.

Pure, over the document `bonsai bench` writes (bench/summary.py), so `bonsai tune` and
`bonsai bench --save` decide by one rule:

  A configuration qualifies when its decode speed, pooled over all prompts ("all" category),
  has the bench's verdict "faster" against plain at every temperature measured: every paired
  ratio above 1 and the median at least 1 + the noise band (bench/stats.py). Among those, the
  one with the highest median ratio (its lowest over the temperatures) wins, except that among
  those within the leader's noise band of it (median ratio >= the leader's / (1 + band)) the one
  combining the most draft types wins: the measurement cannot tell them apart, and a combination
  (`ngram-simple,ngram-mod`) drafts wherever any of its types would, so it holds up on work the
  tune's prompts do not contain (issue 47: ngram-simple alone and with ngram-mod tied at 2.20x
  and 2.19x on the tune's prompts; on unseen chat the lone type ran at 0.58x of the best choice
  and the combination at 1.00x). With none, the decision is plain: speculation is never chosen
  without a gain beyond noise.

  A configuration whose drafts were never accepted does not qualify, whatever its speed: its
  "gain" cannot come from speculation (seen on a loaded machine: ngram-mod drafting nothing at
  1.45x plain over three alternating runs), so it is an artefact a launch would not keep.
"""

from __future__ import annotations

from typing import Any

from bonsai_launch.decisions.store import Choice

RULE = (
    "speculation is chosen only when its pooled decode speed is 'faster' than plain under the bench's noise "
    "rule at every temperature measured (every paired ratio > 1 and median >= 1 + noise band) and some of its "
    "drafts were accepted; the highest median ratio wins, but among those within its noise band of it the one "
    "combining the most draft types; otherwise plain"
)


def _type_count(spec_type: str | None) -> int:
    """How many draft types a configuration combines (`ngram-simple,ngram-mod`: 2)."""
    return len([t for t in (spec_type or "").split(",") if t.strip()])


def _config_choice_fields(config: dict[str, Any]) -> tuple[str | None, int | None]:
    spec = config.get("speculative") or None
    if not spec:
        return (config.get("spec_type"), None)
    return spec.get("type"), spec.get("n_max")


def _head_rows(config: dict[str, Any]) -> int | None:
    """The draft model's head rows as the plan ran them (None: llama's default)."""
    return (config.get("speculative") or {}).get("head_rows")


def _median(comparison: dict) -> float:
    median = ((comparison.get("verdict") or {}).get("ratio") or {}).get("median")
    return float("inf") if median is None else median


def _result(doc: dict, config: str, temp: float) -> dict | None:
    return next(
        (
            r
            for r in doc.get("results", [])
            if r["config"] == config and r["category"] == "all" and r["temperature"] == temp
        ),
        None,
    )


def _status(kind: str | None, n: int, chosen: bool) -> str:
    if chosen:
        return "chosen: faster beyond noise"
    if kind == "faster":
        return "faster, less than the chosen one"
    if kind == "slower":
        return "slower"
    if kind == "noise":
        return "no gain beyond noise"
    if n == 1:
        return "screened out after one run"
    return f"too few runs ({n})" if n else "not measured"


def decide(doc: dict[str, Any], skipped: dict[str, str] | None = None) -> tuple[Choice, list[dict[str, Any]]]:
    """The choice and one table row per configuration (plain first). `skipped` names
    configurations that were planned but not measured, with why."""
    baseline = doc.get("baseline")
    temps = list(doc.get("options", {}).get("temps") or [])
    configs = {c["name"]: c for c in doc.get("configs", [])}
    scored: list[tuple[float, str, dict]] = []
    per_config: dict[str, dict] = {}
    for name in configs:
        if name == baseline:
            continue
        comps = [c for c in doc.get("comparisons", []) if c["config"] == name and c["category"] == "all"]
        by_temp = {c["temperature"]: c for c in comps}
        present = [(t, by_temp[t]) for t in temps if t in by_temp]
        if present:  # show the temperature where it did worst
            temp, comp = min(present, key=lambda tc: _median(tc[1]))
        else:
            temp, comp = (temps[0] if temps else None), None
        per_config[name] = {"temperature": temp, "comparison": comp}
        faster = bool(temps) and all(by_temp.get(t) and by_temp[t]["verdict"]["kind"] == "faster" for t in temps)
        accepted = [(_result(doc, name, t) or {}).get("accepted") for t in temps]
        drafts_accepted = any(a for a in accepted) or all(a is None for a in accepted)  # None: not reported
        per_config[name]["no_drafts"] = faster and not drafts_accepted
        if faster and drafts_accepted:
            scored.append((comp["verdict"]["ratio"]["median"], name, comp))

    choice = Choice(baseline or "plain", "plain", reason="no configuration was faster than plain beyond noise")
    if scored:
        scored.sort(key=lambda s: s[0], reverse=True)
        best_ratio, leader, best_comp = scored[0]
        tied = [s for s in scored if s[0] >= best_ratio / (1 + best_comp["verdict"]["band"])]
        _ratio, name, comp = max(tied, key=lambda s: (_type_count(_config_choice_fields(configs[s[1]])[0]), s[0]))
        spec_type, n_max = _config_choice_fields(configs[name])
        r = comp["verdict"]["ratio"]
        reason = comp["verdict"]["reason"]
        if name != leader:
            reason += (
                f"; within the noise band of {configs[leader].get('label', leader)} ({best_ratio:.2f}x) and "
                "combining more draft types, so it drafts wherever that one would"
            )
        choice = Choice(
            name,
            configs[name].get("label", name),
            spec_type,
            n_max,
            r["median"],
            r["min"],
            r["max"],
            comp["verdict"]["band"],
            reason,
            _head_rows(configs[name]),
        )

    rows = []
    first_temp = temps[0] if temps else 0.0
    if baseline is not None and baseline in configs:
        base_res = _result(doc, baseline, first_temp) or {}
        rows.append(
            {
                "config": baseline,
                "label": configs[baseline].get("label", baseline),
                "spec_type": None,
                "n_max": None,
                "temperature": first_temp,
                "decode_tps": (base_res.get("decode_tps") or {}).get("median"),
                "ratio": None,
                "verdict": None,
                "acceptance_rate": None,
                "runs": (base_res.get("decode_tps") or {}).get("n", 0),
                "status": "chosen: nothing beat it" if not choice.speculative else "baseline",
            }
        )
    for name, info in per_config.items():
        comp = info["comparison"] or {}
        verdict = comp.get("verdict") or {}
        ratio = verdict.get("ratio") or None
        res = _result(doc, name, info["temperature"]) if info["temperature"] is not None else None
        spec_type, n_max = _config_choice_fields(configs[name])
        n = (ratio or {}).get("n", 0)
        rows.append(
            {
                "config": name,
                "label": configs[name].get("label", name),
                "spec_type": spec_type,
                "n_max": n_max,
                "temperature": info["temperature"],
                "decode_tps": ((res or {}).get("decode_tps") or {}).get("median"),
                "ratio": ratio,
                "verdict": verdict.get("kind"),
                "band": verdict.get("band"),
                "acceptance_rate": (res or {}).get("acceptance_rate"),
                "drafted": (res or {}).get("drafted"),
                "runs": n,
                "status": (
                    f"not measured: {skipped[name]}"
                    if skipped and name in skipped and not comp
                    else "faster, but no draft was accepted: not from speculation"
                    if info.get("no_drafts")
                    else _status(verdict.get("kind"), n, name == choice.config)
                ),
            }
        )
    for name, why in (skipped or {}).items():
        if name not in configs:
            rows.append(
                {
                    "config": name,
                    "label": name,
                    "spec_type": None,
                    "n_max": None,
                    "temperature": None,
                    "decode_tps": None,
                    "ratio": None,
                    "verdict": None,
                    "acceptance_rate": None,
                    "runs": 0,
                    "status": f"not measured: {why}",
                }
            )
    return choice, rows


# The table's columns (header, justify). "vs plain" is not the quotient of the two speeds shown:
# it pairs runs (bench/stats.py), which is what the rule decides on, so the header says so.
COLUMNS = (
    ("configuration", "left"),
    ("decode tok/s, median", "right"),
    ("vs plain: median of paired ratios", "right"),
    ("accepted", "right"),
    ("verdict", "left"),
)
RATIO_NOTE = (
    "vs plain: run r of a configuration / plain's run r, median (min-max) over the runs; it can differ "
    "from the ratio of the two medians beside it when runs vary"
)


def format_rows(rows: list[dict[str, Any]]) -> list[tuple[str, str, str, str, str]]:
    """The COLUMNS as text, for tables: configuration, decode tok/s, vs plain, acceptance, verdict."""
    out = []
    for row in rows:
        tps = f"{row['decode_tps']:.1f}" if row.get("decode_tps") is not None else "-"
        r = row.get("ratio")
        if r:
            ratio = f"{r['median']:.2f}x" + (f" ({r['min']:.2f}-{r['max']:.2f})" if r.get("n", 1) > 1 else "")
        else:
            ratio = "-"
        if row.get("acceptance_rate") is not None:
            acc = f"{row['acceptance_rate'] * 100:.0f}%"
        elif row.get("drafted") == 0 and row.get("runs"):
            acc = "none drafted"  # any gain then is not from accepted drafts
        else:
            acc = "-"
        out.append((row["label"], tps, ratio, acc, row["status"]))
    return out
