"""The text of a login service that runs `bonsai start` in the foreground: a systemd user unit
(Linux), a launchd agent (macOS), a Task Scheduler task started at logon (Windows). Pure: no
disk, no processes; `server/service.py` writes and registers what this returns.

The service runs `bonsai start` itself, never `--detach`: bonsai's restart keeper restarts a
llama-server that dies, its logs and `bonsai ps` work as they do in a terminal, and a stop from
the service manager is the SIGTERM (or Ctrl+Break) that `bonsai start` turns into a clean stop
with exit 0. The manager restarts only `bonsai start` itself when it fails (a crash loop bonsai
gave up on, a missing model), slowly and a few times, since bonsai already retried.
"""

from __future__ import annotations

import plistlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

from bonsai_launch.core.errors import BonsaiError

# Launch flags (settings keys, as LaunchOptions.flags and start's own options name them) and the
# `bonsai start` option that gives each back.
_VALUE_OPTIONS = {
    "profile": "--profile",
    "family": "--family",
    "size": "--size",
    "spec_type": "--spec-type",
    "spec_nmax": "--spec-nmax",
    "ctx": "--ctx",
    "ngl": "--ngl",
    "parallel": "--parallel",
    "host": "--host",
    "port": "--port",
    "mmproj": "--mmproj",
    "models_max": "--models-max",  # serve's
    "idle_unload": "--idle-unload",
    "pin": "--pin",
    "preload": "--preload",
}
_BOOL_OPTIONS = {"speculative": ("--speculative", "--no-speculative"), "kv4": ("--kv4", "--no-kv4")}

RESTART_DELAY_S = 30  # after bonsai start itself failed: bonsai's keeper already retried the server
RESTART_BURST = 3  # starts within RESTART_WINDOW_S before the manager gives up
RESTART_WINDOW_S = 600
STOP_TIMEOUT_S = 30  # bonsai start stops llama-server within its own 10 s, then exits


@dataclass(frozen=True)
class ServiceSpec:
    """What one login service runs: `argv` (absolute interpreter first), the BONSAI_* environment
    it keeps, and where its own output goes where the manager has no journal."""

    name: str  # `demo`: unit bonsai-demo.service, agent ai.bonsai.demo, task bonsai-demo
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    log_path: str = ""  # launchd and Task Scheduler: bonsai start's stdout and stderr

    @property
    def unit_name(self) -> str:
        return f"bonsai-{self.name}.service"

    @property
    def label(self) -> str:
        return f"ai.bonsai.{self.name}"

    @property
    def task_name(self) -> str:
        return f"bonsai-{self.name}"


def check_name(name: str) -> str:
    """A service name is part of a file name, a unit name and a launchd label."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        raise BonsaiError(
            f"service name {name!r} is not allowed",
            "use letters, digits, '.', '_' or '-' (64 at most), e.g. --name demo",
        )
    return name


def start_argv(
    interpreter: str,
    flags: Mapping[str, object],
    *,
    model: str | None = None,
    drafter: str | None = None,
    spec_fallback: bool = False,
    passthrough: Sequence[str] = (),
) -> tuple[str, ...]:
    """`INTERPRETER -m bonsai_launch start ...`: the options the user gave, spelled as start spells
    them (flags None are not given and left to the environment and the profile)."""
    argv = [interpreter, "-m", "bonsai_launch", "start"]
    for key, option in _VALUE_OPTIONS.items():
        if flags.get(key) is not None:
            argv += [option, str(flags[key])]
    for key, (on, off) in _BOOL_OPTIONS.items():
        value = flags.get(key)
        if value == "auto":
            argv += ["--speculative", "auto"]
        elif value is not None:
            argv.append(on if value else off)
    if model:
        argv += ["--model", model]
    if drafter:
        argv += ["--drafter", drafter]
    if spec_fallback:
        argv.append("--spec-fallback")
    if passthrough:
        argv += ["--", *passthrough]
    return tuple(argv)


def serve_argv(
    interpreter: str, models: Sequence[str], flags: Mapping[str, object], passthrough: Sequence[str] = ()
) -> tuple[str, ...]:
    """`INTERPRETER -m bonsai_launch serve MODELS ...`: the models as absolute paths where they are
    files or folders (the manager starts it elsewhere), the options as serve spells them."""
    argv = list(start_argv(interpreter, flags, passthrough=passthrough))
    argv[3] = "serve"
    return (*argv[:4], *(absolute_source(m) for m in models), *argv[4:])


def absolute_source(word: str) -> str:
    """`chat=./a.gguf+./d.gguf` -> `chat=/abs/a.gguf+/abs/d.gguf`; a profile name stays as it is."""
    from pathlib import Path

    name, eq, rest = word.partition("=")
    if not eq or "/" in name:
        name, rest = "", word
    parts = [str(Path(p).absolute()) if Path(p).expanduser().exists() else p for p in rest.split("+")]
    return (f"{name}=" if name else "") + "+".join(parts)


def _systemd_quote(word: str) -> str:
    """One ExecStart word: quoted when it has to be, `%` and `$` kept from systemd's expansion."""
    word = word.replace("%", "%%").replace("$", "$$")
    if word and not re.search(r"[\s\"'\\;]", word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_unit(spec: ServiceSpec) -> str:
    """A systemd user unit (~/.config/systemd/user/bonsai-NAME.service)."""
    lines = [
        "[Unit]",
        f"Description=bonsai: llama-server for {spec.name} (bonsai start in the foreground)",
        f"StartLimitIntervalSec={RESTART_WINDOW_S}",
        f"StartLimitBurst={RESTART_BURST}",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(_systemd_quote(w) for w in spec.argv),
    ]
    for key, value in spec.env:
        lines.append("Environment=" + _systemd_quote(f"{key}={value}"))
    lines += [
        # bonsai restarts llama-server itself; the manager restarts bonsai only when bonsai failed.
        "Restart=on-failure",
        f"RestartSec={RESTART_DELAY_S}",
        # SIGTERM to bonsai alone: it stops llama-server in order (the whole group at once would
        # look like a crash to the keeper); anything left gets SIGKILL after the timeout.
        "KillMode=mixed",
        f"TimeoutStopSec={STOP_TIMEOUT_S}",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def launchd_plist(spec: ServiceSpec) -> bytes:
    """A launchd agent (~/Library/LaunchAgents/ai.bonsai.NAME.plist), loaded at login."""
    data: dict[str, object] = {
        "Label": spec.label,
        "ProgramArguments": list(spec.argv),
        "RunAtLoad": True,
        # again only after a failure (a non-zero exit), never after a clean stop
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": RESTART_DELAY_S,
        "ExitTimeOut": STOP_TIMEOUT_S,
        "ProcessType": "Interactive",
    }
    if spec.env:
        data["EnvironmentVariables"] = dict(spec.env)
    if spec.log_path:
        data["StandardOutPath"] = spec.log_path
        data["StandardErrorPath"] = spec.log_path
    return plistlib.dumps(data)


def _cmd_quote(word: str) -> str:
    return '"' + word.replace('"', '""') + '"' if re.search(r'[\s"&|<>^()%!]', word) or not word else word


def task_command(spec: ServiceSpec) -> tuple[str, str]:
    """(Command, Arguments) of the task: cmd.exe sets the BONSAI_* environment and sends bonsai's
    output to the log, neither of which a task action can do by itself."""
    sets = [f'set "{k}={v}"' for k, v in spec.env]
    run = " ".join(_cmd_quote(w) for w in spec.argv)
    if spec.log_path:
        run += f" >> {_cmd_quote(spec.log_path)} 2>&1"
    return "cmd.exe", "/d /c " + " && ".join([*sets, run])


def task_xml(spec: ServiceSpec, user: str) -> str:
    """A Task Scheduler task (schtasks /Create /XML) run at `user`'s logon, with that user's
    rights and no stored password. Write it as UTF-16, as the declaration says."""
    command, arguments = task_command(spec)
    return f"""<?xml version="1.0" encoding="UTF-16"?>
<Task version="1.2" xmlns="http://schemas.microsoft.com/windows/2004/02/mit/task">
  <RegistrationInfo>
    <Description>bonsai: llama-server for {escape(spec.name)} (bonsai start in the foreground)</Description>
    <URI>\\{escape(spec.task_name)}</URI>
  </RegistrationInfo>
  <Triggers>
    <LogonTrigger>
      <Enabled>true</Enabled>
      <UserId>{escape(user)}</UserId>
    </LogonTrigger>
  </Triggers>
  <Principals>
    <Principal id="Author">
      <UserId>{escape(user)}</UserId>
      <LogonType>InteractiveToken</LogonType>
      <RunLevel>LeastPrivilege</RunLevel>
    </Principal>
  </Principals>
  <Settings>
    <MultipleInstancesPolicy>IgnoreNew</MultipleInstancesPolicy>
    <DisallowStartIfOnBatteries>false</DisallowStartIfOnBatteries>
    <StopIfGoingOnBatteries>false</StopIfGoingOnBatteries>
    <ExecutionTimeLimit>PT0S</ExecutionTimeLimit>
    <RestartOnFailure>
      <Interval>PT1M</Interval>
      <Count>{RESTART_BURST}</Count>
    </RestartOnFailure>
    <Enabled>true</Enabled>
  </Settings>
  <Actions Context="Author">
    <Exec>
      <Command>{escape(command)}</Command>
      <Arguments>{escape(arguments)}</Arguments>
    </Exec>
  </Actions>
</Task>
"""
