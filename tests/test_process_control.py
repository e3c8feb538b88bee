"""Process control on Linux, macOS and Windows, all run here on Linux.

Each system's branch is built with `process_control.for_platform(...)` and, where its
system calls do not exist here (console events, Job Objects, creationflags), with fakes
that record what would be called. The macOS watchdog needs nothing Linux lacks, so it runs
for real: a parent using it is killed with SIGKILL and its child must go too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import psutil
import pytest

from bonsai_launch.core import process_control as pc
from bonsai_launch.core.process_control import exit_hint
from bonsai_launch.llamacpp.builds import cmake as cmake_build
from bonsai_launch.server import process as server_process
from bonsai_launch.server.process import ServerProcess, free_port
from start_helpers import gone

ROOT = Path(__file__).resolve().parent.parent
posix_only = pytest.mark.skipif(os.name != "posix", reason="uses POSIX signals and process groups of this machine")
# The systems whose branch can really run on this machine (the others run with fakes above).
RUNNABLE = (
    ["darwin"] * (os.name == "posix")
    + ["linux"] * sys.platform.startswith("linux")
    + ["win32"] * (sys.platform == "win32")
)


class Recorder:
    """Fake system calls: records (name, pid, sig) and optionally raises."""

    def __init__(self, raises: dict[str, BaseException] | None = None) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.raises = raises or {}

    def _call(self, name: str, pid: int, sig: int) -> None:
        self.calls.append((name, pid, sig))
        if name in self.raises:
            raise self.raises[name]

    def syscalls(self, with_killpg: bool = True) -> pc.SysCalls:
        return pc.SysCalls(
            kill=lambda p, s: self._call("kill", p, s),
            killpg=(lambda p, s: self._call("killpg", p, s)) if with_killpg else None,
        )


def sleeper(**kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs)


# -- choosing a control ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "platform, cls",
    [
        ("linux", pc.LinuxControl),
        ("darwin", pc.WatchdogControl),
        ("win32", pc.WindowsControl),
        ("freebsd14", pc.WatchdogControl),
    ],
)
def test_each_system_gets_its_control(platform, cls):
    assert type(pc.for_platform(platform)) is cls


def test_popen_options_per_system():
    linux = pc.for_platform("linux")
    assert linux.popen_options(die_with_parent=True)["start_new_session"] is True
    assert linux.popen_options(die_with_parent=True)["preexec_fn"] is pc._die_with_parent
    assert "preexec_fn" not in linux.popen_options(die_with_parent=False, detached=True)

    mac = pc.for_platform("darwin")
    assert mac.popen_options(die_with_parent=True) == {"start_new_session": True}  # no PDEATHSIG there

    win = pc.for_platform("win32")
    fg = win.popen_options(die_with_parent=True)
    assert fg == {"creationflags": pc.CREATE_NEW_PROCESS_GROUP}  # no start_new_session, no preexec_fn
    detached = win.popen_options(die_with_parent=False, detached=True)
    assert detached["creationflags"] == pc.CREATE_NEW_PROCESS_GROUP | pc.DETACHED_PROCESS
    # The constants match Python's own where they exist.
    assert getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0x200) == pc.CREATE_NEW_PROCESS_GROUP
    assert getattr(signal, "CTRL_BREAK_EVENT", 1) == pc.CTRL_BREAK_EVENT


@posix_only
def test_stop_signals_name_only_signals_of_that_system():
    assert pc.for_platform("win32").stop_signal_names == ("SIGINT", "SIGBREAK")
    assert pc.for_platform("linux").stop_signal_names == ("SIGINT", "SIGTERM", "SIGHUP")
    # Here (Linux) SIGBREAK does not exist: the Windows list resolves to what does, never an AttributeError.
    assert pc.for_platform("win32").stop_signals() == (signal.SIGINT,)
    assert pc.for_platform("darwin").stop_signals() == (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# -- Windows ------------------------------------------------------------------------------------------


def test_windows_stop_is_a_console_break_to_the_group_never_killpg():
    rec = Recorder(raises={"killpg": AssertionError("os.killpg does not exist on Windows")})
    win = pc.for_platform("win32", rec.syscalls())
    assert win.request_stop(4242) is True
    assert win.interrupt(4242) is True
    assert rec.calls == [("kill", 4242, pc.CTRL_BREAK_EVENT)] * 2


def test_windows_without_a_shared_console_says_so():
    rec = Recorder(raises={"kill": OSError(6, "The handle is invalid")})
    assert pc.for_platform("win32", rec.syscalls()).request_stop(4242) is False


def test_windows_sends_no_console_event_to_a_group_outside_its_console():
    """GenerateConsoleCtrlEvent with a group id our console does not know can reach every
    process of our console, bonsai included: detached servers and `bonsai stop` of another
    process's server go straight to TerminateProcess."""
    rec = Recorder()
    win = pc.for_platform("win32", rec.syscalls(with_killpg=False))
    assert win.request_stop(4242, shares_console=False) is False
    assert rec.calls == []
    proc = sleeper()
    server = ServerProcess(
        proc, "http://127.0.0.1:1", Path("/nonexistent.log"), ["llama-server.exe"], win, detached=True
    )
    started = time.monotonic()
    assert server.stop(timeout=10) is not None
    assert rec.calls == [] and time.monotonic() - started < 5  # no waiting on a request never sent


def test_bonsai_stop_on_windows_terminates_at_once(monkeypatch, isolated_home):
    from bonsai_launch.server import instances

    rec = Recorder()
    win = pc.for_platform("win32", rec.syscalls(with_killpg=False))
    proc = sleeper()
    inst = instances.Instance(
        name="x",
        pid=proc.pid,
        create_time=psutil.Process(proc.pid).create_time(),
        host="127.0.0.1",
        port=1,
        base_url="http://127.0.0.1:1",
        profile=None,
        model="m",
        log_path="",
        started_at=time.time(),
        detached=True,
        speculative=False,
        argv=(sys.executable,),
    )
    monkeypatch.setattr(instances, "_matches", lambda i: True)
    started = time.monotonic()
    assert instances.stop(inst, timeout=10, control=win) is True
    assert rec.calls == [] and proc.wait(5) is not None and time.monotonic() - started < 5


def test_windows_server_stop_breaks_resends_then_terminates(monkeypatch):
    """ServerProcess.stop through the Windows branch with a real child: the console event
    is recorded (it cannot reach anything here), so the stop ends in TerminateProcess
    (Popen.kill), and the Job Object is released only after the child is gone."""
    monkeypatch.setattr(server_process, "RESEND_AFTER", 0.2)
    rec = Recorder()
    released = []

    class Job:
        def release(self) -> None:
            released.append(proc.poll())

    win = pc.WindowsControl(rec.syscalls(with_killpg=False), job_factory=lambda pid: Job())
    proc = sleeper()
    server = ServerProcess(
        proc,
        "http://127.0.0.1:1",
        Path("/nonexistent.log"),
        ["llama-server.exe"],
        win,
        win.guard(proc, die_with_parent=True),
    )
    code = server.stop(timeout=0.5)
    assert rec.calls == [("kill", proc.pid, pc.CTRL_BREAK_EVENT)] * 2  # the break, and the resend
    assert code is not None and proc.poll() is not None  # ended by Popen.kill
    assert released == [code]  # released once, after the exit


def test_windows_spawn_passes_creationflags_and_makes_a_job(monkeypatch, tmp_path):
    seen = {}
    jobs = []

    class FakePopen:
        pid = 777

        def __init__(self, argv, **kwargs):
            seen["argv"], seen["kwargs"] = argv, kwargs

        def poll(self):
            return None

    monkeypatch.setattr(server_process.subprocess, "Popen", FakePopen)
    win = pc.WindowsControl(Recorder().syscalls(with_killpg=False), job_factory=lambda pid: jobs.append(pid) or None)
    argv = [r"C:\Program Files\bonsai\llama-server.exe", "--model", r"C:\models\a b.gguf", "--alias", "it's"]
    ServerProcess.spawn(argv, env=None, log_path=tmp_path / "s.log", base_url="http://x", control=win)
    assert seen["argv"] == argv  # a list, as it is: no shell, no quoting
    assert seen["kwargs"]["creationflags"] == pc.CREATE_NEW_PROCESS_GROUP
    assert "start_new_session" not in seen["kwargs"] and "preexec_fn" not in seen["kwargs"]
    assert jobs == [777]
    ServerProcess.spawn(
        argv, env=None, log_path=tmp_path / "s.log", base_url="http://x", control=win, die_with_parent=False
    )
    assert seen["kwargs"]["creationflags"] == pc.CREATE_NEW_PROCESS_GROUP | pc.DETACHED_PROCESS
    assert jobs == [777]  # a detached server gets no job: it must outlive bonsai


@posix_only
def test_windows_force_stop_without_popen_kills_the_process():
    proc = sleeper()
    pc.for_platform("win32").force_stop(proc.pid)  # psutil's kill: TerminateProcess there, SIGKILL here
    assert proc.wait(10) == -signal.SIGKILL


def test_job_object_is_kill_on_close_through_pywin32():
    """assign_kill_on_close_job with stand-ins for pywin32's modules: the calls a real
    Windows would get, in order; releasing closes the job handle."""
    log = []
    limits = {"BasicLimitInformation": {"LimitFlags": 0}}
    win32job = types.SimpleNamespace(
        JobObjectExtendedLimitInformation=9,
        JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE=0x2000,
        CreateJobObject=lambda sa, name: log.append("create") or "JOB",
        QueryInformationJobObject=lambda job, cls: limits,
        SetInformationJobObject=lambda job, cls, info: log.append(("set", info["BasicLimitInformation"]["LimitFlags"])),
        AssignProcessToJobObject=lambda job, proc: log.append(("assign", job, proc)),
    )
    win32api = types.SimpleNamespace(
        OpenProcess=lambda access, inherit, pid: log.append(("open", access, pid)) or "PROC",
        CloseHandle=lambda h: log.append(("close", h)),
    )
    win32con = types.SimpleNamespace(PROCESS_SET_QUOTA=0x100, PROCESS_TERMINATE=0x1)
    guard = pc.assign_kill_on_close_job(55, win32job, win32api, win32con)
    assert log == ["create", ("set", 0x2000), ("open", 0x101, 55), ("assign", "JOB", "PROC"), ("close", "PROC")]
    guard.release()
    guard.release()
    assert log[-1] == ("close", "JOB") and log.count(("close", "JOB")) == 1


def test_job_object_without_pywin32_is_none():
    if sys.platform != "win32":  # pywin32 is a Windows-only dependency
        assert pc.assign_kill_on_close_job(1) is None


@posix_only
def test_windows_build_interrupt_then_job_ends_the_rest(monkeypatch):
    """cmake_build's Ctrl+C path on Windows: a break to ninja's group, then Popen.kill; no
    killpg anywhere (what is left is ended by releasing the Job Object)."""
    rec = Recorder(raises={"killpg": AssertionError("no killpg on Windows")})
    win = pc.WindowsControl(rec.syscalls())
    proc = sleeper()
    monkeypatch.setattr(subprocess.Popen, "wait", _short_wait(subprocess.Popen.wait))
    cmake_build._stop_group(proc, win)
    assert [c[0] for c in rec.calls] == ["kill", "kill"]
    assert all(c[2] == pc.CTRL_BREAK_EVENT for c in rec.calls)
    assert proc.poll() == -signal.SIGKILL


def _short_wait(wait):
    def short(self, timeout=None):
        return wait(self, timeout if timeout is None else min(timeout, 0.2))

    return short


# -- POSIX (Linux and macOS) ---------------------------------------------------------------------------


@posix_only
@pytest.mark.parametrize("platform", ["linux", "darwin"])
def test_posix_stop_signals_the_group(platform):
    rec = Recorder()
    control = pc.for_platform(platform, rec.syscalls())
    control.request_stop(10)
    control.interrupt(10)
    control.force_stop(10)
    control.end_leftovers(10)
    assert rec.calls == [
        ("killpg", 10, signal.SIGTERM),
        ("killpg", 10, signal.SIGINT),
        ("killpg", 10, signal.SIGKILL),
        ("killpg", 10, signal.SIGKILL),
    ]


def test_posix_falls_back_to_the_process_when_the_group_is_not_ours():
    rec = Recorder(raises={"killpg": PermissionError()})
    assert pc.for_platform("linux", rec.syscalls()).request_stop(10) is True
    assert rec.calls == [("killpg", 10, signal.SIGTERM), ("kill", 10, signal.SIGTERM)]


@posix_only
def test_posix_stop_of_a_real_group():
    control = pc.for_platform("linux")
    proc = sleeper(**control.popen_options(die_with_parent=False))
    assert os.getpgid(proc.pid) == proc.pid
    server = ServerProcess(proc, "http://127.0.0.1:1", Path("/nonexistent.log"), ["x"], control)
    assert server.stop(timeout=5) == -signal.SIGTERM


WATCHED_PARENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from bonsai_launch.core import process_control
    from bonsai_launch.server.process import ServerProcess
    control = process_control.for_platform(sys.argv[1])
    child = ServerProcess.spawn([sys.executable, "-c", "import time; time.sleep(120)"], env=None,
                                log_path=Path(sys.argv[2]), base_url="http://127.0.0.1:1", control=control)
    print(child.pid, flush=True)
    if sys.argv[3] == "stop":
        child.stop(5)
        print("stopped", flush=True)
    time.sleep(120)
""")


def _watched_parent(tmp_path: Path, platform: str, mode: str) -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", WATCHED_PARENT, platform, str(tmp_path / "child.log"), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


@pytest.mark.parametrize("platform", RUNNABLE)
def test_killing_bonsai_takes_the_child_along(tmp_path, platform):
    """darwin: the watchdog (runs for real on any POSIX system); linux: PR_SET_PDEATHSIG;
    win32 (on Windows only): the Job Object."""
    parent, child = _watched_parent(tmp_path, platform, "wait")
    try:
        watchers = [
            p for p in psutil.process_iter(["cmdline"]) if "bonsai_launch.core.watchdog" in (p.info["cmdline"] or ())
        ]
        assert bool(watchers) == (platform == "darwin")
        parent.kill()  # SIGKILL (TerminateProcess on Windows): no cleanup code of bonsai runs
        parent.wait(10)
        assert gone(child, timeout=15)
        for w in watchers:
            assert gone(w.pid, timeout=5)  # the watchdog does its job and leaves
    finally:
        parent.kill()
        parent.wait()
        _kill_quietly(child)


@pytest.mark.skipif(sys.platform != "win32", reason="the real console events of Windows (runs in CI on windows-latest)")
def test_windows_real_stop(tmp_path):
    """Written for Windows CI, never run on our Linux machines: CTRL_BREAK_EVENT (or, without
    a console, TerminateProcess) ends a real child started in its own process group."""
    server = ServerProcess.spawn(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env=None,
        log_path=tmp_path / "child.log",
        base_url="http://127.0.0.1:1",
    )
    started = time.monotonic()
    assert server.stop(timeout=10) is not None
    assert time.monotonic() - started < 20


@posix_only
def test_a_normal_stop_sends_the_watchdog_home(tmp_path):
    parent, child = _watched_parent(tmp_path, "darwin", "stop")
    try:
        assert parent.stdout.readline().strip() == "stopped"
        assert gone(child, timeout=1)
        assert not [
            p
            for p in psutil.Process(parent.pid).children(recursive=True)
            if "bonsai_launch.core.watchdog" in " ".join(p.cmdline())
        ]
    finally:
        parent.kill()
        parent.wait()


@posix_only
def test_watchdog_ignores_a_reused_pid():
    from bonsai_launch.core import watchdog

    proc = sleeper()
    try:
        born = psutil.Process(proc.pid).create_time()
        assert watchdog.stop_group(proc.pid, born - 100, grace=1) is True  # "another" process: untouched
        assert proc.poll() is None
        assert watchdog.stop_group(proc.pid, born, grace=5) is True
        assert proc.wait(5) is not None
    finally:
        _kill_quietly(proc.pid)


def _kill_quietly(pid: int) -> None:
    try:
        psutil.Process(pid).kill()
    except psutil.NoSuchProcess:
        pass


def test_argv_reaches_the_child_unchanged(tmp_path):
    """No shell and no quoting between the plan's argv and the server (on Windows, Python's
    list2cmdline and the C runtime's parser must agree; CI's windows lane checks that)."""
    import json

    weird = [
        "a b",
        "it's",
        '{"enable_thinking": false}',
        "$HOME",
        "%PATH%",
        "a,b",
        "",
        "back\\slash\\",
        "\u00fcn\u00efcode",
        "--",
    ]
    log = tmp_path / "argv.log"
    server = ServerProcess.spawn(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *weird],
        env={"PYTHONIOENCODING": "utf-8"},
        log_path=log,
        base_url="http://127.0.0.1:1",
    )
    assert server.wait(30) == 0
    server.stop()
    assert json.loads(log.read_text(encoding="utf-8")) == weird


# -- exit codes ------------------------------------------------------------------------------------------


def test_exit_hints_for_signals_and_ntstatus():
    assert "illegal instruction" in exit_hint(-4)
    assert "illegal instruction" in exit_hint(128 + 4)
    assert "illegal instruction" in exit_hint(0xC000001D)
    assert "access violation" in exit_hint(0xC0000005)
    assert "Ctrl+Break" in exit_hint(0xC000013A)
    assert exit_hint(1) is None


@posix_only
@pytest.mark.server
def test_real_server_dies_with_bonsai_through_the_macos_watchdog(llama_server, tmp_path):
    """The macOS path end to end with the real llama-server: `bonsai start` runs with the
    watchdog control (no PDEATHSIG), is killed with SIGKILL, and the server must go."""
    import tiny_gguf
    from bonsai_launch.server import instances
    from start_helpers import bonsai_env, no_server_left

    model = tiny_gguf.write_target(tmp_path / "target.gguf")
    out = tmp_path / "out.txt"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "support" / "platform_runner.py"),
                "darwin",
                "start",
                "--model",
                str(model),
                "--port",
                str(free_port()),
                "--ctx",
                "2048",
            ],
            env=bonsai_env(llama_server),
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )
    try:
        deadline = time.monotonic() + 60
        while "press Ctrl+C to stop" not in out.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, out.read_text()
            time.sleep(0.05)
        (inst,) = instances.running()
        proc.kill()
        proc.wait(10)
        assert gone(inst.pid, timeout=20)
        assert no_server_left(model)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for inst in instances.running():
            instances.stop(inst, timeout=5)


# -- what may be named where ------------------------------------------------------------------------------

# Signals Python defines on Windows too; anything else must go through getattr/hasattr.
WINDOWS_SIGNALS = {
    "SIGABRT",
    "SIGFPE",
    "SIGILL",
    "SIGINT",
    "SIGSEGV",
    "SIGTERM",
    "SIGBREAK",
    "CTRL_C_EVENT",
    "CTRL_BREAK_EVENT",
}
POSIX_ONLY_MODULES = {"watchdog.py"}  # started only by the macOS/POSIX control


def test_no_posix_only_signal_or_call_outside_the_posix_parts():
    """`signal.SIGKILL` or `os.killpg` in code that runs on Windows is an AttributeError
    there: every such use lives in process_control's POSIX classes (through getattr) or
    in the POSIX-only watchdog."""
    import ast

    package = ROOT / "bonsai_launch"
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path.name in POSIX_ONLY_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                name = f"{node.value.id}.{node.attr}"
                if (
                    node.value.id == "signal"
                    and node.attr.startswith(("SIG", "CTRL_"))
                    and node.attr not in WINDOWS_SIGNALS
                    and node.attr not in ("SIG_IGN", "SIG_DFL")
                ):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
                if node.value.id == "os" and node.attr in ("killpg", "getpgid", "setsid", "setpgid"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert offenders == []


@posix_only
def test_a_stop_signal_held_during_a_spawn_is_acted_on_when_the_hold_ends():
    from bonsai_launch.server.process import SignalForwarder, StopRequested

    steps = []
    with SignalForwarder((signal.SIGUSR2,)) as forwarder:
        with pytest.raises(StopRequested):
            with forwarder.held():
                os.kill(os.getpid(), signal.SIGUSR2)  # the handler runs before os.kill returns
                steps.append("after the signal, still inside")
            steps.append("not reached")
        assert steps == ["after the signal, still inside"]
        assert forwarder.received == signal.SIGUSR2
        # a hold that starts while already stopping raises nothing more
        with forwarder.held():
            pass
    # without a signal a hold is transparent
    with SignalForwarder((signal.SIGUSR2,)) as quiet, quiet.held():
        steps.append("quiet")
    assert quiet.received is None and steps[-1] == "quiet"
