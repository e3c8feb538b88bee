"""Slots in the launch plan: -np, -ub/-b, the context per slot, the build check, prompt-cache
flags. Pure: the same inputs as tests/test_plan.py, no files or processes."""

from __future__ import annotations

import dataclasses

import pytest

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.capabilities import parse_shared_drafting
from bonsai_launch.server.slots import (
    LLAMA_BATCH_DEFAULT,
    LLAMA_UBATCH_DEFAULT,
    context_for_slots,
    draft_length,
    size_batches,
)
from test_plan import CAPS, HW, arg, drafter, plan_for, target

DEMO = dict(
    profile="demo",
    with_drafter=False,
    model=target(arch="gemma3", layers=18, embedding=640, vocab=262144, ctx_len=32768),
)
SPEC = {"BONSAI_SPECULATIVE": "1"}


def reason(plan, flag):
    return " | ".join(r.why for r in plan.reasons if r.flag == flag)


# -- the plan table: N in 1, 2, 4, 8 and each n-max --------------------------------------------------


@pytest.mark.parametrize("slots", [1, 2, 4, 8])
@pytest.mark.parametrize("block", [2, 4, 7, 16])
def test_drafter_plan_table(slots, block):
    plan = plan_for(env={**SPEC, "BONSAI_PARALLEL": str(slots)}, draft=drafter(block_size=block), caps=CAPS["cpu-8g"])
    need = slots * (block + 1)
    assert arg(plan, "-np") == str(slots)
    assert arg(plan, "--spec-draft-n-max") == str(block)
    assert plan.slots.batch_need == need and plan.slots.draft_length == block
    if slots == 1:
        # One slot: llama-server's defaults hold the draft, so nothing is added.
        assert arg(plan, "-ub") is None and arg(plan, "-b") is None
    else:
        assert int(arg(plan, "-ub")) == max(LLAMA_UBATCH_DEFAULT, need)
        assert int(arg(plan, "-b")) == max(LLAMA_BATCH_DEFAULT, need)
        assert f"{slots} slots x ({block} draft + 1) = {need}" in reason(plan, "-ub")
    # Each slot keeps at least the speculative minimum: -c is split evenly without -kvu.
    assert int(arg(plan, "-c")) // slots >= 16384
    assert plan.slots.per_slot_ctx >= 16384
    assert "-kvu" not in plan.argv


# b11434 accepts each n-gram type's length flag (the per-slot draft length needs it)
LENGTH_CAPS = dataclasses.replace(
    CAPS["cpu-8g"],
    flags=CAPS["cpu-8g"].flags
    | {"--spec-ngram-mod-n-max", "--spec-ngram-mod-n-min", "--spec-ngram-simple-size-m", "--spec-ngram-map-k-size-m"},
)


@pytest.mark.parametrize("slots", [1, 2, 4, 8])
@pytest.mark.parametrize(
    "spec_type,draft", [("ngram-mod", 64), ("ngram-simple", 48), ("ngram-map-k", 48), ("ngram-cache", 8)]
)
def test_ngram_plan_table(slots, spec_type, draft):
    plan = plan_for(
        **DEMO,
        hw="cpu-8g",
        env={**SPEC, "BONSAI_PARALLEL": str(slots), "BONSAI_SPEC_TYPE": spec_type},
        caps=LENGTH_CAPS if spec_type in CAPS["cpu-8g"].spec_types else None,
    )
    # Several slots share one slot's draft budget (server/plan/speculation.py per_slot_draft):
    # n-max 64 on each of 4 slots made verify batches of up to 260 mostly rejected tokens.
    if slots > 1 and spec_type != "ngram-cache":
        draft = max(8, draft // slots)
        assert f"{slots} slots share one step's draft budget" in reason(
            plan, "--spec-" + spec_type + "-n-max" if spec_type == "ngram-mod" else "--spec-" + spec_type + "-size-m"
        )
    need = slots * (draft + 1)
    assert plan.slots.batch_need == need and plan.slots.draft_length == draft
    # n-gram drafts are verified causally: -ub is never resized; -b must hold every slot's draft.
    assert arg(plan, "-ub") is None
    assert "causally" in reason(plan, "-ub")
    if slots > 1:
        assert int(arg(plan, "-b")) == max(LLAMA_BATCH_DEFAULT, need)
    assert int(arg(plan, "-c")) == max(16384, slots * 16384)


def test_many_slots_of_a_block_16_drafter_raise_ubatch_beyond_the_default():
    plan = plan_for(env={**SPEC, "BONSAI_PARALLEL": "64"}, draft=drafter(block_size=16))
    assert arg(plan, "-ub") == str(64 * 17) and arg(plan, "-b") == "2048"
    assert "llama-server's default is 512" in reason(plan, "-ub")


def test_a_binary_without_the_length_flag_keeps_the_one_slot_default_on_every_slot():
    plan = plan_for(**DEMO, env={**SPEC, "BONSAI_PARALLEL": "4", "BONSAI_SPEC_TYPE": "ngram-mod"}, caps=CAPS["cpu-8g"])
    assert plan.slots.draft_length == 64 and "--spec-ngram-mod-n-max" not in plan.argv


def test_bonsai_spec_nmax_beats_the_per_slot_length():
    plan = plan_for(**DEMO, env={**SPEC, "BONSAI_PARALLEL": "4", "BONSAI_SPEC_NMAX": "32"}, caps=LENGTH_CAPS)
    assert plan.slots.draft_length == 32 and "BONSAI_SPEC_NMAX" in reason(plan, "--spec-ngram-mod-n-max")


def test_ngram_draft_length_follows_the_value_after_double_dash():
    plan = plan_for(**DEMO, env={**SPEC, "BONSAI_PARALLEL": "40"}, passthrough=("--spec-ngram-mod-n-max", "16"))
    assert plan.slots.draft_length == 16 and plan.slots.batch_need == 40 * 17
    assert arg(plan, "-b") == str(LLAMA_BATCH_DEFAULT)
    plan = plan_for(**DEMO, env={**SPEC, "BONSAI_PARALLEL": "40"})  # without it: the per-slot share, 8
    assert plan.slots.draft_length == 8 and plan.slots.batch_need == 40 * 9


# -- refusals ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["-ub", "--ubatch-size", "-b", "--batch-size"])
def test_explicit_batch_smaller_than_slots_times_draft_is_refused(flag):
    with pytest.raises(BonsaiError) as err:
        plan_for(env={**SPEC, "BONSAI_PARALLEL": "4"}, draft=drafter(block_size=4), passthrough=(flag, "16"))
    label = "-ub" if "u" in flag else "-b"
    assert f"{label} 16 is smaller than speculation needs: 4 slots x (4 draft + 1) = 20" in err.value.message
    assert "at least 20" in err.value.fix and "BONSAI_PARALLEL" in err.value.fix


def test_explicit_batch_large_enough_is_kept_and_not_repeated():
    plan = plan_for(env={**SPEC, "BONSAI_PARALLEL": "4"}, passthrough=("-ub", "20", "-b", "64"))
    assert plan.argv.count("-ub") == 1 and plan.argv.count("-b") == 1  # only the user's own
    assert plan.slots.ubatch == 20 and plan.slots.batch == 64


def test_one_slot_keeps_the_old_rule():
    with pytest.raises(BonsaiError, match=r"-ub 4 is smaller .* 1 slot x \(4 draft \+ 1\) = 5"):
        plan_for(env=SPEC, passthrough=("-ub", "4"))


def test_slots_after_double_dash_count_too():
    with pytest.raises(BonsaiError, match=r"4 slots x \(4 draft \+ 1\) = 20"):
        plan_for(env=SPEC, passthrough=("-np", "4", "-ub", "16"))
    plan = plan_for(env=SPEC, passthrough=("-np", "4"))
    assert plan.argv.count("-np") == 1 and plan.slots.count == 4 and arg(plan, "-ub") == "512"


def test_ngram_types_accept_a_small_ubatch():
    plan = plan_for(**DEMO, env={**SPEC, "BONSAI_PARALLEL": "4"}, passthrough=("-ub", "32"))
    assert plan.slots.ubatch == 32


def test_build_without_shared_drafting_is_refused_for_several_slots():
    old = dataclasses.replace(CAPS["cpu-8g"], binary="/opt/prism/llama-server", shared_drafting=False)
    with pytest.raises(BonsaiError) as err:
        plan_for(env={**SPEC, "BONSAI_PARALLEL": "2"}, caps=old)
    assert "cannot speculate (draft-dspark) on 2 slots" in err.value.message
    assert "/opt/prism/llama-server" in err.value.message and "#22838" in err.value.message
    assert "BONSAI_PARALLEL=1" in err.value.fix and "bonsai build" in err.value.fix
    # One slot, or several without speculation, still work on that build.
    assert arg(plan_for(env=SPEC, caps=old), "-np") == "1"
    assert arg(plan_for(env={"BONSAI_PARALLEL": "4"}, caps=old), "-np") == "4"


def test_probed_build_with_shared_drafting_is_named_in_the_reason():
    caps = dataclasses.replace(CAPS["cpu-8g"], shared_drafting=True)
    plan = plan_for(env={**SPEC, "BONSAI_PARALLEL": "4"}, caps=caps)
    assert "drafts for every slot in one context" in reason(plan, "-np")
    plan = plan_for(env={**SPEC, "BONSAI_PARALLEL": "4"})
    assert "not probed" in reason(plan, "-np")


# -- defaults and reasons --------------------------------------------------------------------------------


def test_default_slots_with_and_without_speculation():
    spec = plan_for(env=SPEC)
    assert arg(spec, "-np") == "1" and "speculation: one slot" in reason(spec, "-np")
    plain = plan_for(env={})
    assert "-np" not in plain.argv
    assert "llama-server's default: auto = 4 slots" in reason(plain, "-np")
    assert plain.slots.count is None and plain.to_json()["slots"]["effective"] == 4


def test_flag_beats_env_for_parallel():
    plan = plan_for(env={"BONSAI_PARALLEL": "2"}, flags={"parallel": 3})
    assert arg(plan, "-np") == "3" and "--parallel" in reason(plan, "-np")


def test_parallel_without_speculation_keeps_a_per_slot_minimum():
    plan = plan_for(hw="cpu-8g", env={"BONSAI_PARALLEL": "8"})
    assert arg(plan, "-np") == "8" and arg(plan, "-ub") is None and arg(plan, "-b") is None
    assert int(arg(plan, "-c")) == 8 * 2048  # the 8 GB tier (8192) would leave 1024 per slot
    plan = plan_for(hw="cpu-128g", env={"BONSAI_PARALLEL": "2"})
    assert arg(plan, "-c") == "131072" and plan.slots.per_slot_ctx == 65536


def test_kv_unified_shares_one_pool():
    plan = plan_for(env={**SPEC, "BONSAI_PARALLEL": "4", "BONSAI_KV_UNIFIED": "1"}, hw="cpu-8g")
    assert "-kvu" in plan.argv and arg(plan, "-c") == "16384"
    assert "share one pool of 16384 tokens" in reason(plan, "-c")
    assert plan.slots.kv_unified and plan.slots.per_slot_ctx == 16384


def test_kv_unified_without_several_slots_warns():
    plan = plan_for(env={**SPEC, "BONSAI_KV_UNIFIED": "1"})
    assert "-kvu" not in plan.argv and any("no effect with one slot" in w for w in plan.warnings)
    plan = plan_for(env={"BONSAI_KV_UNIFIED": "1"})
    assert any("already share one KV pool" in w for w in plan.warnings)


def test_explicit_context_is_kept_with_a_warning_per_slot():
    plan = plan_for(env={**SPEC, "BONSAI_PARALLEL": "4", "BONSAI_CTX": "8192"})
    assert arg(plan, "-c") == "8192" and plan.slots.per_slot_ctx == 2048
    (warning,) = [w for w in plan.warnings if "per slot" in w]
    assert "raise the context to 65536" in warning and "BONSAI_KV_UNIFIED=1" in warning


def test_gpu_too_small_for_every_slot_warns():
    plan = plan_for(hw="cuda-8g", env={**SPEC, "BONSAI_PARALLEL": "8"})
    assert any("8 slots need a" in w and "fewer slots" in w for w in plan.warnings)


def test_dry_run_json_carries_slots_and_prompt_cache():
    data = plan_for(env={**SPEC, "BONSAI_PARALLEL": "4"}).to_json()
    assert data["slots"] == {
        "parallel": 4,
        "effective": 4,
        "kv_unified": False,
        "per_slot_ctx": 16384,
        "draft_length": 4,
        "batch_need": 20,
        "ubatch": 512,
        "batch": 2048,
    }
    assert data["prompt_cache"]["cache_ram_mib"] == 8192 and data["prompt_cache"]["ctx_checkpoints"] == 32
    assert {r["flag"] for r in data["reasons"]} >= {"-np", "-ub", "-b", "-c"}


# -- prompt cache --------------------------------------------------------------------------------------


def test_prompt_cache_settings_become_flags_with_reasons():
    plan = plan_for(env={"BONSAI_CACHE_RAM": "4096", "BONSAI_CTX_CHECKPOINTS": "32", "BONSAI_CACHE_IDLE_SLOTS": "1"})
    assert arg(plan, "--cache-ram") == "4096" and arg(plan, "--ctx-checkpoints") == "32"
    assert "--cache-idle-slots" in plan.argv
    assert "4096 MiB" in reason(plan, "--cache-ram")
    assert plan.prompt_cache["from_llama_server_defaults"] == []


def test_prompt_cache_defaults_pass_nothing():
    plan = plan_for(env={})
    assert not {"--cache-ram", "--ctx-checkpoints", "--cache-idle-slots"} & set(plan.argv)
    assert set(plan.prompt_cache["from_llama_server_defaults"]) == {
        "cache_ram_mib",
        "ctx_checkpoints",
        "cache_idle_slots",
    }


def test_turning_every_prefix_reuse_off_warns():
    plan = plan_for(env={"BONSAI_CACHE_RAM": "0", "BONSAI_CTX_CHECKPOINTS": "0", "BONSAI_CACHE_IDLE_SLOTS": "0"})
    assert "--no-cache-idle-slots" in plan.argv
    assert any("re-reads the whole conversation" in w for w in plan.warnings)


def test_prompt_cache_flag_missing_from_the_build_is_refused():
    with pytest.raises(BonsaiError, match="BONSAI_CACHE_RAM needs --cache-ram"):
        plan_for(env={"BONSAI_CACHE_RAM": "4096"}, caps=CAPS["cpu-8g"])


def test_bad_parallel_value_names_the_setting():
    with pytest.raises(BonsaiError, match="BONSAI_PARALLEL='0' is too small"):
        plan_for(env={"BONSAI_PARALLEL": "0"})


# -- the pure rules ----------------------------------------------------------------------------------------


def test_draft_length_per_type():
    assert draft_length("draft-dspark", 4) == (4, "n-max")
    assert draft_length("draft-simple", None)[0] == 3
    assert draft_length("ngram-mod", None)[0] == 64
    assert draft_length("ngram-mod", 3, {"--spec-ngram-mod-n-max": 12}) == (12, "--spec-ngram-mod-n-max")
    assert draft_length("ngram-map-k4v", None)[0] == 48


def test_size_batches_keeps_ubatch_within_batch():
    sizing = size_batches(8, "draft-dspark", 300)
    assert sizing.ubatch == sizing.batch == 8 * 301


def test_context_for_slots_kv_unified_explicit_below_minimum_warns():
    fitted = context_for_slots(4, True, 16384, 8192, True, "the minimum")
    assert fitted.ctx == 8192 and fitted.warning and "below the minimum" in fitted.warning


def test_shared_drafting_is_read_from_the_help_text():
    from pathlib import Path

    text = (Path(__file__).parent / "data" / "llama-server-b11434-help.txt").read_text()
    assert parse_shared_drafting(text) is True
    older = text.replace("comma-separated list of types of speculative decoding", "type of speculative decoding")
    assert parse_shared_drafting(older) is False
    assert parse_shared_drafting("-m, --model FNAME   model path\n") is False


def test_hardware_table_is_shared():
    assert "cpu-8g" in HW


def test_parallel_and_np_after_double_dash_must_agree():
    # -np after -- counts as --parallel (above BONSAI_PARALLEL, like any flag); a flag that says otherwise is refused.
    with pytest.raises(BonsaiError, match="--parallel 2 and -- -np 4 disagree"):
        plan_for(env=SPEC, flags={"parallel": 2}, passthrough=("-np", "4"))
    assert plan_for(env={**SPEC, "BONSAI_PARALLEL": "2"}, passthrough=("-np", "4")).slots.count == 4
    plan = plan_for(env={**SPEC, "BONSAI_PARALLEL": "4"}, passthrough=("-np", "4"))
    assert plan.slots.count == 4 and plan.argv.count("-np") == 1


def test_slots_proof_needs_more_than_one_drafting_slot():
    from bonsai_launch.server.liveness import SlotResult, SlotsProof

    every = SlotsProof("draft-dspark", 4, tuple(SlotResult(i, 10, 5) for i in range(4)))
    assert every.live and every.summary().startswith(
        "speculative decoding: live on 4 slots (draft-dspark; 4 concurrent"
    )
    assert every.rate == 0.5
    some = SlotsProof("ngram-mod", 8, (SlotResult(0, 3, 3), SlotResult(1, 2, 2), SlotResult(2, 0, 0)))
    assert some.live and "live on 2 of 8 slots" in some.summary()
    one = SlotsProof("draft-dspark", 2, (SlotResult(0, 7, 1), SlotResult(1, 0, 0, "HTTP 500: boom")))
    assert not one.live
    assert "NOT live on several slots" in one.summary() and "slot 1: HTTP 500: boom" in one.summary()
    assert one.to_json()["drafting_slots"] == [0]
