"""`bonsai fleet` and `bonsai export` without servers: the router configs, the fleet file, how
replicas share the machine, the generated vLLM/SGLang lines, and the message when the
LiteLLM proxy is not installed."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.fleet import configs, export, hosts, proxy
from bonsai_launch.fleet.configs import Member
from real_parts import require_litellm

ROOT = Path(__file__).resolve().parent.parent

LOCAL = [
    Member(
        "replica-1",
        "http://127.0.0.1:4001",
        True,
        argv=("llama-server", "-m", "m.gguf", "--port", "4001"),
        env={"CUDA_VISIBLE_DEVICES": "0"},
        parallel=2,
    ),
    Member("replica-2", "http://127.0.0.1:4002", True, argv=("llama-server", "-m", "m.gguf", "--port", "4002")),
]
REMOTE = [Member("gpu-box", "http://10.0.0.7:8080", False, api_key_env="GPU_BOX_KEY")]


# -- LiteLLM ----------------------------------------------------------------------------------------


def test_litellm_config_balances_one_model_over_every_member():
    cfg = configs.litellm_config("bonsai-8b", LOCAL + REMOTE)
    assert {d["model_name"] for d in cfg["model_list"]} == {"bonsai-8b"}
    assert [d["litellm_params"]["api_base"] for d in cfg["model_list"]] == [
        "http://127.0.0.1:4001/v1",
        "http://127.0.0.1:4002/v1",
        "http://10.0.0.7:8080/v1",
    ]
    assert [d["model_info"]["id"] for d in cfg["model_list"]] == ["replica-1", "replica-2", "gpu-box"]
    assert all(d["litellm_params"]["model"] == "openai/bonsai-8b" for d in cfg["model_list"])
    # The remote member's key is read from its variable by the proxy, never written here.
    assert cfg["model_list"][2]["litellm_params"]["api_key"] == "os.environ/GPU_BOX_KEY"
    router = cfg["router_settings"]
    assert router["routing_strategy"] == "least-busy"
    assert router["num_retries"] >= 2 and router["cooldown_time"] > 0 and router["allowed_fails"] == 0
    assert router["enable_health_check_routing"] is True
    general = cfg["general_settings"]
    assert general["background_health_checks"] is True and general["health_check_interval"] < router["cooldown_time"]
    assert general["master_key"] == "os.environ/LITELLM_MASTER_KEY"
    # No per-member concurrency cap: LiteLLM would answer 429 where llama-server queues.
    assert all("max_parallel_requests" not in d["litellm_params"] for d in cfg["model_list"])


@pytest.mark.slow  # imports litellm (~10 s); needs the `fleet` extra, which the fast CI lane lacks
def test_litellm_config_keys_are_the_routers_own(monkeypatch):
    """Every router_settings key is an argument of the installed litellm.Router."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline, as the proxy runs
    require_litellm()
    import inspect

    import litellm.router as router

    accepted = set(inspect.signature(router.Router.__init__).parameters)
    cfg = configs.litellm_config("m", LOCAL)
    assert set(cfg["router_settings"]) <= accepted, set(cfg["router_settings"]) - accepted


# -- llama-swap ---------------------------------------------------------------------------------------


def test_llama_swap_config_uses_only_documented_keys():
    cfg = configs.llama_swap_config("bonsai-8b", LOCAL + REMOTE)
    assert configs.llama_swap_problems(cfg) == []
    assert cfg["models"]["replica-1"]["cmd"] == shlex.join(LOCAL[0].argv)
    assert cfg["models"]["replica-1"]["env"] == ["CUDA_VISIBLE_DEVICES=0"]
    assert cfg["models"]["replica-1"]["checkEndpoint"] == "/health"
    assert cfg["peers"]["gpu-box"] == {
        "proxy": "http://10.0.0.7:8080",
        "models": ["bonsai-8b"],
        "apiKey": "${env.GPU_BOX_KEY}",
    }
    sel = cfg["selectors"]["bonsai-8b"]
    assert sel["strategy"] == "spillover" and sel["targets"] == ["replica-1", "replica-2", "gpu-box/bonsai-8b"]
    assert sel["settings"] == {"spillover": 2}
    yaml.safe_load(yaml.safe_dump(cfg))  # round-trips as YAML


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda c: c.update(loadBalancer="x"), "unknown top-level key 'loadBalancer'"),
        (lambda c: c["models"]["replica-1"].update(replicas=2), "models.replica-1: unknown key 'replicas'"),
        (lambda c: c["models"]["replica-1"].pop("cmd"), "cmd is required"),
        (lambda c: c["selectors"]["m"].update(strategy="round-robin"), "not warm, pin or spillover"),
        (lambda c: c["selectors"]["m"]["targets"].append("nope"), "target 'nope'"),
        (lambda c: c["peers"]["gpu-box"].update(key="k"), "peers.gpu-box: unknown key 'key'"),
    ],
)
def test_llama_swap_checker_catches_undocumented_keys(mutate, words):
    cfg = configs.llama_swap_config("m", LOCAL + REMOTE)
    mutate(cfg)
    assert any(words in p for p in configs.llama_swap_problems(cfg)), configs.llama_swap_problems(cfg)


# -- the fleet file and the machine's share -------------------------------------------------------------


def test_fleet_file_members(tmp_path):
    f = tmp_path / "fleet.yaml"
    f.write_text(
        "members:\n- url: http://gpu-box:8080/v1\n  api_key_env: GPU_BOX_KEY\n  parallel: 4\n"
        "- {url: 'https://b.example:9000', name: b}\n"
    )
    a, b = hosts.parse_fleet_file(f)
    assert (a.name, a.url, a.api_key_env, a.parallel) == ("gpu-box-8080", "http://gpu-box:8080", "GPU_BOX_KEY", 4)
    assert (b.name, b.url, b.api_key_env) == ("b", "https://b.example:9000", None)


@pytest.mark.parametrize(
    "text, words",
    [
        ("members: []", "non-empty 'members'"),
        ("members:\n- url: gpu-box:8080", "is not an http(s) URL"),
        ("members:\n- url: http://a:1\n  api_key_env: 'my key'", "not an environment variable name"),
        ("members:\n- url: http://a:1\n  apikey: X", "unknown key(s) apikey"),
        ("members:\n- {url: 'http://a:1', name: x}\n- {url: 'http://b:1', name: x}", "used twice: x"),
        ("members: [", "not valid YAML"),
    ],
)
def test_bad_fleet_file_names_the_entry_and_the_fix(tmp_path, text, words):
    f = tmp_path / "fleet.yaml"
    f.write_text(text)
    with pytest.raises(BonsaiError) as err:
        hosts.parse_fleet_file(f)
    assert words in str(err.value) and str(f) in str(err.value)


def test_cpu_replicas_split_the_cores_and_pin_them():
    a, b = hosts.replica_shares(2, "cpu", gpus=None, threads=None, cpus=list(range(8)))
    assert a.args == b.args == ("--threads", "4", "--threads-batch", "4")
    assert (a.cores, b.cores) == ((0, 1, 2, 3), (4, 5, 6, 7))
    # A container's cores need not start at 0 or be contiguous.
    a, b = hosts.replica_shares(2, "cpu", gpus=None, threads=None, cpus=[2, 3, 6, 7])
    assert (a.cores, b.cores, b.label) == ((2, 3), (6, 7), "threads 2, cores 6,7")
    # More threads than cores: no pinning (they would overlap), the count as asked.
    (c, *_) = hosts.replica_shares(3, "cpu", gpus=None, threads=4, cpus=list(range(8)))
    assert c.args == ("--threads", "4", "--threads-batch", "4") and c.cores == ()
    # Where threads cannot be pinned (macOS), only the split.
    (d, _) = hosts.replica_shares(2, "cpu", gpus=None, threads=None, cpus=list(range(8)), pin=False)
    assert d.cores == ()


def test_gpu_replicas_get_one_device_each_in_turn():
    shares = hosts.replica_shares(3, "cuda", gpus=["0", "1"], threads=None, cpus=list(range(8)))
    assert [s.env for s in shares] == [
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"CUDA_VISIBLE_DEVICES": "1"},
        {"CUDA_VISIBLE_DEVICES": "0"},
    ]
    assert hosts.replica_shares(1, "vulkan", gpus=["1"], threads=None, cpus=list(range(8)))[0].env == {
        "GGML_VK_VISIBLE_DEVICES": "1"
    }
    with pytest.raises(BonsaiError, match="--gpus=0"):
        hosts.replica_shares(1, "cpu", gpus=["0"], threads=None, cpus=list(range(8)))
    with pytest.raises(BonsaiError, match="give one of them"):
        hosts.replica_shares(2, "cuda", gpus=["0"], threads=2, cpus=list(range(8)))
    with pytest.raises(BonsaiError, match="--gpus='0,x'"):
        hosts.parse_gpus("0,x")


# -- export -----------------------------------------------------------------------------------------------


def _flags(argv: tuple[str, ...]) -> list[str]:
    return [a for a in argv if a.startswith("--")]


def test_vllm_export_uses_documented_flags_and_block_size():
    e = export.build_export("vllm", "ternary-27b", speculative=True)
    assert e.argv[:3] == ("vllm", "serve", "prism-ml/Ternary-Bonsai-27B-AWQ-4bit")
    assert set(_flags(e.argv)) <= set(export.VLLM_FLAGS)
    spec = json.loads(e.argv[e.argv.index("--speculative-config") + 1])
    assert set(spec) <= set(export.VLLM_SPEC_KEYS) and spec["method"] in export.VLLM_METHODS
    # DSpark: at least the drafter's block size, or vLLM refuses it.
    assert spec == {"method": "dspark", "model": "Rahim/Ternary-Bonsai-27B-dspark", "num_speculative_tokens": 4}
    assert e.to_json()["experimental"] is True and "GB" in e.memory and "GGUF" in e.memory


def test_sglang_export_uses_documented_flags():
    e = export.build_export("sglang", "bonsai-8b", speculative=True, max_model_len=8192)
    assert e.argv[:3] == ("python", "-m", "sglang.launch_server")
    assert set(_flags(e.argv)) <= set(export.SGLANG_FLAGS)
    assert e.argv[e.argv.index("--speculative-algorithm") + 1] in export.SGLANG_ALGORITHMS
    assert e.argv[e.argv.index("--speculative-draft-model-path") + 1] == "deepseek-ai/dspark_qwen3_8b_block7"
    assert e.argv[e.argv.index("--model-path") + 1] == "prism-ml/Bonsai-8B-AWQ-4-bit"


def test_export_without_speculation_and_unpacked_27b():
    e = export.build_export("vllm", "bonsai-27b", speculative=False, unpacked=True)
    assert "--speculative-config" not in e.argv and e.argv[2] == "prism-ml/Bonsai-27B-unpacked"
    assert e.checkpoint.weights_gb == 54.0


@pytest.mark.parametrize(
    "engine, profile, spec, words",
    [
        ("tgi", "bonsai-8b", False, "--engine='tgi'"),
        ("vllm", "demo", False, "no vLLM/SGLang checkpoint"),
        ("vllm", "bonsai2-27b", False, "Bonsai 2"),
        ("vllm", "bonsai-1.7b", True, "no safetensors drafter"),
    ],
)
def test_export_refusals_say_what_to_do(engine, profile, spec, words):
    with pytest.raises(BonsaiError) as err:
        export.build_export(engine, profile, speculative=spec)
    assert words in str(err.value) and err.value.fix


def test_export_cli_prints_the_command_and_warns(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bonsai_launch",
            "export",
            "--engine",
            "vllm",
            "--profile",
            "bonsai-8b",
            "--speculative",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("vllm serve prism-ml/Bonsai-8B-AWQ-4-bit ")
    assert "experimental" in done.stderr and "GGUF" in done.stderr


# -- without the extra ---------------------------------------------------------------------------------


def test_fleet_without_litellm_says_how_to_install_it(tmp_path):
    """A `litellm` package without its proxy stands in for a missing install: the command
    names the extra and starts nothing."""
    fake = tmp_path / "shadow" / "litellm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shadow")}
    done = subprocess.run(
        [sys.executable, "-m", "bonsai_launch", "fleet", "up", "--profile", "demo"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'bonsai-launch[fleet]'" in done.stderr and "LiteLLM" in done.stderr
    assert not (Path(os.environ["BONSAI_HOME"]) / "logs").exists()  # nothing was started


@pytest.mark.slow  # needs the `fleet` extra, which the fast CI lane lacks
def test_require_litellm_finds_the_installed_proxy():
    require_litellm()
    assert Path(proxy.require_litellm()).is_file()


def test_proxy_latency_report_pairs_the_two_paths():
    from bonsai_launch.fleet.latency import ProxyLatency

    lat = ProxyLatency(4, [10.0, 12.0, 11.0, 30.0], [15.0, 16.0, 18.0, 33.0])
    data = lat.to_json()
    assert data["added_median_ms"] == 4.5  # median of 5, 4, 7, 3
    assert data["direct_median_ms"] == 11.5 and data["proxied_p90_ms"] == 33.0


def test_running_fleet_refuses_a_different_ask(monkeypatch):
    from bonsai_launch.fleet import service
    from bonsai_launch.fleet.members import UpOptions
    from bonsai_launch.fleet.state import FleetState, MemberState

    st = FleetState(
        "demo",
        "demo",
        [MemberState("replica-1", "http://127.0.0.1:1", True)],
        None,
        None,
        [{"name": "replica-2", "url": "http://127.0.0.1:2", "why": "died"}],
    )
    service._refuse_a_different_fleet(st, UpOptions(flags={}, replicas=None))
    service._refuse_a_different_fleet(st, UpOptions(flags={"profile": "demo"}, replicas=2))
    for opts in (
        UpOptions(flags={"profile": "bonsai-8b"}, replicas=None),
        UpOptions(flags={}, replicas=3),
    ):
        with pytest.raises(BonsaiError, match="fleet down"):
            service._refuse_a_different_fleet(st, opts)


def test_remote_member_without_its_key_is_left_out_with_the_reason(monkeypatch):
    from bonsai_launch.fleet import service
    from bonsai_launch.fleet.members import UpOptions
    from bonsai_launch.fleet.state import MemberState

    monkeypatch.delenv("GPU_BOX_KEY", raising=False)
    m = MemberState("gpu-box", "http://127.0.0.1:9", False, api_key_env="GPU_BOX_KEY")
    opts = UpOptions(flags={}, replicas=None, remote_wait_s=0)
    started: list = []
    excluded: list = []
    lines = service._check_remote([m], opts, started, excluded, lambda _: None)
    assert lines == ["gpu-box (http://127.0.0.1:9): its key variable GPU_BOX_KEY is not set"]
    assert not started and excluded == [
        {"name": "gpu-box", "url": "http://127.0.0.1:9", "why": "its key variable GPU_BOX_KEY is not set"}
    ]
    monkeypatch.setenv("GPU_BOX_KEY", "k")
    excluded.clear()
    lines = service._check_remote([m], opts, started, excluded, lambda _: None)
    assert not started and len(lines) == 1 and lines[0].startswith("gpu-box (http://127.0.0.1:9): unreachable")


def test_master_key_is_bonsai_api_key_or_generated(monkeypatch):
    from bonsai_launch.fleet import service

    monkeypatch.setenv("BONSAI_API_KEY", "team-key")
    assert service._master_key() == ("team-key", "BONSAI_API_KEY")
    monkeypatch.delenv("BONSAI_API_KEY")
    key, source = service._master_key()
    assert source == "generated" and key.startswith("sk-") and len(key) > 30 and key != service._master_key()[0]
