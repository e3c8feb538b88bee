"""MTP as a speculation mode bonsai knows: the plan, the pair check, tune's candidates. Pure: no server.

A model carrying a usable multi-token-prediction layer ({arch}.nextn_predict_layers = 1, the
nextn.* tensors) gets draft-mtp at n-max 1 under BONSAI_SPECULATIVE=1 when it has no drafter; a
separate MTP-only file works as --drafter; a file without MTP layers, or with two, is refused
in one line before llama-server starts (it would exit, or abort)."""

from __future__ import annotations

import dataclasses

import pytest

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.capabilities import Capabilities
from bonsai_launch.models.mtp import mtp_problems
from bonsai_launch.tune import candidates as cands
from test_plan import arg, drafter, plan_for, target

MTP_TENSORS = ("blk.64.nextn.eh_proj.weight", "blk.64.nextn.enorm.weight", "blk.64.nextn.hnorm.weight")


def mtp_target(nextn=1, tensors=MTP_TENSORS, trunk=True, name="qwen35-target.gguf", **kw):
    t = target(layers=64 + nextn, **kw)
    return dataclasses.replace(
        t, path=t.path.with_name(name), nextn_layers=nextn, mtp_tensors=tuple(tensors), trunk_tensors=trunk
    )


def test_speculative_on_a_model_with_mtp_and_no_drafter_picks_draft_mtp_n_max_1():
    plan = plan_for(env={"BONSAI_SPECULATIVE": "1"}, with_drafter=False, model=mtp_target())
    assert arg(plan, "--spec-type") == "draft-mtp" and arg(plan, "--spec-draft-n-max") == "1"
    assert "-md" not in plan.argv and plan.speculative.spec_type == "draft-mtp" and plan.speculative.n_max == 1
    assert "-np" in plan.argv and arg(plan, "-np") == "1"


def test_mtp_n_max_follows_bonsai_spec_nmax():
    plan = plan_for(env={"BONSAI_SPECULATIVE": "1", "BONSAI_SPEC_NMAX": "3"}, with_drafter=False, model=mtp_target())
    assert arg(plan, "--spec-draft-n-max") == "3" and plan.speculative.n_max == 3


def test_a_fitting_dspark_drafter_still_wins_over_mtp_unless_draft_mtp_is_asked_for():
    plan = plan_for(env={"BONSAI_SPECULATIVE": "1"}, model=mtp_target())
    assert arg(plan, "--spec-type") == "draft-dspark"
    asked = plan_for(env={"BONSAI_SPECULATIVE": "1", "BONSAI_SPEC_TYPE": "draft-mtp"}, model=mtp_target())
    assert arg(asked, "--spec-type") == "draft-mtp" and "-md" not in asked.argv
    assert any("is not loaded: draft-mtp drafts with" in w for w in asked.warnings)


def test_separate_mtp_file_is_passed_as_the_drafter():
    mtp_file = mtp_target(trunk=False, name="model-MTP.gguf")
    plan = plan_for(env={"BONSAI_SPECULATIVE": "1"}, model=target(), draft=mtp_file)
    assert arg(plan, "-md") == "/m/model-MTP.gguf" and arg(plan, "--spec-type") == "draft-mtp"
    assert arg(plan, "--spec-draft-n-max") == "1" and arg(plan, "-ngld") == "0"


@pytest.mark.parametrize(
    "model,draft,match",
    [
        (target(), None, "has no MTP layers"),
        (mtp_target(nextn=2), None, "declares 2 MTP layers; llama-server's draft-mtp runs exactly one"),
        (mtp_target(tensors=MTP_TENSORS[:1]), None, "lacks blk.64.nextn.enorm.weight"),
    ],
)
def test_draft_mtp_on_a_file_it_cannot_run_is_refused_before_starting(model, draft, match):
    with pytest.raises(BonsaiError, match=match) as err:
        plan_for(
            env={"BONSAI_SPECULATIVE": "1", "BONSAI_SPEC_TYPE": "draft-mtp"},
            with_drafter=draft is not None,
            model=model,
            draft=draft,
        )
    assert "\n" not in str(err.value).split("\n")[0] and "BONSAI_SPEC_TYPE=draft-mtp" in str(err.value)


def test_mtp_file_for_another_model_is_refused():
    other = mtp_target(trunk=False, name="other-MTP.gguf", embedding=4096)
    with pytest.raises(BonsaiError, match=r"other-MTP\.gguf has embedding size 4096"):
        plan_for(env={"BONSAI_SPECULATIVE": "1"}, model=target(), draft=other)


def test_unusable_mtp_is_not_picked_by_default():
    # two MTP blocks: BONSAI_SPECULATIVE=1 falls back to the profile's drafter, never to draft-mtp
    plan = plan_for(env={"BONSAI_SPECULATIVE": "1"}, model=mtp_target(nextn=2))
    assert arg(plan, "--spec-type") == "draft-dspark"


def test_binary_without_draft_mtp_is_refused():
    caps = Capabilities("llama-server", backend="cpu", spec_types=frozenset({"draft-dspark", "ngram-mod"}))
    with pytest.raises(BonsaiError, match="speculative type draft-mtp is not supported"):
        plan_for(env={"BONSAI_SPECULATIVE": "1"}, with_drafter=False, model=mtp_target(), caps=caps)


def test_pair_check_counts_trunk_layers_only():
    # a drafter tapping block 64, the MTP block, passed the check and then aborted llama-server
    tap = drafter(layers=(1, 64))
    with pytest.raises(BonsaiError, match=r"reads target layers \[64\] but .* has 64 layers \(and 1 MTP layer"):
        plan_for(env={"BONSAI_SPECULATIVE": "1"}, model=mtp_target(), draft=tap)
    assert mtp_problems(mtp_target()) == []


def test_no_profile_no_drafter_no_mtp_gets_draft_free_ngram_mod():
    from bonsai_launch.config.settings import resolve
    from bonsai_launch.server.plan import PlanInputs, build_plan
    from test_plan import HW

    settings = resolve({}, {"BONSAI_SPECULATIVE": "1"}, {})
    plan = build_plan(PlanInputs(settings=settings, model=target(), hardware=HW["cpu-24g"], binary="/b/llama-server"))
    assert arg(plan, "--spec-type") == "ngram-mod"
    assert any("no drafter, no MTP layer, no profile" in r.why for r in plan.reasons)


def test_tune_candidates_include_draft_mtp_n_max_1_to_3_when_the_model_has_mtp():
    found = cands.all_candidates(None, "draft-dspark", 4, "ngram-mod", mtp="model")
    mtp = [c for c in found if c.spec_type == "draft-mtp"]
    assert [c.n_max for c in mtp] == [1, 2, 3] and not any(c.with_drafter for c in mtp)
    assert [c.flags()["spec_nmax"] for c in mtp] == [1, 2, 3]
    assert mtp[1].label == "draft-mtp n-max 2"
    assert not any(c.spec_type == "draft-mtp" for c in cands.all_candidates(None, None, None, "ngram-mod"))
    assert not any(c.spec_type == "draft-mtp" for c in cands.all_candidates({"ngram-mod"}, None, None, None, "model"))
    chosen = cands.restrict(found, ["draft-mtp"])
    assert [c.name for c in chosen] == ["plain", "draft-mtp/n1", "draft-mtp/n2", "draft-mtp/n3"]
    assert cands.all_candidates(None, None, None, None, mtp="file")[1].with_drafter
