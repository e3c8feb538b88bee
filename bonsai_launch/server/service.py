"""`bonsai service`: install, uninstall and report a login service that runs `bonsai start`.

The files come from `server/service_files.py`; this module puts them in the user's own folders
and asks the user's service manager to take them: systemd's user instance (Linux), launchd's
GUI domain (macOS), Task Scheduler (Windows). Nothing is written outside the user's folders and
nothing needs administrator rights. Where the manager cannot be reached (no user systemd, as in
a container), the file is still written and the result says the one command that enables it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.server import service_files
from bonsai_launch.server.service_files import ServiceSpec

Run = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(list(argv), 127, "", str(exc))


def kind(platform: str | None = None) -> str:
    platform = platform or sys.platform
    if platform == "win32":
        return "task"
    return "launchd" if platform == "darwin" else "systemd"


def file_path(spec: ServiceSpec, platform: str | None = None, env: Mapping[str, str] | None = None) -> Path:
    """Where the service file goes: always under the user's home (or XDG_CONFIG_HOME)."""
    env = os.environ if env is None else env
    which = kind(platform)
    if which == "systemd":
        xdg = env.get("XDG_CONFIG_HOME", "").strip()
        base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
        return base / "systemd" / "user" / spec.unit_name
    if which == "launchd":
        return Path.home() / "Library" / "LaunchAgents" / f"{spec.label}.plist"
    from bonsai_launch.core.paths import bonsai_home

    return bonsai_home() / "service" / f"{spec.task_name}.xml"


def log_file(name: str) -> Path:
    """bonsai start's own output, where the manager keeps no journal (launchd, Task Scheduler)."""
    from bonsai_launch.core.paths import logs_dir

    return logs_dir() / f"service-{name}.log"


def make_spec(
    name: str,
    argv: Sequence[str],
    environ: Mapping[str, str],
    platform: str | None = None,
) -> ServiceSpec:
    """The service for `argv`, keeping the BONSAI_* settings of `environ` (the registry's names
    only), so that the service starts as `bonsai start` would in this shell."""
    from bonsai_launch.config.settings import SETTINGS

    names = {s.env for s in SETTINGS}
    env = tuple(sorted((k, v) for k, v in environ.items() if k in names))
    log = "" if kind(platform) == "systemd" else str(log_file(name))
    return ServiceSpec(service_files.check_name(name), tuple(argv), env, log)


def render(spec: ServiceSpec, platform: str | None = None, user: str | None = None) -> bytes:
    which = kind(platform)
    if which == "systemd":
        return service_files.systemd_unit(spec).encode()
    if which == "launchd":
        return service_files.launchd_plist(spec)
    user = user or os.environ.get("USERNAME") or os.environ.get("USER") or "user"
    domain = os.environ.get("USERDOMAIN")
    return service_files.task_xml(spec, f"{domain}\\{user}" if domain else user).encode("utf-16")


@dataclass
class Result:
    """What install, uninstall or status did and found, for people and for --json."""

    name: str
    kind: str
    path: str
    installed: bool
    manager: bool = False  # the service manager was reached
    enabled: bool | None = None
    running: bool | None = None
    logs: list[str] = field(default_factory=list)
    next_step: str | None = None  # the one command left to the user
    done: list[str] = field(default_factory=list)  # commands run, in order

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _logs(spec: ServiceSpec, which: str) -> list[str]:
    from bonsai_launch.core.paths import logs_dir

    own = f"journalctl --user -u {spec.unit_name}" if which == "systemd" else spec.log_path or str(log_file(spec.name))
    return [own, f"{logs_dir()} (llama-server's log, `bonsai logs`)"]


def _manager_commands(spec: ServiceSpec, which: str, path: Path, action: str) -> list[list[str]]:
    uid = str(os.getuid()) if hasattr(os, "getuid") else ""
    table = {
        ("systemd", "install"): [
            ["systemctl", "--user", "daemon-reload"],
            ["systemctl", "--user", "enable", spec.unit_name],
        ],
        ("systemd", "uninstall"): [
            ["systemctl", "--user", "disable", "--now", spec.unit_name],
            ["systemctl", "--user", "daemon-reload"],
        ],
        ("launchd", "install"): [["launchctl", "bootstrap", f"gui/{uid}", str(path)]],
        ("launchd", "uninstall"): [["launchctl", "bootout", f"gui/{uid}/{spec.label}"]],
        ("task", "install"): [["schtasks", "/Create", "/TN", spec.task_name, "/XML", str(path), "/F"]],
        ("task", "uninstall"): [["schtasks", "/Delete", "/TN", spec.task_name, "/F"]],
    }
    return table[(which, action)]


def reachable(which: str, run: Run = _run) -> bool:
    """Whether the user's service manager answers (a user systemd needs a login session)."""
    probe = {
        "systemd": ["systemctl", "--user", "show-environment"],
        "launchd": ["launchctl", "print", f"gui/{os.getuid() if hasattr(os, 'getuid') else 0}"],
        "task": ["schtasks", "/Query", "/TN", "\\"],
    }[which]
    if shutil.which(probe[0]) is None:
        return False
    return run(probe).returncode == 0


def _joined(commands: list[list[str]]) -> str:
    from bonsai_launch.core.shell import render_command

    return " && ".join(render_command(c) for c in commands)


def install(spec: ServiceSpec, platform: str | None = None, run: Run = _run, path: Path | None = None) -> Result:
    """Write the service file (replacing an older one) and hand it to the manager when it answers."""
    from bonsai_launch.core.errors import ActionFailed

    which = kind(platform)
    path = path or file_path(spec, platform)
    path.parent.mkdir(parents=True, exist_ok=True)
    if spec.log_path:
        Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(render(spec, platform))
    if spec.env and hasattr(os, "chmod"):
        os.chmod(tmp, 0o600)  # it may hold BONSAI_API_KEY: readable by the user alone
    os.replace(tmp, path)
    result = Result(spec.name, which, str(path), True, logs=_logs(spec, which))
    commands = _manager_commands(spec, which, path, "install")
    if not reachable(which, run):
        result.next_step = f"no {_manager_word(which)} answers here; to enable it at login: {_joined(commands)}"
        return result
    result.manager = True
    if which == "launchd":  # an agent loaded before (an older install) must go first, or bootstrap fails
        run(_manager_commands(spec, which, path, "uninstall")[0])
    for argv in commands:
        done = run(argv)
        result.done.append(" ".join(argv))
        if done.returncode != 0:
            raise ActionFailed(
                f"`{' '.join(argv)}` failed: {(done.stderr or done.stdout).strip()}",
                f"the file is written ({path}); fix the error and run: {_joined(commands)}",
            )
    result.enabled = True
    if which == "systemd":
        result.next_step = f"starts at your next login; now: systemctl --user start {spec.unit_name}"
    return result


def uninstall(spec: ServiceSpec, platform: str | None = None, run: Run = _run, path: Path | None = None) -> Result:
    """Stop and unregister the service where the manager answers, then remove its file."""
    which = kind(platform)
    path = path or file_path(spec, platform)
    result = Result(spec.name, which, str(path), False, logs=_logs(spec, which))
    commands = _manager_commands(spec, which, path, "uninstall")
    if path.exists() and reachable(which, run):
        result.manager = True
        if which == "systemd":  # disable first; daemon-reload once the file is gone
            commands = commands[:1]
        for argv in commands:
            run(argv)  # a service that was never enabled is not an error
            result.done.append(" ".join(argv))
    existed = path.exists()
    path.unlink(missing_ok=True)
    if result.manager and which == "systemd":
        run(["systemctl", "--user", "daemon-reload"])
        result.done.append("systemctl --user daemon-reload")
    if not existed:
        result.next_step = f"nothing to remove: {path} does not exist"
    return result


def status(spec: ServiceSpec, platform: str | None = None, run: Run = _run, path: Path | None = None) -> Result:
    """Installed (the file), enabled and running (the manager, else bonsai's own instances)."""
    which = kind(platform)
    path = path or file_path(spec, platform)
    result = Result(spec.name, which, str(path), path.exists(), logs=_logs(spec, which))
    if reachable(which, run):
        result.manager = True
        if which == "systemd":
            result.enabled = run(["systemctl", "--user", "is-enabled", spec.unit_name]).returncode == 0
            result.running = run(["systemctl", "--user", "is-active", spec.unit_name]).returncode == 0
        elif which == "launchd":
            uid = os.getuid() if hasattr(os, "getuid") else 0
            shown = run(["launchctl", "print", f"gui/{uid}/{spec.label}"])
            result.enabled = shown.returncode == 0
            result.running = shown.returncode == 0 and "state = running" in shown.stdout
        else:
            shown = run(["schtasks", "/Query", "/TN", spec.task_name, "/FO", "LIST"])
            result.enabled = shown.returncode == 0
            result.running = shown.returncode == 0 and "Running" in shown.stdout
    if result.running is None:
        result.running = _served_by_bonsai(spec)
    return result


def _served_by_bonsai(spec: ServiceSpec) -> bool:
    """Without the manager: whether a server bonsai knows runs under a `bonsai start` of this argv."""
    from bonsai_launch.server import instances

    profiles = {spec.name, _profile_of(spec.argv)}
    return any(i.supervisor_pid and not i.detached and i.profile in profiles for i in instances.running())


def _profile_of(argv: Sequence[str]) -> str | None:
    words = list(argv)
    for flag in ("--profile", "-p"):
        if flag in words and words.index(flag) + 1 < len(words):
            return words[words.index(flag) + 1]
    return None


def _manager_word(which: str) -> str:
    return {"systemd": "user systemd", "launchd": "launchd", "task": "Task Scheduler"}[which]
