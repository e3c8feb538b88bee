"""The bench chart as SVG, drawn with the standard library: no extra install.

Grouped bars: decode tok/s per category (median, with a min-max whisker), one bar per
configuration, one panel per temperature. Browsers, GitHub's Markdown and image viewers show
SVG; the document is plain text, so two runs can be compared with diff.
"""

from __future__ import annotations

import math
from typing import Any
from xml.sax.saxutils import escape

COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")
PANEL_H = 260
TOP = 48
LEFT = 56
BAR_W = 14
GAP = 18  # between categories


TITLE = "bonsai bench: decode speed per category and configuration"
EM = 0.6  # a character's width in em, a little above sans-serif's average: text sized by it fits


def text_width(text: str, size: float = 11) -> float:
    """About how wide `text` is drawn at font size `size`, so a frame can be made to hold it."""
    return len(text) * size * EM


def _nice_max(value: float) -> float:
    """A round axis maximum at or above `value` (1, 2, 2.5 or 5 times a power of ten)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power:
            return step * power
    return 10 * power


def render(doc: dict[str, Any]) -> str:
    """The SVG text for a bench document (bench/summary.py)."""
    temps = doc["options"]["temps"]
    cats = list(doc["categories"]) + ["all"]
    configs = [c["name"] for c in doc["configs"]]
    labels = {c["name"]: c.get("label", c["name"]) for c in doc["configs"]}
    results = {(r["config"], r["category"], r["temperature"]): r.get("decode_tps") for r in doc.get("results", [])}
    top_value = max([s["max"] for s in results.values() if s] or [1.0])
    y_max = _nice_max(top_value)
    group_w = len(configs) * BAR_W + GAP
    panel_w = len(cats) * group_w + GAP
    # as wide as the panels, the title (14 px, centred) and the legend's longest label need
    legend_w = LEFT + 18 + max([text_width(labels[c]) for c in configs] or [0.0]) + 10
    width = round(max(LEFT + len(temps) * (panel_w + 20) + 10, text_width(TITLE, 14) + 20, legend_w))
    legend_h = 18 * len(configs) + 10
    height = TOP + PANEL_H + 60 + legend_h
    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'
        ),
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" font-size="14">{TITLE}</text>',
        (
            f'<text x="14" y="{TOP + PANEL_H / 2:.0f}" transform="rotate(-90 14 {TOP + PANEL_H / 2:.0f})" '
            'text-anchor="middle">decode tok/s (median, min-max)</text>'
        ),
    ]

    def y(value: float) -> float:
        return TOP + PANEL_H - value / y_max * PANEL_H

    for p, temp in enumerate(temps):
        x0 = LEFT + p * (panel_w + 20)
        out.append(f'<text x="{x0 + panel_w / 2:.0f}" y="{TOP - 10}" text-anchor="middle">temperature {temp:g}</text>')
        for i in range(5):  # grid and y labels
            value = y_max * i / 4
            out.append(f'<line x1="{x0}" x2="{x0 + panel_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#ddd"/>')
            if p == 0:
                out.append(f'<text x="{x0 - 4}" y="{y(value) + 4:.1f}" text-anchor="end">{value:g}</text>')
        out.append(f'<line x1="{x0}" x2="{x0 + panel_w}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#333"/>')
        for c, cat in enumerate(cats):
            gx = x0 + GAP + c * group_w
            for k, config in enumerate(configs):
                s = results.get((config, cat, temp))
                if not s:
                    continue
                bx = gx + k * BAR_W
                color = COLORS[k % len(COLORS)]
                out.append(
                    f'<rect x="{bx}" y="{y(s["median"]):.1f}" width="{BAR_W - 2}" '
                    f'height="{y(0) - y(s["median"]):.1f}" fill="{color}">'
                    f"<title>{escape(labels[config])}, {escape(cat)}: {s['median']:.1f} tok/s</title></rect>"
                )
                if s["max"] > s["min"]:
                    mid = bx + (BAR_W - 2) / 2
                    out.append(
                        f'<line x1="{mid:.1f}" x2="{mid:.1f}" y1="{y(s["max"]):.1f}" y2="{y(s["min"]):.1f}" '
                        'stroke="#222"/>'
                    )
            out.append(
                f'<text x="{gx + len(configs) * BAR_W / 2:.0f}" y="{y(0) + 14:.0f}" '
                f'text-anchor="middle">{escape(cat)}</text>'
            )
    ly = TOP + PANEL_H + 40
    for k, config in enumerate(configs):
        out.append(f'<rect x="{LEFT}" y="{ly + 18 * k}" width="12" height="12" fill="{COLORS[k % len(COLORS)]}"/>')
        out.append(f'<text x="{LEFT + 18}" y="{ly + 18 * k + 10}">{escape(labels[config])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render_concurrency(doc: dict[str, Any]) -> str | None:
    """Two panels over the number of simultaneous clients: total tok/s and time to first
    token (p95); one line per configuration and slot count. None when nothing was measured."""
    rows = doc.get("concurrency") or []
    if not rows:
        return None
    labels = {c["name"]: c.get("label", c["name"]) for c in doc["configs"]}
    series: dict[tuple[str, Any], list[dict]] = {}
    for r in rows:
        series.setdefault((r["config"], r.get("slots")), []).append(r)
    levels = sorted({r["level"] for r in rows})
    panel_w, gap = 300, 70
    width = LEFT + 2 * panel_w + gap + 20
    height = TOP + PANEL_H + 60 + 18 * len(series) + 10
    panels = (
        ("total throughput, tok/s (median of repeats)", lambda p: (p.get("throughput_tps") or {}).get("median")),
        ("time to first token, s (p95)", lambda p: p.get("ttft_p95_s")),
    )
    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'
        ),
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" font-size="14">bonsai bench: slots x clients</text>',
    ]
    for p, (title, value) in enumerate(panels):
        x0 = LEFT + p * (panel_w + gap)
        top = max([value(r) or 0.0 for r in rows] + [0.0])
        y_max = _nice_max(top)

        def x(level: int) -> float:
            if len(levels) == 1:
                return x0 + panel_w / 2  # noqa: B023 - x() is used only within this panel's iteration
            return x0 + 10 + (panel_w - 20) * levels.index(level) / (len(levels) - 1)  # noqa: B023 - as above

        def y(v: float) -> float:
            return TOP + PANEL_H - v / y_max * PANEL_H  # noqa: B023 - y() too

        out.append(f'<text x="{x0 + panel_w / 2:.0f}" y="{TOP - 10}" text-anchor="middle">{escape(title)}</text>')
        for i in range(5):
            v = y_max * i / 4
            out.append(f'<line x1="{x0}" x2="{x0 + panel_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{x0 - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        for level in levels:
            out.append(f'<text x="{x(level):.1f}" y="{y(0) + 14:.0f}" text-anchor="middle">{level}</text>')
        out.append(
            f'<text x="{x0 + panel_w / 2:.0f}" y="{y(0) + 30:.0f}" text-anchor="middle">simultaneous clients</text>'
        )
        for k, points in enumerate(series.values()):
            color = COLORS[k % len(COLORS)]
            pts = [(x(r["level"]), y(value(r) or 0.0)) for r in sorted(points, key=lambda r: r["level"])]
            out.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
                + '"/>'
            )
            out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>' for a, b in pts]
    ly = TOP + PANEL_H + 46
    for k, (config, slots) in enumerate(series):
        name = labels.get(config, config) + (f", {slots} slot{'s' if slots != 1 else ''}" if slots else "")
        out.append(f'<rect x="{LEFT}" y="{ly + 18 * k}" width="12" height="12" fill="{COLORS[k % len(COLORS)]}"/>')
        out.append(f'<text x="{LEFT + 18}" y="{ly + 18 * k + 10}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
