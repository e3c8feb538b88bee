"""`bonsai serve`'s plan, without a server: the preset file it writes, what it refuses before
anything starts, and the watcher's rule for unloading (server/plan/router.py, router_watch.py).

The router itself runs in tests/test_serve_server.py."""

from __future__ import annotations

import json

import pytest

import tiny_gguf
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.options import pinned_table
from bonsai_launch.server.plan import ModelPlan, ServerPlan
from bonsai_launch.server.plan.router import check_names, idle_times, plan_router, preset_items, render_preset
from bonsai_launch.server.router_inputs import parse_sources
from bonsai_launch.server.router_watch import ModelRecord, child_port, due
from cli_runner import run_cli


def model(name: str, *args: str) -> ModelPlan:
    return ModelPlan(
        name, f"/m/{name}.gguf", ("-m", f"/m/{name}.gguf", "--alias", name, *args), (), (), None, 4096, 0, "cpu", None
    )


def router(models, **settings):
    return plan_router(
        ServerPlan("llama-server", "127.0.0.1", 8080, env={"LLAMA_API_KEY": "k"}),
        [(m.name, m) for m in models],
        settings,
        pinned_table(),
        preset_path="/h/serve/serve.ini",
        cache_dir="/h/serve/no-hub-cache",
        name="serve",
    )


def test_each_model_is_one_preset_section_of_its_own_flags():
    a = model("a", "-ngl", "0", "-c", "4096", "-md", "/m/d.gguf", "--spec-type", "draft-dspark", "--no-mmproj-offload")
    b = model("b", "-np", "2", "-kvu", "--temp", "0")
    plan = router([a, b], pin="a", preload="b")
    sections = plan.preset.split("\n\n")
    assert sections[1].splitlines() == [
        "[a]",
        "model = /m/a.gguf",
        "gpu-layers = 0",
        "ctx-size = 4096",
        "spec-draft-model = /m/d.gguf",
        "spec-type = draft-dspark",
        "no-mmproj-offload = true",  # llama-server reads a negative spelling's `true` as the switch off
        "load-on-startup = true",
    ]
    assert "parallel = 2" in sections[2] and "kvu = true" in sections[2] and "load-on-startup = true" in sections[2]
    assert "alias" not in plan.preset  # the section's name is the model's name
    # nothing of a model on the router's command line: its flags would reach every child
    assert plan.argv == (
        "llama-server", "--host", "127.0.0.1", "--port", "8080", "--metrics",
        "--models-preset", "/h/serve/serve.ini", "--models-max", "4",
    )  # fmt: skip
    assert plan.env["LLAMA_API_KEY"] == "k" and plan.env["LLAMA_CACHE"] == "/h/serve/no-hub-cache"
    assert plan.model_named("a").pinned and plan.model_named("a").idle_unload_s == 0


@pytest.mark.parametrize(
    "args, words",
    [
        (("--temp", "0", "--temp", "1"), "--temp is given twice"),
        (("--chat-template-kwargs", "a #b"), "cannot be written in a preset"),
        (("--chat-template-kwargs", "x\ny"), "cannot be written in a preset"),
        (("--control-vector-layer-range", "1", "2"), "takes two values"),
    ],
)
def test_a_flag_a_preset_cannot_hold_is_refused_naming_the_model(args, words):
    with pytest.raises(BonsaiError, match=words) as err:
        preset_items("m", model("m", *args).args, pinned_table())
    assert err.value.message.startswith("model 'm': ")


def test_two_models_under_one_name_are_refused_in_one_line():
    with pytest.raises(BonsaiError) as err:
        check_names([("./a/x.gguf", model("x")), ("./b/x.gguf", model("x"))])
    assert err.value.message == "two models are named 'x': ./a/x.gguf and ./b/x.gguf"
    assert "NAME=./b/x.gguf" in (err.value.fix or "")
    with pytest.raises(BonsaiError) as err:  # named twice by the user: the hint names the file, not "NAME=x=..."
        check_names([("x=./a/x.gguf", model("x")), ("x=./b/y.gguf", model("x"))])
    assert (err.value.fix or "").endswith("another name: NAME=./b/y.gguf")
    with pytest.raises(BonsaiError, match="cannot hold spaces"):
        check_names([("x y.gguf", model("x y"))])


def test_idle_times_pins_and_preloads_name_served_models():
    assert idle_times("300,b=30", ["a", "b"]) == {"a": 300, "b": 30}
    assert idle_times(None, ["a"]) == {"a": 0}
    with pytest.raises(BonsaiError, match="'soon' is not a number"):
        idle_times("soon", ["a"])
    with pytest.raises(BonsaiError, match="names 'c', which is not served") as err:
        idle_times("c=5", ["a", "b"])
    assert err.value.fix == "served: a, b"
    with pytest.raises(BonsaiError, match="BONSAI_PIN names 'z'"):
        router([model("a")], pin="z")
    with pytest.raises(BonsaiError, match="more than BONSAI_MODELS_MAX=1"):
        router([model("a"), model("b")], preload="all", models_max=1)
    plan = router([model("a"), model("b")], idle_unload="60,b=0", pin="a")
    assert [(m.name, m.idle_unload_s, m.pinned) for m in plan.models] == [("a", 0, True), ("b", 0, False)]


def test_the_preset_renders_what_llama_server_reads():
    # the keys are option spellings without dashes, each an option of the pinned llama-server
    text = render_preset(router([model("a", "-fa", "on", "--jinja")]).models, pinned_table())
    for line in text.splitlines():
        if " = " in line and not line.startswith(";") and line.split(" = ")[0] not in ("version", "load-on-startup"):
            assert pinned_table().lookup("--" + line.split(" = ")[0]) or pinned_table().lookup(
                "-" + line.split(" = ")[0]
            )


def test_the_watcher_unloads_after_idle_and_keeps_pins():
    r = ModelRecord("a", idle_unload_s=10, state="loaded", last_active=100.0)
    assert due(r, 105.0) is None and r.unload_in(105.0) == 5.0
    assert due(r, 110.0) == "unload"
    assert due(ModelRecord("a", idle_unload_s=0, state="loaded", last_active=0.0), 1e9) is None  # never
    assert due(ModelRecord("a", idle_unload_s=10, state="unloaded"), 1e9) is None
    pinned = ModelRecord("p", idle_unload_s=10, pinned=True, state="loaded", last_active=0.0)
    assert due(pinned, 1e9) is None and pinned.unload_in(1e9) is None
    assert due(ModelRecord("p", pinned=True, state="unloaded"), 0) == "load"  # evicted to make room: back
    assert due(ModelRecord("p", pinned=True, state="failed"), 0) is None  # a failed load is not retried in a loop
    assert child_port({"args": ["llama-server", "--port", "41234", "--alias", "a"]}) == 41234
    assert child_port({"args": ["llama-server", "--port", "0"]}) is None


def test_sources_name_profiles_files_pairs_and_folders(tmp_path):
    t = tiny_gguf.write_target(tmp_path / "t.gguf")
    d = tiny_gguf.write_dspark_drafter(tmp_path / "d.gguf")
    folder = tmp_path / "models"
    folder.mkdir()
    tiny_gguf.write_target(folder / "one.gguf")
    tiny_gguf.write_target(folder / "two.gguf")
    tiny_gguf.write_dspark_drafter(folder / "dspark-two.gguf")  # a drafter is not a model of its own
    (folder / "vision-mmproj.gguf").write_bytes(b"GGUF")
    got = parse_sources(["demo", f"{t}", f"chat={t}+{d}", str(folder)], ["demo", "bonsai-8b"])
    assert [(s.name, s.profile, s.model, s.drafter) for s in got] == [
        (None, "demo", None, None),
        (None, None, str(t), None),
        ("chat", None, str(t), str(d)),
        (None, None, str(folder / "one.gguf"), None),
        (None, None, str(folder / "two.gguf"), None),
    ]
    with pytest.raises(BonsaiError, match="neither a profile"):
        parse_sources(["nosuch"], ["demo"])
    with pytest.raises(BonsaiError, match=r"drafter .* is not a file"):
        parse_sources([f"{t}+{tmp_path / 'none.gguf'}"], [])


def test_serve_refuses_bad_input_in_one_line_before_anything_is_written(capsys, tmp_path, isolated_home):
    t = tiny_gguf.write_target(tmp_path / "t.gguf")
    again = tmp_path / "b"
    again.mkdir()
    t2 = tiny_gguf.write_target(again / "t.gguf")
    wide = tiny_gguf.write_dspark_drafter(tmp_path / "wide.gguf", target_embedding=128)
    for argv, words in (
        ([str(t), str(t2)], f"two models are named 't': {t} and {t2}"),
        ([f"pair={t}+{wide}"], "model pair: drafter does not fit the target"),
        ([str(t), "--pin", "nope"], "BONSAI_PIN names 'nope', which is not served"),
    ):
        code, out, err = run_cli(capsys, "serve", *argv, "--dry-run")
        assert code == 2, err
        assert err.startswith(f"error: {words}") and err.count("\n") == 1, err
        assert out == ""
    assert not (isolated_home / "serve").exists()  # nothing half-written


def test_dry_run_shows_the_router_command_and_its_preset(capsys, tmp_path):
    t = tiny_gguf.write_target(tmp_path / "t.gguf")
    d = tiny_gguf.write_dspark_drafter(tmp_path / "d.gguf", block_size=4)
    code, out, err = run_cli(capsys, "serve", f"plain={t}", f"pair={t}+{d}", "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    pair = next(m for m in plan["models"] if m["name"] == "pair")
    # the plan `bonsai start --model T --drafter D --speculative` makes: the drafter, n-max = its block size
    assert pair["speculative"] == {
        "type": "draft-dspark",
        "n_max": 4,
        "drafter": str(d),
        "draft_ngl": 0,
        "head_rows": None,  # draft-mtp's draft head rows: llama's default
    }
    assert "[pair]\n" in plan["preset"] and f"spec-draft-model = {d}" in plan["preset"]
    assert next(m for m in plan["models"] if m["name"] == "plain")["speculative"] is None
    assert "--models-preset" in plan["argv"] and "-md" not in plan["argv"]
    assert plan["host"] == "127.0.0.1"  # loopback unless the user opts in
