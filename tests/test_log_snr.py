"""DSpark log-SNR conditioning (vendor/llama.cpp/patches/0002-*): the maths against the
reference's test vectors, what bonsai reads from the header, and our patched llama-server
loading, refusing and conditioning exactly as specified.

The end-to-end fixture is explained in tests/support/log_snr_ref.py: its drafts agree with the target
only when the server computes the conditioning vector of one row kind (mask rows, or the anchor
row) as specified; a fixture built for swapped sin/cos halves or swapped anchor/mask values is
rejected by the same server. test_fixture_fails_unless_the_server_follows_its_convention shows,
in numpy, that the fixture can fail.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import log_snr_ref as R
import test_plan
import tiny_gguf
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.paths import logs_dir
from bonsai_launch.llamacpp.binaries import implements_log_snr, probe
from bonsai_launch.models.gguf import LOG_SNR_TENSORS, check_pair, inspect_gguf
from bonsai_launch.server import client
from bonsai_launch.server.process import free_port
from start_helpers import bonsai, json_out, stop_all

T = 7  # what the tiny constant target always predicts
MASK = 511  # the drafters' mask token (vocab - 1)
LOADED_LOG = "DFlash with DSpark log-SNR conditioning (min -9.000, max 9.000)"


@pytest.fixture(autouse=True)
def cleanup():
    yield
    stop_all()


def start_args(model: Path, *extra: object) -> list[str]:
    return ["--model", str(model), "--port", str(free_port()), "--ctx", "2048", *map(str, extra)]


def drop(name: str) -> tiny_gguf.LogSnr:
    return tiny_gguf.LogSnr(tensors=tuple(t for t in LOG_SNR_TENSORS if t != name))


# -- the maths, in numpy -----------------------------------------------------------------------------


def test_anchor_features_match_the_reference_test_vectors():
    feat = R.features(R.T_ANCHOR)
    assert feat.dtype == np.float32 and feat.shape == (128,)
    for i, (sin, cos) in R.ANCHOR_TEST_VECTORS.items():
        assert feat[i] == pytest.approx(sin, abs=1e-6), i
        assert feat[64 + i] == pytest.approx(cos, abs=1e-6), i
    # float64 differs by up to ~5.7e-5: the angle (up to 1000 rad) is rounded to float32 first
    assert 1e-6 < np.abs(feat - R.features_f64(R.T_ANCHOR)).max() < 1e-4


def test_mask_features_are_64_zeros_then_64_ones():
    assert np.array_equal(R.features(R.T_MASK), np.r_[np.zeros(64), np.ones(64)].astype(np.float32))


def test_mlp_output_for_the_mask_row_uses_the_last_64_input_columns():
    mlp = R.Mlp.random(16, seed=1)
    e_anchor, e_mask = R.conditioning(mlp)
    by_hand = mlp.fc2 @ R.silu(mlp.fc1[:, 64:].sum(axis=1) + mlp.b1) + mlp.b2
    np.testing.assert_allclose(e_mask, by_hand, rtol=1e-5, atol=1e-6)
    assert not np.allclose(e_anchor, e_mask)


@pytest.mark.parametrize("focus", R.FOCUSES)
@pytest.mark.parametrize("convention", R.CONVENTIONS)
def test_fixture_fails_unless_the_server_follows_its_convention(tmp_path, focus, convention):
    pair = R.write_conditioning_pair(tmp_path, convention=convention, focus=focus, token=T)
    for server in R.CONVENTIONS:
        drafts = R.simulate_drafts(pair.drafter, [T, MASK, MASK, MASK], server)
        if server == convention:
            assert drafts == [T] * 4, server
        else:
            rejected = drafts[1:] if focus == "mask" else drafts[:1]
            assert all(d != T for d in rejected), (server, drafts)


@pytest.mark.parametrize("focus", R.FOCUSES)
def test_near_decoys_catch_a_vector_off_by_one_or_two_percent(tmp_path, focus):
    pair = R.write_conditioning_pair(tmp_path, focus=focus, token=T, near_decoys=300)
    judged = slice(1, None) if focus == "mask" else slice(0, 1)
    assert R.simulate_drafts(pair.drafter, [T, MASK, MASK, MASK]) == [T] * 4
    for seed in range(5):
        assert R.simulate_drafts(pair.drafter, [T, MASK, MASK, MASK], error=1e-3, seed=seed) == [T] * 4
        off = R.simulate_drafts(pair.drafter, [T, MASK, MASK, MASK], error=0.01, seed=seed)
        assert all(d != T for d in off[judged]), off
    for scale in (0.98, 1.02):  # the length counts too: the row's own embedding is added to it
        off = R.simulate_drafts(pair.drafter, [T, MASK, MASK, MASK], scale=scale)
        assert all(d != T for d in off[judged]), (scale, off)


def test_tiny_gguf_log_snr_writer_refuses_what_it_cannot_write(tmp_path):
    with pytest.raises(ValueError, match="not log-SNR tensors"):
        tiny_gguf.write_dspark_drafter(
            tmp_path / "a.gguf", log_snr=tiny_gguf.LogSnr(weights={"fc.weight": np.zeros(1)})
        )
    with pytest.raises(ValueError, match=r"log_snr_fc1.weight: numpy shape \(128, 64\), expected \(64, 128\)"):
        tiny_gguf.write_dspark_drafter(
            tmp_path / "b.gguf",
            log_snr=tiny_gguf.LogSnr(weights={"log_snr_fc1.weight": np.zeros((128, 64), dtype=np.float32)}),
        )
    with pytest.raises(ValueError, match="does not have"):
        tiny_gguf.write_dspark_drafter(tmp_path / "c.gguf", tensor_overrides={"output.weight": np.zeros((512, 64))})
    assert not list(tmp_path.iterdir())  # nothing half-written
    # given weights are written as given; a dropped tensor leaves the others' random values unchanged
    w = np.arange(64, dtype=np.float32)
    full = tiny_gguf.write_dspark_drafter(
        tmp_path / "full.gguf", log_snr=tiny_gguf.LogSnr(weights={"log_snr_fc2.bias": w})
    )
    part = tiny_gguf.write_dspark_drafter(tmp_path / "part.gguf", log_snr=drop("log_snr_fc1.bias"))
    from gguf import GGUFReader

    full_t = {t.name: np.array(t.data) for t in GGUFReader(full).tensors}
    part_t = {t.name: np.array(t.data) for t in GGUFReader(part).tensors}
    assert np.array_equal(full_t["log_snr_fc2.bias"], w)
    assert "log_snr_fc1.bias" not in part_t and np.array_equal(
        full_t["log_snr_fc2.weight"], part_t["log_snr_fc2.weight"]
    )


# -- what bonsai reads from the header --------------------------------------------------------------


def test_inspect_reads_the_log_snr_keys_and_tensors(tmp_path):
    target = tiny_gguf.write_target(tmp_path / "t.gguf")
    drafter = tiny_gguf.write_dspark_drafter(tmp_path / "d.gguf", log_snr=True)
    d = inspect_gguf(drafter).drafter
    assert d.log_snr and (d.log_snr_min, d.log_snr_max) == (-9.0, 9.0)
    assert d.log_snr_tensors == LOG_SNR_TENSORS
    assert check_pair(inspect_gguf(target), inspect_gguf(drafter)) == []

    done = bonsai(["inspect", drafter, "--json"])
    assert done.returncode == 0, done.stderr
    data = json_out(done)["drafter"]
    assert data["log_snr"] is True and data["log_snr_min"] == -9.0 and data["log_snr_tensors"] == list(LOG_SNR_TENSORS)
    table = bonsai(["inspect", drafter])
    assert "log-SNR conditioning" in table.stdout and "yes (min -9.0, max 9.0; 4/4 tensors" in table.stdout

    # the legacy layout keeps the keys under dspark.dspark.*; it is refused as a whole anyway
    legacy = inspect_gguf(tiny_gguf.write_dspark_drafter(tmp_path / "legacy.gguf", legacy=True, log_snr=True)).drafter
    assert legacy.kind == "legacy-dspark" and legacy.log_snr and legacy.log_snr_max == 9.0
    assert legacy.log_snr_problems("legacy.gguf") == []

    plain = inspect_gguf(tiny_gguf.write_dspark_drafter(tmp_path / "plain.gguf")).drafter
    assert not plain.log_snr and plain.log_snr_tensors == () and plain.log_snr_problems("plain.gguf") == []


@pytest.mark.parametrize(
    "log_snr, words",
    [
        (drop("log_snr_fc2.bias"), "lacks the tensor log_snr_fc2.bias"),
        (tiny_gguf.LogSnr(tensors=()), "lacks the tensors log_snr_fc1.weight, log_snr_fc1.bias"),
        (tiny_gguf.LogSnr(flag=None), "does not set dflash.log_snr_conditioning = true"),
        (tiny_gguf.LogSnr(flag=False), "does not set dflash.log_snr_conditioning = true"),
        (tiny_gguf.LogSnr(max_log_snr=None), "lacks dflash.max_log_snr"),
        (tiny_gguf.LogSnr(min_log_snr=9.0), "dflash.max_log_snr 9.0 not greater than dflash.min_log_snr 9.0"),
        (tiny_gguf.LogSnr(min_log_snr=math.nan), "not finite"),
    ],
)
def test_pair_check_names_what_the_patched_loader_would_refuse(tmp_path, log_snr, words):
    target = inspect_gguf(tiny_gguf.write_target(tmp_path / "t.gguf"))
    problems = check_pair(target, inspect_gguf(tiny_gguf.write_dspark_drafter(tmp_path / "d.gguf", log_snr=log_snr)))
    assert len(problems) == 1 and words in problems[0], problems
    assert "bonsai convert-drafter" in problems[0]


# -- does the llama-server implement it? ---------------------------------------------------------------


def _log_snr_drafter_info():
    d = test_plan.drafter()
    return dataclasses.replace(
        d,
        drafter=dataclasses.replace(
            d.drafter, log_snr=True, log_snr_min=-9.0, log_snr_max=9.0, log_snr_tensors=LOG_SNR_TENSORS
        ),
    )


def test_plan_refuses_a_log_snr_drafter_on_a_binary_without_the_patch():
    caps = dataclasses.replace(test_plan.CAPS["cpu-8g"], binary="/usr/bin/llama-server", dspark_log_snr=False)
    with pytest.raises(BonsaiError) as refused:
        test_plan.plan_for(env={"BONSAI_SPECULATIVE": "1"}, caps=caps, draft=_log_snr_drafter_info())
    assert (
        "drafter.gguf uses log-SNR conditioning, which /usr/bin/llama-server does not implement"
        in refused.value.message
    )
    assert "bonsai build" in refused.value.fix
    plan = test_plan.plan_for(
        env={"BONSAI_SPECULATIVE": "1"},
        caps=dataclasses.replace(caps, dspark_log_snr=True),
        draft=_log_snr_drafter_info(),
    )
    assert "-md" in plan.argv
    # a drafter without the conditioning runs on any build
    assert "-md" in test_plan.plan_for(env={"BONSAI_SPECULATIVE": "1"}, caps=caps).argv


def test_log_snr_support_is_read_from_the_binary_or_its_libllama(tmp_path):
    plain = tmp_path / "bin" / "llama-server"
    plain.parent.mkdir()
    plain.write_bytes(b"\x7fELF" + b"\0" * 4096 + b"%s.target_layers\0")
    assert not implements_log_snr(plain)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libllama.so").write_bytes(b"\0" * 64 + b"%s.log_snr_conditioning\0")
    assert implements_log_snr(plain)


@pytest.mark.server
def test_the_built_server_implements_log_snr(llama_server):
    assert implements_log_snr(llama_server)
    assert probe(llama_server).dspark_log_snr


# -- the patched llama-server ---------------------------------------------------------------------------


@pytest.mark.server
def test_log_snr_drafter_loads_and_speculation_is_live(llama_server, tmp_path):
    target = tiny_gguf.write_target(tmp_path / "target.gguf")
    drafter = tiny_gguf.write_dspark_drafter(tmp_path / "drafter.gguf", block_size=4, log_snr=True)
    done = bonsai(
        ["start", *start_args(target, "--drafter", drafter, "--speculative"), "--detach", "--json"], server=llama_server
    )
    assert done.returncode == 0, done.stdout + done.stderr
    spec = json_out(done)["speculative"]
    assert spec["live"] and spec["type"] == "draft-dspark" and spec["n_max"] == 4 and spec["drafted"] > 0

    # the loader's own line (shown at verbosity 4) says the conditioning is on, with its bounds
    with tiny_gguf.serve(
        llama_server, ["-m", target, "-md", drafter, "--spec-draft-n-max", "4", "-lv", "4"], tmp_path / "verbose.log"
    ) as srv:
        assert LOADED_LOG in srv.log()


@pytest.mark.server
@pytest.mark.parametrize("focus", R.FOCUSES)
@pytest.mark.slow
def test_conditioning_as_specified_accepts_every_draft(llama_server, tmp_path, focus):
    # 300 near decoys: a server vector 1% (relative) off numpy's value would draft a decoy (see
    # test_near_decoys_catch_a_vector_off_by_one_or_two_percent), so these drafts pin the MLP output
    pair = R.write_conditioning_pair(tmp_path, convention="spec", focus=focus, token=T, near_decoys=300)
    done = bonsai(
        ["start", *start_args(pair.target, "--drafter", pair.drafter, "--speculative"), "--detach", "--json"],
        server=llama_server,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json_out(done)
    assert data["speculative"]["live"] and data["speculative"]["acceptance"] == 1.0
    answer = client.completion(data["url"], "tok1 tok2 tok3", n_predict=32, temperature=0)
    timings = answer["timings"]
    assert timings["draft_n"] >= 16 and timings["draft_n_accepted"] == timings["draft_n"]


@pytest.mark.server
def test_conditioning_holds_with_several_slots_drafting_at_once(llama_server, tmp_path):
    # several sequences' blocks may share one ubatch: each block's first row is its anchor
    pair = R.write_conditioning_pair(tmp_path, convention="spec", focus="anchor", token=T)
    args = ["-m", pair.target, "-md", pair.drafter, "--spec-draft-n-max", "4", "-np", "3", "-c", "4096"]
    with tiny_gguf.serve(llama_server, args, tmp_path / "server.log") as srv, ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda i: srv.completion(f"tok{i} tok2", n_predict=32), range(3)))
    for answer in answers:
        timings = answer["timings"]
        assert timings["draft_n"] > 0 and timings["draft_n_accepted"] == timings["draft_n"], timings


def acceptance(server: Path, pair: R.ConditioningPair, log: Path) -> float:
    args = ["-m", pair.target, "-md", pair.drafter, "--spec-draft-n-max", "4", "-np", "1", "-c", "2048"]
    with tiny_gguf.serve(server, args, log) as srv:
        timings = srv.completion("tok1 tok2 tok3", n_predict=32)["timings"]
    assert timings["draft_n"] > 0
    return timings["draft_n_accepted"] / timings["draft_n"]


@pytest.mark.server
@pytest.mark.parametrize("focus", R.FOCUSES)
@pytest.mark.slow
def test_swapped_conditioning_fixtures_are_rejected(llama_server, tmp_path, focus):
    rates = {
        c: acceptance(
            llama_server,
            R.write_conditioning_pair(tmp_path / c, convention=c, focus=focus, token=T),
            tmp_path / f"{c}.log",
        )
        for c in R.CONVENTIONS
    }
    assert rates["spec"] == 1.0, rates
    for swapped in ("sin_cos_swapped", "anchor_mask_swapped"):
        # mask focus: the anchor's draft is still right, the three mask drafts are not (about 1/4);
        # anchor focus: the first draft is wrong, so nothing after it counts (0)
        assert rates[swapped] <= (0.5 if focus == "mask" else 0.0), rates


@pytest.mark.server
@pytest.mark.slow
def test_conditioning_survives_q4_0_quantization(llama_server, tmp_path):
    # the real drafter ships Q4_0 (llama-quantize of the converted file): fc1/fc2 are quantized too
    quantize = llama_server.parent / "llama-quantize"
    assert quantize.is_file(), f"no llama-quantize beside {llama_server}: run `bonsai build`"
    rates = {}
    for convention in ("spec", "sin_cos_swapped"):
        pair = R.write_conditioning_pair(tmp_path / convention, convention=convention, focus="anchor", token=T)
        q4 = pair.drafter.with_name("drafter-Q4_0.gguf")
        done = subprocess.run([quantize, pair.drafter, q4, "Q4_0"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert inspect_gguf(q4).tensor_types.get("Q4_0", 0) >= 2
        rates[convention] = acceptance(
            llama_server, dataclasses.replace(pair, drafter=q4), tmp_path / f"{convention}.log"
        )
    assert rates == {"spec": 1.0, "sin_cos_swapped": 0.0}, rates


@pytest.mark.server
@pytest.mark.parametrize(
    "log_snr, message",
    [
        (drop("log_snr_fc1.weight"), "tensor 'log_snr_fc1.weight' not found"),
        (drop("log_snr_fc2.bias"), "tensor 'log_snr_fc2.bias' not found"),
        (tiny_gguf.LogSnr(flag=None), "wrong number of tensors"),
        (tiny_gguf.LogSnr(min_log_snr=None), "key not found in model: dflash.min_log_snr"),
        (
            tiny_gguf.LogSnr(min_log_snr=9.0),
            "dspark log-SNR conditioning: max_log_snr must be greater than min_log_snr",
        ),
        (tiny_gguf.LogSnr(max_log_snr=math.inf), "dspark log-SNR conditioning: min/max_log_snr must be finite"),
    ],
)
def test_patched_loader_refuses_a_broken_log_snr_drafter(llama_server, tmp_path, log_snr, message):
    target = tiny_gguf.write_target(tmp_path / "target.gguf")
    drafter = tiny_gguf.write_dspark_drafter(tmp_path / "drafter.gguf", log_snr=log_snr)
    with (
        pytest.raises(tiny_gguf.ServerExited) as exited,
        tiny_gguf.serve(
            llama_server, ["-m", target, "-md", drafter, "--spec-draft-n-max", "4"], tmp_path / "server.log"
        ),
    ):
        pass
    assert exited.value.returncode == 1
    assert message in exited.value.log


@pytest.mark.server
def test_bonsai_refuses_a_log_snr_drafter_missing_a_tensor(llama_server, tmp_path):
    target = tiny_gguf.write_target(tmp_path / "target.gguf")
    drafter = tiny_gguf.write_dspark_drafter(tmp_path / "drafter.gguf", log_snr=drop("log_snr_fc2.weight"))
    done = bonsai(["start", *start_args(target, "--drafter", drafter, "--speculative")], server=llama_server)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "log_snr_fc2.weight" in lines[0] and "Traceback" not in done.stderr
    assert not logs_dir().exists() or not any(logs_dir().iterdir())  # never spawned

    inspected = bonsai(["inspect", drafter, "--target", target])
    assert inspected.returncode != 0 and "lacks the tensor log_snr_fc2.weight" in inspected.stdout + inspected.stderr
