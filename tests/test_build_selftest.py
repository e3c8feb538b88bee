"""The build self-test (issue 38): each check fails on a build with its bug, and a failure changes
what bonsai does.

- kernels: the pinned llama.cpp without our patches (tests/support/ggml_libs.py) fails the
  check for Q1_0 and Q2_0, for Q4_0, Q8_0 and the K-quants on their missing tiles (patches 0020,
  0022-0026), and passes F16; the current build passes every type; a build
  whose check failed for a type refuses a model with weights of that type;
- hybrid_two_slots: the AMX code cannot run here, so the harness switch BONSAI_SELF_TEST_FAULT=
  hybrid gives the second of two concurrent sequences a wrong column; the check fails, and the
  plan for a hybrid target on 2+ slots gains --no-repack (a dense target, or one slot, does not);
  the same run without the switch passes and plans no workaround;
- gpu_offload (vulkan lane): with no GPU visible the check is skipped and the build stands (CI's
  own `bonsai build --backend vulkan` is that case); the Vulkan build on lavapipe passes; with the switch it fails, a
  named --backend then stops at `bonsai build`'s last step and at planning, and the failure is
  remembered for `auto` like a failed compile.

The self-test runs on a copy of the build's llama-server in a temporary BONSAI_HOME, so the
verdicts these tests force never land beside the real build.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

import tiny_gguf
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.builds import kernel_check
from bonsai_launch.llamacpp.builds import selftest_record as rec
from bonsai_launch.models import tiny_hybrid
from bonsai_launch.server import selftest
from test_vulkan_lane import RIG_ENV, vulkan_server  # noqa: F401 - the lane's fixture, used by the last test

# -- pure parts ------------------------------------------------------------------------------------

FAILED_KERNELS_OUTPUT = """avx2=1 avx512=0 avx512_vnni=0 avx_vnni=0 q1_0.nrows=1 q2_0.nrows=1 q2_0.generic=absent
FAIL: Q2_0 has no x86 kernel: its vec_dot is the scalar reference (patch 0005 missing)
type q1_0 ok
type q2_0 failed 1
type q4_0 ok
type q8_0 ok
type f16 ok
1 failures
"""


def test_the_kernel_verdict_names_the_failed_types():
    result = kernel_check.parse(FAILED_KERNELS_OUTPUT, 1)
    assert not result.passed
    assert result.types == {"Q1_0": True, "Q2_0": False, "Q4_0": True, "Q8_0": True, "F16": True}
    assert result.flags()["avx2"] and not result.flags()["avx512"]
    crashed = kernel_check.parse("avx2=1\n", -11)  # died before its verdict: nothing is proven
    assert not crashed.passed and not any(crashed.types.values())


def _record(**statuses: str) -> dict:
    checks = [{"name": n, "status": s, "detail": f"{n} detail"} for n, s in statuses.items()]
    if "kernels" in statuses:
        checks[0]["types"] = {"Q1_0": True, "Q2_0": statuses["kernels"] == "passed"}
    return {"checks": checks, "log": "/x/selftest.log", "backend": "cpu"}


def test_what_each_failed_check_means():
    ok = _record(kernels="passed", hybrid_two_slots="passed")
    assert rec.hybrid_workaround(ok) is None and rec.refused_types(ok) == {} and rec.failed(ok, rec.GPU) is None
    bad = _record(kernels="failed", hybrid_two_slots="failed", gpu_offload="failed")
    assert "--no-repack" in (rec.hybrid_workaround(bad) or "")
    assert list(rec.refused_types(bad)) == ["Q2_0"] and "/x/selftest.log" in rec.refused_types(bad)["Q2_0"]
    assert rec.failed(bad, rec.GPU) == "gpu_offload detail"
    assert rec.hybrid_workaround(None) is None  # no verdict (a binary bonsai did not build): nothing changes


def test_a_verdict_belongs_to_the_binary_it_tested(tmp_path):
    server = tmp_path / "k" / "bin" / "llama-server"
    server.parent.mkdir(parents=True)
    server.write_bytes(b"one")
    rec.write_record(tmp_path / "k", {"binary": "llama-server", "binary_stamp": rec.binary_stamp(server), "checks": []})
    assert rec.for_server(server) is not None
    server.write_bytes(b"rebuilt")  # another binary: the old verdict no longer speaks for it
    assert rec.for_server(server) is None


# -- against the real builds -----------------------------------------------------------------------


def _copy_build(server: Path, home: Path, backend: str = "cpu") -> dict:
    """The build's llama-server (static) as the only build of a temporary BONSAI_HOME."""
    key_dir = home / "builds" / f"{backend}-selftestcopy"
    (key_dir / "bin").mkdir(parents=True)
    copy = key_dir / "bin" / "llama-server"
    shutil.copy2(server.resolve(), copy)
    real = json.loads((server.resolve().parent.parent / "manifest.json").read_text())
    manifest = {**real, "key": key_dir.name, "binaries": {"llama-server": str(copy)}}
    (key_dir / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def _plan_for(model: Path, binary: Path, parallel: int | None):
    from bonsai_launch.server.inputs import gather_plan

    flags = {"parallel": parallel} if parallel else {}
    return gather_plan(flags, str(model), None, (), binary, env={})


@pytest.mark.server
def test_a_failed_hybrid_check_makes_start_plan_the_workaround(llama_server, tmp_path, monkeypatch):
    monkeypatch.setenv("BONSAI_HOME", str(tmp_path / "home"))
    manifest = _copy_build(llama_server, tmp_path / "home")
    binary = Path(manifest["binaries"]["llama-server"])
    hybrid = tiny_hybrid.write_hybrid_target(tmp_path / "hybrid.gguf", weight_type="q8_0")
    dense = tiny_gguf.write_target(tmp_path / "dense.gguf")

    plan = selftest.plan_self_test(manifest)
    only = ("hybrid_two_slots",)
    forced = selftest.run_self_test(selftest.SelfTestPlan(plan.key_dir, binary, "cpu", only, fault="hybrid"))
    assert not forced["passed"], forced
    assert "differs" in forced["checks"][0]["detail"]
    assert rec.for_server(binary) == forced  # kept beside the copy's manifest

    for parallel in (2, None):  # 2 slots, and llama-server's auto (4)
        p = _plan_for(hybrid, binary, parallel)
        assert "--no-repack" in p.argv, p.argv
        assert any("--no-repack" in w and "self-test" in w for w in p.warnings), p.warnings
    assert "--no-repack" not in _plan_for(hybrid, binary, 1).argv  # one slot: nothing to work around
    assert "--no-repack" not in _plan_for(dense, binary, 2).argv  # dense targets were never affected
    from bonsai_launch import doctor

    report = doctor.gather()
    (entry,) = [b for b in report.builds if b["key"] == manifest["key"]]
    assert entry["self_test"]["checks"][0]["status"] == "failed"  # what `doctor --json` shows
    assert any("--no-repack" in p.what and manifest["key"] in p.what for p in report.problems), report.problems

    clean = selftest.run_self_test(selftest.SelfTestPlan(plan.key_dir, binary, "cpu", only))
    assert clean["passed"], clean
    assert "--no-repack" not in _plan_for(hybrid, binary, 2).argv


@pytest.mark.server
def test_the_current_build_passes_every_check(llama_server):
    """The kernels, 2 slots on a hybrid target, and draft-mtp lossless, on the build under test.
    Run into a scratch record: the real build's kept verdict is left as it is."""
    key_dir = llama_server.resolve().parent.parent
    result = kernel_check.check_build(key_dir) if (key_dir / "work").is_dir() else None
    if result is None:
        import real_parts

        real_parts.missing(f"{key_dir}/work is missing", "run `bonsai build` (it keeps work/)")
    assert result is not None and result.passed, result.output[-3000:] if result else ""
    assert result.types == dict.fromkeys(kernel_check.TYPES, True)


@pytest.mark.server
@pytest.mark.slow
def test_the_kernel_check_passes_on_the_portable_build(tmp_path):
    """The kernels an AVX2-only CPU runs, which the native build of an AVX-512 machine never
    compiles: maddubs instead of dpbusd (0020's Q4_0, the runs within int16 of 0023-0025, 0026's
    Q8_0 by each weight's sign), and the ymm kernels' one pass (0027) and widths of 5-8 columns
    (0028). The patched pin configured as `bonsai build --portable` passes every type; without
    0026 its Q8_0 is not in the tiles and the check fails."""
    import ggml_libs

    root, include = ggml_libs.portable_key_dir()
    exe = kernel_check.compile_check(kernel_check.link_parts(root, include), tmp_path)
    result = kernel_check.run(exe)
    assert "avx2=1 avx512=0 avx512_vnni=0 avx_vnni=0" in result.first_line, result.first_line
    assert "q8_0.rows16=1" in result.first_line, result.first_line
    assert result.passed, result.output[-3000:]
    assert result.types == dict.fromkeys(kernel_check.TYPES, True)


@pytest.mark.server
@pytest.mark.slow
def test_the_kernel_check_fails_on_the_build_without_our_patches(tmp_path):
    import ggml_libs

    root, include = ggml_libs.prepatch_key_dir()
    exe = kernel_check.compile_check(kernel_check.link_parts(root, include), tmp_path)
    result = kernel_check.run(exe)
    assert not result.passed, result.output[-3000:]
    # our patches are Q1_0's, Q2_0's and PTQ1_0's (a type the pin lacks), and since 0020 and 0022-0026
    # Q4_0's, Q8_0's, Q4_K's, Q5_0's, Q6_K's and Q5_K's tiles: those fail on their wiring (upstream's
    # answers for them are right); F16 must still pass there (no false alarm)
    dpbusd = "avx512_vnni=1" in result.first_line or "avx_vnni=1" in result.first_line
    want = {
        "Q1_0": False,
        "Q2_0": False,
        "Q4_0": False,
        "Q8_0": False,
        "F16": True,
        "PTQ1_0": False,
        "Q4_K": False,
        "Q5_0": False,
        "Q6_K": False,
        "Q5_K": False,
    }
    assert result.types == want, result.output
    assert any("patch 0005 missing" in f for f in result.failures)
    assert [f for f in result.failures if "patch 0020 missing" in f and "Q4_0" in f], result.failures
    assert not [f for f in result.failures if "Q4_0" in f and "patch 0020" not in f], (
        "upstream's Q4_0 answers are right"
    )
    assert [f for f in result.failures if "patch 0023 missing" in f], result.failures
    assert [f for f in result.failures if "patch 0024 missing" in f], result.failures
    assert [f for f in result.failures if "patch 0025 missing" in f], result.failures
    q8_0_patch = "patch 0020 missing" if dpbusd else "patch 0026 missing"  # dpbusd, or maddubs by the weights' sign
    assert [f for f in result.failures if q8_0_patch in f and "Q8_0" in f], result.failures
    assert not [f for f in result.failures if "Q8_0" in f and q8_0_patch not in f], "upstream's Q8_0 answers are right"
    assert not [f for f in result.failures if "Q5_K" in f and "patch 0025" not in f], (
        "upstream's Q5_K answers are right"
    )
    assert not [f for f in result.failures if "Q6_K" in f and "patch 0024" not in f], (
        "upstream's Q6_K answers are right"
    )
    assert not [f for f in result.failures if "Q5_0" in f and "patch 0023" not in f], (
        "upstream's Q5_0 answers are right"
    )
    if "amx_int8=1" in result.output:  # an AMX-INT8 CPU: its batched tiles are patch 0014's
        assert any("patch 0014 missing" in f for f in result.failures), result.output[-3000:]
    # the same libraries as a build of another source (no patch series claimed): its answers are
    # right (upstream's scalar kernels), so nothing is refused there
    assert kernel_check.run(exe, our_patches=False).passed
    # and that verdict refuses a Q2_0 model at planning, naming the log
    from bonsai_launch.server.inputs import _refuse_failed_kernels

    record = {"checks": [{"name": "kernels", "status": "failed", "types": result.types}], "log": "/k/selftest.log"}
    with pytest.raises(BonsaiError, match=r"Q2_0 weights.*kernel self-test failed.*selftest.log"):
        _refuse_failed_kernels(record, {"Q2_0": 10, "F32": 3}, Path("m.gguf"))
    _refuse_failed_kernels(record, {"F16": 10, "F32": 3}, Path("m.gguf"))  # a type that passed: served


@pytest.mark.vulkan
@pytest.mark.server
def test_a_failed_gpu_check_stops_a_named_backend_and_is_remembered_for_auto(
    llama_server,
    vulkan_server,  # noqa: F811 - pytest's fixture, imported from the vulkan lane above
    tmp_path,
    monkeypatch,
):
    from bonsai_launch.llamacpp.builds import fallback, toolchain
    from bonsai_launch.llamacpp.builds.builder import BuildRequest, BuildResult

    monkeypatch.setenv("BONSAI_HOME", str(tmp_path / "home"))
    manifest = _copy_build(vulkan_server, tmp_path / "home", "vulkan")
    binary = Path(manifest["binaries"]["llama-server"])
    plan = selftest.SelfTestPlan(binary.parent.parent, binary, "vulkan", (rec.GPU,), cpu_server=llama_server)
    # No GPU visible (llama.cpp skips lavapipe unless told): nothing to check, and the build stands.
    for k in RIG_ENV:
        monkeypatch.delenv(k, raising=False)
    unseen = selftest.run_self_test(plan)
    assert unseen["passed"] and unseen["checks"][0]["status"] == "skipped", unseen
    assert "no GPU device visible" in unseen["checks"][0]["detail"], unseen

    for k, v in RIG_ENV.items():
        monkeypatch.setenv(k, v)
    good = selftest.run_self_test(plan)
    assert good["passed"], good
    assert "llvmpipe" in good["device"] or "Vulkan" in good["device"], good

    result = BuildResult(manifest, binary, True, binary.parent.parent)
    with pytest.raises(Exception, match="self-test failed its GPU check"):
        (binary.parent.parent / "selftest.json").unlink()
        selftest.after_build(result, BuildRequest(backend="vulkan"), fault="gpu")
    assert fallback.recorded_failure("vulkan", toolchain.detect(versions=False)) is not None  # auto skips it
    assert selftest.run_self_test(plan)["passed"]  # a rerun that passes on the device clears it
    assert fallback.recorded_failure("vulkan", toolchain.detect(versions=False)) is None
    selftest.run_self_test(replace(plan, fault="gpu"))
    hybrid = tiny_hybrid.write_hybrid_target(tmp_path / "hybrid.gguf")
    with pytest.raises(BonsaiError, match="failed its GPU check"):
        _plan_for(hybrid, binary, 1)


@pytest.mark.server
def test_the_speculative_check_fails_on_a_wrong_speculative_answer(llama_server, tmp_path, monkeypatch):
    """Both pairs (hybrid draft-mtp, dense draft-simple) draft, accept only part, and equal plain;
    the harness switch makes one speculative answer wrong, and the check says which pair."""
    monkeypatch.setenv("BONSAI_HOME", str(tmp_path / "home"))
    manifest = _copy_build(llama_server, tmp_path / "home")
    binary = Path(manifest["binaries"]["llama-server"])
    only = ("speculative",)
    good = selftest.run_self_test(selftest.SelfTestPlan(binary.parent.parent, binary, "cpu", only))
    check = good["checks"][0]
    assert check["status"] == "passed", check
    for pair in ("hybrid draft-mtp", "dense draft-simple"):
        accepted, drafted = map(int, check[pair].split()[0].split("/"))
        assert 0 < accepted < drafted, (pair, check)  # rollbacks happened: the path that can go wrong ran
    bad = selftest.run_self_test(selftest.SelfTestPlan(binary.parent.parent, binary, "cpu", only, fault="speculative"))
    assert bad["checks"][0]["status"] == "failed" and "differs from plain" in bad["checks"][0]["detail"], bad
