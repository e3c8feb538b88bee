"""Arguments after `--`: parsed against llama-server's option table and folded into the plan.

Pure tests over the pinned build's real `--help` (tests/data) and the plan; the CLI and the
real server are exercised in test_passthrough_cli.py and test_passthrough_server.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.options import PINNED_TABLE, parse_option_table, pinned_table
from bonsai_launch.server.passthrough import parse
from test_plan import arg, drafter, plan_for, target

HELP = (Path(__file__).parent / "data" / "llama-server-b11434-help.txt").read_text()
TABLE = parse_option_table(HELP)


# -- the option table -------------------------------------------------------------------------------


def test_shipped_table_is_generated_from_the_pinned_help():
    assert PINNED_TABLE.read_text() == TABLE.to_text(), "run: python -m bonsai_launch.llamacpp.options"


@pytest.mark.parametrize(
    "spellings, canonical",
    [
        (("-c", "--ctx-size", "--ctx_size"), "--ctx-size"),
        (("-np", "--parallel"), "--parallel"),
        (("-ub", "--ubatch-size"), "--ubatch-size"),
        (("-b", "--batch-size"), "--batch-size"),
        (("-md", "--spec-draft-model", "--model-draft"), "--spec-draft-model"),
        (("-ngld", "--spec-draft-ngl", "--gpu-layers-draft", "--n-gpu-layers-draft"), "--spec-draft-ngl"),
        (("-ngl", "--gpu-layers", "--n-gpu-layers"), "--gpu-layers"),
        (("-a", "--alias"), "--alias"),
        (("--host",), "--host"),
        (("--api-key",), "--api-key"),
        (("-nkvo", "--no-kv-offload", "-kvo"), "--kv-offload"),
    ],
)
def test_aliases_fold_to_one_name(spellings, canonical):
    assert {TABLE.canonical(s) for s in spellings} == {canonical}


def test_value_counts_and_environment_names():
    assert TABLE.lookup("--metrics").values == 0
    assert TABLE.lookup("-fa").values == 1  # `[on|off|auto]` is a required value in llama.cpp
    assert TABLE.lookup("--override-tensor").values == 1
    assert TABLE.lookup("--control-vector-layer-range").values == 2
    assert TABLE.lookup("--api-key").env == "LLAMA_API_KEY"
    assert TABLE.lookup("--hf-token").env == "HF_TOKEN"
    assert TABLE.lookup("--draft-max").removed
    assert TABLE.lookup("--fim-qwen-1.5b-default") is not None


# -- parsing ------------------------------------------------------------------------------------------


def test_parse_counts_values_like_llama_server():
    p = parse(["--seed", "-1", "--no-warmup", "--port=9001", "--control-vector-layer-range", "1", "2"], TABLE)
    assert [(a.canonical, a.values) for a in p.args] == [
        ("--seed", ("-1",)),
        ("--warmup", ()),
        ("--port", ("9001",)),
        ("--control-vector-layer-range", ("1", "2")),
    ]


@pytest.mark.parametrize(
    "words, message",
    [
        (["--cxt", "4096"], "unknown option --cxt"),
        (["--ctx-sise", "4096"], "did you mean --ctx-size?"),
        (["-c"], "-c needs a value"),
        (["4096"], "unexpected argument '4096'"),
        (["--metrics=1"], "takes no value"),
    ],
)
def test_parse_refuses_what_llama_server_would_reject(words, message):
    with pytest.raises(BonsaiError, match=message.replace("?", r"\?")):
        parse(words, TABLE)


# -- folding into the plan ------------------------------------------------------------------------


def count(plan, *spellings):
    return sum(plan.argv.count(s) for s in spellings)


def test_remote_host_after_dashdash_needs_the_opt_in():
    with pytest.raises(BonsaiError, match=r"-- --host='0.0.0.0' is not a loopback address.*BONSAI_ALLOW_REMOTE=1"):
        plan_for(passthrough=("--host", "0.0.0.0"))
    with pytest.raises(BonsaiError, match="no API key"):
        plan_for(env={"BONSAI_ALLOW_REMOTE": "1"}, passthrough=("--host", "0.0.0.0"))
    plan = plan_for(env={"BONSAI_ALLOW_REMOTE": "1", "BONSAI_API_KEY": "k"}, passthrough=("--host", "0.0.0.0"))
    assert plan.host == "0.0.0.0" and count(plan, "--host") == 1 and arg(plan, "--host") == "0.0.0.0"
    assert plan.to_json()["from_passthrough"] == ["host"]


@pytest.mark.parametrize("host", ["127.0.0.1,0.0.0.0", "/tmp/llama.sock"])
def test_several_addresses_or_a_socket_are_refused(host):
    with pytest.raises(BonsaiError, match="one TCP address"):
        plan_for(env={"BONSAI_ALLOW_REMOTE": "1", "BONSAI_API_KEY": "k"}, passthrough=("--host", host))


def test_port_flag_and_passthrough_must_agree():
    with pytest.raises(BonsaiError, match="--port 9000 and -- --port 9001 disagree"):
        plan_for(flags={"port": 9000}, passthrough=("--port", "9001"))
    assert plan_for(flags={"port": 9000}, passthrough=("--port", "9000")).port == 9000
    plan = plan_for(env={"BONSAI_PORT": "9000"}, passthrough=("--port", "9001"))  # like a flag: above env
    assert plan.port == 9001 and count(plan, "--port") == 1 and arg(plan, "--port") == "9001"


def test_small_context_after_dashdash_with_speculation_is_the_plans_context_and_warned():
    plan = plan_for(env={"BONSAI_SPECULATIVE": "1"}, passthrough=("-c", "1024"))
    assert plan.ctx == 1024 and count(plan, "-c", "--ctx-size") == 1 and arg(plan, "-c") == "1024"
    assert any("below 16384" in w and "after --" in w for w in plan.warnings)


def test_bad_value_names_the_passthrough_argument():
    with pytest.raises(BonsaiError, match="-- -c='lots' is not a whole number"):
        plan_for(passthrough=("-c", "lots"))


def test_slots_after_dashdash_obey_the_ubatch_rule():
    plan = plan_for(env={"BONSAI_SPECULATIVE": "1"}, passthrough=("-np", "2", "-ub", "64"))
    assert plan.slots.count == 2 and count(plan, "-np", "--parallel") == 1 and arg(plan, "-np") == "2"
    assert arg(plan, "-ub") == "64" and count(plan, "-ub", "--ubatch-size") == 1
    assert plan.to_json()["from_passthrough"] == ["parallel", "ubatch"]
    plan = plan_for(env={"BONSAI_SPECULATIVE": "1"}, passthrough=("--parallel", "200"))  # sized by the slots rule
    assert arg(plan, "-ub") == str(200 * 5) and count(plan, "-ub", "--ubatch-size") == 1
    with pytest.raises(BonsaiError, match=r"-ub 4 is smaller than speculation needs: 1 slot x \(4 draft \+ 1\) = 5"):
        plan_for(env={"BONSAI_SPECULATIVE": "1"}, passthrough=("--ubatch-size", "4"))
    with pytest.raises(BonsaiError, match=r"-b 4 is smaller"):
        plan_for(env={"BONSAI_SPECULATIVE": "1"}, passthrough=("--batch-size", "4"))
    plan = plan_for(passthrough=("-ub", "64", "-b", "128"))  # without speculation: as given, once
    assert arg(plan, "-ub") == "64" and arg(plan, "-b") == "128" and count(plan, "-b", "--batch-size") == 1


def test_spec_settings_after_dashdash_go_through_the_drafter_rules():
    with pytest.raises(BonsaiError, match="differs from the drafter's block size 4"):
        plan_for(env={"BONSAI_SPECULATIVE": "1"}, passthrough=("--spec-draft-n-max", "8"))
    with pytest.raises(BonsaiError, match="does not match the drafter"):
        plan_for(env={"BONSAI_SPECULATIVE": "1"}, passthrough=("--spec-type", "draft-simple"))
    plan = plan_for(env={"BONSAI_SPECULATIVE": "1"}, passthrough=("--spec-draft-n-max", "4"))
    assert count(plan, "--spec-draft-n-max") == 1


def test_api_key_after_dashdash_moves_to_the_environment():
    plan = plan_for(passthrough=("--api-key", "sk-secret-1"))
    assert "sk-secret-1" not in plan.argv and "--api-key" not in plan.argv
    assert plan.env == {"LLAMA_API_KEY": "sk-secret-1"} and plan.api_key == "sk-secret-1"
    data = plan.to_json()
    assert "sk-secret-1" not in str(data) and data["api_key_required"] is True


def test_other_secrets_move_to_their_environment_variable():
    plan = plan_for(passthrough=("--hf-token", "hf_abc"))
    assert "hf_abc" not in plan.argv and plan.env["HF_TOKEN"] == "hf_abc"
    assert "hf_abc" not in str(plan.to_json())


@pytest.mark.parametrize(
    "words, hint",
    [
        (("-m", "/x.gguf"), "--model PATH"),
        (("-md", "/d.gguf"), "--drafter PATH"),
        (("-ngld", "0"), "BONSAI_NGL"),
        (("--api-key-file", "/keys"), "BONSAI_API_KEY"),
        (("--help",), "directly"),
        (("--draft-max", "4"), "removed"),
        (("-hf", "org/repo"), "--model PATH"),
        (("--spec-default",), "BONSAI_SPECULATIVE=1"),
        (("--fim-qwen-7b-spec",), "preset"),
    ],
)
def test_options_bonsai_sets_itself_are_refused_with_the_setting_to_use(words, hint):
    with pytest.raises(BonsaiError) as err:
        plan_for(passthrough=words)
    assert hint in str(err.value)


def test_a_planned_flag_without_a_setting_is_never_repeated():
    with pytest.raises(BonsaiError, match=r"conflicts with --cache-type-k q4_0.*BONSAI_KV4"):
        plan_for(env={"BONSAI_KV4": "1"}, with_drafter=False, passthrough=("-ctk", "q8_0"))
    plan = plan_for(passthrough=("--metrics",))
    assert count(plan, "--metrics") == 1


def test_passthrough_replaces_the_profiles_server_arguments():
    model = target(arch="gemma3", layers=18, embedding=640, vocab=262144, ctx_len=32768)
    plan = plan_for("demo", model=model, with_drafter=False, passthrough=("--chat-template", "chatml"))
    assert count(plan, "--chat-template") == 1 and arg(plan, "--chat-template") == "chatml"
    assert "--jinja" in plan.argv and "--skip-chat-parsing" in plan.argv  # the rest of the profile's arguments stay


# -- issue 18: the key and the model name -------------------------------------------------------


def test_a_key_the_user_sets_is_enforced_on_loopback():
    plan = plan_for(env={"BONSAI_API_KEY": "sk-local-test"})
    assert plan.host == "127.0.0.1" and plan.env == {"LLAMA_API_KEY": "sk-local-test"}
    assert "sk-local-test" not in " ".join(plan.argv)
    assert any(r.flag == "LLAMA_API_KEY" and "required" in r.why for r in plan.reasons)
    assert plan_for().env == {}


def test_several_keys_are_all_accepted_and_clients_send_the_first():
    plan = plan_for(env={"BONSAI_API_KEY": "k1,k2"})
    assert plan.env["LLAMA_API_KEY"] == "k1,k2" and plan.api_key == "k1"


def test_served_model_name_is_the_profile_or_the_file_stem():
    plan = plan_for("ternary-27b")
    assert arg(plan, "--alias") == "ternary-27b" and plan.model_name == "ternary-27b"
    assert plan.to_json()["model_name"] == "ternary-27b"
    plan = plan_for(passthrough=("-a", "my-model"))
    assert plan.model_name == "my-model" and count(plan, "--alias", "-a") == 1
    plan = plan_for(passthrough=("--alias", "zeta, alpha"))  # every alias is served; the first sorted is the name
    assert arg(plan, "--alias") == "zeta, alpha" and plan.model_name == "alpha"


def test_every_owned_flag_appears_once_and_equals_the_plan_json():
    plan = plan_for(
        env={"BONSAI_ALLOW_REMOTE": "1", "BONSAI_API_KEY": "k", "BONSAI_SPECULATIVE": "1"},
        draft=drafter(block_size=4),
        passthrough=(
            "--host",
            "0.0.0.0",
            "--port",
            "9123",
            "--ctx-size",
            "20000",
            "--parallel",
            "2",
            "-ngl",
            "0",
            "--threads",
            "2",
        ),
    )
    data = plan.to_json()
    for spellings, key in (
        (("--host",), "host"),
        (("--port",), "port"),
        (("-c", "--ctx-size"), "ctx"),
        (("-np", "--parallel"), "slots"),
        (("-ngl", "--gpu-layers"), "ngl"),
    ):
        assert count(plan, *spellings) == 1, spellings
        value = next(plan.argv[i + 1] for i, a in enumerate(plan.argv) if a in spellings)
        assert value == str(data[key]["parallel"] if key == "slots" else data[key]), key
    assert set(data["from_passthrough"]) == {"host", "port", "ctx", "parallel", "ngl"}


def test_pinned_table_loads():
    assert pinned_table().lookup("-np").canonical == "--parallel"


def test_llama_server_variables_that_bypass_the_plan_are_warned_about():
    from bonsai_launch.server.passthrough import inherited_env_warnings

    found = inherited_env_warnings({"LLAMA_ARG_UBATCH": "4", "LLAMA_API_KEY": "x", "LLAMA_ARG_THREADS": "2"}, TABLE)
    assert len(found) == 2
    assert any(w.startswith("LLAMA_ARG_UBATCH is set") and "-- --ubatch-size" in w for w in found)
    assert any(w.startswith("LLAMA_API_KEY is set") and "BONSAI_API_KEY" in w for w in found)
