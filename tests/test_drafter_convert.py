"""`bonsai convert-drafter`: the legacy `dspark` -> `dflash` conversion, its refusals, its output.

Unit assertions follow the list at the end of /work/shared/reference/dspark-conversion.md;
refusals go through the real CLI (one `error:` line, non-zero exit, nothing left behind).
Quantizing needs llama-quantize from `bonsai build` (next to the real llama-server).
"""

from __future__ import annotations

import hashlib
import json

import pytest
from gguf import GGUFReader

import tiny_gguf
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.models.drafters import convert as drafter_convert
from bonsai_launch.models.drafters import quantize
from bonsai_launch.models.drafters.convert import convert_drafter
from bonsai_launch.models.drafters.plan import plan_conversion
from bonsai_launch.models.drafters.provenance import CONVERTER_VERSION, read_provenance, stale_reasons
from bonsai_launch.models.gguf import check_pair, inspect_gguf
from cli_runner import run_cli
from legacy_dspark_gguf import patch_tensor_type, with_key, write_legacy_drafter

RENAMED = {
    "dspark.fc.weight": "fc.weight",
    "dspark.hidden_norm.weight": "enc.output_norm.weight",
    "dspark.markov_head_a.weight": "markov_w1.weight",
    "dspark.markov_head_b.weight": "markov_w2.weight",
    "dspark.confidence_head.weight": "conf_proj.weight",
    "dspark.confidence_head.bias": "conf_proj.bias",
    "dspark.log_snr_fc1.weight": "log_snr_fc1.weight",
    "dspark.log_snr_fc1.bias": "log_snr_fc1.bias",
    "dspark.log_snr_fc2.weight": "log_snr_fc2.weight",
    "dspark.log_snr_fc2.bias": "log_snr_fc2.bias",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("legacy")
    out = {
        "target": tiny_gguf.write_target(d / "T.gguf", layers=4),
        "legacy": write_legacy_drafter(d / "L.gguf", log_snr=False),
        "legacy_snr": write_legacy_drafter(d / "LS.gguf", log_snr=True),
        "narrow_conf": write_legacy_drafter(d / "narrow.gguf", confidence_head_with_markov=False),
        "unknown_tensor": write_legacy_drafter(d / "foo.gguf", extra_tensor="dspark.foo.weight"),
        "collision": write_legacy_drafter(d / "collide.gguf", extra_dflash_key=True),
        "mask7": write_legacy_drafter(d / "mask7.gguf", mask_token_id=7),
        "other_vocab_target": tiny_gguf.write_target(d / "T640.gguf", layers=4, vocab=640),
        "wide_target": tiny_gguf.write_target(d / "T128.gguf", layers=4, embedding=128),
        "shallow_target": tiny_gguf.write_target(d / "T2.gguf", layers=2),
        "other_target": tiny_gguf.write_target(d / "Tother.gguf", layers=4, token_prefix="other"),
    }
    q41 = d / "L-Q4_1.gguf"
    q41.write_bytes(out["legacy"].read_bytes())
    out["type42"] = patch_tensor_type(q41, "dspark.fc.weight", 42)
    out["masked_target"] = with_key(out["target"], d / "Tmask.gguf", "tokenizer.ggml.mask_token_id", 3)
    return out


def _convert(files, tmp_path, source="legacy_snr", target="target", **kw):
    kw.setdefault("quantization", "none")
    return convert_drafter(files[source], files[target], tmp_path / "D.gguf", **kw)


def _fields(path):
    reader = GGUFReader(path)
    return reader, {name: f for name, f in reader.fields.items() if not name.startswith("GGUF.")}


# --- what the output is -------------------------------------------------------------------------


def test_tensor_bytes_are_the_sources_and_names_are_renamed(files, tmp_path):
    result = _convert(files, tmp_path)
    src, out = GGUFReader(files["legacy_snr"]), GGUFReader(result.output)
    by_src = {t.name: t for t in src.tensors}
    assert len(src.tensors) == 24 and len(out.tensors) == 22  # log-SNR family, shared tensors dropped
    assert not any(t.name.startswith("dspark.") for t in out.tensors)
    for t in out.tensors:
        original = next(n for n in by_src if RENAMED.get(n, n) == t.name)
        s = by_src[original]
        assert t.tensor_type == s.tensor_type and list(t.shape) == list(s.shape), t.name
        assert bytes(t.data.tobytes()) == bytes(s.data.tobytes()), t.name
    assert {t.tensor_type.name for t in out.tensors} == {"BF16", "F32"}


def test_key_types_are_kept_and_renamed(files, tmp_path):
    result = _convert(files, tmp_path)
    _, src = _fields(files["legacy_snr"])
    _, out = _fields(result.output)
    assert out["general.architecture"].contents() == "dflash"
    for key, f in src.items():
        if key.startswith("tokenizer.") or key == "general.architecture" or key == "dspark.dspark.mask_token_id":
            continue
        new = (
            "dflash." + key.removeprefix("dspark.dspark.").removeprefix("dspark.") if key.startswith("dspark.") else key
        )
        assert [int(t) for t in out[new].types] == [int(t) for t in f.types], key
        if not key.endswith("target_layers"):
            assert out[new].contents() == f.contents(), key
    assert out["dflash.log_snr_conditioning"].contents() is True
    assert out["dflash.min_log_snr"].contents() == -9.0 and out["dflash.max_log_snr"].contents() == 9.0


def test_target_layers_are_shifted_exactly_once(files, tmp_path):
    _, out = _fields(_convert(files, tmp_path).output)
    layers = out["dflash.target_layers"]
    assert layers.contents() == [1, 3] and layers.types[1].name == "INT32"
    # a second conversion of the output is refused, so no second shift can happen
    with pytest.raises(BonsaiError, match="already in the dflash layout"):
        plan_conversion(tmp_path / "D.gguf", files["target"])


def test_the_targets_tokenizer_replaces_the_stub(files, tmp_path):
    _, donor = _fields(files["target"])
    _, out = _fields(_convert(files, tmp_path).output)
    for key, f in donor.items():
        if key.startswith("tokenizer."):
            assert out[key].contents() == f.contents(), key
    assert out["tokenizer.ggml.model"].contents() == "test"  # not the legacy "none"
    assert out["tokenizer.ggml.mask_token_id"].contents() == 511
    info = inspect_gguf(tmp_path / "D.gguf")
    assert info.vocab_fingerprint == inspect_gguf(files["target"]).vocab_fingerprint
    assert info.drafter.kind == "dspark" and info.drafter.block_size == 4 and info.drafter.mask_token_id == 511
    assert check_pair(inspect_gguf(files["target"]), info) == []


def test_the_drafters_mask_id_wins_over_the_targets(files, tmp_path):
    result = convert_drafter(files["mask7"], files["masked_target"], tmp_path / "D.gguf", quantization="none")
    _, out = _fields(result.output)
    assert out["tokenizer.ggml.mask_token_id"].contents() == 7


@pytest.mark.parametrize("keep, count", [(False, 18), (True, 20)])
def test_shared_tensors_dropped_unless_kept_and_offsets_aligned(files, tmp_path, keep, count):
    result = _convert(files, tmp_path, source="legacy", keep_shared_tensors=keep)
    reader = GGUFReader(result.output)
    names = {t.name for t in reader.tensors}
    assert len(reader.tensors) == count
    assert ("token_embd.weight" in names) is keep and ("output.weight" in names) is keep
    assert result.dropped == (() if keep else ("token_embd.weight", "output.weight"))
    assert all(t.data_offset % 32 == 0 for t in reader.tensors)


def test_provenance_says_where_it_came_from(files, tmp_path):
    result = _convert(files, tmp_path)
    prov = read_provenance(result.output)
    assert prov == result.provenance
    assert prov.source_sha256 == hashlib.sha256(files["legacy_snr"].read_bytes()).hexdigest()
    assert prov.target_vocab_fingerprint == inspect_gguf(files["target"]).vocab_fingerprint
    assert prov.converter_version == CONVERTER_VERSION and prov.shared_tensors == "dropped"
    assert stale_reasons(result.output, prov.source_sha256, files["target"]) == []
    assert any("another source" in r for r in stale_reasons(result.output, "0" * 64, files["target"]))
    assert any("another vocabulary" in r for r in stale_reasons(result.output, None, files["other_target"]))
    assert read_provenance(files["target"]) is None


def test_inspect_shows_the_conversion_record(files, tmp_path, capsys):
    result = _convert(files, tmp_path)
    code, out, err = run_cli(capsys, "inspect", str(result.output), "--json")
    assert code == 0, err
    assert json.loads(out)["conversion"] == result.provenance.to_json()
    code, out, err = run_cli(capsys, "inspect", str(files["target"]), "--json")
    assert json.loads(out)["conversion"] is None


def test_memory_stays_flat_the_copy_is_streamed(files, tmp_path, monkeypatch):
    """The copy goes through one fixed block, never the whole file: with a 4 KiB block the
    tiny file needs many reads, and the bytes still come out identical."""
    monkeypatch.setattr(drafter_convert, "COPY_BLOCK", 4096)
    seen = []
    plan = plan_conversion(files["legacy_snr"], files["target"], quantization="none")
    drafter_convert.write_converted(plan, tmp_path / "D.gguf", on_bytes=seen.append)
    assert max(seen) <= 4096 and sum(seen) == files["legacy_snr"].stat().st_size
    src = {RENAMED.get(t.name, t.name): t for t in GGUFReader(files["legacy_snr"]).tensors}
    for t in GGUFReader(tmp_path / "D.gguf").tensors:
        assert t.data.tobytes() == src[t.name].data.tobytes(), t.name


def test_interrupt_leaves_nothing_behind(files, tmp_path, monkeypatch):
    class Boom:
        def note(self, message):
            pass

        def bar(self, label, total, initial=0):
            class B:
                def update(self, n):
                    raise KeyboardInterrupt

                def close(self):
                    pass

            return B()

    with pytest.raises(KeyboardInterrupt):
        convert_drafter(files["legacy_snr"], files["target"], tmp_path / "D.gguf", quantization="none", reporter=Boom())
    assert list(tmp_path.iterdir()) == []


# --- refusals through the real CLI ----------------------------------------------------------------


def _refused(capsys, tmp_path, *argv, progress=False):
    """One `error:` line; with progress=True (a failure after work began) the progress bars'
    final lines may precede it, and the error line must be the last."""
    before = sorted(tmp_path.rglob("*"))
    code, out, err = run_cli(capsys, "convert-drafter", *map(str, argv))
    lines = [line for line in err.splitlines() if line.strip()]
    if progress:
        assert [line for line in lines if line.startswith("error")] == lines[-1:], err
        lines = lines[-1:]
    assert code != 0, (out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err + out
    assert sorted(tmp_path.rglob("*")) == before  # nothing half-written
    return lines[0]


@pytest.mark.parametrize(
    "source, target, words",
    [
        ("converted", "target", ["already in the dflash layout", "bonsai start --drafter"]),
        ("target", "target", ["architecture 'qwen3'", "dspark-bf16.gguf"]),
        ("type42", "target", ["type 42", "dspark-bf16.gguf"]),
        ("unknown_tensor", "target", ["dspark.foo.weight", "no dflash equivalent"]),
        ("collision", "target", ["dspark.block_size", "dspark.dspark.block_size"]),
        ("narrow_conf", "target", ["confidence head 64 wide", "72"]),
        ("legacy_snr", "other_vocab_target", ["512-token vocabulary", "640 tokens", "--target"]),
        ("legacy_snr", "wide_target", ["embedding size 64", "128", "--target"]),
        ("legacy_snr", "shallow_target", ["[0, 2]", "[1, 3]", "2 layers", "--target"]),
        ("legacy_snr", "legacy", ["is a drafter", "target model"]),
    ],
)
def test_refusals(files, tmp_path, capsys, source, target, words):
    paths = dict(files)
    if source == "converted":
        (tmp_path / "prev").mkdir()
        paths["converted"] = _convert(files, tmp_path / "prev").output
    work = tmp_path / "out"
    work.mkdir()
    line = _refused(capsys, work, paths[source], "--target", paths[target], "-o", work / "D.gguf", "--quantize", "none")
    for w in words:
        assert w in line, line


def test_existing_output_needs_force(files, tmp_path, capsys):
    existing = tmp_path / "D.gguf"
    existing.write_bytes(b"keep me")
    line = _refused(capsys, tmp_path, files["legacy_snr"], "--target", files["target"], "-o", existing)
    assert "already exists" in line and "--force" in line
    assert existing.read_bytes() == b"keep me"
    code, out, err = run_cli(
        capsys,
        "convert-drafter",
        str(files["legacy_snr"]),
        "--target",
        str(files["target"]),
        "-o",
        str(existing),
        "--quantize",
        "none",
        "--force",
        "--json",
    )
    assert code == 0, err
    assert json.loads(out)["tensors"] == 22 and existing.read_bytes()[:4] == b"GGUF"


def test_bad_quantize_value_and_missing_source(files, tmp_path, capsys):
    line = _refused(
        capsys,
        tmp_path,
        files["legacy_snr"],
        "--target",
        files["target"],
        "-o",
        tmp_path / "D.gguf",
        "--quantize",
        "Q3_K",
    )
    assert "Q3_K" in line and "Q4_0" in line
    line = _refused(capsys, tmp_path, tmp_path / "nope.gguf", "--target", files["target"], "-o", tmp_path / "D.gguf")
    assert "not found" in line


def test_missing_llama_quantize_is_named(files, tmp_path, capsys, monkeypatch):
    lonely = tmp_path / "bin" / "llama-server"
    lonely.parent.mkdir()
    lonely.write_text("#!/bin/sh\n")
    monkeypatch.setenv("BONSAI_LLAMA_SERVER", str(lonely))
    work = tmp_path / "out"
    work.mkdir()
    line = _refused(capsys, work, files["legacy_snr"], "--target", files["target"], "-o", work / "D.gguf")
    assert "llama-quantize is not built" in line and "bonsai build" in line


# --- quantized with the real llama-quantize ----------------------------------------------------------


@pytest.fixture
def quantize_bin(llama_server):
    path = llama_server.parent / "llama-quantize"
    if not path.is_file():
        pytest.fail(f"no llama-quantize next to {llama_server}: run `bonsai build`")
    return path


def test_quantized_with_llama_quantize_keeps_provenance(files, tmp_path, capsys, monkeypatch, quantize_bin):
    monkeypatch.setenv("BONSAI_LLAMA_SERVER", str(quantize_bin.parent / "llama-server"))
    code, out, err = run_cli(
        capsys,
        "convert-drafter",
        str(files["legacy_snr"]),
        "--target",
        str(files["target"]),
        "-o",
        str(tmp_path / "D.gguf"),
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    reader = GGUFReader(tmp_path / "D.gguf")
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["fc.weight"] == "Q4_0" and types["blk.0.attn_q.weight"] == "Q4_0"
    assert types["output_norm.weight"] == "F32"
    prov = read_provenance(tmp_path / "D.gguf")
    assert prov.quantization == "Q4_0" and prov.source_sha256 == data["provenance"]["source_sha256"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["D.gguf"]  # no temporary files or logs left


def test_llama_quantize_is_found_in_another_installed_build(tmp_path, monkeypatch):
    """The newest build may lack llama-quantize (built before it was a target); any installed
    build's copy will do, since quantizing depends on neither our patches nor the backend."""
    from bonsai_launch.core.paths import builds_dir
    from bonsai_launch.llamacpp.builds.install import write_manifest

    for key, tools in (("cpu-old", ("llama-server", "llama-quantize")), ("cpu-new", ("llama-server",))):
        bin_dir = builds_dir() / key / "bin"
        bin_dir.mkdir(parents=True)
        for tool in tools:
            (bin_dir / tool).write_text("#!/bin/sh\n")
        built_at = "2026-01-02" if key == "cpu-new" else "2026-01-01"
        write_manifest(
            builds_dir() / key,
            {"schema": 1, "backend": "cpu", "built_at": built_at, "binaries": {t: str(bin_dir / t) for t in tools}},
        )
    monkeypatch.setenv("BONSAI_LLAMA_SERVER", str(builds_dir() / "cpu-new" / "bin" / "llama-server"))
    assert quantize.find_quantize() == builds_dir() / "cpu-old" / "bin" / "llama-quantize"


def test_failed_quantize_leaves_nothing_behind(files, tmp_path, capsys, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "llama-server").write_text("#!/bin/sh\n")
    quantize = bin_dir / "llama-quantize"
    quantize.write_text("#!/bin/sh\necho 'llama_model_quantize: failed to quantize: out of luck'\nexit 1\n")
    quantize.chmod(0o755)
    monkeypatch.setenv("BONSAI_LLAMA_SERVER", str(bin_dir / "llama-server"))
    work = tmp_path / "out"
    work.mkdir()
    line = _refused(
        capsys, work, files["legacy_snr"], "--target", files["target"], "-o", work / "D.gguf", progress=True
    )
    assert "llama-quantize failed (exit 1): llama_model_quantize: failed to quantize: out of luck" in line
    assert "--quantize none" in line
