"""The router configurations a fleet writes: LiteLLM proxy (run by `bonsai fleet up`) and
llama-swap (written beside it for users who run llama-swap instead). Pure: members in, dicts out.

LiteLLM: one `model_name` shared by every member, one `api_base` each, so the router
load-balances them; `least-busy` sends a request to the member with the fewest in flight,
failed calls are retried on another member and a failing member is cooled down. Background
health checks take a member out of the pool before a user request hits it
(docs.litellm.ai: proxy/load_balancing, routing, proxy/health_check_routing).
llama-swap: its documented keys only (mostlygeek/llama-swap docs/config.example.yaml); it
cannot be installed from our registries, so the file is checked, never run.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

# How the proxy treats members. A member that fails once is cooled down for COOLDOWN_S. LiteLLM
# (1.103) retries a 500 at once and may pick the same member again: least-busy sees a dead
# member as idle, and the cooldown is recorded by a failure callback that can run after the
# retry. Enough immediate retries outlast that race (each one to a dead member fails in
# milliseconds); the background health check takes the member out within seconds.
# Measured across network hosts (tests/test_fleet_hosts.py, docs/serving-a-team.md "Faults,
# measured"; 3 runs on a loaded 2-core machine, 0 requests lost in each): a killed member is out
# of the pool in 3.5-7 s, a hung one or one whose link dropped in 11-15 s (interval + check
# timeout), a recovered one back in 1-5 s. Those times come from these settings, not the CPU.
NUM_RETRIES = 8
ALLOWED_FAILS = 0
# Longer than the slowest verdict (interval + check timeout = 15 s), so a member that failed a
# request is judged by at least one health check before it can be picked again: no flapping.
COOLDOWN_S = 30
# Each check is one 1-token request per member; every 5 s costs nothing measurable and bounds
# how long a dead member stays in the pool (the retries cover requests in that window).
HEALTH_CHECK_INTERVAL_S = 5
# One background check asks each member for 1 token. LiteLLM waits 60 s for it by default, and
# the checks of all members are gathered: one hung member (SIGSTOP: connections accepted, no
# answer) would freeze every member's verdict for a minute. A loaded CPU member answers 1 token
# in well under 2 s (tests/test_fleet_hosts.py), so 10 s is generous and a hung member leaves
# the pool within interval + 10 s.
HEALTH_CHECK_TIMEOUT_S = 10
# How long one request may take. Long answers on a CPU member legitimately take minutes, so the
# default is long; a hung member or a dropped link then holds the requests already sent to it
# this long before they are retried elsewhere. A fleet file can set `timeout` per member.
REQUEST_TIMEOUT_S = 600
MASTER_KEY_ENV = "LITELLM_MASTER_KEY"  # the proxy reads the key from its environment, never from the file


@dataclass(frozen=True)
class Member:
    """One llama-server behind the proxy: a local replica or a remote host."""

    name: str
    url: str  # base URL without /v1
    local: bool
    api_key_env: str | None = None  # the variable holding its key (remote members, keyed replicas)
    argv: tuple[str, ...] = ()  # local replicas: the llama-server command line
    env: dict[str, str] = field(default_factory=dict)  # local replicas: device selection
    parallel: int = 1  # slots: requests it serves at once
    timeout: float | None = None  # seconds one request to it may take (None: REQUEST_TIMEOUT_S)

    def to_json(self) -> dict:
        return {"name": self.name, "url": self.url, "local": self.local, "api_key_env": self.api_key_env}


def litellm_config(model: str, members: list[Member]) -> dict:
    """The proxy's config.yaml as a dict. Every member is an OpenAI-compatible deployment of
    `model`; the master key comes from the environment (os.environ/...)."""
    model_list = []
    for m in members:
        params: dict = {
            "model": f"openai/{model}",
            "api_base": m.url.rstrip("/") + "/v1",
            "api_key": f"os.environ/{m.api_key_env}" if m.api_key_env else "none",
            "timeout": m.timeout or REQUEST_TIMEOUT_S,
        }
        # No max_parallel_requests: LiteLLM answers 429 past it, while llama-server queues
        # requests beyond its slots itself; least-busy already prefers the idlest member.
        model_list.append(
            {
                "model_name": model,
                "litellm_params": params,
                "model_info": {
                    "id": m.name,
                    "mode": "chat",
                    "health_check_max_tokens": 1,
                    "health_check_timeout": HEALTH_CHECK_TIMEOUT_S,
                },
            }
        )
    return {
        "model_list": model_list,
        "router_settings": {
            "routing_strategy": "least-busy",
            "num_retries": NUM_RETRIES,
            "allowed_fails": ALLOWED_FAILS,
            "cooldown_time": COOLDOWN_S,
            "retry_after": 0,
            "enable_health_check_routing": True,
        },
        "litellm_settings": {
            "num_retries": NUM_RETRIES,
            "request_timeout": REQUEST_TIMEOUT_S,
            "drop_params": True,
            "telemetry": False,
        },
        "general_settings": {
            "master_key": f"os.environ/{MASTER_KEY_ENV}",
            "background_health_checks": True,
            "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        },
    }


# -- llama-swap ----------------------------------------------------------------------------------

LLAMA_SWAP_TOP_KEYS = frozenset(
    {
        "healthCheckTimeout",
        "logLevel",
        "logTimeFormat",
        "logToStdout",
        "store",
        "metricsMaxInMemory",
        "captureBuffer",
        "ui",
        "performance",
        "startPort",
        "sendLoadingState",
        "includeAliasesInList",
        "globalTTL",
        "unloadTimeout",
        "macros",
        "apiKeys",
        "tailcat",
        "upstream",
        "profiles",
        "selectors",
        "models",
        "hooks",
        "routing",
        "peers",
    }
)
LLAMA_SWAP_MODEL_KEYS = frozenset(
    {
        "macros",
        "cmd",
        "name",
        "description",
        "env",
        "proxy",
        "checkEndpoint",
        "ttl",
        "unloadTimeout",
        "compat",
        "useModelName",
        "filters",
        "aliases",
        "metadata",
        "concurrencyLimit",
        "sendLoadingState",
        "timeouts",
        "capabilities",
        "unlisted",
        "cmdStop",
    }
)
LLAMA_SWAP_SELECTOR_KEYS = frozenset({"strategy", "targets", "name", "description", "metadata", "settings"})
LLAMA_SWAP_SELECTOR_STRATEGIES = frozenset({"warm", "pin", "spillover"})
LLAMA_SWAP_PEER_KEYS = frozenset({"proxy", "models", "apiKey", "timeouts", "filters", "tailcatKey"})


def llama_swap_config(model: str, members: list[Member], api_key_env: str | None = "BONSAI_API_KEY") -> dict:
    """A llama-swap config serving the same fleet: each local replica is a model whose `cmd` is
    its llama-server command line (llama-swap starts it), each remote member a peer, and one
    `spillover` selector named `model` fills a replica to its slot count before using the next."""
    models: dict = {}
    peers: dict = {}
    targets: list[str] = []
    for m in members:
        if m.local:
            entry: dict = {
                "cmd": shlex.join(m.argv),
                "proxy": m.url,
                "checkEndpoint": "/health",
                "ttl": 0,
                "unlisted": True,
            }
            if m.env:
                entry["env"] = [f"{k}={v}" for k, v in sorted(m.env.items())]
            models[m.name] = entry
            targets.append(m.name)
        else:
            peer: dict = {"proxy": m.url, "models": [model]}
            if m.api_key_env:
                peer["apiKey"] = "${env.%s}" % m.api_key_env  # noqa: UP031 - braces would need doubling
            peers[m.name] = peer
            targets.append(f"{m.name}/{model}")
    config: dict = {
        "healthCheckTimeout": 600,
        "models": models,
        "selectors": {
            model: {
                "strategy": "spillover",
                "targets": targets,
                "settings": {"spillover": max([m.parallel for m in members] or [1])},
            }
        },
    }
    if peers:
        config["peers"] = peers
    if api_key_env:
        config["apiKeys"] = ["${env.%s}" % api_key_env]  # noqa: UP031 - braces would need doubling
    # llama-swap starts every model it routes to; preload them so the pool is warm.
    if models:
        config["hooks"] = {"on_startup": {"preload": list(models)}}
    return config


def llama_swap_problems(config: dict) -> list[str]:
    """Keys and values not in llama-swap's documented configuration (empty when it is clean)."""
    problems = [f"unknown top-level key {k!r}" for k in config if k not in LLAMA_SWAP_TOP_KEYS]
    models = config.get("models") or {}
    if not isinstance(models, dict):
        return problems + ["models must be a mapping"]
    for name, entry in models.items():
        problems += [f"models.{name}: unknown key {k!r}" for k in entry if k not in LLAMA_SWAP_MODEL_KEYS]
        if "cmd" not in entry:
            problems.append(f"models.{name}: cmd is required")
    peers = config.get("peers") or {}
    for name, peer in peers.items():
        problems += [f"peers.{name}: unknown key {k!r}" for k in peer if k not in LLAMA_SWAP_PEER_KEYS]
        problems += [f"peers.{name}: {k} is required" for k in ("proxy", "models") if k not in peer]
    known_ids = set(models) | {f"{p}/{m}" for p, peer in peers.items() for m in peer.get("models", [])}
    for name, sel in (config.get("selectors") or {}).items():
        problems += [f"selectors.{name}: unknown key {k!r}" for k in sel if k not in LLAMA_SWAP_SELECTOR_KEYS]
        if sel.get("strategy") not in LLAMA_SWAP_SELECTOR_STRATEGIES:
            problems.append(f"selectors.{name}: strategy {sel.get('strategy')!r} is not warm, pin or spillover")
        if name in models:
            problems.append(f"selectors.{name}: a selector ID cannot be a model ID")
        problems += [
            f"selectors.{name}: target {t!r} is not a model or peer model"
            for t in sel.get("targets", [])
            if t not in known_ids
        ]
        settings = sel.get("settings") or {}
        problems += [f"selectors.{name}.settings: unknown key {k!r}" for k in settings if k != "spillover"]
    preload = ((config.get("hooks") or {}).get("on_startup") or {}).get("preload") or []
    problems += [f"hooks.on_startup.preload: {p!r} is not a model" for p in preload if p not in models]
    return problems
