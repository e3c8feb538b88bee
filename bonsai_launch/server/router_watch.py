"""Memory that follows use, and proof per model, for a `bonsai serve` router.

llama-server's router loads a model on its first request and unloads the least recently used one
past --models-max, but it never unloads an idle one (--sleep-idle-seconds frees the weights and
keeps the process: llama.cpp #18189). This watcher, a daemon thread of the process that keeps the
router (the foreground `bonsai serve`, or a detached one's keeper), looks at the router's /models
and each loaded child's own /metrics every POLL_S and:
- proves a speculative model live (drafted > 0) when it has loaded, as `bonsai start` does, and
  writes the verdict into the router's log;
- counts a model busy while its counters move or a request is in flight, and unloads it
  (POST /models/unload: the child process ends, its memory returns) after its idle time;
- loads a pinned model again when it is not loaded (the router evicted it to make room);
- keeps each model's state, speculation, acceptance, memory and time to unload in a state file
  beside the instance's, for `bonsai ps`.
Which action is due is a pure function of a model's record and the time (`due`), tested without
a server; the effects go through the one client.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.server import client

POLL_S = 1.0
BUSY_COUNTERS = ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:n_decode_total")
IN_FLIGHT = ("llamacpp:requests_processing", "llamacpp:requests_deferred")
DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
RUNNING_STATES = ("loading", "loaded", "sleeping")


@dataclass
class ModelRecord:
    """What the watcher knows of one model (the state file holds these, as JSON)."""

    name: str
    idle_unload_s: int = 0
    pinned: bool = False
    spec_type: str | None = None
    n_max: int | None = None
    state: str = "unloaded"  # the router's word (unloaded, loading, loaded, sleeping) or "failed"
    port: int | None = None  # the child's own loopback port while it runs
    pid: int | None = None
    rss_bytes: int | None = None
    loaded_at: float | None = None
    last_active: float | None = None
    counters: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    proof: dict[str, Any] | None = None  # the speculation proof of the current load
    exit_code: int | None = None  # of the last failed load
    loads: int = 0
    unloads: int = 0  # by idle time

    def unload_in(self, now: float) -> float | None:
        """Seconds until the idle unload; None when it never comes (pinned, no idle time, not loaded)."""
        if self.pinned or not self.idle_unload_s or self.state not in ("loaded", "sleeping"):
            return None
        return max(0.0, self.idle_unload_s - (now - (self.last_active or now)))

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        data = asdict(self)
        data["unload_in_s"] = self.unload_in(time.time() if now is None else now)
        return data


def due(record: ModelRecord, now: float) -> str | None:
    """The action a model's record calls for now: "unload" (idle past its time), "load" (pinned and
    not loaded, and its last load did not fail), or None."""
    if record.pinned:
        return "load" if record.state == "unloaded" else None
    remaining = record.unload_in(now)
    return "unload" if remaining is not None and remaining <= 0 else None


def child_port(status: dict[str, Any]) -> int | None:
    """The child's port from /models' `status.args` (the router renders `--port N` into them)."""
    args = status.get("args") or []
    for flag, value in zip(args, [*args[1:], ""], strict=True):
        if flag == "--port" and str(value).isdigit() and int(value) > 0:
            return int(value)
    return None


def state_file(instance_name: str) -> Path:
    """Beside the instance's own state file, under another suffix (instances.running() reads *.json)."""
    from bonsai_launch.core.paths import run_dir

    return run_dir() / f"{instance_name}.models"


def read_state(instance_name: str) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(state_file(instance_name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class RouterWatch:
    """The watcher thread of one router (see the module docstring)."""

    def __init__(
        self,
        instance_name: str,
        base_url: str,
        api_key: str | None,
        models: list[dict[str, Any]],
        log_path: Path,
        poll_s: float = POLL_S,
    ) -> None:
        self.instance_name, self.base_url, self.api_key = instance_name, base_url, api_key
        self.log_path, self.poll_s = log_path, poll_s
        known = read_state(instance_name)
        self.records: dict[str, ModelRecord] = {}
        for m in models:
            record = ModelRecord(m["name"], m.get("idle_unload_s") or 0, bool(m.get("pinned")), m.get("spec_type"))
            record.n_max = m.get("n_max")
            old = known.get(m["name"]) or {}
            if old.get("proof") and old.get("port"):  # proven before this watcher started (serve's preloads)
                record.proof, record.port, record.state = old["proof"], old["port"], old.get("state", "unloaded")
                record.loaded_at, record.last_active = old.get("loaded_at"), old.get("last_active")
            self.records[m["name"]] = record
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bonsai-router-watch", daemon=True)

    def start(self) -> RouterWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def note(self, text: str) -> None:
        from bonsai_launch.core.log_files import append_note

        append_note(self.log_path, text)

    def _run(self) -> None:
        while not self.stopped.wait(self.poll_s):
            try:
                self.step(time.time())
            except Exception:  # never end the process that keeps the router over a failed look
                continue

    # -- one look --------------------------------------------------------------------------------

    def step(self, now: float) -> None:
        statuses = router_models(self.base_url, self.api_key)
        for name, record in self.records.items():
            status = statuses.get(name)
            if status is None:
                continue
            self._observe(record, status, now)
            action = due(record, now)
            if action == "unload":
                idle = now - (record.last_active or now)
                post_model(self.base_url, "/models/unload", name, self.api_key)
                record.unloads += 1
                self.note(
                    f"model {name}: unloaded after {idle:.0f} s without a request (BONSAI_IDLE_UNLOAD="
                    f"{record.idle_unload_s}); its llama-server process ends and its memory returns"
                )
                record.state = "unloading"
            elif action == "load":
                post_model(self.base_url, "/models/load", name, self.api_key)
                self.note(f"model {name}: pinned, loading it again")
                record.state = "loading"
        self.save(now)

    def _observe(self, record: ModelRecord, status: dict[str, Any], now: float) -> None:
        word = str(status.get("value") or "unloaded")
        if word == "unloaded" and status.get("failed"):
            if record.state != "failed":
                self.note(
                    f"model {record.name}: its llama-server failed to load it (exit code {status.get('exit_code')})"
                )
            record.state, record.exit_code = "failed", status.get("exit_code")
            record.port = record.pid = record.rss_bytes = None
            return
        port = child_port(status) if word in RUNNING_STATES else None
        if word in ("loaded", "sleeping") and (record.state not in ("loaded", "sleeping") or port != record.port):
            record.loaded_at, record.last_active, record.counters = now, now, []
            record.loads += 1
            record.exit_code = None
            record.port = port
            if record.spec_type and port:
                record.proof = self.proof_once(record)
        record.state, record.port = word, port
        if word not in RUNNING_STATES:
            record.pid = record.rss_bytes = None
            return
        record.pid, record.rss_bytes = child_memory(self.instance_name, port)
        if word == "loaded" and port:
            self._activity(record, now)

    def _activity(self, record: ModelRecord, now: float) -> None:
        """Busy while its counters move or a request is in flight (the child's own /metrics: reading
        it never loads a model, and is not a request the router counts)."""
        try:
            metrics = client.metrics(f"http://127.0.0.1:{record.port}", self.api_key)
        except Exception:
            return
        counters = [metrics.get(k, 0.0) for k in BUSY_COUNTERS]
        if (record.counters and counters != record.counters) or any(metrics.get(k, 0.0) > 0 for k in IN_FLIGHT):
            record.last_active = now
        record.counters = counters
        record.drafted, record.accepted = int(metrics.get(DRAFTED, 0)), int(metrics.get(ACCEPTED, 0))

    def proof_once(self, record: ModelRecord, wait_s: float = 300.0) -> dict[str, Any]:
        """One proof per load of a model, however many watchers see it load (`bonsai serve` proves
        what it loads at start while a detached router's keeper already watches): the first to
        claim the load proves it, another takes its verdict from the state file."""
        marker = state_file(self.instance_name).with_name(f"{self.instance_name}.proving-{record.name}-{record.port}")
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and not self.stopped.is_set():
                known = read_state(self.instance_name).get(record.name) or {}
                if known.get("proof") and known.get("port") == record.port:
                    return dict(known["proof"])
                time.sleep(0.2)
            return {"live": False, "summary": "the speculation proof of another watcher did not finish"}
        except OSError:
            pass  # no marker possible: prove here
        proof = self.prove(record)
        record.proof = proof
        self.save(time.time())
        return proof

    def prove(self, record: ModelRecord) -> dict[str, Any]:
        """The liveness proof on the child's own port (the router's key guards it too)."""
        from bonsai_launch.server import liveness

        try:
            proof = liveness.prove(
                f"http://127.0.0.1:{record.port}", record.spec_type or "", record.n_max, None, self.api_key
            )
        except Exception as exc:
            self.note(f"model {record.name}: the speculation proof failed: {exc}")
            return {"live": False, "summary": f"the proof failed: {exc}"}
        self.note(f"model {record.name}: {proof.summary()}")
        return {**proof.to_json(), "summary": proof.summary()}

    def save(self, now: float) -> None:
        from bonsai_launch.server.instances import write_atomic

        data = {name: r.to_json(now) for name, r in self.records.items()}
        write_atomic(state_file(self.instance_name), json.dumps(data, indent=2) + "\n")


def router_models(base_url: str, api_key: str | None) -> dict[str, dict[str, Any]]:
    """The router's /models: {name: its `status` object}. Asking never loads anything."""
    with client.session(api_key, client.DEFAULT_TIMEOUT) as http:
        r = http.get(client.base(base_url) + "/models")
    data = r.json().get("data") if r.status_code == 200 else None
    return {str(m.get("id")): dict(m.get("status") or {}) for m in data or []}


def post_model(base_url: str, path: str, name: str, api_key: str | None) -> dict[str, Any]:
    """POST /models/load or /models/unload for one model (the router's key guards both)."""
    return client.post_json(base_url, path, {"model": name}, api_key)


def child_memory(instance_name: str, port: int | None) -> tuple[int | None, int | None]:
    """(pid, resident bytes) of the router's child that listens on `port` (its command line says so)."""
    from bonsai_launch.server import instances

    inst = instances.load(instances.state_path(instance_name))
    if not port or inst is None:
        return None, None
    import psutil

    try:
        for child in psutil.Process(inst.pid).children():
            args = child.cmdline()
            if any(a == "--port" and v == str(port) for a, v in itertools.pairwise(args)):
                return child.pid, child.memory_info().rss
    except (psutil.Error, OSError):
        pass
    return None, None


def for_job(job) -> RouterWatch | None:
    """Start the watcher of a restart job's router (None: the job is not a router's)."""
    if not job.router:
        return None
    return RouterWatch(
        job.instance["name"],
        job.instance["base_url"],
        job.api_key,
        job.router["models"],
        job.log_path,
        float(job.router.get("poll_s") or POLL_S),
    ).start()
