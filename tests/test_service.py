"""`bonsai service install | uninstall | status` (server/service_files.py, server/service.py).

The Linux unit is checked by systemd itself (`systemd-analyze verify`, which prints every key
it cannot parse and fails on an ExecStart that is not executable); the macOS plist is read back
with plistlib and the Windows task with xml.etree. The argv a service runs is handed to the real
`bonsai start --dry-run`, so a spelling start does not take fails here. Files only ever land
under the test's own HOME, XDG_CONFIG_HOME and BONSAI_HOME.
"""

from __future__ import annotations

import json
import os
import plistlib
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bonsai_launch.core.errors import ActionFailed
from bonsai_launch.server import service, service_files
from cli_runner import run_cli

REAL_REACHABLE = service.reachable
TASK_NS = {"t": "http://schemas.microsoft.com/windows/2004/02/mit/task"}


LINUX_ONLY = pytest.mark.skipif(
    sys.platform != "linux", reason="systemd-analyze is Linux's (the Linux jobs run it; .ci/run installs systemd)"
)


@pytest.fixture(autouse=True)
def own_folders(tmp_path, monkeypatch):
    """HOME, XDG_CONFIG_HOME and BONSAI_HOME inside the test: nothing can touch the real ones.
    The real service manager is never asked (a macOS or Windows CI runner would register the
    agent or task for real): tests that want one pass their own `run`."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(Path, "home", lambda: tmp_path / "home")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("BONSAI_HOME", str(tmp_path / "bonsai"))
    monkeypatch.setattr(service, "reachable", lambda which, run=None: False)
    return tmp_path


def reachable_when_run_answers(monkeypatch):
    """Put the real `reachable` back: it asks the `run` a test passes."""
    monkeypatch.setattr(service, "reachable", REAL_REACHABLE)


def spec_for(tmp_path: Path, platform: str = "linux", **env: str) -> service_files.ServiceSpec:
    model = tmp_path / "my models" / "100%.gguf"  # a space and a % that systemd would expand
    argv = service_files.start_argv(
        sys.executable,
        {"profile": "demo", "port": 8090, "speculative": True, "kv4": False, "ctx": None},
        model=str(model),
        passthrough=("--threads", "2"),
    )
    return service.make_spec("demo", argv, {"BONSAI_SLEEP_IDLE_SECONDS": "600", "HOME": "/x", **env}, platform)


def unreachable(argv):
    return subprocess.CompletedProcess(list(argv), 1, "", "Failed to connect to bus")


@LINUX_ONLY
def test_linux_unit_passes_systemd_analyze_verify(own_folders):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: apt-get install systemd (.ci/run installs it)"
    spec = spec_for(own_folders, BONSAI_API_KEY="k$y")
    result = service.install(spec, "linux", run=unreachable)
    path = Path(result.path)
    assert path == own_folders / "xdg" / "systemd" / "user" / "bonsai-demo.service"
    done = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    # verify exits 0 on keys it cannot parse and only prints them: any output is a finding
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr
    text = path.read_text()
    assert (
        f"ExecStart={sys.executable} -m bonsai_launch start --profile demo --port 8090 --speculative --no-kv4 " in text
    )
    assert '"' + str(own_folders / "my models" / "100%%.gguf") + '" -- --threads 2' in text
    assert "Environment=BONSAI_SLEEP_IDLE_SECONDS=600" in text and "Environment=BONSAI_API_KEY=k$$y" in text
    assert "HOME" not in text  # only the settings registry's variables are kept
    assert "--detach" not in text and "Restart=on-failure" in text and "KillMode=mixed" in text
    assert path.stat().st_mode & 0o077 == 0  # it holds the key: the user's alone
    assert "systemctl --user daemon-reload && systemctl --user enable bonsai-demo.service" in result.next_step


@LINUX_ONLY
def test_a_broken_unit_fails_the_verify_check(own_folders):
    """The check above can fail: the same verify on a unit with a bad key and a missing binary."""
    spec = spec_for(own_folders)
    bad = service_files.systemd_unit(spec).replace("KillMode=mixed", "KillMode=sometimes")
    bad = bad.replace(f"ExecStart={sys.executable}", "ExecStart=/nonexistent/python")
    path = own_folders / "bonsai-bad.service"
    path.write_text(bad)
    done = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "kill mode" in done.stderr and "/nonexistent/python" in done.stderr


def test_without_xdg_config_home_the_unit_goes_to_dot_config(own_folders, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME")
    path = service.file_path(spec_for(own_folders), "linux")
    assert path == own_folders / "home" / ".config" / "systemd" / "user" / "bonsai-demo.service"


@LINUX_ONLY
def test_install_enables_through_a_reachable_user_systemd_and_stops_on_its_error(own_folders, monkeypatch):
    reachable_when_run_answers(monkeypatch)
    calls: list[list[str]] = []

    def systemctl(argv):
        calls.append(list(argv))
        failed = argv[-1] == "bonsai-demo.service" and "enable" in argv and len(calls) > 3
        return subprocess.CompletedProcess(list(argv), 1 if failed else 0, "", "enable refused" if failed else "")

    if shutil.which("systemctl") is None:
        pytest.fail("systemctl is missing: apt-get install systemd")
    result = service.install(spec_for(own_folders), "linux", run=systemctl)
    assert calls == [
        ["systemctl", "--user", "show-environment"],
        ["systemctl", "--user", "daemon-reload"],
        ["systemctl", "--user", "enable", "bonsai-demo.service"],
    ]
    assert result.enabled and result.manager and "systemctl --user start bonsai-demo.service" in result.next_step
    with pytest.raises(ActionFailed, match="enable refused"):
        service.install(spec_for(own_folders), "linux", run=systemctl)


def test_macos_install_unloads_an_older_agent_before_bootstrap(own_folders, monkeypatch):
    calls: list[list[str]] = []

    def launchctl(argv):
        calls.append(list(argv))
        return subprocess.CompletedProcess(list(argv), 0, "", "")

    monkeypatch.setattr(service, "reachable", lambda which, run=None: True)
    result = service.install(spec_for(own_folders, "darwin"), "darwin", run=launchctl)
    uid = os.getuid() if hasattr(os, "getuid") else ""
    assert calls == [
        ["launchctl", "bootout", f"gui/{uid}/ai.bonsai.demo"],
        ["launchctl", "bootstrap", f"gui/{uid}", result.path],
    ]
    assert Path(result.path).name == "ai.bonsai.demo.plist" and result.enabled


def test_macos_agent_is_a_plist_that_restarts_only_after_a_failure(own_folders):
    spec = spec_for(own_folders, "darwin")
    path = service.file_path(spec, "darwin")
    assert path == own_folders / "home" / "Library" / "LaunchAgents" / "ai.bonsai.demo.plist"
    data = plistlib.loads(service.render(spec, "darwin"))
    assert data["Label"] == "ai.bonsai.demo" and data["ProgramArguments"] == list(spec.argv)
    assert data["ProgramArguments"][:4] == [sys.executable, "-m", "bonsai_launch", "start"]
    assert data["RunAtLoad"] is True and data["KeepAlive"] == {"SuccessfulExit": False}
    assert data["EnvironmentVariables"] == {"BONSAI_SLEEP_IDLE_SECONDS": "600"}
    assert data["StandardErrorPath"] == str(own_folders / "bonsai" / "logs" / "service-demo.log")


def test_windows_task_is_xml_run_at_logon_with_the_settings_and_a_log(own_folders):
    spec = spec_for(own_folders, "win32")
    assert service.file_path(spec, "win32") == own_folders / "bonsai" / "service" / "bonsai-demo.xml"
    raw = service.render(spec, "win32", user="alice")
    assert raw[:2] in (b"\xff\xfe", b"\xfe\xff")  # UTF-16 with a BOM, as schtasks /XML reads it
    root = ET.fromstring(raw)
    logon = root.find("t:Triggers/t:LogonTrigger", TASK_NS)
    assert logon is not None and logon.findtext("t:UserId", namespaces=TASK_NS) == "alice"
    assert root.findtext("t:Principals/t:Principal/t:RunLevel", namespaces=TASK_NS) == "LeastPrivilege"
    assert root.findtext("t:Settings/t:ExecutionTimeLimit", namespaces=TASK_NS) == "PT0S"
    exec_ = root.find("t:Actions/t:Exec", TASK_NS)
    assert exec_ is not None and exec_.findtext("t:Command", namespaces=TASK_NS) == "cmd.exe"
    args = exec_.findtext("t:Arguments", namespaces=TASK_NS) or ""
    assert args.startswith('/d /c set "BONSAI_SLEEP_IDLE_SECONDS=600" && ')
    assert '"' + str(own_folders / "my models" / "100%.gguf") + '"' in args
    assert args.endswith(f">> {own_folders / 'bonsai' / 'logs' / 'service-demo.log'} 2>&1")


def test_uninstall_removes_the_file_and_status_follows(own_folders):
    spec = spec_for(own_folders)
    assert not service.status(spec, "linux", run=unreachable).installed
    service.install(spec, "linux", run=unreachable)
    found = service.status(spec, "linux", run=unreachable)
    assert found.installed and found.running is False and found.enabled is None
    assert found.logs[0] == "journalctl --user -u bonsai-demo.service"
    gone = service.uninstall(spec, "linux", run=unreachable)
    assert not Path(gone.path).exists() and not gone.installed
    assert "nothing to remove" in service.uninstall(spec, "linux", run=unreachable).next_step


def test_bad_service_name_is_refused(capsys):
    code, _out, err = run_cli(capsys, "service", "status", "--name", "../etc")
    assert code == 2 and "service name '../etc' is not allowed" in err


@LINUX_ONLY  # --dry-run prints this platform's file: the unit on Linux
def test_the_argv_a_service_runs_is_one_bonsai_start_takes(capsys, own_folders, tiny_pair, monkeypatch):
    """`service install --dry-run` prints the unit; its ExecStart words, given to the real
    `bonsai start --dry-run`, make the plan with the same settings. A relative --model becomes
    absolute: the service does not start in this folder."""
    monkeypatch.chdir(tiny_pair["target"].parent)
    code, out, err = run_cli(
        capsys,
        "service",
        "install",
        "--model",
        tiny_pair["target"].name,
        "--port",
        "8091",
        "--ctx",
        "2048",
        "--dry-run",
    )
    assert code == 0, err
    exec_line = next(line for line in out.splitlines() if line.startswith("ExecStart="))
    words = exec_line.removeprefix("ExecStart=").split()
    assert words[:4] == [str(Path(sys.executable).absolute()), "-m", "bonsai_launch", "start"]
    assert not (own_folders / "xdg" / "systemd").exists()  # --dry-run writes nothing
    assert words[words.index("--model") + 1] == str(tiny_pair["target"])
    monkeypatch.chdir(own_folders)
    code, out, err = run_cli(capsys, *words[3:], "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    argv = plan["argv"]
    assert argv[argv.index("--port") + 1] == "8091" and argv[argv.index("-c") + 1] == "2048"


def test_cli_install_status_uninstall_in_the_users_folders(capsys, own_folders):
    code, out, err = run_cli(capsys, "service", "install", "--profile", "demo", "--json")
    assert code == 0, err
    installed = json.loads(out)
    assert Path(installed["path"]).is_relative_to(own_folders)
    code, out, _ = run_cli(capsys, "service", "status", "--profile", "demo")
    assert code == 0 and "installed  yes" in out and "running    no" in out and "logs" in out
    code, out, _ = run_cli(capsys, "service", "uninstall", "--profile", "demo")
    assert code == 0 and "removed" in out
    code, out, _ = run_cli(capsys, "service", "status", "--profile", "demo", "--json")
    assert json.loads(out)["installed"] is False
