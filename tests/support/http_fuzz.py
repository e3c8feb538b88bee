"""A bounded, seeded fuzzer for llama-server's HTTP API (tests/test_fuzz_server.py and
benchmarks/fuzz_server.py).

Bodies for the endpoints bonsai exposes are made from valid templates and mutated with
`random.Random(seed)`: a known field set to a value of the wrong type or at an edge
(negative, 2**31, 2**63, a token id past the vocabulary, NaN as text, deep nesting), fields
dropped, the body replaced by another JSON type, or by bytes that are not JSON. Every request
must get an HTTP status code; a request the server never answers is checked against /health,
and a server that died is a crash, recorded with the body and the log line that says why.
The corpus opens with the known killers (KNOWN_KILLERS), so that even a short run sends them.
Everything is loopback and bounded by a request count and a time budget.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

# Requests that aborted llama-server b11434 before our patches (vendor/llama.cpp/patches/0003-*).
KNOWN_KILLERS: list[tuple[str, str, Any]] = [
    (
        "POST",
        "/completion",
        {
            "prompt": "hi",
            "grammar": 'root ::= "a"+',
            "grammar_lazy": True,
            "grammar_triggers": [{"type": 99, "value": "a"}],
        },
    ),
    (
        "POST",
        "/completion",
        {
            "prompt": "hi",
            "grammar": 'root ::= "a"+',
            "grammar_lazy": True,
            "grammar_triggers": [{"type": -1, "value": "a"}],
        },
    ),
]

POSTS = ("/completion", "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")
GETS = ("/health", "/v1/models", "/slots", "/props")

_EDGE_INTS = [
    0,
    1,
    -1,
    2,
    7,
    63,
    64,
    255,
    256,
    1023,
    2**15,
    2**31 - 1,
    2**31,
    -(2**31),
    -(2**31) - 1,
    2**32,
    2**63 - 1,
    -(2**63),
    2**64,
]
_EDGE_FLOATS = [0.0, -0.0, 0.5, 1.0, -1.0, 1e-30, 1e30, -1e30, 1.7976931348623157e308, 2.5e-324]
_EDGE_STRINGS = [
    "",
    " ",
    "a",
    "\u0000",
    "\n" * 3,
    "\ud7ff\u00e9\u4e2d",
    "<|im_start|>",
    "%s%n",
    "{",
    "root ::= ",
    "x" * 3000,
]


def _value(rng: random.Random, vocab: int, depth: int = 0) -> Any:
    """A value of a random JSON type, biased to edges."""
    kind = rng.randrange(12 if depth < 3 else 8)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind in (2, 3):
        return rng.choice(_EDGE_INTS + [vocab - 1, vocab, vocab + 1, -vocab, rng.randrange(-(2**40), 2**40)])
    if kind == 4:
        return rng.choice(_EDGE_FLOATS + [rng.uniform(-5, 5)])
    if kind in (5, 6, 7):
        return rng.choice(_EDGE_STRINGS + ["".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(1, 12)))])
    if kind in (8, 9):
        return [_value(rng, vocab, depth + 1) for _ in range(rng.randrange(0, 5))]
    return {
        rng.choice(FIELDS + ["type", "value", "token", "role", "content", "id"]): _value(rng, vocab, depth + 1)
        for _ in range(rng.randrange(0, 4))
    }


def _tokens(rng: random.Random, vocab: int) -> list[Any]:
    pool = [0, 1, vocab - 1, vocab, vocab + 7, -1, -(2**31), 2**31 - 1, 2**31, 2**40, 1.5, "3", None, [1]]
    return [rng.choice(pool) if rng.random() < 0.3 else rng.randrange(vocab) for _ in range(rng.randrange(0, 8))]


def _trigger(rng: random.Random, vocab: int) -> Any:
    t: dict[str, Any] = {
        "type": rng.choice([0, 1, 2, 3, 3, 4, 99, -1, 2**31, "1", None, 1.5]),
        "value": rng.choice(["a", "", "(", "[", "x+", 5, None]),
    }
    if rng.random() < 0.6:
        t["token"] = rng.choice([0, 1, vocab - 1, vocab, -1, 2**31, "x", None])
    return t if rng.random() < 0.9 else _value(rng, vocab)


# Request fields (completion, OpenAI, tokenizer) the mutations pick from.
FIELDS = [
    "prompt", "n_predict", "max_tokens", "max_completion_tokens", "temperature", "top_k", "top_p", "min_p",
    "typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold", "n_probs", "logprobs", "top_logprobs",
    "post_sampling_probs", "logit_bias", "grammar", "grammar_lazy", "grammar_triggers", "preserved_tokens",
    "json_schema", "response_format", "stop", "samplers", "seed", "id_slot", "n_keep", "n_discard", "cache_prompt",
    "stream", "stream_options", "repeat_last_n", "repeat_penalty", "frequency_penalty", "presence_penalty",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "mirostat",
    "mirostat_tau", "mirostat_eta", "min_keep", "n_indent", "n_cmpl", "n", "t_max_predict_ms", "ignore_eos",
    "lora", "chat_format", "reasoning_format", "response_fields", "return_tokens", "return_progress",
    "reasoning_budget_tokens", "reasoning_budget_start_tag", "reasoning_budget_end_tags", "reasoning_budget_message",
    "generation_prompt", "chat_parser", "continue_final_message", "parse_tool_calls", "tools", "tool_choice",
    "parallel_tool_calls", "chat_template_kwargs", "messages", "content", "tokens", "add_special", "parse_special",
    "with_pieces", "input_extra", "timings_per_token", "adaptive_target", "adaptive_decay", "backend_sampling",
    "n_cache_reuse", "sse_ping_interval", "echo", "model", "suffix", "user", "dynatemp_range", "dynatemp_exponent",
]  # fmt: skip


def _field_value(name: str, rng: random.Random, vocab: int) -> Any:
    """A plausible-but-hostile value for a known field."""
    if name == "grammar_triggers":
        return [_trigger(rng, vocab) for _ in range(rng.randrange(0, 3))]
    if name in ("tokens", "prompt") and rng.random() < 0.5:
        toks = _tokens(rng, vocab)
        return toks if rng.random() < 0.7 else [toks, "text", toks]
    if name == "logit_bias":
        return rng.choice([
            [[rng.choice([vocab, -1, 2**31, 3]), rng.choice([1.0, False, True, "x", None])]],
            {str(rng.choice([vocab, -5, 2**40, 3])): rng.choice([-100, False, 1e30])},
            {"hello": 2.0},
            _value(rng, vocab),
        ])  # fmt: skip
    if name == "messages":
        roles = ["user", "assistant", "system", "tool", "developer", "", None, 5]
        return [
            {"role": rng.choice(roles), "content": rng.choice(["hi", "", None, [{"type": "text", "text": "x"}], [{"type": "image_url", "image_url": {"url": "data:,"}}], [{"type": 7}], 5])}
            for _ in range(rng.randrange(0, 4))
        ]  # fmt: skip
    if name == "tools":
        return [{"type": "function", "function": {"name": rng.choice(["f", "", 5]), "parameters": _value(rng, vocab)}}]
    if name in ("json_schema", "response_format"):
        return rng.choice([{"type": "object"}, {"type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": 2**63}}}, {"$ref": "#/x"}, {"type": ["array"], "items": {"$ref": "#"}}, _value(rng, vocab)])  # fmt: skip
    if name == "grammar":
        return rng.choice(
            ['root ::= "a"+', "root ::= root", "root ::= [", "", 'root ::= "a"{0,1000000}', _value(rng, vocab)]
        )
    if name == "samplers":
        return rng.choice([["top_k", "bogus"], "kpt?", [], ["dry"] * 50, _value(rng, vocab)])
    return _value(rng, vocab)


def _base(path: str, rng: random.Random) -> dict[str, Any]:
    small = rng.choice([1, 2, 4, 8])
    if path == "/v1/chat/completions":
        return {"messages": [{"role": "user", "content": "hello"}], "max_tokens": small}
    if path == "/v1/completions":
        return {"prompt": "hello", "max_tokens": small}
    if path == "/tokenize":
        return {"content": "hello world"}
    if path == "/detokenize":
        return {"tokens": [1, 2, 3]}
    return {"prompt": "hello", "n_predict": small}


@dataclass
class Case:
    method: str
    path: str
    body: Any = None  # JSON value, or bytes sent as they are

    def describe(self) -> str:
        shown = self.body if isinstance(self.body, bytes) else json.dumps(self.body)[:400]
        return f"{self.method} {self.path} {shown}"


def cases(seed: int, vocab: int) -> Callable[[], Case]:
    """An endless, seeded stream of cases: the known killers first, then generated ones."""
    rng = random.Random(seed)
    queue = [Case(m, p, b) for m, p, b in KNOWN_KILLERS]

    def next_case() -> Case:
        if queue:
            return queue.pop(0)
        if rng.random() < 0.1:
            return Case("GET", rng.choice(GETS) + rng.choice(["", "", "?fail_on_no_slot=1", "?model=x"]))
        path = rng.choice(POSTS)
        body: Any = _base(path, rng)
        for _ in range(rng.randrange(1, 5)):
            action = rng.random()
            if action < 0.7:
                name = rng.choice(FIELDS)
                body[name] = _field_value(name, rng, vocab)
            elif action < 0.8 and body:
                body.pop(rng.choice(list(body)))
            else:
                name = rng.choice(FIELDS)
                body[name] = _value(rng, vocab)
        # keep generation short: the tiny model runs to n_predict (a request without one gets the
        # server's -n, see BonsaiTarget)
        for cap in ("n_predict", "max_tokens", "max_completion_tokens"):
            if isinstance(body.get(cap), int) and body[cap] > 64:
                body[cap] = 64
        roll = rng.random()
        if roll < 0.03:
            return Case(
                "POST", path, rng.choice([b"{", b"\xff\xfe", b"[" * 5000 + b"]" * 5000, b'{"prompt": NaN}', b""])
            )
        if roll < 0.06:
            return Case("POST", path, _value(rng, vocab))
        return Case("POST", path, body)

    return next_case


@dataclass
class Crash:
    case: str
    why: str  # the log line that says why (GGML_ASSERT, terminate, ...) or the exit cause


@dataclass
class Report:
    seed: int
    sent: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    no_status: list[str] = field(default_factory=list)  # answered nothing, server still healthy
    crashes: list[Crash] = field(default_factory=list)
    elapsed_s: float = 0.0

    def distinct_crashes(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for c in self.crashes:
            found.setdefault(c.why, []).append(c.case)
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "requests": self.sent,
            "elapsed_s": round(self.elapsed_s, 1),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "no_status": self.no_status,
            "crashes": len(self.crashes),
            "distinct_crashes": {k: v[:3] for k, v in self.distinct_crashes().items()},
        }


def healthy(base_url: str, headers: dict[str, str], wait_s: float = 0.0) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if httpx.get(base_url + "/health", timeout=2.0, trust_env=False, headers=headers).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


class Target:
    """The server under test, as the fuzzer sees it; benchmarks/fuzz_server.py and the test
    implement it over `bonsai start --detach`."""

    base_url: str
    api_key: str | None = None

    def pid(self) -> int | None:
        """The llama-server pid now (None: none runs)."""
        raise NotImplementedError

    def crash_reason(self) -> str:
        """Why the last server ended (its log's GGML_ASSERT/terminate line, or the exit cause)."""
        raise NotImplementedError

    def recover(self) -> bool:
        """Bring a healthy server back (bonsai's restart, or a fresh start); False: give up."""
        raise NotImplementedError


def run(
    target: Target, *, seed: int, requests: int, seconds: float, vocab: int, request_timeout: float = 30.0
) -> Report:
    """Send up to `requests` cases within `seconds`. After a request without an answer, and
    every 25 requests, the server's pid decides: the same one, healthy (a request without a
    status, recorded in no_status), or another one or none (a crash, then `recover()`)."""
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    base_url = target.base_url
    report = Report(seed)
    next_case = cases(seed, vocab)
    known = target.pid()
    started = time.monotonic()

    def crashed(case: Case) -> bool:
        """Record a crash if the server changed or is gone; True: the run must end."""
        nonlocal known
        time.sleep(0.3)  # an abort takes a moment to end the process
        if target.pid() == known and healthy(base_url, headers, wait_s=2.0) and target.pid() == known:
            return False
        report.crashes.append(Crash(case.describe(), target.crash_reason()))
        ok = target.recover()
        known = target.pid()
        return not ok

    with httpx.Client(timeout=request_timeout, trust_env=False, headers=headers) as http:
        while report.sent < requests and time.monotonic() - started < seconds:
            case = next_case()
            report.sent += 1
            try:
                if case.method == "GET":
                    r = http.get(base_url + case.path)
                elif isinstance(case.body, bytes):
                    r = http.post(base_url + case.path, content=case.body, headers={"Content-Type": "application/json"})
                else:
                    r = http.post(base_url + case.path, content=json.dumps(case.body).encode())
                report.statuses[r.status_code] = report.statuses.get(r.status_code, 0) + 1
                if report.sent % 25 == 0 and target.pid() != known and crashed(case):
                    break
                continue
            except httpx.HTTPError:
                pass
            before = len(report.crashes)
            if crashed(case):
                break
            if len(report.crashes) == before:
                report.no_status.append(case.describe())  # no answer, yet the same server is healthy
    report.elapsed_s = time.monotonic() - started
    return report


_WHY_MARKERS = ("GGML_ASSERT", "GGML_ABORT", "terminate called", "what():", "Segmentation fault")


class BonsaiTarget(Target):
    """llama-server as `bonsai start --detach` launches it (restarts on, as by default), in the
    caller's BONSAI_HOME and with the caller's BONSAI_LLAMA_SERVER."""

    def __init__(
        self, model: Path, port: int, *, ctx: int = 512, extra: tuple[str, ...] = (), memory_limit: int = 2**30
    ) -> None:
        self.base_url = f"http://127.0.0.1:{port}"
        self.args = [
            "start",
            "--model",
            str(model),
            "--port",
            str(port),
            "--ctx",
            str(ctx),
            "--detach",
            "--json",
            *extra,
            "--",
            "-n",  # what a request without n_predict/max_tokens generates (else the whole context)
            "16",
        ]
        self.name = ""
        self.log: Path | None = None
        self.offset = 0
        self.starts = 0
        # A request that makes the server allocate gigabytes is a crash too (the out-of-memory
        # killer's, on most machines): past `memory_limit` bytes of RSS the fuzzer kills it.
        self.memory_limit = memory_limit
        self.over_memory: int | None = None
        self._watching = threading.Event()

    def start(self) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "bonsai_launch", *self.args],
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            raise RuntimeError(f"bonsai start failed ({done.returncode}): {done.stderr[-2000:]}")
        data = json.loads(done.stdout)
        self.name, self.log = data["name"], Path(data["log"])
        self.offset = self.log.stat().st_size
        self.starts += 1
        if not self._watching.is_set():
            self._watching.set()
            threading.Thread(target=self._watch_memory, daemon=True).start()

    def _watch_memory(self) -> None:
        import psutil

        while self._watching.is_set():
            pid = self.pid()
            try:
                rss = psutil.Process(pid).memory_info().rss if pid else 0
                if rss > self.memory_limit:
                    self.over_memory = rss
                    psutil.Process(pid).kill()
            except psutil.Error:
                pass
            time.sleep(0.02)

    def instance(self):
        from bonsai_launch.server import instances

        return next((i for i in instances.running() if i.name == self.name), None)

    def pid(self) -> int | None:
        inst = self.instance()
        return inst.pid if inst is not None and inst.state == "running" else None

    def crash_reason(self) -> str:
        if self.over_memory is not None:
            rss, self.over_memory = self.over_memory, None
            return f"RSS over {self.memory_limit >> 20} MiB ({rss >> 20} MiB): killed by the fuzzer"
        time.sleep(0.5)  # the keeper writes the exit cause into the log
        text = self.log.read_bytes()[self.offset :].decode("utf-8", "replace") if self.log else ""
        lines = [ln.strip() for ln in text.splitlines()]
        cause = next((ln for ln in lines if "[bonsai" in ln and "llama-server" in ln), "")
        for n, line in enumerate(lines):
            if "terminate called" in line and n + 1 < len(lines) and "what():" in lines[n + 1]:
                return f"{line} {lines[n + 1]}"[:200]  # the exception's type and message
            if any(m in line for m in _WHY_MARKERS):
                # file:line: GGML_ASSERT(...) without the build's path: one fault, one signature
                found = re.search(r"([\w.-]+\.(?:cpp|c|h|hpp)):(\d+): (GGML_\w+.*)", line)
                return (f"{found[1]}:{found[2]}: {found[3]}" if found else line)[:200]
        return cause[cause.find("llama-server") :][:200] or "exited (no reason in the log)"

    def recover(self, wait_s: float = 90.0) -> bool:
        """Wait for bonsai's restart; start afresh if bonsai gave up (a crash loop)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            inst = self.instance()
            if inst is None:
                break
            if inst.state == "running" and healthy(self.base_url, {}, wait_s=0.0):
                self.offset = self.log.stat().st_size if self.log else 0
                return True
            time.sleep(0.25)
        self.stop()
        try:
            self.start()
        except RuntimeError:
            return False
        return True

    def stop(self) -> None:
        self._watching.clear()
        if self.name:
            subprocess.run(
                [sys.executable, "-m", "bonsai_launch", "stop", self.name],
                capture_output=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
