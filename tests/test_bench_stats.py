"""The statistics behind every bench verdict: medians, ranges, paired ratios, the noise rule,
output comparison, and the aggregation of requests into per-category numbers."""

from __future__ import annotations

import pytest

from bonsai_launch.bench import stats
from bonsai_launch.bench.measure import RequestResult, SpecCounters, counter_delta, spec_counters
from bonsai_launch.bench.stats import aggregate
from bonsai_launch.server.client import parse_metrics


def test_spread_is_median_min_max_of_present_values():
    s = stats.spread([3.0, None, 1.0, 2.0])
    assert (s.median, s.min, s.max, s.n) == (2.0, 1.0, 3.0, 3)
    assert stats.spread([None]) is None
    assert stats.spread([4.0, 6.0]).median == 5.0
    assert stats.spread([10.0, 12.0, 11.0]).relative_range == pytest.approx(2 / 11)


def test_paired_ratios_pair_by_repeat_and_skip_missing():
    cand = {0: 20.0, 1: 30.0, 2: None, 3: 10.0}
    base = {0: 10.0, 1: 10.0, 2: 10.0}
    assert stats.paired_ratios(cand, base) == [2.0, 3.0]
    assert stats.paired_ratios({0: 1.0}, {0: 0.0}) == []


@pytest.mark.parametrize(
    "ratios, kind",
    [
        ([1.6, 1.7, 1.8], "faster"),  # all above 1, far beyond the 5% band
        ([0.7, 0.75, 0.8], "slower"),  # all below 1, beyond the band
        ([0.95, 1.1, 1.3], "noise"),  # both sides of 1
        ([1.01, 1.02, 1.03], "noise"),  # all above 1 but inside the 5% band
        ([0.97, 0.98, 0.99], "noise"),  # all below 1 but inside the band
        ([2.0, 2.1], "inconclusive"),  # fewer than 3 repeats: nothing is claimed
        ([], "inconclusive"),
    ],
)
def test_verdict_kinds(ratios, kind):
    assert stats.verdict(ratios).kind == kind


def test_noisy_sides_widen_the_band():
    # The baseline alone varies by a third between repeats: a 1.21x median is not a speed-up.
    base = stats.spread([10.0, 12.0, 14.0])
    cand = stats.spread([13.0, 14.5, 16.0])
    v = stats.verdict([1.3, 1.21, 1.14], base, cand)
    assert v.band == pytest.approx(4 / 12)
    assert v.kind == "noise"
    # The same ratios with steady sides are a real speed-up.
    steady = stats.verdict([1.3, 1.21, 1.14], stats.spread([10.0, 10.1, 10.2]), stats.spread([13.0, 13.1, 13.2]))
    assert steady.kind == "faster"


def test_verdict_json_and_reason_mention_the_band():
    v = stats.verdict([1.5, 1.6, 1.7])
    data = v.to_json()
    assert data["kind"] == "faster" and data["band"] == 0.05
    assert data["ratio"]["median"] == 1.6
    assert "noise band" in v.reason


def test_first_difference_and_piece_index():
    assert stats.first_difference("abc", "abc") is None
    assert stats.first_difference("abcd", "abXd") == 2
    assert stats.first_difference("abc", "abcdef") == 3  # a prefix differs where it ends
    pieces = ["def", " add", "(a"]
    assert stats.piece_index(pieces, 0) == 0
    assert stats.piece_index(pieces, 4) == 1
    assert stats.piece_index(pieces, 8) == 2
    assert stats.piece_index(pieces, 99) == 2


def _req(**kw) -> RequestResult:
    base = dict(config="c", prompt_id="p", category="code", temperature=0.0, repeat=0)
    base.update(kw)
    return RequestResult(**base)


def test_aggregate_weights_rates_by_tokens_and_defines_acceptance():
    a = _req(
        completion_tokens=100,
        predicted_n=100,
        predicted_ms=2000.0,
        prompt_n=50,
        prompt_ms=100.0,
        client_decode_tps=50.0,
        wall_s=2.2,
        ttft_s=0.2,
        drafted=80,
        accepted=60,
        verify_steps=20,
    )
    b = _req(
        completion_tokens=50,
        predicted_n=50,
        predicted_ms=500.0,
        prompt_n=150,
        prompt_ms=300.0,
        client_decode_tps=98.0,
        wall_s=0.9,
        ttft_s=0.4,
        drafted=20,
        accepted=10,
        verify_steps=10,
    )
    agg = aggregate([a, b])
    assert agg["server_decode_tps"] == pytest.approx(150 / 2.5)  # not the mean of 50 and 100
    assert agg["decode_tps"] == agg["server_decode_tps"]
    assert agg["client_decode_tps"] == pytest.approx((99 + 49) / (99 / 50 + 49 / 98))
    assert agg["prefill_tps"] == pytest.approx(200 / 0.4)
    assert agg["acceptance_rate"] == pytest.approx(70 / 100)  # accepted / drafted
    assert agg["mean_acceptance_length"] == pytest.approx(1 + 70 / 30)  # 1 + accepted / verify steps
    assert agg["ttft_s"] == pytest.approx(0.3)
    assert agg["tokens"] == 150 and agg["errors"] == 0


def test_aggregate_without_server_timings_falls_back_to_the_client():
    r = _req(completion_tokens=11, client_decode_tps=20.0, wall_s=1.0, ttft_s=0.5)
    agg = aggregate([r, _req(error="HTTP 500")])
    assert agg["server_decode_tps"] is None
    assert agg["decode_tps"] == pytest.approx(20.0)
    assert agg["acceptance_rate"] is None and agg["mean_acceptance_length"] is None
    assert agg["errors"] == 1


LLAMA_METRICS = """# HELP llamacpp:spec_decode_num_draft_tokens_total x
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 120
llamacpp:spec_decode_num_accepted_tokens_total 90
llamacpp:spec_decode_num_drafts_total 30
"""
VLLM_METRICS = """vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} 10.0
vllm:spec_decode_num_draft_tokens_total{model_name="m",engine="0"} 30.0
vllm:spec_decode_num_accepted_tokens_total{model_name="m",engine="0"} 21.0
"""
SGLANG_METRICS = 'sglang:spec_accept_length{model_name="m"} 2.8\nsglang:spec_accept_rate{model_name="m"} 0.6\n'


def test_spec_counters_for_each_server_family():
    llama = spec_counters(parse_metrics(LLAMA_METRICS))
    assert (llama.family, llama.drafted, llama.accepted, llama.steps) == ("llamacpp", 120, 90, 30)
    vllm = spec_counters(parse_metrics(VLLM_METRICS))
    assert (vllm.family, vllm.drafted, vllm.accepted, vllm.steps) == ("vllm", 30, 21, 10)
    sgl = spec_counters(parse_metrics(SGLANG_METRICS))
    assert sgl.family == "sglang" and sgl.accept_length_gauge == 2.8
    assert spec_counters({}).family is None


def test_counter_delta_only_within_one_family():
    before = SpecCounters("llamacpp", 100, 80, 20)
    after = SpecCounters("llamacpp", 130, 100, 30)
    assert counter_delta(before, after) == (30, 20, 10)
    assert counter_delta(SpecCounters(None), after) == (None, None, None)
    assert counter_delta(SpecCounters("sglang"), SpecCounters("sglang")) == (None, None, None)


def test_memory_sampler_reads_rss_and_gpu_memory(monkeypatch):
    import os
    from types import SimpleNamespace

    from bonsai_launch.bench import measure

    pid = os.getpid()

    class FakeNvml:
        def nvmlDeviceGetComputeRunningProcesses(self, handle):
            return [SimpleNamespace(pid=pid, usedGpuMemory=3 * 2**30), SimpleNamespace(pid=1, usedGpuMemory=2**30)]

        def nvmlShutdown(self):
            pass

    monkeypatch.setattr(measure, "_nvml_handles", lambda: (FakeNvml(), ["gpu0", "gpu1"]))
    with measure.MemorySampler(pid, interval=0.01) as sampler:
        pass
    assert sampler.peak_rss and sampler.peak_rss > 10 * 2**20
    assert sampler.peak_gpu == 2 * 3 * 2**30  # this process on both GPUs, not the other one


def test_memory_sampler_without_nvidia(monkeypatch):
    import os

    from bonsai_launch.bench import measure

    monkeypatch.setattr(measure, "_nvml_handles", lambda: None)
    with measure.MemorySampler(os.getpid(), interval=0.01) as sampler:
        pass
    assert sampler.peak_gpu is None and sampler.peak_rss
