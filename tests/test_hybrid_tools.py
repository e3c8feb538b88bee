"""`bonsai tune` and `bonsai bench` on a hybrid (qwen35) model carrying an MTP layer: tuning
offers draft-mtp at n-max 1, 2 and 3, and the bench measures the MTP mode like the others
(live, and identical to plain at temperature 0)."""

from __future__ import annotations

import pytest

import bench_options
from bonsai_launch.bench import prompts as suite
from bonsai_launch.models import tiny_hybrid
from bonsai_launch.tune.subject import TuneRequest, plan_candidates, subject

pytestmark = pytest.mark.server

THREADS = ("-t", "1")


def test_tune_offers_draft_mtp_n_max_1_to_3_without_a_drafter(llama_server, tmp_path):
    model = tiny_hybrid.write_hybrid_target(tmp_path / "mtp.gguf", mtp=True, weight_type="q8_0")
    request = TuneRequest({}, str(model), None, THREADS, llama_server)
    found = subject(request, suite.load_prompts()[:2]).candidates
    names = [c.name for c in found]
    assert names[:4] == ["plain", "draft-mtp/n1", "draft-mtp/n2", "draft-mtp/n3"], names
    specs, refused = plan_candidates(request, tuple(c for c in found if c.spec_type in (None, "draft-mtp")))
    assert refused == {}
    for spec in specs[1:]:
        argv = list(spec.plan.argv)
        assert argv[argv.index("--spec-type") + 1] == "draft-mtp" and "-md" not in argv
        assert argv[argv.index("--spec-draft-n-max") + 1] == spec.name[-1]
    # a model without MTP layers is offered none
    plain = tiny_hybrid.write_hybrid_target(tmp_path / "plain.gguf", weight_type="q8_0")
    other = subject(TuneRequest({}, str(plain), None, THREADS, llama_server), suite.load_prompts()[:2])
    assert not any(c.spec_type == "draft-mtp" for c in other.candidates)


def test_tune_offers_ngram_mod_in_front_of_the_mtp_layer_and_of_a_drafter(llama_server, tmp_path):
    """The lists Bonsai 2 users run (llamacpp/spec_types.py), planned as a launch would be."""
    import tiny_gguf

    model = tiny_hybrid.write_hybrid_target(tmp_path / "mtp.gguf", mtp=True, weight_type="q8_0")
    drafter = tiny_gguf.write_dspark_drafter(tmp_path / "d.gguf", target_layers=(1, 3), block_size=4)
    request = TuneRequest({}, str(model), str(drafter), THREADS, llama_server)
    found = subject(request, suite.load_prompts()[:2]).candidates
    lists = tuple(c for c in found if c.spec_type and "," in c.spec_type)
    assert [c.name for c in lists] == ["ngram-mod+draft-mtp/n1", "ngram-mod+draft-mtp/n2", "ngram-mod+draft-dspark"]
    specs, refused = plan_candidates(request, lists)
    assert refused == {}
    for spec in specs:
        argv = list(spec.plan.argv)
        kind = spec.name.split("+")[1].split("/")[0]
        assert argv[argv.index("--spec-type") + 1] == f"ngram-mod,{kind}"
        assert ("-md" in argv) == (kind == "draft-dspark"), argv


def test_bench_measures_the_mtp_mode_live_and_identical_to_plain(llama_server, tmp_path):
    from bonsai_launch.bench.pipeline import Target, run_bench

    model = tiny_hybrid.write_hybrid_target(tmp_path / "mtp.gguf", mtp=True, mtp_accept=0.5, weight_type="q8_0")
    options = bench_options.one_pass()
    doc, _ = run_bench(options, Target(model=str(model), binary=llama_server, passthrough=THREADS), tmp_path / "out")
    proof = next(s for s in doc["servers"] if s["config"] == "speculative")["spec_proof"]
    assert proof["type"] == "draft-mtp" and proof["n_max"] == 1 and proof["live"] and proof["drafted"] > 0
    spec = next(r for r in doc["results"] if r["config"] == "speculative" and r["category"] == "all")
    assert 0 < spec["acceptance_rate"] < 1
    eq = next(c for c in doc["comparisons"] if c["category"] == "all")["output_equality"]
    assert eq["compared"] == 4 and eq["identical"] == 4
