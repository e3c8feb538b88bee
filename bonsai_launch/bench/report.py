"""Drawing the report: a rich table for the terminal, Markdown, JSON and an SVG chart.

Every renderer reads the one summary dict (summary.py), so the four outputs always agree.
The chart needs nothing beyond the standard library (chart.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MARK = {"faster": "faster", "slower": "SLOWER", "noise": "noise", "inconclusive": "?"}
LEGEND = (
    "faster / SLOWER: beyond the noise band; noise: within it; ?: fewer than 3 repeats, no verdict. "
    "Ratios are paired per repeat, candidate / baseline, median (min-max). "
    "acc. rate = accepted / drafted draft tokens."
)


# -- small formatters ---------------------------------------------------------------------------


def _sp(s: dict | None, digits: int = 1, unit: str = "") -> str:
    if not s:
        return "-"
    if s["n"] == 1 or s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}{unit}"
    return f"{s['median']:.{digits}f}{unit} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def _ratio(v: dict | None) -> str:
    if not v or not v.get("ratio"):
        return "-"
    r = v["ratio"]
    text = f"{r['median']:.2f}x"
    if r["n"] > 1:
        text += f" ({r['min']:.2f}-{r['max']:.2f})"
    return f"{text} {MARK.get(v['kind'], v['kind'])}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _mib(s: dict | None) -> str:
    if not s:
        return "-"
    return _sp({k: (v / 2**20 if k != "n" else v) for k, v in s.items()}, 0, " MiB")


def _temp(t: float) -> str:
    return f"{t:g}"


def _labels(doc: dict) -> dict[str, str]:
    return {c["name"]: c["label"] for c in doc["configs"]}


def _equality_text(eq: dict | None) -> str:
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


def _result(doc: dict, config: str, category: str, temp: float) -> dict | None:
    return next(
        (r for r in doc["results"] if r["config"] == config and r["category"] == category and r["temperature"] == temp),
        None,
    )


def _label(labels: dict[str, str], config: str | None) -> str | None:
    """A configuration's display name (its own name when it has none)."""
    return labels.get(config, config) if config is not None else None


def _comparison(doc: dict, config: str, category: str, temp: float) -> dict | None:
    return next(
        (
            c
            for c in doc["comparisons"]
            if c["config"] == config and c["category"] == category and c["temperature"] == temp
        ),
        None,
    )


def _candidates(doc: dict) -> list[str]:
    return [c["name"] for c in doc["configs"] if c["name"] != doc.get("baseline")]


def _machine(doc: dict) -> str:
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


# -- terminal -------------------------------------------------------------------------------------


def print_terminal(doc: dict, console=None, paths: dict[str, str] | None = None) -> None:
    from rich.console import Console

    console = console or Console()
    labels = _labels(doc)
    base = doc.get("baseline")
    cands = _candidates(doc)
    o = doc["options"]
    console.print(
        f"[bold]bonsai bench[/bold] ({doc['mode']} mode): {len(doc['configs'])} configurations, "
        f"{o['repeats']} repeats, temperatures {', '.join(_temp(t) for t in o['temps'])}, "
        f"max {o['max_tokens']} tokens; {_machine(doc)}"
    )

    if len(cands) <= 2:
        console.print(_category_rows_table(doc))
    else:
        # Many configurations: one row each, categories across, so the table stays readable.
        for table in _config_rows_tables(doc, labels, base, cands):
            console.print(table)
    console.print(f"[dim]{LEGEND}[/dim]")

    if doc["verdicts"]:
        console.print("[bold]Verdicts[/bold]")
        for v in doc["verdicts"]:
            style = {"faster": "green", "slower": "red"}.get(v["kind"], "yellow")
            console.print(f"  [{style}]{v['line']}[/{style}]")
    for c in cands:
        comp = _comparison(doc, c, "all", 0.0)
        if not (comp and comp.get("output_equality")):
            continue
        console.print(
            f"  temperature 0, {labels.get(c, c)} vs {_label(labels, base)}: {_equality_text(comp['output_equality'])}"
        )

    _print_tradeoffs(doc, console, labels)
    if paths:
        for kind, path in paths.items():
            console.print(f"  {kind}: {path}")
    from rich.markup import escape

    for note in doc.get("notes") or []:
        console.print(f"  [dim]note: {escape(note)}[/dim]")  # a note may hold [brackets], e.g. pip extras


def _category_rows_table(doc: dict):
    """The per-category speed table for the terminal: the Markdown table's rows without the
    verdict column (the verdict lines are printed right below it)."""
    from rich.table import Table

    header, rows = category_speed_rows(doc)
    table = Table(title="Decode speed per category (median of repeats, min-max; ratios paired per repeat)")
    for i, name in enumerate(header[:-1]):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row[:-1])
    return table


def _config_rows_tables(doc: dict, labels: dict[str, str], base: str | None, cands: list[str]):
    from rich.table import Table

    cats = doc["categories"] + ["all"]
    speed = Table(
        title=f"Decode speed: {_label(labels, base)} tok/s, others as paired ratios (median of repeats; "
        "ranges in bench.md)"
    )
    accept = Table(title="Acceptance rate (accepted / drafted draft tokens)")
    for table in (speed, accept):
        table.add_column("configuration")
        table.add_column("T", justify="right")
        for cat in cats:
            table.add_column(cat, justify="right")
    for temp in doc["options"]["temps"]:
        if base:
            speed.add_row(
                labels.get(base, base),
                _temp(temp),
                *[_sp_median((_result(doc, base, cat, temp) or {}).get("decode_tps")) for cat in cats],
            )
        for c in cands:
            cells = []
            for cat in cats:
                comp = _comparison(doc, c, cat, temp)
                v = comp["verdict"] if comp else None
                cells.append(
                    f"{v['ratio']['median']:.2f}x {MARK.get(v['kind'], v['kind'])}" if v and v.get("ratio") else "-"
                )
            speed.add_row(labels.get(c, c), _temp(temp), *cells)
            accept.add_row(
                labels.get(c, c),
                _temp(temp),
                *[_pct((_result(doc, c, cat, temp) or {}).get("acceptance_rate")) for cat in cats],
            )
    return speed, accept


def _sp_median(s: dict | None) -> str:
    return "-" if not s else f"{s['median']:.1f}"


def _print_tradeoffs(doc: dict, console, labels: dict[str, str]) -> None:
    from rich.table import Table

    mt = doc.get("multi_turn") or {}
    if mt.get("turns"):
        t = Table(title="Multi-turn: time to first token per turn (prompt tokens evaluated / reused from cache)")
        t.add_column("configuration")
        turns = sorted({r["turn"] for r in mt["turns"]})
        for n in turns:
            t.add_column(f"turn {n}", justify="right")
        for config in [c["name"] for c in doc["configs"]]:
            cells = []
            for n in turns:
                r = next((x for x in mt["turns"] if x["config"] == config and x["turn"] == n), None)
                if r is None:
                    cells.append("-")
                    continue
                ev = r["prompt_n"]["median"] if r.get("prompt_n") else None
                ca = r["cache_n"]["median"] if r.get("cache_n") else None
                extra = f" ({ev:.0f}/{ca:.0f})" if ev is not None and ca is not None else ""
                cells.append(_sp(r["ttft_s"], 3, " s") + extra)
            t.add_row(labels.get(config, config), *cells)
        console.print(t)
        for c in mt.get("comparisons") or []:
            console.print(
                f"  first token on turns 2+, {labels.get(c['config'], c['config'])} vs baseline: "
                f"{_ratio(c['verdict'])} (above 1 = sooner)"
            )
    conc = doc.get("concurrency") or []
    if conc:
        header, rows = concurrency_rows(doc)
        t = Table(title="Slots x clients: total and per-user speed, time to first token")
        for name in header:
            t.add_column(name, justify="left" if name == "configuration" else "right")
        for row in rows:
            t.add_row(*row)
        console.print(t)
        for u in doc.get("users") or []:
            console.print(f"  [bold]{u['line']}[/bold]  [dim]({u['settings']})[/dim]")
    mem = doc.get("memory") or []
    if any(m.get("peak_rss_bytes") for m in mem):
        t = Table(title="Memory and startup per server")
        t.add_column("configuration")
        t.add_column("peak RSS", justify="right")
        t.add_column("vs baseline", justify="right")
        t.add_column("GPU memory", justify="right")
        t.add_column("ready after", justify="right")
        for m in mem:
            delta = m.get("rss_delta_bytes")
            t.add_row(
                labels.get(m["config"], m["config"]),
                _mib(m["peak_rss_bytes"]),
                "-" if delta is None else f"{delta / 2**20:+.0f} MiB",
                _mib(m.get("peak_gpu_bytes")),
                _sp(m.get("startup_s"), 2, " s"),
            )
        console.print(t)


# -- Markdown -------------------------------------------------------------------------------------


def _md_table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> list[str]:
    align = align or ["l"] + ["r"] * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def category_speed_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-category table: baseline tok/s, each candidate's paired ratio
    and acceptance rate, and the verdict; one source for the terminal and the Markdown report."""
    labels = _labels(doc)
    base = doc.get("baseline")
    cands = _candidates(doc)
    header = ["category", "T"] + ([f"{labels.get(base, base)} tok/s"] if base else [])
    for c in cands:
        header += [labels.get(c, c), "acc. rate"]
    header.append("verdict")
    rows = []
    for temp in doc["options"]["temps"]:
        for category in doc["categories"] + ["all"]:
            row = [category, _temp(temp)]
            if base:
                row.append(_sp((_result(doc, base, category, temp) or {}).get("decode_tps")))
            for c in cands:
                comp = _comparison(doc, c, category, temp)
                res = _result(doc, c, category, temp) or {}
                row += [
                    _ratio(comp["verdict"]) if comp else _sp(res.get("decode_tps")),
                    _pct(res.get("acceptance_rate")),
                ]
            v = next((x for x in doc["verdicts"] if x["category"] == category and x["temperature"] == temp), None)
            row.append(v["line"].split(": ", 1)[1] if v else "-")
            rows.append(row)
    return header, rows


def concurrency_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    """The slots x clients table: one source for the terminal and the Markdown report."""
    labels = _labels(doc)
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
                labels.get(r["config"], r["config"]),
                "-" if r.get("slots") is None else str(r["slots"]),
                _sp(r["throughput_tps"]),
                _sp_median(r.get("per_stream_tps")),
                _num(r.get("ttft_p50_s")),
                _num(r.get("ttft_p95_s")),
                _vs_baseline(r),
            ]
        )
    return header, rows


def _vs_baseline(row: dict) -> str:
    if not row.get("verdict"):
        return "-"
    text = _ratio(row["verdict"])
    if row.get("baseline_slots") is not None and row.get("baseline_slots") != row.get("slots"):
        text += f" (baseline on {row['baseline_slots']})"
    return text


def verdict_table_markdown(doc: dict) -> list[str]:
    header, rows = category_speed_rows(doc)
    return _md_table(header, rows, ["l", "r"] + ["r"] * (len(header) - 3) + ["l"])


def config_rows_markdown(doc: dict) -> list[str]:
    """Many configurations: one row per configuration and temperature, categories across;
    then the acceptance rates in the same layout."""
    labels = _labels(doc)
    base = doc.get("baseline")
    cats = doc["categories"] + ["all"]
    speed, accept = [], []
    for temp in doc["options"]["temps"]:
        if base:
            speed.append(
                [f"{labels.get(base, base)} (tok/s)", _temp(temp)]
                + [_sp((_result(doc, base, cat, temp) or {}).get("decode_tps")) for cat in cats]
            )
        for c in _candidates(doc):
            row = [labels.get(c, c), _temp(temp)]
            for cat in cats:
                comp = _comparison(doc, c, cat, temp)
                row.append(_ratio(comp["verdict"]) if comp else "-")
            speed.append(row)
            accept.append(
                [labels.get(c, c), _temp(temp)]
                + [_pct((_result(doc, c, cat, temp) or {}).get("acceptance_rate")) for cat in cats]
            )
    header = ["configuration", "T"] + cats
    out = _md_table(header, speed)
    out += ["", "Acceptance rate (accepted / drafted draft tokens):", ""]
    out += _md_table(header, accept)
    return out


def to_markdown(doc: dict, chart: str | None = None) -> str:
    labels = _labels(doc)
    o = doc["options"]
    lines = [f"# bonsai bench report ({doc['created']})", ""]
    lines.append(f"- mode: {doc['mode']}; configurations: " + ", ".join(labels[c["name"]] for c in doc["configs"]))
    lines.append(
        f"- {o['repeats']} repeats, temperatures {', '.join(_temp(t) for t in o['temps'])}, "
        f"max {o['max_tokens']} tokens, API {o['api']}, categories {', '.join(doc['categories'])}"
        + (" (--quick)" if o.get("quick") else "")
    )
    lines.append(f"- machine: {_machine(doc)}")
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
    if len(_candidates(doc)) <= 2:
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
        comp = _comparison(doc, r["config"], r["category"], r["temperature"])
        rows.append(
            [
                labels.get(r["config"], r["config"]),
                r["category"],
                _temp(r["temperature"]),
                _sp(r["decode_tps"]),
                _sp(r["client_decode_tps"]),
                _sp(r["prefill_tps"], 0),
                _sp(r["ttft_s"], 3),
                _pct(r["acceptance_rate"]),
                _num(r["mean_acceptance_length"]),
                _equality_text(comp.get("output_equality")) if comp else "-",
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
                cells.append(_sp(r["ttft_s"], 3, " s") if r else "-")
            rows.append(cells)
        lines += _md_table(["configuration"] + [f"turn {n}" for n in turns], rows)
        for c in mt.get("comparisons") or []:
            lines.append("")
            lines.append(
                f"Turns 2+, {labels.get(c['config'], c['config'])}: baseline TTFT / candidate TTFT "
                f"{_ratio(c['verdict'])} (above 1 = first token sooner)."
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
                    _mib(m["peak_rss_bytes"]),
                    "-" if delta is None else f"{delta / 2**20:+.0f} MiB",
                    _mib(m.get("peak_gpu_bytes")),
                    _sp(m.get("startup_s"), 2, " s"),
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
