"""BONSAI_DRAFT_HEAD_ROWS and `bonsai tune` trying draft-mtp with the whole LM head.

Patch 0015 has a qwen35 MTP layer draft from the LM head's first 65536 rows where the CPU
computes the head (tests/test_draft_head_rows.py). That pays on text whose tokens lie inside the
cut (English, code) and costs on text with many past it (Chinese, Japanese, Korean, Russian:
about 30%). So the setting carries LLAMA_DRAFT_HEAD_ROWS into the plan, tune measures each MTP
length with the whole head too when plain's answers have enough tokens past the cut, and
BONSAI_SPECULATIVE=auto runs the head the decision was measured with.
"""

from __future__ import annotations

import dataclasses

import pytest

from bonsai_launch.bench.data import ConfigSpec
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.decisions import store
from bonsai_launch.decisions.store import Choice
from bonsai_launch.llamacpp.replay import Stream
from bonsai_launch.models.draft_head import FLAG as DRAFT_HEAD_FLAG
from bonsai_launch.models.draft_head import drafter_head_is_cut, mtp_head_is_cut
from bonsai_launch.server.plan.weights import gpu_layers, head_on_cpu
from bonsai_launch.tune import candidates as cands
from bonsai_launch.tune import draft_head
from bonsai_launch.tune.decide import decide
from bonsai_launch.tune.rounds import _without_needless_whole_head
from test_mtp_plan import mtp_target
from test_plan import arg, drafter, plan_for, target

ON = {"BONSAI_SPECULATIVE": "1"}


def mtp_plan(env: dict[str, str], model=None):
    return plan_for(env={**ON, **env}, with_drafter=False, model=model or mtp_target())


# -- the setting in the plan --------------------------------------------------------------------


def rows(plan) -> str | None:
    """The plan's --spec-draft-head-rows (patch 0017), as llama-server gets it."""
    return arg(plan, DRAFT_HEAD_FLAG)


def test_the_setting_reaches_llama_server_as_its_option_with_its_reason():
    plan = mtp_plan({"BONSAI_DRAFT_HEAD_ROWS": "0"})
    assert rows(plan) == "0" and plan.speculative.head_rows == 0
    assert "LLAMA_DRAFT_HEAD_ROWS" not in plan.env  # one mechanism: the option, per server
    reason = next(r for r in plan.reasons if r.flag == DRAFT_HEAD_FLAG)
    assert "BONSAI_DRAFT_HEAD_ROWS=0 (env)" in reason.why and "whole LM head" in reason.why
    cut = mtp_plan({"BONSAI_DRAFT_HEAD_ROWS": "32768"})
    assert rows(cut) == "32768" and any("first 32768 rows" in r.why for r in cut.reasons)


def test_the_option_after_the_double_dash_is_the_setting():
    plan = plan_for(env=ON, with_drafter=False, model=mtp_target(), passthrough=[DRAFT_HEAD_FLAG, "0"])
    assert list(plan.argv).count(DRAFT_HEAD_FLAG) == 1 and rows(plan) == "0"
    with pytest.raises(BonsaiError) as err:
        plan_for(env=ON, with_drafter=False, model=mtp_target(), passthrough=[DRAFT_HEAD_FLAG, "65k"])
    assert "65k" in str(err.value)


def test_a_binary_without_the_option_refuses_the_setting_and_takes_no_default():
    from bonsai_launch.llamacpp.capabilities import Capabilities

    old = Capabilities("/opt/llama-server", spec_types=frozenset({"draft-mtp", "draft-dspark"}))
    with pytest.raises(BonsaiError) as err:
        plan_for(env={**ON, "BONSAI_DRAFT_HEAD_ROWS": "0"}, with_drafter=False, model=mtp_target(), caps=old)
    assert "BONSAI_DRAFT_HEAD_ROWS needs --spec-draft-head-rows" in str(err.value)
    spm = dataclasses.replace(target(), tokenizer_model="llama")
    plan = plan_for(env=ON, model=spm, draft=borrowing(), caps=old)
    assert rows(plan) is None and plan.speculative.head_rows is None


def test_unset_the_plan_leaves_llamas_default():
    plan = mtp_plan({})
    assert rows(plan) is None and plan.speculative.head_rows is None
    assert not any(r.flag == DRAFT_HEAD_FLAG for r in plan.reasons)


@pytest.mark.parametrize("value", ["65k", "-256", "all", "1.5"])
def test_a_value_that_is_not_a_row_count_is_refused_in_one_line(value):
    with pytest.raises(BonsaiError) as err:
        mtp_plan({"BONSAI_DRAFT_HEAD_ROWS": value})
    assert "BONSAI_DRAFT_HEAD_ROWS" in str(err.value) and value in str(err.value)


def test_without_draft_mtp_or_on_another_architecture_it_warns_that_it_does_nothing():
    dspark = plan_for(env={**ON, "BONSAI_DRAFT_HEAD_ROWS": "0"})  # the profile's DSpark drafter
    assert arg(dspark, "--spec-type") == "draft-dspark" and rows(dspark) is None
    assert any("the drafter has a head of its own" in w for w in dspark.warnings)
    plain = plan_for(env={"BONSAI_DRAFT_HEAD_ROWS": "0"}, with_drafter=False)
    assert rows(plain) is None and any("has no effect" in w for w in plain.warnings)
    glm = mtp_plan({"BONSAI_DRAFT_HEAD_ROWS": "0"}, model=mtp_target(arch="glm4moe", name="glm.gguf"))
    assert arg(glm, "--spec-type") == "draft-mtp" and rows(glm) is None
    assert any("has no effect on glm4moe" in w for w in glm.warnings)


def borrowing(info=None):
    """A DSpark drafter with no head of its own (it reads the target's, as the published ones do)."""
    info = info or drafter()
    return dataclasses.replace(info, drafter=dataclasses.replace(info.drafter, borrows_head=True))


def test_a_dspark_drafter_borrowing_the_head_takes_the_setting_one_with_its_own_head_does_not():
    plan = plan_for(env={**ON, "BONSAI_DRAFT_HEAD_ROWS": "0"}, draft=borrowing())
    assert arg(plan, "--spec-type") == "draft-dspark" and rows(plan) == "0"
    assert plan.speculative.head_rows == 0
    assert any(r.flag == DRAFT_HEAD_FLAG and "the drafter drafts from the whole LM head" in r.why for r in plan.reasons)
    own = plan_for(env={**ON, "BONSAI_DRAFT_HEAD_ROWS": "0"}, draft=drafter())
    assert rows(own) is None and own.speculative.head_rows is None


def test_a_vocabulary_not_ordered_by_frequency_keeps_the_whole_borrowed_head():
    """Gemma 3's SentencePiece vocabulary has 17% of English past id 65536 (measured): the plan
    gives its borrowing drafter the whole head unless the user says otherwise; BPE keeps the cut."""
    spm = dataclasses.replace(target(), tokenizer_model="llama")
    plan = plan_for(env=ON, model=spm, draft=borrowing())
    assert rows(plan) == "0" and plan.speculative.head_rows == 0
    assert any(r.flag == DRAFT_HEAD_FLAG and "not ordered by frequency" in r.why for r in plan.reasons)
    assert not drafter_head_is_cut(spm, borrowing(), head_on_cpu=True)
    bpe = plan_for(env=ON, draft=borrowing())
    assert rows(bpe) is None and bpe.speculative.head_rows is None
    asked = plan_for(env={**ON, "BONSAI_DRAFT_HEAD_ROWS": "32768"}, model=spm, draft=borrowing())
    assert rows(asked) == "32768"  # the user's setting wins over the detected default
    assert list(asked.argv).count(DRAFT_HEAD_FLAG) == 1


def test_each_model_of_a_router_keeps_its_own_rows_in_its_preset_section():
    """A router's children share its environment but each reads its own preset section: with
    the option (patch 0017) a tuned whole head and the default cut live side by side."""
    from bonsai_launch.server.plan.router import plan_router
    from test_plan import pinned_table

    whole = mtp_plan({"BONSAI_DRAFT_HEAD_ROWS": "0"})
    default = mtp_plan({})
    other = dataclasses.replace(default.served, name="other")
    router = plan_router(
        whole.server, [("a", whole.served), ("b", other)], {}, pinned_table(),
        preset_path="/tmp/p.ini", cache_dir="/tmp/c", name="r",
    )  # fmt: skip
    sections = router.preset.split("\n[")
    mine = next(x for x in sections if x.startswith(f"{whole.served.name}]"))
    theirs = next(x for x in sections if x.startswith("other]"))
    assert "spec-draft-head-rows = 0" in mine and "spec-draft-head-rows" not in theirs
    assert "LLAMA_DRAFT_HEAD_ROWS" not in router.env and not any("draft head" in w for w in router.warnings)


# -- when the cut applies -----------------------------------------------------------------------


def test_the_cut_applies_to_qwen35_vocabularies_past_65536_with_the_head_on_the_cpu():
    assert mtp_head_is_cut(target(), head_on_cpu=True)  # qwen35, 248320 tokens
    assert not mtp_head_is_cut(target(), head_on_cpu=False)
    assert not mtp_head_is_cut(target(vocab=65536), head_on_cpu=True)
    assert not mtp_head_is_cut(target(arch="qwen3"), head_on_cpu=True)


def test_a_borrowed_drafter_head_is_cut_on_any_target_past_65536_tokens_on_the_cpu():
    dense = target(arch="qwen3", vocab=151936)
    assert drafter_head_is_cut(dense, borrowing(), head_on_cpu=True)
    assert not drafter_head_is_cut(dense, borrowing(), head_on_cpu=False)
    assert not drafter_head_is_cut(dense, drafter(), head_on_cpu=True)  # its own head
    assert not drafter_head_is_cut(target(vocab=32000), borrowing(), head_on_cpu=True)
    assert not drafter_head_is_cut(dense, None, head_on_cpu=True)


@pytest.mark.parametrize(
    "backend,ngl,layers,expected",
    [("cpu", None, 24, True), ("cuda", None, 24, False), ("cuda", 0, 24, True), ("cuda", 24, 24, True),
     ("cuda", 25, 24, False), ("vulkan", 99, None, False)],
)  # fmt: skip
def test_the_head_is_on_the_cpu_unless_every_layer_and_the_output_are_offloaded(backend, ngl, layers, expected):
    """Unset, the GPU layers are the plan's own default (all on a GPU build): tune asks the
    plan's rule rather than keeping its own."""
    assert head_on_cpu(backend, gpu_layers(ngl, backend), layers) is expected
    if ngl is None:
        plan = plan_for(env=ON, with_drafter=False, model=mtp_target())  # a CPU build: -ngl 0
        assert arg(plan, "-ngl") == str(gpu_layers(None, "cpu"))


# -- tune's candidates and their screening ------------------------------------------------------


def test_each_mtp_length_gets_a_whole_head_twin_where_the_head_is_cut():
    found = cands.all_candidates(None, mtp="model", mtp_head_cut=True)
    whole = [c for c in found if c.head_rows == 0]
    assert [c.name for c in whole] == ["draft-mtp/n1/whole-head", "draft-mtp/n2/whole-head", "draft-mtp/n3/whole-head"]
    assert whole[1].label == "draft-mtp n-max 2, whole draft head"
    assert whole[1].flags() == {"speculative": True, "spec_type": "draft-mtp", "spec_nmax": 2, "draft_head_rows": 0}
    assert "draft_head_rows" not in next(c for c in found if c.name == "draft-mtp/n2").flags()
    assert not any(c.head_rows is not None for c in cands.all_candidates(None, mtp="model"))
    # `--configs draft-mtp` names every MTP configuration; one may be named alone
    assert len(cands.restrict(found, ["draft-mtp"])) == 1 + 6
    assert [c.name for c in cands.restrict(found, ["draft-mtp/n2/whole-head"])] == ["plain", "draft-mtp/n2/whole-head"]


def test_a_borrowing_drafter_gets_one_whole_head_twin():
    found = cands.all_candidates(None, "draft-dspark", 4, drafter_head_cut=True)
    twin = next(c for c in found if c.head_rows == 0)
    assert twin.name == "draft-dspark/whole-head" and twin.drafter_file
    assert twin.flags() == {"speculative": True, "spec_type": "draft-dspark", "spec_nmax": None, "draft_head_rows": 0}
    assert draft_head.cut_sibling(twin.name) == "draft-dspark"
    # `--configs drafter` still means the drafter as it runs by default
    assert [c.name for c in cands.restrict(found, ["drafter"])] == ["plain", "draft-dspark"]


def stream(*generated: int) -> Stream:
    return Stream((1, 2, 3), tuple(generated))


def test_the_share_of_plains_answer_tokens_past_the_cut():
    assert draft_head.share_past({"a": stream(5, 70000), "b": stream(65535, 65536)}) == 0.5
    assert draft_head.share_past({}) is None and draft_head.share_past({"a": stream()}) is None


def spec(name: str, rows: int | None = None) -> ConfigSpec:
    flags = {"speculative": True, "spec_type": "draft-mtp"} | ({} if rows is None else {"draft_head_rows": rows})
    return ConfigSpec(name, False, "draft-mtp", flags)


def test_whole_head_runs_are_left_out_only_when_plains_answers_stay_inside_the_cut():
    specs = [spec("draft-mtp/n2"), spec("draft-mtp/n2/whole-head", 0)]
    english = {"a": stream(*([100] * 99 + [70000]))}  # 1% past the cut
    skipped: dict[str, str] = {}
    assert _without_needless_whole_head(specs, english, frozenset(), skipped) == specs[:1]
    assert "1.0% of plain's answer tokens lie past the draft head's first 65536 rows" in skipped[specs[1].name]
    chinese = {"a": stream(*([100] * 7 + [100000] * 3))}  # 30% past it
    assert _without_needless_whole_head(specs, chinese, frozenset(), {}) == specs
    assert _without_needless_whole_head(specs, {}, frozenset(), {}) == specs  # no answers: measured
    named = frozenset({"draft-mtp/n2/whole-head"})  # asked for by name: measured whatever the answers
    assert _without_needless_whole_head(specs, english, named, {}) == specs


# -- the decision and auto ----------------------------------------------------------------------


def test_the_decision_keeps_the_head_it_was_measured_with():
    choice = Choice("draft-mtp/n2/whole-head", "draft-mtp n-max 2, whole draft head", "draft-mtp", 2, 1.4, head_rows=0)
    assert Choice.from_json(choice.to_json()) == choice
    assert "whole draft head" in choice.describe()
    old = {k: v for k, v in choice.to_json().items() if k != "head_rows"}  # stored before the field existed
    assert Choice.from_json(old).head_rows is None


def bench_doc(head_rows: int | None) -> dict:
    """A bench summary where draft-mtp/n2 (run with `head_rows`) is 1.5x plain beyond noise."""
    verdict = {"kind": "faster", "ratio": {"median": 1.5, "min": 1.4, "max": 1.6, "n": 3}, "band": 0.1, "reason": "x"}
    return {
        "baseline": "plain",
        "options": {"temps": [0.0]},
        "configs": [
            {"name": "plain", "label": "plain", "speculative": None},
            {
                "name": "draft-mtp/n2/whole-head",
                "label": "draft-mtp n-max 2, whole draft head",
                "speculative": {"type": "draft-mtp", "n_max": 2, "head_rows": head_rows},
            },
        ],
        "comparisons": [
            {"config": "draft-mtp/n2/whole-head", "category": "all", "temperature": 0.0, "verdict": verdict}
        ],
        "results": [{"config": "draft-mtp/n2/whole-head", "temperature": 0.0, "category": "all", "accepted": 10}],
    }


def test_decide_takes_the_head_rows_from_the_plan_that_ran():
    choice, _rows = decide(bench_doc(0))
    assert choice.config == "draft-mtp/n2/whole-head" and choice.head_rows == 0 and choice.n_max == 2
    assert decide(bench_doc(None))[0].head_rows is None


def test_auto_runs_the_decisions_head_and_refuses_an_explicit_one(llama_server, tmp_path, capsys, monkeypatch):
    from bonsai_launch.decisions.auto import launch_key
    from bonsai_launch.decisions.identity import TuneKey
    from bonsai_launch.models import tiny_hybrid
    from bonsai_launch.server.inputs import model_files, select
    from test_tune import _dry

    monkeypatch.setenv("BONSAI_LLAMA_SERVER", str(llama_server))
    model = tiny_hybrid.write_hybrid_target(tmp_path / "hybrid-mtp.gguf", mtp=True)
    files = model_files(select({}), str(model), None)
    k, why = launch_key(files, llama_server)
    assert why is None
    choice = Choice("draft-mtp/n2/whole-head", "draft-mtp n-max 2, whole draft head", "draft-mtp", 2, 1.4, head_rows=0)
    key = TuneKey(k.machine, k.build, k.model_sha256, None, "p" * 64)
    store.save(store.Decision(key, choice, ({"config": "plain"},), "2026-12-06T08:00:00Z", "tune", str(model)))

    code, plan = _dry(capsys, "--model", str(model), "--speculative", "auto")
    assert code == 0 and plan["tuning"]["status"] == "found", plan
    assert plan["speculative"]["type"] == "draft-mtp" and plan["speculative"]["head_rows"] == 0
    assert any(r["flag"] == DRAFT_HEAD_FLAG and r["value"] == "0" for r in plan["reasons"])
    argv = plan["argv"]
    assert argv[argv.index(DRAFT_HEAD_FLAG) + 1] == "0"

    monkeypatch.setenv("BONSAI_DRAFT_HEAD_ROWS", "0")
    code, err = _dry(capsys, "--model", str(model), "--speculative", "auto")
    assert code == 2 and "BONSAI_DRAFT_HEAD_ROWS=0 cannot be combined with BONSAI_SPECULATIVE=auto" in err


def mtp_spec(n: int, whole: bool = False) -> ConfigSpec:
    flags = {"speculative": True, "spec_type": "draft-mtp", "spec_nmax": n} | ({"draft_head_rows": 0} if whole else {})
    return ConfigSpec(f"draft-mtp/n{n}" + ("/whole-head" if whole else ""), False, "draft-mtp", flags)


ENGLISH = {"a": stream(*([100] * 99 + [70000]))}  # 1% of the answer tokens past the cut
CHINESE = {"a": stream(*([100] * 7 + [100000] * 3))}  # 30%


def tune_rounds(
    monkeypatch, others: list[ConfigSpec], answers, named=()
) -> tuple[list[str], dict[str, str], list[str]]:
    """tune/rounds.py under the default budget with a stand-in for the server runs: each takes 10
    s (of a clock that moves only with them) and n-max 2 screens best with the cut. Returns the
    configurations screened in order, what was skipped with why, and the notes."""
    from bonsai_launch.bench.data import BenchData, BenchOptions, SilentListener
    from bonsai_launch.tune import rounds as rd

    now = [0.0]
    monkeypatch.setattr(rd.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(rd, "_screening_ratios", lambda data, base: {"draft-mtp/n1": 1.2, "draft-mtp/n2": 1.5})
    plain = ConfigSpec("plain", True, None, {"speculative": False})
    clock = rd.Clock(None)
    ran: list[str] = []

    def measure(config: ConfigSpec, repeat: int) -> None:
        now[0] += 10.0
        if repeat == 0:
            ran.append(config.name)
        clock.runs.append(10.0)
        clock.times[config.name] = 10.0

    data = BenchData("launch", BenchOptions(), [plain, *others], [])
    skipped: dict[str, str] = {}
    notes: list[str] = []
    rd.rounds(plain, others, measure, clock, data, skipped, notes, 8, 2, [], SilentListener(), None, None, None,
              answers, frozenset(named))  # fmt: skip
    return ran, skipped, notes


@pytest.mark.parametrize(
    "answers,named,measured",
    [
        (ENGLISH, (), ["plain", "draft-mtp/n1", "draft-mtp/n2"]),
        (CHINESE, (), ["plain", "draft-mtp/n1", "draft-mtp/n2", "draft-mtp/n2/whole-head"]),
        ({}, (), ["plain", "draft-mtp/n1", "draft-mtp/n2", "draft-mtp/n2/whole-head"]),  # no answers: measured
        (ENGLISH, ("draft-mtp/n1/whole-head",), ["plain", "draft-mtp/n1", "draft-mtp/n2", "draft-mtp/n1/whole-head"]),
    ],
)
def test_a_tuning_session_screens_the_whole_head_at_the_best_length_when_plains_answers_ask_for_it(
    answers, named, measured, monkeypatch
):
    """The rounds (tune/rounds.py) with a stand-in for the server runs, where n-max 2 screens
    best with the cut: its whole-head twin gets one screening run when plain's answers reach past
    the cut (or say nothing), none on English-like answers, and a twin named in --configs runs."""
    others = [mtp_spec(1), mtp_spec(2), mtp_spec(1, whole=True), mtp_spec(2, whole=True)]
    ran, skipped, notes = tune_rounds(monkeypatch, others, answers, named)
    assert ran == measured, (skipped, notes)
    for name in {s.name for s in others} - set(ran):
        assert name in skipped
    if "draft-mtp/n2/whole-head" in ran:  # the default budget made room for it
        assert any("one more plain run's time" in n for n in notes), notes
        assert "best configuration with the cut only" in skipped["draft-mtp/n1/whole-head"]


def test_the_whole_head_twin_screens_first_and_the_others_while_the_budget_lasts(monkeypatch):
    """Under the default budget (8 plain runs of 10 s, one more for the twin) with six
    drafter-with-n-gram candidates listed first: the MTP lengths screen first, then the twin of
    the best, then the others while a screening run still fits (the best two are confirmed past
    the budget anyway). The synthetic 2B's tune (2026-12-06) listed the pairs first and the twin
    never ran; screening only while its confirmation fit too then left out the pairs, its best."""
    pairs = [ConfigSpec(f"ngram-mod+draft-mtp/p{n}", False, "x", {"speculative": True}) for n in range(6)]
    others = [*pairs, mtp_spec(1), mtp_spec(2), mtp_spec(1, whole=True), mtp_spec(2, whole=True)]
    ran, skipped, _ = tune_rounds(monkeypatch, others, CHINESE)
    first = ["plain", "draft-mtp/n1", "draft-mtp/n2", "draft-mtp/n2/whole-head"]
    assert ran[:9] == [*first, *(p.name for p in pairs[:5])], ran
    assert "budget (90 s" in skipped[pairs[5].name]  # 80 s in, its run would end past the 90 s


@pytest.mark.server
def test_bonsai_start_carries_the_setting_to_llama_server(llama_server, tmp_path):
    """The real server: a 66048-token qwen35 whose one answer token (65636) is past the default
    cut. Started by bonsai with draft-mtp, its drafts are all refused by default and all accepted
    with BONSAI_DRAFT_HEAD_ROWS=0 (the whole head): the setting reached patch 0015."""
    from bonsai_launch.models import tiny_hybrid
    from bonsai_launch.server.process import free_port
    from start_helpers import bonsai, bonsai_env, json_out, stop_all

    model = tiny_hybrid.write_hybrid_target(
        tmp_path / "big-vocab-mtp.gguf", mode="constant", constant_token=65536 + 100, mtp=True, vocab=65536 + 512
    )
    seen = {}
    try:
        for rows in (None, "0"):
            env = bonsai_env(llama_server, BONSAI_SPECULATIVE="1", **({"BONSAI_DRAFT_HEAD_ROWS": rows} if rows else {}))
            args = ["start", "--model", str(model), "--port", free_port(), "--ctx", "2048", "--json", "--detach"]
            data = json_out(bonsai([*args, "--", "-t", "1"], env=env))
            seen[rows] = data["speculative"]
            stop_all()
    finally:
        stop_all()
    default, whole = seen[None], seen["0"]
    assert default["type"] == whole["type"] == "draft-mtp", seen
    assert default["drafted"] > 0 and default["accepted"] == 0, default
    assert whole["drafted"] > 0 and whole["accepted"] == whole["drafted"], whole
