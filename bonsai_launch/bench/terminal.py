"""The report on the terminal: rich tables of verdicts, per-configuration speeds and the trade-offs."""

from __future__ import annotations

from bonsai_launch.bench.format import (
    LEGEND,
    MARK,
    candidate_configs,
    category_speed_rows,
    concurrency_rows,
    config_labels,
    equality_text,
    find_comparison,
    find_result,
    label_of,
    machine_text,
    median_text,
    mib_text,
    pct_text,
    ratio_text,
    speed_text,
    temp_text,
)


def print_terminal(doc: dict, console=None, paths: dict[str, str] | None = None) -> None:
    from rich.console import Console

    console = console or Console()
    labels = config_labels(doc)
    base = doc.get("baseline")
    cands = candidate_configs(doc)
    o = doc["options"]
    console.print(
        f"[bold]bonsai bench[/bold] ({doc['mode']} mode): {len(doc['configs'])} configurations, "
        f"{o['repeats']} repeats, temperatures {', '.join(temp_text(t) for t in o['temps'])}, "
        f"max {o['max_tokens']} tokens; {machine_text(doc)}"
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
        comp = find_comparison(doc, c, "all", 0.0)
        if not (comp and comp.get("output_equality")):
            continue
        console.print(
            f"  temperature 0, {labels.get(c, c)} vs {label_of(labels, base)}: {equality_text(comp['output_equality'])}"
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
        title=f"Decode speed: {label_of(labels, base)} tok/s, others as paired ratios (median of repeats; "
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
                temp_text(temp),
                *[median_text((find_result(doc, base, cat, temp) or {}).get("decode_tps")) for cat in cats],
            )
        for c in cands:
            cells = []
            for cat in cats:
                comp = find_comparison(doc, c, cat, temp)
                v = comp["verdict"] if comp else None
                cells.append(
                    f"{v['ratio']['median']:.2f}x {MARK.get(v['kind'], v['kind'])}" if v and v.get("ratio") else "-"
                )
            speed.add_row(labels.get(c, c), temp_text(temp), *cells)
            accept.add_row(
                labels.get(c, c),
                temp_text(temp),
                *[pct_text((find_result(doc, c, cat, temp) or {}).get("acceptance_rate")) for cat in cats],
            )
    return speed, accept


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
                cells.append(speed_text(r["ttft_s"], 3, " s") + extra)
            t.add_row(labels.get(config, config), *cells)
        console.print(t)
        for c in mt.get("comparisons") or []:
            console.print(
                f"  first token on turns 2+, {labels.get(c['config'], c['config'])} vs baseline: "
                f"{ratio_text(c['verdict'])} (above 1 = sooner)"
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
                mib_text(m["peak_rss_bytes"]),
                "-" if delta is None else f"{delta / 2**20:+.0f} MiB",
                mib_text(m.get("peak_gpu_bytes")),
                speed_text(m.get("startup_s"), 2, " s"),
            )
        console.print(t)
