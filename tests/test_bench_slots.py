"""The slots x clients part of the bench report: rows per configuration, slot count and client
count, TTFT percentiles, the "for K simultaneous users" verdicts in JSON, terminal, Markdown and
PNG. Synthetic measurements shaped like the issue's hand measurement on the demo; no server."""

from __future__ import annotations

import json

import pytest

from bonsai_launch.bench import format as report_format
from bonsai_launch.bench import prompts as suite
from bonsai_launch.bench import report, terminal
from bonsai_launch.bench.data import BenchData, BenchOptions, ConfigSpec, LoadRun
from bonsai_launch.bench.measure import RequestResult
from bonsai_launch.bench.schema import validate
from bonsai_launch.bench.stats import percentile
from bonsai_launch.bench.summary import summarize
from bonsai_launch.bench.verdicts import users_verdicts

# (config, slots) -> aggregate tok/s with 1 and 4 clients (the demo numbers)
TOTALS = {("plain", 4): {1: 46.4, 4: 82.6}, ("ngram-mod", 1): {1: 54.6, 4: 46.9}, ("ngram-mod", 4): {1: 54.0, 4: 73.1}}


def _data(repeats: int = 3) -> BenchData:
    prompts = [suite.Prompt("code-0", "code", (("user", "x"),))]
    configs = [ConfigSpec("plain", True, None), ConfigSpec("ngram-mod", False, "ngram-mod")]
    data = BenchData(
        "launch", BenchOptions(repeats=repeats, temps=(0.0,), concurrency=(1, 4), parallel=(1, 4)), configs, prompts
    )
    for r in range(repeats):
        for (config, slots), by_level in TOTALS.items():
            for level, total in by_level.items():
                tokens = 48 * 2 * level
                data.loads.append(
                    LoadRun(config, r, level, 2 * level, tokens, tokens / (total * (1 + 0.01 * r)), 0, slots)
                )
                queued = level > slots  # clients beyond the slots wait for a free one
                for i in range(2 * level):
                    ttft = 0.05 + (0.5 * (i // max(1, slots)) if queued else 0.02 * i)
                    data.requests.append(
                        RequestResult(
                            config,
                            f"p{i}",
                            "code",
                            0.0,
                            r,
                            phase="concurrency",
                            level=level,
                            slots=slots,
                            ttft_s=ttft,
                            wall_s=1.0,
                            completion_tokens=48,
                            client_decode_tps=total / min(level, slots),
                        )
                    )
    data.finished = data.started + 10
    return data


@pytest.fixture
def doc():
    return summarize(_data())


def test_rows_per_configuration_slots_and_clients(doc):
    assert validate(doc) == []
    keys = {(r["config"], r["slots"], r["level"]) for r in doc["concurrency"]}
    assert keys == {(c, s, n) for (c, s) in TOTALS for n in (1, 4)}
    four = next(r for r in doc["concurrency"] if (r["config"], r["slots"], r["level"]) == ("ngram-mod", 4, 4))
    assert four["throughput_tps"]["median"] == pytest.approx(73.1 * 1.01, rel=1e-6)
    assert four["per_stream_tps"]["median"] == pytest.approx(73.1 / 4)
    assert four["ttft_p50_s"] <= four["ttft_p95_s"]
    queued = next(r for r in doc["concurrency"] if (r["config"], r["slots"], r["level"]) == ("ngram-mod", 1, 4))
    assert queued["ttft_p95_s"] > four["ttft_p95_s"] * 5  # one slot: seven requests queue behind the first
    # compared with the baseline at the same slot count; plain never ran on 1 slot here, so the
    # 1-slot row falls back to plain's only server
    assert four["baseline_slots"] == 4 and four["ratios"] == pytest.approx([73.1 / 82.6] * 3, rel=1e-3)
    assert queued["baseline_slots"] == 4


def test_users_verdicts_pick_the_best_total_per_client_count(doc):
    users = {u["clients"]: u for u in doc["users"]}
    assert users[1]["config"] == "ngram-mod" and users[1]["slots"] == 1  # 54.6 beats 54.0 and 46.4
    assert users[1]["tied"]  # 54.0 on 4 slots is within 5%
    assert users[4]["config"] == "plain" and users[4]["slots"] == 4
    assert users[4]["settings"] == "BONSAI_SPECULATIVE=0 BONSAI_PARALLEL=4"
    assert users[1]["settings"] == "BONSAI_SPECULATIVE=1 BONSAI_SPEC_TYPE=ngram-mod BONSAI_PARALLEL=1"
    assert users[4]["line"].startswith("for 4 simultaneous users, use plain with 4 slots: 83.4 tok/s total")
    assert "(next: ngram-mod 4 slots, 73.8 tok/s)" in users[4]["line"]


def test_a_tie_goes_to_the_sooner_first_token():
    rows = [
        {
            "config": "a",
            "slots": 1,
            "level": 4,
            "throughput_tps": {"median": 100.0},
            "per_stream_tps": None,
            "ttft_p95_s": 3.0,
        },
        {
            "config": "b",
            "slots": 4,
            "level": 4,
            "throughput_tps": {"median": 97.0},
            "per_stream_tps": None,
            "ttft_p95_s": 0.4,
        },
        {
            "config": "c",
            "slots": 4,
            "level": 4,
            "throughput_tps": {"median": 80.0},
            "per_stream_tps": None,
            "ttft_p95_s": 0.1,
        },
    ]
    (u,) = users_verdicts(rows, [{"name": n, "label": n} for n in "abc"], 3)
    assert u["config"] == "b" and u["tied"] and "first token p95 0.40 s" in u["line"]
    (u,) = users_verdicts(rows, [{"name": n, "label": n} for n in "abc"], 1)
    assert u["line"].endswith("fewer than 3 repeats: indicative only")


def test_percentile_is_nearest_rank():
    values = [float(i) for i in range(1, 21)]
    assert percentile(values, 95) == 19.0 and percentile(values, 50) == 10.0
    assert percentile([2.0], 95) == 2.0 and percentile([], 95) is None


def test_terminal_markdown_and_chart(doc, tmp_path):
    from rich.console import Console

    console = Console(record=True, width=200)
    terminal.print_terminal(doc, console)
    text = console.export_text()
    assert "Slots x clients" in text and "TTFT p95 s" in text and "per user tok/s" in text
    assert "for 4 simultaneous users, use plain with 4 slots" in text
    paths = report.write_reports(json.loads(report.to_json_text(doc)), tmp_path)
    md = (tmp_path / "bench.md").read_text()
    assert "## Trade-off: slots x concurrent clients" in md and "### For K simultaneous users" in md
    assert "| 4 | speculative (ngram-mod) |" not in md  # labels are the configs' own
    assert "| 4 | ngram-mod | 4 |" in md
    assert "`BONSAI_SPECULATIVE=0 BONSAI_PARALLEL=4`" in md
    written = json.loads((tmp_path / "bench.json").read_text())
    assert validate(written) == [] and written["users"] == doc["users"]
    assert (tmp_path / "concurrency.svg").read_text().startswith("<svg")  # no extra install needed
    assert paths["concurrency_chart"].endswith("concurrency.svg") and "(concurrency.svg)" in md
    assert written["concurrency_chart"] == "concurrency.svg"


def test_parallel_options_are_checked():
    from bonsai_launch.bench.pipeline import Target, run_bench
    from bonsai_launch.core.errors import BonsaiError

    with pytest.raises(BonsaiError, match="--parallel: 0 is outside 1-256"):
        run_bench(BenchOptions(parallel=(0, 4)), Target(url="http://127.0.0.1:9"), None)
    with pytest.raises(BonsaiError, match="names a slot count twice"):
        run_bench(BenchOptions(parallel=(4, 4)), Target(url="http://127.0.0.1:9"), None)
    with pytest.raises(BonsaiError, match="a --url server keeps its own"):
        run_bench(BenchOptions(parallel=(1, 4)), Target(url="http://127.0.0.1:9"), None)


# -- against the real llama-server -------------------------------------------------------------------


@pytest.mark.server
def test_launch_mode_runs_every_slot_count(llama_server, tmp_path):
    import tiny_gguf as tg
    from bonsai_launch.bench.pipeline import Target, run_bench

    target = tg.write_target(tmp_path / "target.gguf", constant_token=7)
    drafter = tg.write_dspark_drafter(tmp_path / "drafter.gguf", constant_token=7)
    options = BenchOptions(
        configs=("plain", "speculative"),
        categories=("code",),
        per_category=1,
        temps=(0.0,),
        repeats=1,
        max_tokens=8,
        concurrency=(1, 2),
        parallel=(1, 2),
        turns=2,
        conversations=1,
        tradeoff_tokens=8,
    )
    doc, _paths = run_bench(
        options,
        Target(model=str(target), drafter=str(drafter), binary=llama_server, passthrough=("-t", "1")),
        tmp_path / "out",
        chart=False,
    )
    assert validate(doc) == []
    assert {(r["config"], r["slots"], r["level"]) for r in doc["concurrency"]} == {
        (c, s, n) for c in ("plain", "speculative") for s in (1, 2) for n in (1, 2)
    }
    spec = next(c for c in doc["configs"] if c["name"] == "speculative")
    two = spec["slot_argv"]["2"]
    assert two[two.index("-np") + 1] == "2" and "-md" in two
    assert {(s["config"], s["slots"]) for s in doc["servers"] if s["purpose"] == "trade-offs"} == {
        (c, n) for c in ("plain", "speculative") for n in (1, 2)
    }
    loaded = [r for r in doc["requests"] if r["phase"] == "concurrency" and r["config"] == "speculative"]
    assert loaded and all(r["drafted"] > 0 and not r["error"] for r in loaded)  # every stream drafted, on both counts
    assert {u["clients"] for u in doc["users"]} == {1, 2}
    assert all("fewer than 3 repeats" in u["line"] for u in doc["users"])
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "### For K simultaneous users" in md


def test_interleaved_conversations_take_turns(monkeypatch):
    from bonsai_launch.bench import requests
    from bonsai_launch.bench.data import SilentListener

    sent = []

    class Http:
        pass

    def fake_send(http, endpoint, result, messages, max_tokens, seed):
        sent.append((result.prompt_id, result.turn, len(messages)))
        result.text = "ok"
        return result

    convs = [suite.Conversation("a", ("1", "2", "3")), suite.Conversation("b", ("1", "2", "3"))]
    spec = ConfigSpec("plain", True, None)
    for interleave, expected in (
        (False, ["a1", "a2", "a3", "b1", "b2", "b3"]),
        (True, ["a1", "b1", "a2", "b2", "a3", "b3"]),
    ):
        sent.clear()
        data = BenchData("launch", BenchOptions(turns=3, interleave=interleave), [spec], [])
        monkeypatch.setattr(requests, "_send", fake_send)
        requests.run_multi_turn(Http(), None, spec, data.options, convs, 0, data, SilentListener())
        assert [f"{p}{t}" for p, t, _ in sent] == expected
        assert [n for p, t, n in sent if p == "b"] == [1, 3, 5]  # each turn carries its own history


def test_without_parallel_each_side_keeps_its_own_slots():
    """No --parallel: plain runs on llama-server's auto 4 slots, speculation on 1; the rows
    still compare at the same client count, and say which slots the baseline had."""
    data = _data()
    data.loads = [load for load in data.loads if (load.config, load.slots) in (("plain", 4), ("ngram-mod", 1))]
    data.requests = [r for r in data.requests if (r.config, r.slots) in (("plain", 4), ("ngram-mod", 1))]
    doc = summarize(data)
    row = next(r for r in doc["concurrency"] if r["config"] == "ngram-mod" and r["level"] == 4)
    assert row["baseline_slots"] == 4 and row["verdict"]["kind"] == "slower"
    assert row["ratios"] == pytest.approx([46.9 / 82.6] * 3, rel=1e-3)
    _header, rows = report_format.concurrency_rows(doc)
    assert any(cell.endswith("(baseline on 4)") for r in rows for cell in r)


def test_auto_is_named_by_the_decision_each_slot_count_ran():
    """auto on 4 slots runs the decision tuned for 4 slots (here ngram-map-k4v), not the default
    launch's (ngram-mod): the rows and the verdict name that, and reproduce it as auto."""
    rows = [
        {"config": "auto", "slots": 4, "level": 4, "throughput_tps": {"median": 110.0}, "per_stream_tps": None}
        | {"ttft_p95_s": 0.5},
        {"config": "plain", "slots": 4, "level": 4, "throughput_tps": {"median": 87.0}, "per_stream_tps": None}
        | {"ttft_p95_s": 0.4},
    ]
    configs = [
        {"name": "plain", "label": "plain"},
        {"name": "auto", "label": "auto (ngram-mod)", "slot_labels": {"4": "auto (ngram-map-k4v)"}},
    ]
    (u,) = users_verdicts(rows, configs, 3)
    assert u["line"].startswith("for 4 simultaneous users, use auto (ngram-map-k4v) with 4 slots")
    assert u["settings"] == "BONSAI_SPECULATIVE=auto BONSAI_PARALLEL=4"
    doc = {
        "configs": configs,
        "concurrency": [r | {"throughput_tps": {"median": 1.0, "min": 1.0, "max": 1.0, "n": 3}} for r in rows],
    }
    _header, table = report_format.concurrency_rows(doc)
    assert table[0][1] == "auto (ngram-map-k4v)" and table[1][1] == "plain"


def test_a_config_spec_labels_each_slot_plan():
    class Plan:
        def __init__(self, spec_type):
            self.speculative = type("Spec", (), {"spec_type": spec_type})() if spec_type else None

    spec = ConfigSpec("auto", False, "ngram-mod", plan=None, slot_plans={4: Plan("ngram-map-k4v"), 2: Plan(None)})
    assert spec.label == "auto (ngram-mod)"
    assert spec.slot_labels() == {"2": "auto (plain)", "4": "auto (ngram-map-k4v)"}
