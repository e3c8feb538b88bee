"""Drawing the report: a rich table for the terminal, Markdown, JSON and an SVG chart.

Every renderer reads the one summary dict (summary.py), so the four outputs always agree.
The chart needs nothing beyond the standard library (chart.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bonsai_launch.bench.format import (
    LEGEND,
    candidate_configs,
    category_speed_rows,
    concurrency_rows,
    config_labels,
    equality_text,
    find_comparison,
    find_result,
    machine_text,
    mib_text,
    num_text,
    pct_text,
    ratio_text,
    speed_text,
    temp_text,
)

# -- small formatters ---------------------------------------------------------------------------


# -- terminal -------------------------------------------------------------------------------------


# -- Markdown -------------------------------------------------------------------------------------


def _md_table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> list[str]:
    align = align or ["l"] + ["r"] * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def verdict_table_markdown(doc: dict) -> list[str]:
    header, rows = category_speed_rows(doc)
    return _md_table(header, rows, ["l", "r"] + ["r"] * (len(header) - 3) + ["l"])


def config_rows_markdown(doc: dict) -> list[str]:
    """Many configurations: one row per configuration and temperature, categories across;
    then the acceptance rates in the same layout."""
    labels = config_labels(doc)
    base = doc.get("baseline")
    cats = doc["categories"] + ["all"]
    speed, accept = [], []
    for temp in doc["options"]["temps"]:
        if base:
            speed.append(
                [f"{labels.get(base, base)} (tok/s)", temp_text(temp)]
                + [speed_text((find_result(doc, base, cat, temp) or {}).get("decode_tps")) for cat in cats]
            )
        for c in candidate_configs(doc):
            row = [labels.get(c, c), temp_text(temp)]
            for cat in cats:
                comp = find_comparison(doc, c, cat, temp)
                row.append(ratio_text(comp["verdict"]) if comp else "-")
            speed.append(row)
            accept.append(
                [labels.get(c, c), temp_text(temp)]
                + [pct_text((find_result(doc, c, cat, temp) or {}).get("acceptance_rate")) for cat in cats]
            )
    header = ["configuration", "T"] + cats
    out = _md_table(header, speed)
    out += ["", "Acceptance rate (accepted / drafted draft tokens):", ""]
    out += _md_table(header, accept)
    return out


def to_markdown(doc: dict, chart: str | None = None) -> str:
    labels = config_labels(doc)
    o = doc["options"]
    lines = [f"# bonsai bench report ({doc['created']})", ""]
    lines.append(f"- mode: {doc['mode']}; configurations: " + ", ".join(labels[c["name"]] for c in doc["configs"]))
    lines.append(
        f"- {o['repeats']} repeats, temperatures {', '.join(temp_text(t) for t in o['temps'])}, "
        f"max {o['max_tokens']} tokens, API {o['api']}, categories {', '.join(doc['categories'])}"
        + (" (--quick)" if o.get("quick") else "")
    )
    lines.append(f"- machine: {machine_text(doc)}")
    lines.append(f"- duration: {doc['duration_s']:.0f} s")
    for c in doc["configs"]:
        if c.get("argv"):
            lines.append(f"- `{c['name']}`: `{' '.join(c['argv'][1:])}`")
        elif c.get("url"):
            lines.append(f"- `{c['name']}`: {c['url']}")
    lines += ["", "## Verdicts", ""]
    lines += [f"- {v['line']}" for v in doc["verdicts"]] or ["- no comparison (one configuration)"]
    lines += [
        "",
        "## Decode speed per category",
        "",
        (
            "The baseline's numbers are decode tok/s, median of the repeats (min-max); the others are paired "
            "ratios (candidate / baseline of the same repeat) with the verdict of the noise rule."
        ),
        "",
    ]
    if len(candidate_configs(doc)) <= 2:
        lines += verdict_table_markdown(doc)
    else:
        lines += config_rows_markdown(doc)
    lines += ["", LEGEND]
    if chart:
        lines += ["", f"![decode tok/s per category]({chart})"]

    lines += ["", "## Details", ""]
    header = [
        "config",
        "category",
        "T",
        "decode tok/s",
        "client decode tok/s",
        "prefill tok/s",
        "TTFT s",
        "acceptance rate",
        "mean acceptance length",
        "temperature-0 output vs baseline",
    ]
    rows = []
    for r in doc["results"]:
        comp = find_comparison(doc, r["config"], r["category"], r["temperature"])
        rows.append(
            [
                labels.get(r["config"], r["config"]),
                r["category"],
                temp_text(r["temperature"]),
                speed_text(r["decode_tps"]),
                speed_text(r["client_decode_tps"]),
                speed_text(r["prefill_tps"], 0),
                speed_text(r["ttft_s"], 3),
                pct_text(r["acceptance_rate"]),
                num_text(r["mean_acceptance_length"]),
                equality_text(comp.get("output_equality")) if comp else "-",
            ]
        )
    lines += _md_table(header, rows, ["l", "l", "r", "r", "r", "r", "r", "r", "r", "l"])

    mt = doc.get("multi_turn") or {}
    if mt.get("turns"):
        lines += ["", "## Trade-off: time to first token in a conversation", ""]
        turns = sorted({r["turn"] for r in mt["turns"]})
        rows = []
        for c in doc["configs"]:
            cells = [labels[c["name"]]]
            for n in turns:
                r = next((x for x in mt["turns"] if x["config"] == c["name"] and x["turn"] == n), None)
                cells.append(speed_text(r["ttft_s"], 3, " s") if r else "-")
            rows.append(cells)
        lines += _md_table(["configuration"] + [f"turn {n}" for n in turns], rows)
        for c in mt.get("comparisons") or []:
            lines.append("")
            lines.append(
                f"Turns 2+, {labels.get(c['config'], c['config'])}: baseline TTFT / candidate TTFT "
                f"{ratio_text(c['verdict'])} (above 1 = first token sooner)."
            )
    conc = doc.get("concurrency") or []
    if conc:
        lines += ["", "## Trade-off: slots x concurrent clients", ""]
        header, rows = concurrency_rows(doc)
        lines += _md_table(header, rows, ["r", "l"] + ["r"] * (len(header) - 2))
        users = doc.get("users") or []
        if users:
            lines += ["", "### For K simultaneous users", ""]
            lines += [f"- {u['line']} (`{u['settings']}`)" for u in users]
        if doc.get("concurrency_chart"):
            lines += ["", f"![total tok/s and time to first token per client count]({doc['concurrency_chart']})"]
    mem = doc.get("memory") or []
    if any(m.get("peak_rss_bytes") for m in mem):
        lines += ["", "## Memory and startup", ""]
        rows = []
        for m in mem:
            delta = m.get("rss_delta_bytes")
            rows.append(
                [
                    labels.get(m["config"], m["config"]),
                    mib_text(m["peak_rss_bytes"]),
                    "-" if delta is None else f"{delta / 2**20:+.0f} MiB",
                    mib_text(m.get("peak_gpu_bytes")),
                    speed_text(m.get("startup_s"), 2, " s"),
                ]
            )
        lines += _md_table(["configuration", "peak RSS", "vs baseline", "GPU memory", "ready after"], rows)
    lines += ["", "## Definitions", ""]
    lines += [f"- **{k}**: {v}" for k, v in doc["definitions"].items()]
    if doc.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    return "\n".join(lines) + "\n"


# -- chart ----------------------------------------------------------------------------------------


def write_chart(doc: dict, path: Path) -> None:
    """Grouped bars of decode tok/s per category and configuration (bench/chart.py), as SVG."""
    from bonsai_launch.bench import chart

    _write_text(path, chart.render(doc))


# -- files ----------------------------------------------------------------------------------------


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def to_json_text(doc: dict) -> str:
    return json.dumps(doc, indent=2, default=str) + "\n"


def write_reports(doc: dict, out_dir: Path, chart: bool = True) -> dict[str, str]:
    """bench.json, bench.md and (unless chart=False) bench.svg and, with concurrency rows,
    concurrency.svg in `out_dir`; returns their paths. Each file is written under a temporary
    name and renamed, so none is ever half-written."""
    from bonsai_launch.bench import chart as charts

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, str] = {}
    if chart:
        write_chart(doc, out_dir / "bench.svg")
        paths["chart"] = str(out_dir / "bench.svg")
        concurrency = charts.render_concurrency(doc)
        if concurrency is not None:
            _write_text(out_dir / "concurrency.svg", concurrency)
            paths["concurrency_chart"] = str(out_dir / "concurrency.svg")
            doc["concurrency_chart"] = "concurrency.svg"
    _write_text(out_dir / "bench.json", to_json_text(doc))
    paths["json"] = str(out_dir / "bench.json")
    _write_text(out_dir / "bench.md", to_markdown(doc, "bench.svg" if "chart" in paths else None))
    paths["markdown"] = str(out_dir / "bench.md")
    return paths
