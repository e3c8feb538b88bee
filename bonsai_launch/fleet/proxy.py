"""The LiteLLM proxy process: find it, spawn it on loopback, wait until it answers, stop it.

It runs detached (its own process group, outliving `bonsai fleet up`), like a detached
`bonsai start`; its pid and creation time are kept so a reused pid is never signalled.
The master key reaches it through the environment only.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.fleet.configs import MASTER_KEY_ENV
from bonsai_launch.fleet.state import ProxyState
from bonsai_launch.server.process import ServerProcess

INSTALL_HINT = (
    "pip install 'bonsai-launch[fleet]' (in a checkout: pip install -e '.[fleet]'); "
    "it installs the LiteLLM proxy, litellm[proxy]"
)
READY_TIMEOUT = 180.0  # the proxy imports a lot: ~10 s on an idle 2-core machine


def require_litellm() -> str:
    """The `litellm` proxy command, or a clear error saying how to install it."""
    import importlib.util

    # find_spec of the top-level name only: "litellm.proxy" would import litellm itself (seconds,
    # and a network fetch of its cost map); the proxy's folder is looked up on disk instead.
    spec = importlib.util.find_spec("litellm")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    missing = not any((Path(f) / "proxy" / "proxy_server.py").is_file() for f in folders)
    exe = Path(sys.executable).with_name("litellm.exe" if sys.platform == "win32" else "litellm")
    if not missing and not exe.is_file():
        found = shutil.which("litellm")
        exe = Path(found) if found else exe
    if missing or not exe.is_file():
        raise BonsaiError("bonsai fleet needs the LiteLLM proxy, which is not installed", INSTALL_HINT)
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:  # the [proxy] extra
        raise BonsaiError(
            "the LiteLLM proxy's server parts are missing (litellm without its [proxy] extra)", INSTALL_HINT
        ) from None
    return str(exe)


def proxy_env(master_key: str) -> dict[str, str]:
    return {
        MASTER_KEY_ENV: master_key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # offline: no cost map download at start
        "LITELLM_TELEMETRY": "False",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def spawn(exe: str, config: Path, port: int, master_key: str, log_path: Path, host: str = "127.0.0.1") -> ServerProcess:
    argv = [exe, "--config", str(config), "--host", host, "--port", str(port), "--num_workers", "1"]
    return ServerProcess.spawn(
        argv, env=proxy_env(master_key), log_path=log_path, base_url=f"http://{host}:{port}", die_with_parent=False
    )


def wait_ready(server: ServerProcess, timeout: float = READY_TIMEOUT) -> None:
    """Until /health/liveliness answers 200 (no key needed); the log tail if it dies first."""
    import httpx

    from bonsai_launch.server.client import session

    deadline = time.monotonic() + timeout
    with session(None, 2.0) as http:
        while True:
            code = server.returncode
            if code is not None:
                tail = "\n".join("  " + line for line in server.log_tail(20))
                raise ActionFailed(
                    f"the LiteLLM proxy exited with code {code} while starting; last log lines:\n{tail}",
                    f"full log: {server.log_path}",
                )
            try:
                if http.get(server.base_url + "/health/liveliness").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ActionFailed(
                    f"the LiteLLM proxy did not answer within {timeout:.0f} s", f"see its log {server.log_path}"
                )
            time.sleep(0.2)


def _process(state: ProxyState):
    import psutil

    try:
        proc = psutil.Process(state.pid)
        if proc.status() == psutil.STATUS_ZOMBIE or abs(proc.create_time() - state.create_time) > 1.0:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def alive(state: ProxyState | None) -> bool:
    return state is not None and _process(state) is not None


def stop(state: ProxyState, timeout: float = 15.0) -> bool:
    """Ask its group to stop, wait, then end it for certain (process_control, per system).
    True when nothing of it is left."""
    import psutil

    from bonsai_launch.core import process_control

    proc = _process(state)
    if proc is None:
        return True
    group = [proc, *proc.children(recursive=True)]
    control = process_control.current()
    if control.request_stop(state.pid, shares_console=False):  # not started in this console
        _, left = psutil.wait_procs(group, timeout=timeout)
    else:
        left = group
    if left:
        control.force_stop(state.pid)
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        _, left = psutil.wait_procs(left, timeout=5)
    control.end_leftovers(state.pid)
    return not left
