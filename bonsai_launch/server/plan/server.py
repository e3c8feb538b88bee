"""The process half of a plan: where llama-server listens, its key, and the flags that belong to
the process whatever model it serves (/metrics, its log level, idle sleep). `bonsai start` and
`bonsai serve` (a router hosting many models) plan it the same way, from the settings alone."""

from __future__ import annotations

from bonsai_launch.config.settings import Settings
from bonsai_launch.llamacpp.capabilities import Capabilities, require_flag
from bonsai_launch.server.plan.host import check_host, is_loopback
from bonsai_launch.server.plan.types import Reason, ServerPlan

METRICS_WHY = "expose /metrics so `bonsai verify` and `bonsai bench` can read speculative counters"


def setting_why(s: Settings, key: str, default_why: str) -> str:
    return {
        "passthrough": "from the arguments after --",
        "flag": "set by flag",
        "env": "set by environment",
        "profile": "set by the profile",
    }.get(s.source(key), default_why)


def plan_server(s: Settings, binary: str, caps: Capabilities | None) -> ServerPlan:
    """The ServerPlan for settings `s` (owned options after -- already folded in)."""
    check_host(s)
    host, port = s["host"], s["port"]
    env: dict[str, str] = {}
    reasons: list[Reason] = []
    if s.get("api_key"):
        # Enforced whatever the host (loopback is shared by every user of the machine); through
        # the environment, so the key never shows in `ps` output.
        env["LLAMA_API_KEY"] = s["api_key"]
        reasons.append(
            Reason("LLAMA_API_KEY", "***", f"an API key is required ({setting_why(s, 'api_key', 'generated')})")
        )
    reasons.append(
        Reason(
            "--host",
            host,
            ("loopback only" if is_loopback(host) else "BONSAI_ALLOW_REMOTE=1")
            + f" ({setting_why(s, 'host', 'default')})",
        )
    )
    source = s.source("port")
    reasons.append(
        Reason("--port", str(port), f"from {source}" if source != "passthrough" else "from the arguments after --")
    )
    sleep = s.get("sleep_idle_seconds") or None
    if sleep:
        require_flag(caps, "--sleep-idle-seconds", "BONSAI_SLEEP_IDLE_SECONDS")
        reasons.append(
            Reason(
                "--sleep-idle-seconds",
                str(sleep),
                f"BONSAI_SLEEP_IDLE_SECONDS ({s.source('sleep_idle_seconds')}): unload the model when idle",
            )
        )
    if s["verbose"]:
        reasons.append(Reason("--verbose", "", "BONSAI_LLAMA_VERBOSE=1"))
    reasons.append(Reason("--metrics", "", METRICS_WHY))
    return ServerPlan(
        binary=binary,
        host=host,
        port=port,
        env=env,
        reasons=tuple(reasons),
        sleep_idle_seconds=sleep,
        verbose=bool(s["verbose"]),
        metrics=True,
    )
