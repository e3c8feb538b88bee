"""Bonsai 2's codecs (PQ2_0, PTQ1_0) served as mainline Q2_0, and the layouts refused before a spawn.

The codecs are checked against each other, against the reference decoding of
shared/reference/bonsai2-format.md and against mainline Q2_0 of the same codes; a folded file in
each codec is served by `bonsai start` on our build (repacked once, losslessly) and answers like
its plain-basis twin; a folded file on a build without patch 0010, a fork type id on a binary
bonsai did not build, and PrismML's old group-128 "Q2_0" are each refused in one line.
"""

from __future__ import annotations

import itertools
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "support"))

import hadamard_fold
import tiny_gguf
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.flavours import BuildKind
from bonsai_launch.models import codec_repack, tiny_hybrid
from bonsai_launch.models import ternary_codecs as codecs
from bonsai_launch.models.gguf import inspect_gguf
from bonsai_launch.server.model_codec import path_on, serveable
from start_helpers import bonsai, json_out, stop_all


def _codes(blocks: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 3, (blocks, 128)).astype(np.uint8)
    d = rng.standard_normal(blocks).astype(np.float16).astype(np.float32)
    return codes, d


def _reference_pq2_0(block: bytes) -> list[float]:
    """The facts' words, one weight at a time: fp16 d, then weight j in byte j/4 at bits 2(j%4)."""
    d = struct.unpack("<e", block[:2])[0]
    return [(((block[2 + j // 4] >> (2 * (j % 4))) & 3) - 1) * d for j in range(128)]


def _reference_ptq1_0(block: bytes) -> list[float]:
    """The facts' element map and digit formula, element by element; d is the last 2 bytes."""
    d = struct.unpack("<e", block[26:28])[0]
    out = [0.0] * 128
    for m in range(16):
        for n in range(5):
            out[m + 16 * n] = ((((block[m] * 3**n) & 0xFF) * 3 >> 8) - 1) * d
    for m in range(8):
        for n in range(5):
            out[80 + m + 8 * n] = ((((block[16 + m] * 3**n) & 0xFF) * 3 >> 8) - 1) * d
    for h in range(2):
        for n in range(4):
            out[120 + h + 2 * n] = ((((block[24 + h] * 3**n) & 0xFF) * 3 >> 8) - 1) * d
    return out


def test_one_set_of_codes_decodes_alike_in_every_codec():
    codes, d = _codes(64)
    reference = codecs.values(codes, d)
    pq2 = codecs.encode_pq2_0(codes, d)
    ptq1 = codecs.encode_ptq1_0(codes, d)
    assert len(pq2) == 64 * 34 and len(ptq1) == 64 * 28
    for i in range(64):
        assert _reference_pq2_0(pq2[i * 34 : (i + 1) * 34]) == pytest.approx(list(reference[i]), abs=0)
        assert _reference_ptq1_0(ptq1[i * 28 : (i + 1) * 28]) == pytest.approx(list(reference[i]), abs=0)
    # mainline Q2_0 of the same codes: two 64-weight blocks with the block's d each
    q2 = codecs.encode_q2_0(codes.reshape(-1, 64), np.repeat(d, 2))
    assert codecs.to_q2_0(codecs.PQ2_0, pq2) == q2 == codecs.to_q2_0(codecs.PTQ1_0, ptq1)
    q_codes, q_d = codecs.decode_q2_0(q2)
    assert np.array_equal(codecs.values(q_codes, q_d).reshape(-1), reference.reshape(-1))


def test_every_five_trit_byte_reads_back():
    for digits in itertools.product(range(3), repeat=5):
        codes = np.zeros((1, 128), dtype=np.uint8)
        codes[0, [0, 16, 32, 48, 64]] = digits  # qs[0] holds elements 0, 16, 32, 48, 64
        back, _ = codecs.decode_ptq1_0(codecs.encode_ptq1_0(codes, np.ones(1, np.float32)))
        assert tuple(back[0, [0, 16, 32, 48, 64]]) == digits


def test_ptq1_0_refuses_the_code_it_cannot_hold():
    codes, d = _codes(1)
    codes[0, 5] = 3
    with pytest.raises(ValueError, match="ternary codes only"):
        codecs.encode_ptq1_0(codes, d)


# --- files --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ternary(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ternary")
    pair = hadamard_fold.write_fold_pair(folder)
    return {
        "PQ2_0": hadamard_fold.write_ternary(pair, folder / "tiny-folded-PQ2_0.gguf", codecs.PQ2_0),
        "PTQ1_0": hadamard_fold.write_ternary(pair, folder / "tiny-folded-PTQ1_0.gguf", codecs.PTQ1_0),
        "twin": hadamard_fold.write_ternary_twin(pair, folder / "tiny-plain-twin-F32.gguf"),
    }


@pytest.mark.slow
def test_both_codecs_repack_into_the_same_q2_0_file(ternary):
    pq2, ptq1 = codec_repack.repack(ternary["PQ2_0"]), codec_repack.repack(ternary["PTQ1_0"])
    assert pq2.read_bytes()[64:] != b"" and pq2.read_bytes() == ptq1.read_bytes()
    info = inspect_gguf(pq2)
    assert "Q2_0" not in inspect_gguf(ternary["PQ2_0"]).tensor_types and info.tensor_types.get("Q2_0") == 13
    assert info.fold_version == 1  # the keys travel with the weights
    # memory per codec: the same weights in 34, 28 and 36 bytes per 128
    sizes = {k: inspect_gguf(ternary[k]).data_bytes for k in ("PQ2_0", "PTQ1_0")} | {"Q2_0": info.data_bytes}
    assert sizes["PTQ1_0"] < sizes["PQ2_0"] < sizes["Q2_0"]


def _group128_file(path: Path) -> Path:
    """A file whose type-42 tensor holds 34-byte blocks of 128 (PrismML's old "Q2_0")."""
    codes, d = _codes(2 * 64)  # 2 rows of 8192 weights
    src = tiny_hybrid.write_parts(
        path.with_suffix(".f32.gguf"), [], [("w.weight", np.zeros((2, 8192), np.float32), {})]
    )
    raw = codecs.encode_pq2_0(codes, d)
    return codec_repack.rewrite(src, path, lambda n, t, dims, nb: (codecs.Q2_0, len(raw), lambda _b: raw))


def test_group128_under_type_42_is_refused_by_inspect_and_start(tmp_path, llama_server):
    bad = _group128_file(tmp_path / "my-ternary-Q2_0.gguf")  # not a catalog name: read from the header
    info = inspect_gguf(bad)
    assert info.q2_0_group128
    done = bonsai(["inspect", bad], server=llama_server)
    assert done.returncode != 0 and "old group-128 'Q2_0' blocks under mainline's type id 42" in done.stderr
    done = bonsai(["start", "--model", bad, "--detach"], server=llama_server)
    assert done.returncode != 0 and "old group-128" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_folded_file_is_refused_on_a_build_that_cannot_fold(ternary):
    """A bonsai build from before patch 0010, and a binary bonsai did not build."""
    info = inspect_gguf(ternary["PQ2_0"])

    def serve(kind: BuildKind, foreign: bool):
        return serveable(info, kind, path_on(info, kind, None, None), foreign=foreign, repack=False)

    with pytest.raises(BonsaiError, match=r"Hadamard-folded.*does not undo the fold"):
        serve(BuildKind("mainline", folds=False), False)
    with pytest.raises(BonsaiError, match=r"uses PrismML.s PQ2_0 .types 142/143."):
        serve(BuildKind("mainline"), True)
    # a fork build takes it as it is; the current series repacks it
    assert serve(BuildKind("fork", folds=True), False) == (info, None)
    served, note = serve(BuildKind("mainline", folds=True), False)
    assert served is info and "made when the server starts" in (note or "")


@pytest.mark.parametrize("codec", ["PQ2_0", "PTQ1_0"])
@pytest.mark.slow
def test_start_serves_a_folded_file_like_its_plain_twin(llama_server, ternary, tmp_path, codec):
    """PQ2_0 runs as its Q2_0 repack; PTQ1_0 as it is on our CPU build (patch 0013), with no
    repacked copy written."""
    repack = codec_repack.output_path(ternary[codec])
    repack.unlink(missing_ok=True)
    try:
        started = json_out(
            bonsai(["start", "--model", ternary[codec], "--ctx", "512", "--detach", "--json"], server=llama_server)
        )
        repacked = any("runs as its lossless Q2_0 repack" in w for w in started["plan"]["warnings"])
        assert repacked == (codec == "PQ2_0") and repack.is_file() == (codec == "PQ2_0")
        assert started["name"] == ternary[codec].stem
        served = started["url"]
        got = [_greedy(served, p) for p in hadamard_fold.PROMPTS]
    finally:
        stop_all()
    with tiny_gguf.serve(llama_server, ["-m", ternary["twin"], "-c", "512"], tmp_path / "twin.log") as twin:
        want = [_greedy(twin.url, p) for p in hadamard_fold.PROMPTS]
    assert got == want


def _greedy(url: str, prompt: list[int]) -> list[int]:
    import json
    import urllib.request

    body = json.dumps({"prompt": prompt, "n_predict": 8, "temperature": 0, "n_probs": 1}).encode()
    req = urllib.request.Request(f"{url}/completion", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return [step["id"] for step in json.load(resp)["completion_probabilities"]]


@pytest.mark.slow
def test_ptq1_0_as_it_is_answers_like_its_q2_0_repack(llama_server, ternary, tmp_path):
    """The same codes, held at 1.75 bits per weight (patch 0013) and as Q2_0 (2.25): the same
    greedy tokens from the same CPU build."""
    native = ternary["PTQ1_0"]
    assert "PTQ1_0" in inspect_gguf(native).tensor_types
    answers = {}
    for label, model in (("native", native), ("repack", codec_repack.repack(native))):
        # llama-server loads type 143 only with patch 0013: the pin alone refuses the file
        with tiny_gguf.serve(llama_server, ["-m", model, "-c", "512"], tmp_path / f"{label}.log") as s:
            answers[label] = [_greedy(s.url, p) for p in hadamard_fold.PROMPTS]
    assert answers["native"] == answers["repack"]
