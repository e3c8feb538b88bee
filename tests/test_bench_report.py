"""The report document: its JSON schema, the verdict lines, Markdown, the terminal table, and
the SVG chart. Built from synthetic measurements: no server."""

from __future__ import annotations

import json

import pytest

from bonsai_launch.bench import prompts as suite
from bonsai_launch.bench import report, terminal
from bonsai_launch.bench.data import BenchData, BenchOptions, ConfigSpec, LoadRun, ServerRun
from bonsai_launch.bench.measure import RequestResult
from bonsai_launch.bench.schema import load_schema, validate
from bonsai_launch.bench.summary import summarize

# (category, plain tok/s per repeat, speculative tok/s per repeat)
SPEEDS = {
    "code-edit": ([40.0, 41.0, 39.0], [80.0, 84.0, 78.0]),  # clearly faster
    "chat": ([42.0, 40.0, 41.0], [41.0, 43.0, 39.0]),  # noise
    "math": ([40.0, 40.5, 41.0], [30.0, 31.0, 29.5]),  # clearly slower
}


def _data(repeats: int = 3, temps=(0.0, 0.7)) -> BenchData:
    prompts = [suite.Prompt(f"{c}-{i}", c, (("user", f"{c} {i}"),)) for c in SPEEDS for i in range(2)]
    configs = [ConfigSpec("plain", True, None), ConfigSpec("speculative", False, "ngram-mod")]
    data = BenchData("launch", BenchOptions(repeats=repeats, temps=tuple(temps)), configs, prompts)
    for r in range(repeats):
        for t in temps:
            for p in prompts:
                for name, idx in (("plain", 0), ("speculative", 1)):
                    tps = SPEEDS[p.category][idx][r]
                    # temperature 0: the speculative text differs from plain at char 5 on one prompt
                    text = "hello world" if not (name == "speculative" and p.id == "chat-0") else "hellO world"
                    spec = name == "speculative"
                    data.requests.append(
                        RequestResult(
                            name,
                            p.id,
                            p.category,
                            t,
                            r,
                            text=text,
                            pieces=["hel", "lo", " world"],
                            ttft_s=0.1,
                            wall_s=64 / tps + 0.1,
                            completion_tokens=64,
                            predicted_n=64,
                            predicted_ms=64 / tps * 1000,
                            prompt_n=20,
                            prompt_ms=50.0,
                            client_decode_tps=tps * 0.98,
                            drafted=40 if spec else 0,
                            accepted=30 if spec else 0,
                            verify_steps=10 if spec else 0,
                        )
                    )
        for name in ("plain", "speculative"):
            data.servers.append(
                ServerRun(
                    name, r, "temp=0", pid=1, startup_s=1.5, peak_rss_bytes=(500 if name == "plain" else 520) * 2**20
                )
            )
            for turn in (1, 2, 3, 4):
                data.requests.append(
                    RequestResult(
                        name,
                        "conv",
                        "multi-turn",
                        0.0,
                        r,
                        phase="multi-turn",
                        turn=turn,
                        ttft_s=0.1 * turn * (1.5 if name == "speculative" else 1.0),
                        prompt_n=30,
                        cache_n=10 * turn,
                        completion_tokens=32,
                    )
                )
            for level in (1, 4):
                tokens = 64 * 2 * level
                wall = tokens / (40.0 * (level if name == "plain" else 1))
                data.loads.append(LoadRun(name, r, level, 2 * level, tokens, wall, 0))
    data.environment = {
        "hardware": {"logical_cores": 2, "ram_gb": 23.5, "arch": "x86_64", "gpus": []},
        "load_average_start": [0.5, 0.4, 0.3],
        "load_average_end": [1.0, 0.8, 0.5],
    }
    data.finished = data.started + 100
    return data


@pytest.fixture
def doc():
    return summarize(_data())


def test_document_follows_the_schema(doc):
    assert validate(doc) == []
    # and survives a JSON round trip unchanged in meaning
    assert validate(json.loads(report.to_json_text(doc))) == []


def test_schema_with_the_reference_validator(doc):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(report.to_json_text(doc)), load_schema())


def test_validator_reports_problems(doc):
    broken = json.loads(report.to_json_text(doc))
    broken["mode"] = "sideways"
    del broken["results"][0]["decode_tps"]
    broken["comparisons"][0]["verdict"]["kind"] = "great"
    errors = validate(broken)
    assert any(e.startswith("$.mode") for e in errors)
    assert any("missing 'decode_tps'" in e for e in errors)
    assert any("comparisons[0].verdict.kind" in e for e in errors)


def test_verdicts_per_category(doc):
    kinds = {(v["category"], v["temperature"]): v["kind"] for v in doc["verdicts"]}
    assert kinds[("code-edit", 0.0)] == "faster"
    assert kinds[("chat", 0.0)] == "noise"
    assert kinds[("math", 0.0)] == "slower"
    line = next(v["line"] for v in doc["verdicts"] if v["category"] == "code-edit" and v["temperature"] == 0.0)
    assert line.startswith("code-edit (T=0): speculative (ngram-mod) 2.0")
    assert "turn it on" in line
    math_line = next(v["line"] for v in doc["verdicts"] if v["category"] == "math" and v["temperature"] == 0.0)
    assert "slower" in math_line and "leave it off" in math_line


def test_acceptance_and_equality_are_reported(doc):
    res = next(
        r
        for r in doc["results"]
        if r["config"] == "speculative" and r["category"] == "code-edit" and r["temperature"] == 0.0
    )
    assert res["acceptance_rate"] == pytest.approx(0.75)
    assert res["mean_acceptance_length"] == pytest.approx(4.0)
    chat = next(c for c in doc["comparisons"] if c["category"] == "chat" and c["temperature"] == 0.0)
    eq = chat["output_equality"]
    assert eq["compared"] == 6 and eq["identical"] == 3
    assert eq["first_diff_char"]["min"] == 4 and eq["first_diff_piece"]["min"] == 1
    hot = next(c for c in doc["comparisons"] if c["category"] == "chat" and c["temperature"] == 0.7)
    assert hot["output_equality"] is None  # sampling: texts are not expected to match


def test_tradeoffs_show_the_costs(doc):
    later = doc["multi_turn"]["comparisons"][0]
    assert later["verdict"]["kind"] == "slower"  # turns 2+ wait 1.5x longer with speculation here
    four = next(r for r in doc["concurrency"] if r["config"] == "speculative" and r["level"] == 4)
    assert four["verdict"]["kind"] == "slower" and four["verdict"]["ratio"]["median"] == pytest.approx(0.25)
    mem = next(m for m in doc["memory"] if m["config"] == "speculative")
    assert mem["rss_delta_bytes"] == 20 * 2**20


def test_fewer_than_three_repeats_claim_nothing():
    doc = summarize(_data(repeats=2, temps=(0.0,)))
    assert {v["kind"] for v in doc["verdicts"]} == {"inconclusive"}
    assert validate(doc) == []


def test_markdown_and_terminal(doc):
    md = report.to_markdown(doc, "bench.svg")
    assert "| code-edit | 0 |" in md and "faster" in md and "SLOWER" in md
    assert "![decode tok/s per category](bench.svg)" in md
    assert "## Definitions" in md and "accepted / drafted" in md
    from rich.console import Console

    console = Console(record=True, width=200)
    terminal.print_terminal(doc, console, {"json": "/x/bench.json"})
    text = console.export_text()
    assert "Verdicts" in text and "code-edit (T=0)" in text and "/x/bench.json" in text


def test_reports_and_the_svg_chart_need_no_extra_install(doc, tmp_path):
    import xml.etree.ElementTree as ET

    paths = report.write_reports(json.loads(report.to_json_text(doc)), tmp_path / "a")
    assert paths["chart"].endswith("bench.svg")
    svg = ET.parse(paths["chart"]).getroot()  # well-formed XML
    assert svg.tag.endswith("svg")
    text = (tmp_path / "a" / "bench.svg").read_text()
    # a bar per (configuration, category incl. all, temperature) and the legend's labels
    assert text.count("<title>") == 2 * 4 * 2
    assert "speculative (ngram-mod)" in text and "temperature 0.7" in text
    assert "![decode tok/s per category](bench.svg)" in (tmp_path / "a" / "bench.md").read_text()
    paths = report.write_reports(json.loads(report.to_json_text(doc)), tmp_path / "b", chart=False)
    assert "chart" not in paths and not (tmp_path / "b" / "bench.svg").exists()
    assert "bench.svg" not in (tmp_path / "b" / "bench.md").read_text()
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")]  # no temporary files left


def _clipped(svg_text: str) -> list[str]:
    """Every line of text that reaches past the frame, at 0.6 em a character (sans-serif's
    average is about 0.5-0.55): its x, its anchor and the SVG's width decide where it ends."""
    import xml.etree.ElementTree as ET

    svg = ET.fromstring(svg_text)
    width = float(svg.get("width"))
    out = []
    for el in svg.iter("{http://www.w3.org/2000/svg}text"):
        if el.get("transform"):  # the rotated axis label runs down the side
            continue
        w = len("".join(el.itertext())) * float(el.get("font-size") or svg.get("font-size")) * 0.6
        x = float(el.get("x"))
        start = {"middle": x - w / 2, "end": x - w}.get(el.get("text-anchor") or "start", x)
        if start < 0 or start + w > width:
            out.append(f"{''.join(el.itertext())!r}: {start:.0f}-{start + w:.0f} in a frame {width:.0f} wide")
    return out


@pytest.mark.parametrize("temps", [(0.0,), (0.0, 0.7)])
def test_the_chart_frame_holds_its_title_and_labels(temps):
    """One temperature (what tune and the demo bench run) made the panels narrower than the
    title, which was cut off at both ends; the frame now grows to the title and the legend."""
    from bonsai_launch.bench import chart

    doc = summarize(_data(temps=temps))
    doc["configs"][1]["label"] = "speculative (ngram-mod, drafting up to 16 tokens, the profile's choice)"
    assert not _clipped(chart.render(doc))
    assert chart.TITLE in chart.render(doc)


def test_terminal_notes_keep_their_brackets(doc):
    from rich.console import Console

    doc = dict(doc, notes=["install it with pip install 'bonsai-launch[demo]'"])
    console = Console(record=True, width=200)
    terminal.print_terminal(doc, console, {})
    assert "pip install 'bonsai-launch[demo]'" in console.export_text()


def test_busy_machine_is_noted():
    from bonsai_launch.bench.pipeline import busy_note

    hw = {"logical_cores": 2}
    assert busy_note({"hardware": hw, "load_average_start": [0.3], "load_average_end": [2.5]}) is None
    assert "busy" in busy_note({"hardware": hw, "load_average_start": [1.6], "load_average_end": [2.0]})
    assert "busy" in busy_note({"hardware": hw, "load_average_start": [0.2], "load_average_end": [3.4]})
    assert busy_note({}) is None
