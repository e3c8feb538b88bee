"""The watch's rule over a server's cumulative counters (server/watch.py), and what a sustained
"below plain" does to a stored decision (decisions/store.py). Pure; the real server's side is
tests/test_watch_server.py."""

from __future__ import annotations

from bonsai_launch.decisions import store
from bonsai_launch.decisions.identity import TuneKey
from bonsai_launch.decisions.store import Choice, Decision
from bonsai_launch.server.watch import Bounds, Sample, from_metrics, plain_speed, verdict, windows

B = Bounds(every_s=1, window_tokens=100, windows=2, min_accept=0.2)


def counters(*steps: tuple[int, int]) -> list[Sample]:
    """Cumulative samples from (drafted, accepted) increments."""
    out, d, a = [Sample(0, 0)], 0, 0
    for dd, da in steps:
        d, a = d + dd, a + da
        out.append(Sample(d, a, predicted=d, predicted_s=d / 50))
    return out


def test_no_full_window_is_watching():
    assert verdict(counters((60, 60)), B)["status"] == "watching"


def test_a_window_closes_at_the_drafted_bound_and_pays_when_drafts_are_kept():
    v = verdict(counters((60, 60), (60, 55)), B)
    assert v["status"] == "paying" and v["windows"] == 1
    assert v["last"]["drafted"] == 120 and abs(v["last"]["acceptance"] - 115 / 120) < 1e-9


def test_below_plain_needs_the_sustained_number_of_windows():
    one_bad = counters((100, 100), (100, 5))
    assert verdict(one_bad, B)["status"] == "paying"  # one odd window is not a change of work
    two_bad = counters((100, 100), (100, 5), (100, 0))
    v = verdict(two_bad, B)
    assert v["status"] == "below plain" and "2 windows in a row" in v["why"]
    # and back: the work changed again
    assert verdict(counters((100, 5), (100, 0), (100, 90)), B)["status"] == "paying"


def test_decode_speed_under_the_decisions_plain_speed_is_below_plain():
    fast_plain = Bounds(every_s=1, window_tokens=100, windows=1, min_accept=0.2, plain_tps=80.0)
    v = verdict(counters((100, 90)), fast_plain)  # 50 tok/s decoding, plain measured 80
    assert v["status"] == "below plain" and "plain measured 80.0" in v["why"]
    assert verdict(counters((100, 90)), Bounds(1, 100, 1, 0.2, 40.0))["status"] == "paying"


def test_a_restarted_server_starts_the_counters_over():
    samples = [*counters((100, 100)), Sample(10, 0)]  # counters went down
    assert windows(samples, 100) == windows(counters((100, 100)), 100)


def test_metrics_without_spec_counters_give_no_sample():
    assert from_metrics({"llamacpp:requests_processing": 1}) is None
    s = from_metrics(
        {"llamacpp:spec_decode_num_draft_tokens_total": 8, "llamacpp:spec_decode_num_accepted_tokens_total": 6}
    )
    assert s == Sample(8, 6)


def test_plain_speed_comes_from_the_decisions_baseline_row():
    table = [{"spec_type": None, "ratio": None, "decode_tps": 41.5}, {"spec_type": "ngram-mod", "decode_tps": 60}]
    assert plain_speed({"status": "found", "table": table}) == 41.5
    assert plain_speed({"status": "stale", "table": table}) is None and plain_speed(None) is None


def test_a_retune_mark_makes_the_decision_stale_until_it_is_measured_again():
    k = TuneKey("CPU x2 (Linux x86_64)", "cpu-abc:0011", "m" * 64, None, "p" * 64)
    choice = Choice("ngram-mod", "ngram-mod", "ngram-mod", None, 1.5)
    d = Decision(k, choice, ({"config": "plain"},), "2026-12-01T05:00:00Z", "tune", "/m/model.gguf")
    store.save(d)
    assert store.lookup(d.key).status == "found"
    store.mark_retune(d.key.id, {"why": "2 windows in a row: 0% of drafts accepted"})
    found = store.lookup(d.key)
    assert found.status == "stale" and "0% of drafts accepted" in found.changed[0]
    store.save(d)  # tuned again
    assert store.lookup(d.key).status == "found"
