"""Several speculative types at once (BONSAI_SPEC_TYPE=ngram-mod,draft-mtp), in the plan and in
tune's candidates. Pure: no server (tests/test_bonsai2_speculation.py runs them).

What Bonsai 2 users without a drafter run is a grafted MTP head with n-gram lookup in front of
it; llama-server (b11434) takes the list and tries the n-gram types first every step
(bonsai_launch/llamacpp/spec_types.py). The setting takes any such list, written in that order;
the plan gives the draft model its n-max and the n-gram types their own lengths, sizes the
batches for the longest, and refuses a list the server cannot run in one line.
"""

from __future__ import annotations

import re

import pytest

from bonsai_launch.config.settings import BY_KEY, parse_value
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.capabilities import Capabilities
from bonsai_launch.llamacpp.options import pinned_table
from bonsai_launch.tune import candidates as cands
from test_mtp_plan import mtp_target
from test_plan import arg, drafter, plan_for, target

MTP_TYPES = frozenset({"none", "ngram-mod", "ngram-simple", "draft-mtp", "draft-dspark"})
FLAGS = frozenset(name for option in pinned_table().options for name in option.names)  # the pinned build's
SHARED = Capabilities("llama-server", backend="cpu", spec_types=MTP_TYPES, flags=FLAGS, shared_drafting=True)


@pytest.mark.parametrize(
    "raw, value",
    [
        ("ngram-mod,draft-mtp", "ngram-mod,draft-mtp"),
        ("draft-mtp, NGRAM-MOD", "ngram-mod,draft-mtp"),  # llama-server's order, whatever the user's
        ("ngram-mod,ngram-simple,ngram-mod", "ngram-simple,ngram-mod"),
        ("draft-mtp", "draft-mtp"),
    ],
)
def test_the_setting_takes_a_list_in_llama_servers_order(raw, value):
    assert parse_value(BY_KEY["spec_type"], raw, "BONSAI_SPEC_TYPE") == value


@pytest.mark.parametrize(
    "raw, problem", [("ngram-mod,turbo", "names 'turbo', not a known value"), ("none,ngram-mod", "combines none")]
)
def test_a_list_with_an_unknown_type_or_none_is_refused_naming_it(raw, problem):
    with pytest.raises(BonsaiError, match=problem) as err:
        parse_value(BY_KEY["spec_type"], raw, "BONSAI_SPEC_TYPE")
    assert str(err.value).startswith(f"BONSAI_SPEC_TYPE={raw!r}") and "several joined by commas" in str(err.value)


def combined(spec_type: str, **kw):
    env = {"BONSAI_SPECULATIVE": "1", "BONSAI_SPEC_TYPE": spec_type, **kw.pop("env", {})}
    return plan_for(env=env, caps=kw.pop("caps", SHARED), **kw)


def test_ngram_mod_with_the_models_own_mtp_layer():
    plan = combined("ngram-mod,draft-mtp", with_drafter=False, model=mtp_target())
    assert arg(plan, "--spec-type") == "ngram-mod,draft-mtp" and "-md" not in plan.argv
    assert arg(plan, "--spec-draft-n-max") == "1"  # the MTP head's n-max; ngram-mod keeps its own 64
    assert "--spec-ngram-mod-n-max" not in plan.argv
    assert plan.speculative.spec_type == "ngram-mod,draft-mtp" and plan.speculative.n_max == 1
    why = next(r.why for r in plan.reasons if r.flag == "--spec-type")
    assert "n-gram lookup drafts repeated text first" in why and "multi-token-prediction layer" in why


def test_bonsai_spec_nmax_is_the_draft_models_n_max_in_a_list():
    plan = combined("ngram-mod,draft-mtp", env={"BONSAI_SPEC_NMAX": "2"}, with_drafter=False, model=mtp_target())
    assert arg(plan, "--spec-draft-n-max") == "2" and "--spec-ngram-mod-n-max" not in plan.argv


def test_two_slots_share_the_ngram_budget_and_the_batch_holds_the_longest_draft():
    plan = combined("ngram-mod,draft-mtp", env={"BONSAI_PARALLEL": "2"}, with_drafter=False, model=mtp_target())
    assert arg(plan, "-np") == "2" and arg(plan, "--spec-ngram-mod-n-max") == "32"
    assert plan.slots.draft_length == 32 and plan.slots.batch_need == 2 * (32 + 1)  # ngram-mod's 32, not the MTP's 1


def test_ngram_mod_with_a_dspark_drafter_sizes_the_ubatch_for_the_longest():
    plan = combined("ngram-mod,draft-dspark", env={"BONSAI_PARALLEL": "4"})
    assert arg(plan, "--spec-type") == "ngram-mod,draft-dspark" and arg(plan, "-md") == "/m/drafter.gguf"
    assert arg(plan, "--spec-draft-n-max") == "4" and arg(plan, "--spec-ngram-mod-n-max") == "16"
    assert plan.slots.batch_need == 4 * (16 + 1) and int(arg(plan, "-ub")) >= plan.slots.batch_need


def test_a_list_of_ngram_types_caps_each_at_bonsai_spec_nmax():
    plan = combined("ngram-simple,ngram-mod", env={"BONSAI_SPEC_NMAX": "16"}, with_drafter=False)
    assert arg(plan, "--spec-type") == "ngram-simple,ngram-mod"
    assert arg(plan, "--spec-ngram-simple-size-m") == "16" and arg(plan, "--spec-ngram-mod-n-max") == "16"
    assert "-md" not in plan.argv and plan.speculative.n_max == 16


@pytest.mark.parametrize(
    "spec_type, kw, problem",
    [
        ("draft-mtp,draft-dspark", {}, "combines 2 draft models (draft-mtp, draft-dspark), and llama-server has one"),
        ("ngram-mod,draft-mtp", {"with_drafter": False, "model": target()}, "has no MTP layers"),
        ("ngram-mod,draft-dspark", {"with_drafter": False}, "needs a draft-dspark model"),
        ("ngram-mod,draft-dspark", {"draft": drafter(kind="dflash")}, "which needs draft-dflash"),
        (
            "ngram-mod,draft-mtp",
            {
                "caps": Capabilities("llama-server", spec_types=MTP_TYPES, flags=FLAGS, shared_drafting=False),
                "model": mtp_target(),
            },
            "lists several types, but the --spec-type of llama-server takes one",
        ),
    ],
)
def test_a_list_the_server_cannot_run_is_refused_in_one_line(spec_type, kw, problem):
    with pytest.raises(BonsaiError, match=re.escape(problem)) as err:
        combined(spec_type, **kw)
    assert "\n" not in str(err.value) and err.value.fix


def test_tune_measures_ngram_mod_with_the_mtp_layer_and_with_the_drafter():
    found = cands.all_candidates(None, "draft-dspark", 4, None, mtp="model")
    by_name = {c.name: c for c in found}
    for n in (1, 2):
        mtp = by_name[f"ngram-mod+draft-mtp/n{n}"]
        assert mtp.flags() == {"speculative": True, "spec_type": "ngram-mod,draft-mtp", "spec_nmax": n}
        assert not mtp.with_drafter and mtp.label == f"ngram-mod,draft-mtp n-max {n}"
    dspark = by_name["ngram-mod+draft-dspark"]
    assert dspark.flags()["spec_nmax"] is None and dspark.with_drafter  # n-max is the block size
    # not offered where the build cannot run a list, nor without an MTP layer or a drafter
    assert not any("+" in c.name for c in cands.all_candidates(None, shared_drafting=False, mtp="model"))
    assert not any("+draft" in c.name for c in cands.all_candidates(None))
    assert [c.name for c in cands.restrict(found, ["ngram-mod+draft-mtp/n1"])] == ["plain", "ngram-mod+draft-mtp/n1"]
