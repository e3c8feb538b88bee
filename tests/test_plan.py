"""The launch plan, table-driven over profiles x speculation x hardware. Pure: no files."""

from __future__ import annotations

from pathlib import Path

import pytest

from bonsai_launch.config.profiles import load_all
from bonsai_launch.config.settings import resolve
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.hardware import GPU, Hardware
from bonsai_launch.core.shell import render_command
from bonsai_launch.llamacpp.capabilities import Capabilities
from bonsai_launch.llamacpp.options import pinned_table
from bonsai_launch.models.gguf import DrafterInfo, GGUFInfo
from bonsai_launch.server.passthrough import parse as parse_passthrough
from bonsai_launch.server.plan import PlanInputs, build_plan

GB = 2**30
PROFILES = load_all()


def target(arch="qwen35", layers=64, embedding=5120, vocab=248320, fingerprint="abc", size=7 * GB, ctx_len=262144):
    return GGUFInfo(
        path=Path(f"/m/{arch}-target.gguf"),
        file_size=size,
        version=3,
        architecture=arch,
        name="t",
        layers=layers,
        embedding=embedding,
        context_length=ctx_len,
        head_count=24,
        head_count_kv=4,
        key_length=256,
        value_length=256,
        vocab_size=vocab,
        vocab_fingerprint=fingerprint,
        tokenizer_model="gpt2",
        has_chat_template=True,
        block_size=None,
        tensor_count=10,
        tensor_types={"Q2_0": 10},
        data_bytes=size - 1000,
    )


def drafter(
    block_size=4,
    embedding=5120,
    vocab=248320,
    fingerprint="abc",
    kind="dspark",
    layers=(1, 16, 31),
    mask=248319,
    name="drafter.gguf",
):
    info = DrafterInfo(
        kind=kind,
        block_size=block_size,
        target_layers=layers,
        mask_token_id=mask,
        draft_layers=1,
        has_confidence_head=False,
    )
    return GGUFInfo(
        path=Path(f"/m/{name}"),
        file_size=600 * 2**20,
        version=3,
        architecture="dspark" if kind == "legacy-dspark" else "dflash",
        name="d",
        layers=1,
        embedding=embedding,
        context_length=4096,
        head_count=8,
        head_count_kv=8,
        key_length=128,
        value_length=128,
        vocab_size=vocab,
        vocab_fingerprint=fingerprint,
        tokenizer_model="gpt2",
        has_chat_template=False,
        block_size=block_size,
        tensor_count=5,
        tensor_types={"Q4_1": 5},
        data_bytes=1,
        drafter=info,
    )


HW = {
    "cpu-8g": Hardware("Linux", "x86_64", 2, 2, 8 * GB),
    "cpu-24g": Hardware("Linux", "x86_64", 2, 2, 24 * GB),
    "cpu-128g": Hardware("Linux", "x86_64", 16, 32, 128 * GB),
    "cuda-24g": Hardware("Linux", "x86_64", 8, 16, 64 * GB, gpus=(GPU(0, "RTX 4090", 24 * GB, 23 * GB, "8.9"),)),
    "cuda-8g": Hardware("Linux", "x86_64", 8, 16, 64 * GB, gpus=(GPU(0, "RTX 3070", 8 * GB, 7 * GB, "8.6"),)),
    "metal": Hardware("Darwin", "arm64", 10, 10, 32 * GB, metal=True),
}
ALL_SPEC = frozenset({"none", "draft-dflash", "draft-dspark", "ngram-mod", "ngram-simple", "ngram-map-k"})
CAPS = {
    "cpu-8g": Capabilities(
        "llama-server", backend="cpu", spec_types=ALL_SPEC, flags=frozenset({"--cache-type-k", "--spec-draft-type-k"})
    ),
    "cuda-24g": Capabilities(
        "llama-server", backend="cuda", spec_types=ALL_SPEC, flags=frozenset({"--cache-type-k", "--spec-draft-type-k"})
    ),
}


def plan_for(
    profile="ternary-27b",
    hw="cpu-24g",
    env=None,
    flags=None,
    with_drafter=True,
    caps=None,
    passthrough=(),
    model=None,
    draft=None,
    mmproj=None,
):
    prof = PROFILES[profile]
    settings = resolve(flags or {}, env or {}, prof.settings)
    return build_plan(
        PlanInputs(
            settings=settings,
            model=model or target(),
            hardware=HW[hw],
            binary="/bin/llama-server",
            profile=prof,
            drafter=(draft or drafter()) if with_drafter else None,
            mmproj=mmproj,
            capabilities=caps,
            passthrough=parse_passthrough(passthrough, pinned_table()),
        )
    )


def arg(plan, flag):
    argv = list(plan.argv)
    return argv[argv.index(flag) + 1] if flag in argv else None


# profile, hardware, speculative, expected (ctx, ngl, spec type, n-max, -np)
CASES = [
    # 7 GB of weights leave an 8 GB machine no room for the tier's 8192 tokens (256 KiB each here)
    ("ternary-27b", "cpu-8g", False, (2048, "0", None, None, None)),
    ("ternary-27b", "cpu-24g", False, (32768, "0", None, None, None)),
    ("ternary-27b", "cpu-128g", False, (131072, "0", None, None, None)),
    ("bonsai-8b", "cpu-128g", False, (65536, "0", None, None, None)),
    ("ternary-27b", "cpu-8g", True, (16384, "0", "draft-dspark", "4", "1")),
    ("ternary-27b", "cpu-128g", True, (131072, "0", "draft-dspark", "4", "1")),
    ("ternary-27b", "cuda-24g", True, (None, "99", "draft-dspark", "4", "1")),
    ("bonsai-27b", "metal", True, (32768, "99", "draft-dspark", "4", "1")),
    ("demo", "cpu-8g", True, (16384, "0", "ngram-mod", None, "1")),
    ("demo", "cpu-8g", False, (8192, "0", None, None, None)),
]


@pytest.mark.parametrize("profile,hw,spec,expected", CASES)
def test_plan_table(profile, hw, spec, expected):
    ctx, ngl, spec_type, n_max, np_ = expected
    demo = dict(arch="gemma3", layers=18, embedding=640, vocab=262144, ctx_len=32768, size=300 * 2**20)
    model = target(**demo) if profile == "demo" else None
    plan = plan_for(
        profile, hw, env={"BONSAI_SPECULATIVE": "1" if spec else "0"}, with_drafter=profile != "demo", model=model
    )
    if ctx is not None:
        assert arg(plan, "-c") == str(ctx)
    assert int(arg(plan, "-c")) > 0, "never -c 0"
    assert arg(plan, "-ngl") == ngl
    assert arg(plan, "--spec-type") == spec_type
    assert arg(plan, "--spec-draft-n-max") == n_max
    assert arg(plan, "-np") == np_
    if spec and spec_type.startswith("draft"):
        assert arg(plan, "-ngld") == ngl
        assert arg(plan, "-md") == "/m/drafter.gguf"
    assert {r.flag for r in plan.reasons} >= {"-m", "-c", "-ngl"}
    assert plan.argv[-len(PROFILES[profile].server_args) :] == PROFILES[profile].server_args


@pytest.mark.parametrize(
    "hw,env,caps,expected",
    [
        ("cpu-8g", {}, None, ("0", "no GPU detected")),  # no build probed: the hardware decides
        ("cpu-8g", {}, "cpu-8g", ("0", "CPU build: nothing to offload")),
        ("cuda-24g", {}, None, ("99", "cuda backend: offload all layers")),
        ("cuda-24g", {"BONSAI_NGL": "12"}, None, ("12", "BONSAI_NGL/--ngl (env)")),
    ],
)
def test_the_gpu_layers_and_the_reason_the_plan_gives(hw, env, caps, expected):
    plan = plan_for(hw=hw, env=env, caps=CAPS[caps] if caps else None)
    assert (arg(plan, "-ngl"), " | ".join(r.why for r in plan.reasons if r.flag == "-ngl")) == expected


def test_reference_flags_for_ternary_27b_with_drafter():
    plan = plan_for(env={"BONSAI_SPECULATIVE": "1"}, draft=drafter(block_size=7))
    argv = list(plan.argv)
    for flag in ("-fa", "--temp", "--top-p", "--top-k", "--min-p", "--jinja"):
        assert flag in argv
    assert arg(plan, "--temp") == "0.7" and arg(plan, "--top-p") == "0.95" and arg(plan, "--top-k") == "20"
    assert arg(plan, "--spec-draft-n-max") == "7", "n-max is the block size read from the drafter"
    assert arg(plan, "--host") == "127.0.0.1" and arg(plan, "--port") == "8080"


def test_gpu_memory_limits_the_context():
    plan = plan_for(hw="cuda-8g", env={"BONSAI_SPECULATIVE": "0"})
    # 7 GiB free - 7 GiB weights - margin: the KV cache gets almost nothing.
    assert int(arg(plan, "-c")) <= 16384
    assert any("GPU" in r.why for r in plan.reasons if r.flag == "-c")


def test_explicit_context_wins_even_with_speculation():
    plan = plan_for(env={"BONSAI_SPECULATIVE": "1", "BONSAI_CTX": "4096"})
    assert arg(plan, "-c") == "4096"


def test_flag_beats_env():
    plan = plan_for(env={"BONSAI_CTX": "4096"}, flags={"ctx": 8192})
    assert arg(plan, "-c") == "8192"


def test_ngl_zero_means_drafter_on_cpu_too():
    plan = plan_for(hw="cuda-24g", env={"BONSAI_SPECULATIVE": "1", "BONSAI_NGL": "0"})
    assert arg(plan, "-ngl") == "0" and arg(plan, "-ngld") == "0"


def test_kv4_with_drafter_sets_drafter_cache_types():
    plan = plan_for(env={"BONSAI_SPECULATIVE": "1", "BONSAI_KV4": "yes"}, caps=CAPS["cpu-8g"])
    assert arg(plan, "--cache-type-k") == "q4_0" and arg(plan, "--cache-type-v") == "q4_0"
    assert arg(plan, "--spec-draft-type-k") == "q4_0" and arg(plan, "--spec-draft-type-v") == "q4_0"


def test_kv4_on_a_binary_without_it_is_refused():
    caps = Capabilities("old-server", backend="cpu", spec_types=ALL_SPEC, flags=frozenset())
    with pytest.raises(BonsaiError, match="--cache-type-k"):
        plan_for(env={"BONSAI_KV4": "1"}, caps=caps)


def test_sleep_idle_seconds_passes_the_flag_and_zero_or_unset_never_sleeps():
    plan = plan_for(env={"BONSAI_SLEEP_IDLE_SECONDS": "300"})
    assert arg(plan, "--sleep-idle-seconds") == "300"
    assert any(r.flag == "--sleep-idle-seconds" and "BONSAI_SLEEP_IDLE_SECONDS" in r.why for r in plan.reasons)
    assert "--sleep-idle-seconds" not in plan_for(env={"BONSAI_SLEEP_IDLE_SECONDS": "0"}).argv
    assert "--sleep-idle-seconds" not in plan_for().argv
    with pytest.raises(BonsaiError, match="BONSAI_SLEEP_IDLE_SECONDS"):
        plan_for(env={"BONSAI_SLEEP_IDLE_SECONDS": "soon"})
    with pytest.raises(BonsaiError, match="--sleep-idle-seconds"):
        plan_for(env={"BONSAI_SLEEP_IDLE_SECONDS": "5"}, caps=Capabilities("old", backend="cpu", flags=frozenset()))
    with pytest.raises(BonsaiError, match="BONSAI_SLEEP_IDLE_SECONDS"):
        plan_for(env={"BONSAI_SLEEP_IDLE_SECONDS": "5"}, passthrough=["--sleep-idle-seconds", "9"])


def test_binary_without_dspark_is_refused():
    caps = Capabilities("old-server", backend="cpu", spec_types=frozenset({"none", "draft-simple"}))
    with pytest.raises(BonsaiError, match="draft-dspark"):
        plan_for(env={"BONSAI_SPECULATIVE": "1"}, caps=caps)


def test_nmax_mismatch_names_both_numbers():
    with pytest.raises(BonsaiError, match=r"BONSAI_SPEC_NMAX=6 .*block size 4"):
        plan_for(env={"BONSAI_SPECULATIVE": "1", "BONSAI_SPEC_NMAX": "6"})


def test_nmax_equal_to_block_size_is_fine():
    plan = plan_for(env={"BONSAI_SPECULATIVE": "1", "BONSAI_SPEC_NMAX": "4"})
    assert arg(plan, "--spec-draft-n-max") == "4"


def test_drafter_without_block_size_is_refused():
    with pytest.raises(BonsaiError, match="no block size"):
        plan_for(env={"BONSAI_SPECULATIVE": "1"}, draft=drafter(block_size=None))


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(embedding=4096), "embedding size 4096"),
        (dict(vocab=151936), "151936 tokens"),
        (dict(fingerprint="zzz"), "different token lists"),
        (dict(layers=(1, 70)), "target layers"),
        (dict(mask=999999), "mask token id"),
        (dict(kind="legacy-dspark"), "legacy"),
    ],
)
def test_mismatched_drafter_is_refused(bad, match):
    with pytest.raises(BonsaiError, match=match):
        plan_for(env={"BONSAI_SPECULATIVE": "1"}, draft=drafter(**bad))


def test_target_without_layer_inputs_is_refused():
    with pytest.raises(BonsaiError, match="qwen2"):
        plan_for(env={"BONSAI_SPECULATIVE": "1"}, model=target(arch="qwen2"))


def test_speculation_without_drafter_or_draft_free_mode_is_refused():
    with pytest.raises(BonsaiError, match="no usable drafter"):
        plan_for("bonsai-8b", env={"BONSAI_SPECULATIVE": "1"}, with_drafter=False)


def test_explicit_ngram_type_works_without_drafter():
    plan = plan_for("bonsai-8b", env={"BONSAI_SPECULATIVE": "1", "BONSAI_SPEC_TYPE": "ngram-map-k"}, with_drafter=False)
    assert arg(plan, "--spec-type") == "ngram-map-k" and "-md" not in plan.argv


def test_spec_settings_without_speculation_warn():
    plan = plan_for(env={"BONSAI_SPEC_NMAX": "4"})
    assert any("BONSAI_SPEC_NMAX" in w for w in plan.warnings)
    assert "--spec-draft-n-max" not in plan.argv


def test_small_ubatch_in_passthrough_is_refused():
    with pytest.raises(BonsaiError, match="-ub 4 is smaller"):
        plan_for(env={"BONSAI_SPECULATIVE": "1"}, passthrough=("-ub", "4"))


def test_passthrough_is_appended_unchanged():
    plan = plan_for(passthrough=("--threads", "2", "--override-kv", "a=int:1"))
    assert plan.argv[-4:] == ("--threads", "2", "--override-kv", "a=int:1")


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::"])
def test_remote_host_needs_opt_in(host):
    with pytest.raises(BonsaiError, match="BONSAI_ALLOW_REMOTE"):
        plan_for(env={"BONSAI_HOST": host})


def test_remote_host_with_opt_in_needs_a_key_and_hides_it():
    with pytest.raises(BonsaiError, match="API key"):
        plan_for(env={"BONSAI_HOST": "0.0.0.0", "BONSAI_ALLOW_REMOTE": "1"})
    plan = plan_for(env={"BONSAI_HOST": "0.0.0.0", "BONSAI_ALLOW_REMOTE": "1", "BONSAI_API_KEY": "s3cret"})
    assert "s3cret" not in " ".join(plan.argv)
    assert plan.env["LLAMA_API_KEY"] == "s3cret"
    assert plan.to_json()["env"]["LLAMA_API_KEY"] == "***"


def test_vision_projector_and_cap_on_cpu():
    plan = plan_for(mmproj=Path("/m/mmproj.gguf"))
    assert arg(plan, "--mmproj") == "/m/mmproj.gguf"
    assert arg(plan, "--image-max-tokens") == "1024"
    cuda = plan_for(hw="cuda-24g", mmproj=Path("/m/mmproj.gguf"), caps=CAPS["cuda-24g"])
    assert "--image-max-tokens" not in cuda.argv
    cpu_only = plan_for(mmproj=Path("/m/mmproj.gguf"), env={"BONSAI_MMPROJ_CPU": "on"})
    assert "--no-mmproj-offload" in cpu_only.argv


def test_render_posix_and_powershell():
    argv = ("/bin/llama-server", "--chat-template-kwargs", '{"enable_thinking": false}', "it's")
    assert (
        render_command(argv) == "/bin/llama-server --chat-template-kwargs '{\"enable_thinking\": false}' 'it'\"'\"'s'"
    )
    assert (
        render_command(argv, "powershell")
        == "& '/bin/llama-server' --chat-template-kwargs '{\"enable_thinking\": false}' 'it''s'"
    )
