"""Checking a running OpenAI-compatible server: health, model, decode speed, speculation.

Works on any such server; llama-server gives more (per-request timings with draft counts,
/slots, /metrics), and only there can speculation be proven. The report is plain data, so
`bonsai verify --json` and the text output are two views of one result.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.core.errors import ActionFailed
from bonsai_launch.server import client
from bonsai_launch.server import liveness as speculation_probe
from bonsai_launch.server.liveness import PROOF_PROMPT

PROOF_TOKENS = 32  # a few more than start's proof: verify also reports decode speed

SPEC_COUNTERS = ("llamacpp:spec_decode_num_draft_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_total")


@dataclass
class VerifyReport:
    url: str
    healthy: bool = False
    health: str = ""
    server: str = "unknown"  # "llama-server" or "openai-compatible"
    model: str | None = None
    tokens: int = 0
    decode_tps: float | None = None
    speculative: bool | None = None  # None: cannot tell (not llama-server)
    slots_speculative: bool | None = None
    drafted: int = 0
    accepted: int = 0
    expect_speculative: bool = False
    not_live_reason: str | None = None  # the same words `bonsai start` prints
    woke: bool = False  # it was asleep (BONSAI_SLEEP_IDLE_SECONDS); the probe woke it
    problems: list[str] = field(default_factory=list)

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["acceptance"] = self.acceptance
        data["ok"] = self.ok
        return data


def verify(url: str, *, api_key: str | None = None, expect_speculative: bool = False) -> VerifyReport:
    base = client.base(url)
    report = VerifyReport(url=base, expect_speculative=expect_speculative)
    try:
        h = client.health(base, api_key)
    except ActionFailed as exc:
        report.health = "unreachable"
        report.problems.append(exc.message)
        return report
    report.health = h.status
    report.healthy = h.ok
    if h.status_code == 404:  # not every OpenAI-compatible server has /health; /v1/models will tell
        report.healthy = True
        report.health = "no /health endpoint"
    if not report.healthy:
        report.problems.append(f"health: {h.status} (HTTP {h.status_code})")
        return report

    try:
        props = client.props(base, api_key)
    except ActionFailed:
        props = None
    is_llama = props is not None and ("build_info" in props or "default_generation_settings" in props)
    report.server = "llama-server" if is_llama else "openai-compatible"
    try:
        ids = client.models(base, api_key)
        report.model = ids[0] if ids else None
    except ActionFailed as exc:
        report.problems.append(f"model list: {exc.message}")
    if props and not report.model:
        report.model = props.get("model_alias") or props.get("model_path")

    if is_llama:
        _check_llama(base, api_key, report)
    else:
        _check_openai(base, api_key, report)

    if expect_speculative and not report.speculative:
        if report.speculative is None:
            report.problems.append("speculation cannot be checked: the server is not llama-server (no draft counts)")
        else:
            report.problems.append(f"speculative decoding is not live: {report.not_live_reason}")
    return report


def _check_llama(base: str, api_key: str | None, report: VerifyReport) -> None:
    """The speculation probe `bonsai start` uses, judged by the same rule (drafted > 0)."""
    try:
        result = speculation_probe.probe(base, api_key, PROOF_TOKENS)
    except ActionFailed as exc:
        report.problems.append(f"generation: {exc.message}")
        return
    report.slots_speculative = result.slots_speculative
    report.woke = result.woke
    report.tokens = result.tokens
    report.decode_tps = result.decode_tps
    report.drafted, report.accepted = result.drafted, result.accepted
    report.speculative = speculation_probe.is_live(result)
    if not report.speculative:
        inst = _bonsai_instance(base)
        report.not_live_reason = speculation_probe.not_live_reason(
            result, inst.spec_type if inst else None, Path(inst.log_path) if inst else None
        )
    if report.tokens == 0:
        report.problems.append("generation: the server produced no tokens")


def _bonsai_instance(base: str):
    """The bonsai server at this URL, if bonsai started it (its log explains a failed drafter)."""
    from bonsai_launch.server import instances

    for inst in instances.running():
        if client.base(inst.base_url) == base:
            return inst
    return None


def _check_openai(base: str, api_key: str | None, report: VerifyReport) -> None:
    started = time.monotonic()
    try:
        result = client.chat_completion(
            base,
            [{"role": "user", "content": PROOF_PROMPT}],
            max_tokens=PROOF_TOKENS,
            temperature=0.0,
            api_key=api_key,
            model=report.model,
        )
    except ActionFailed as exc:
        report.problems.append(f"generation: {exc.message}")
        return
    elapsed = time.monotonic() - started
    usage = result.get("usage") or {}
    report.tokens = int(usage.get("completion_tokens") or 0)
    # Without server timings this includes prompt processing: a lower bound on decode speed.
    report.decode_tps = report.tokens / elapsed if report.tokens and elapsed > 0 else None
    timings = result.get("timings") or {}
    if timings:  # an OpenAI-compatible front of llama-server: judged by the same rule
        report.drafted, report.accepted, _ = client.acceptance(timings)
        report.speculative = speculation_probe.is_live(
            speculation_probe.ProbeResult(report.drafted, report.accepted, report.tokens, report.decode_tps, None, 1)
        )
        if not report.speculative:
            report.not_live_reason = speculation_probe.not_live_reason(
                speculation_probe.ProbeResult(0, 0, report.tokens, report.decode_tps, None, 1)
            )
    if report.tokens == 0 and not (result.get("choices") or []):
        report.problems.append("generation: the server returned no answer")
