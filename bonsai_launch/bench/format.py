"""How the report writes numbers and picks rows, for the terminal and for Markdown alike: speeds with
their spread, ratios, verdict marks, and the per-category and per-client-count rows."""

from __future__ import annotations

MARK = {"faster": "faster", "slower": "SLOWER", "noise": "noise", "inconclusive": "?"}


LEGEND = (
    "faster / SLOWER: beyond the noise band; noise: within it; ?: fewer than 3 repeats, no verdict. "
    "Ratios are paired per repeat, candidate / baseline, median (min-max). "
    "acc. rate = accepted / drafted draft tokens."
)


def speed_text(s: dict | None, digits: int = 1, unit: str = "") -> str:
    if not s:
        return "-"
    if s["n"] == 1 or s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}{unit}"
    return f"{s['median']:.{digits}f}{unit} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def ratio_text(v: dict | None) -> str:
    if not v or not v.get("ratio"):
        return "-"
    r = v["ratio"]
    text = f"{r['median']:.2f}x"
    if r["n"] > 1:
        text += f" ({r['min']:.2f}-{r['max']:.2f})"
    return f"{text} {MARK.get(v['kind'], v['kind'])}"


def pct_text(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def num_text(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def mib_text(s: dict | None) -> str:
    if not s:
        return "-"
    return speed_text({k: (v / 2**20 if k != "n" else v) for k, v in s.items()}, 0, " MiB")


def temp_text(t: float) -> str:
    return f"{t:g}"


def config_labels(doc: dict) -> dict[str, str]:
    return {c["name"]: c["label"] for c in doc["configs"]}


def equality_text(eq: dict | None) -> str:
    if not eq:
        return "-"
    text = f"{eq['identical']}/{eq['compared']} identical"
    if eq["identical"] < eq["compared"] and eq.get("first_diff_char"):
        d = eq["first_diff_char"]
        p = eq.get("first_diff_piece") or {}
        text += f"; first diff at char {d['min']:.0f}" + (f" (~token {p['min']:.0f})" if p else "")
        if d["n"] > 1:
            text += f", median char {d['median']:.0f}"
    if not eq.get("baseline_self_consistent", True):
        text += "; baseline itself varies"
    return text


def find_result(doc: dict, config: str, category: str, temp: float) -> dict | None:
    return next(
        (r for r in doc["results"] if r["config"] == config and r["category"] == category and r["temperature"] == temp),
        None,
    )


def label_on(config: dict, slots: int | None) -> str:
    """A configuration's display name on `slots` slots: its own for that slot count (auto: the
    type its decision for that count runs), else its label, else its name."""
    return (config.get("slot_labels") or {}).get(str(slots)) or config.get("label") or config["name"]


def slot_label(doc: dict, config: str, slots: int | None) -> str:
    """`label_on` for the configuration of this name in a report."""
    return next((label_on(c, slots) for c in doc["configs"] if c["name"] == config), config)


def label_of(labels: dict[str, str], config: str | None) -> str | None:
    """A configuration's display name (its own name when it has none)."""
    return labels.get(config, config) if config is not None else None


def find_comparison(doc: dict, config: str, category: str, temp: float) -> dict | None:
    return next(
        (
            c
            for c in doc["comparisons"]
            if c["config"] == config and c["category"] == category and c["temperature"] == temp
        ),
        None,
    )


def candidate_configs(doc: dict) -> list[str]:
    return [c["name"] for c in doc["configs"] if c["name"] != doc.get("baseline")]


def machine_text(doc: dict) -> str:
    env = doc.get("environment") or {}
    hw = env.get("hardware") or {}
    parts = []
    if hw:
        parts.append(f"{hw.get('logical_cores')} logical cores, {hw.get('ram_gb')} GB RAM, {hw.get('arch')}")
        gpus = hw.get("gpus") or []
        if gpus:
            parts.append(", ".join(g["name"] for g in gpus))
    server = env.get("llama_server") or {}
    if server.get("build"):
        parts.append(f"llama.cpp build {server['build']} ({server.get('backend')})")
    if env.get("llama_arg_env"):
        parts.append("environment " + " ".join(f"{k}={v}" for k, v in env["llama_arg_env"].items()))
    la, lb = env.get("load_average_start"), env.get("load_average_end")
    if la:
        parts.append(f"load average {la[0]:.2f} at start" + (f", {lb[0]:.2f} at end" if lb else ""))
    return "; ".join(parts)


def median_text(s: dict | None) -> str:
    return "-" if not s else f"{s['median']:.1f}"


def category_speed_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-category table: baseline tok/s, each candidate's paired ratio
    and acceptance rate, and the verdict; one source for the terminal and the Markdown report."""
    labels = config_labels(doc)
    base = doc.get("baseline")
    cands = candidate_configs(doc)
    header = ["category", "T"] + ([f"{labels.get(base, base)} tok/s"] if base else [])
    for c in cands:
        header += [labels.get(c, c), "acc. rate"]
    header.append("verdict")
    rows = []
    for temp in doc["options"]["temps"]:
        for category in doc["categories"] + ["all"]:
            row = [category, temp_text(temp)]
            if base:
                row.append(speed_text((find_result(doc, base, category, temp) or {}).get("decode_tps")))
            for c in cands:
                comp = find_comparison(doc, c, category, temp)
                res = find_result(doc, c, category, temp) or {}
                row += [
                    ratio_text(comp["verdict"]) if comp else speed_text(res.get("decode_tps")),
                    pct_text(res.get("acceptance_rate")),
                ]
            v = next((x for x in doc["verdicts"] if x["category"] == category and x["temperature"] == temp), None)
            row.append(v["line"].split(": ", 1)[1] if v else "-")
            rows.append(row)
    return header, rows


def concurrency_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    """The slots x clients table: one source for the terminal and the Markdown report."""
    header = [
        "clients",
        "configuration",
        "slots",
        "total tok/s",
        "per user tok/s",
        "TTFT p50 s",
        "TTFT p95 s",
        "vs baseline",
    ]
    rows = []
    for r in doc.get("concurrency") or []:
        rows.append(
            [
                str(r["level"]),
                slot_label(doc, r["config"], r.get("slots")),
                "-" if r.get("slots") is None else str(r["slots"]),
                speed_text(r["throughput_tps"]),
                median_text(r.get("per_stream_tps")),
                num_text(r.get("ttft_p50_s")),
                num_text(r.get("ttft_p95_s")),
                vs_baseline_text(r),
            ]
        )
    return header, rows


def vs_baseline_text(row: dict) -> str:
    if not row.get("verdict"):
        return "-"
    text = ratio_text(row["verdict"])
    if row.get("baseline_slots") is not None and row.get("baseline_slots") != row.get("slots"):
        text += f" (baseline on {row['baseline_slots']})"
    return text
