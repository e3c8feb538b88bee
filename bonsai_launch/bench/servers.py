"""The servers a bench run measures: one planned per configuration and launched (then proven
live), or running ones attached by URL."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bonsai_launch.bench.data import (
    READY_TIMEOUT,
    ConfigSpec,
    Listener,
    ServerRun,
    effective_slots,
)
from bonsai_launch.bench.measure import (
    Endpoint,
    MemorySampler,
    pid_listening_on,
    served_model,
)
from bonsai_launch.core.errors import ActionFailed, BonsaiError
from bonsai_launch.server.client import HTTPX_DEFAULT_TIMEOUT, session


def config_flags(name: str, base_flags: dict[str, Any]) -> dict[str, Any]:
    """The settings flags of one configuration: the user's flags with only the speculative
    settings replaced."""
    flags = dict(base_flags)
    if name == "plain":
        flags.update(speculative=False, spec_type=None, spec_nmax=None)
    elif name == "speculative":
        flags.update(speculative=True)
    elif name == "auto":
        flags.update(speculative="auto", spec_type=None, spec_nmax=None)
    else:  # a type, or several joined by '+' (a --configs list is split at commas)
        flags.update(speculative=True, spec_type=name.replace("+", ","))
    return flags


def plan_configs(
    names: Sequence[str],
    base_flags: dict[str, Any],
    model: str | None,
    drafter: str | None,
    passthrough: tuple[str, ...],
    binary: Path,
    parallel: Sequence[int] | None = None,
) -> list[ConfigSpec]:
    """A LaunchPlan per configuration (and, with `parallel`, per slot count), with one context
    size for all of them: the largest any of them asks for, so the KV cache (and its memory) is
    the same on every side."""
    from bonsai_launch.server.inputs import gather_plan

    def build(ctx: int | None) -> list[ConfigSpec]:
        specs = []
        for name in names:
            flags = config_flags(name, base_flags)
            flags["port"] = 8080  # replaced by a free port for every server
            if ctx is not None:
                flags["ctx"] = ctx
            plan = gather_plan(flags, model, drafter, passthrough, binary, repack=True)
            spec_type = plan.speculative.spec_type if plan.speculative else None
            slot_plans = {
                n: gather_plan({**flags, "parallel": n}, model, drafter, passthrough, binary, repack=True)
                for n in parallel or ()
            }
            specs.append(ConfigSpec(name, name == "plain", spec_type, flags, plan=plan, slot_plans=slot_plans))
        return specs

    specs = build(base_flags.get("ctx") or None)
    ctxs = {p.ctx for s in specs for p in (s.plan, *s.slot_plans.values())}
    if len(ctxs) > 1:
        specs = build(max(ctxs))
    if not any(s.baseline for s in specs):
        specs[0].baseline = True
    for s in specs:
        if s.name == "auto":
            # every server auto runs needs its decision: the default launch (the suite) and each
            # --parallel slot count (trade-offs), each tuned for its own settings
            for slots, plan in [(None, s.plan), *s.slot_plans.items()]:
                tuning = plan.tuning or {}
                if tuning.get("status") != "found":
                    on = f" on {slots} slots" if slots else ""
                    raise BonsaiError(
                        f"configuration auto has no tuning decision to run{on}: {tuning.get('why', 'none')}",
                        f"run `{tuning.get('hint', 'bonsai tune')}` first",  # with --parallel N for a slot plan
                    )
            continue
        if s.name != "plain" and s.spec_type is None:
            raise BonsaiError(
                f"configuration {s.name} would run without speculation", "check the profile and --drafter"
            )
    return specs


@contextmanager
def launched(
    spec: ConfigSpec, run: ServerRun, log_dir: Path, listener: Listener, api: str = "chat"
) -> Iterator[Endpoint]:
    """Start the configuration's server (for `run.slots` slots when --parallel planned them) on
    a free port, wait until ready, sample its memory, and always stop it."""
    from bonsai_launch.server.lifecycle import Lifecycle
    from bonsai_launch.server.process import free_port

    base_plan = spec.plan_for_slots(run.slots)
    if run.slots is None:
        run.slots = effective_slots(base_plan)
    attempts = 2  # a free port can be taken by someone else between our check and the bind
    for attempt in range(attempts):
        plan = base_plan.on_port(free_port())
        slots_tag = f"-np{run.slots}" if spec.slot_plans else ""
        log = log_dir / f"{spec.name}-r{run.repeat + 1}-{run.purpose.replace('=', '')}{slots_tag}.log"
        listener.step(f"{spec.label}: starting llama-server ({run.purpose}, repeat {run.repeat + 1})")
        life = Lifecycle(plan.argv, env=plan.env, log_path=log, base_url=plan.base_url)
        try:
            run.startup_s, _ = life.start(READY_TIMEOUT)
        except ActionFailed:
            bind_failed = any("couldn't bind" in line for line in life.server.log_tail(20)) if life.server else False
            if bind_failed and attempt + 1 < attempts:
                continue
            raise
        with life:
            proc = life.server
            assert proc is not None
            run.pid, run.log = proc.pid, str(log)
            if plan.speculative is not None:
                _prove_live(spec, run, plan, life, log, listener)
            try:
                with MemorySampler(proc.pid) as sampler:
                    yield Endpoint(plan.base_url, api=api, api_key=plan.api_key)  # a key the user set is enforced
            finally:
                # read once the sampler has stopped: its last look is in the peak
                run.peak_rss_bytes, run.peak_gpu_bytes = sampler.peak_rss, sampler.peak_gpu
                if not proc.alive():
                    raise ActionFailed(proc.exit_message("during the benchmark"), f"full log: {log}")
        return


def _prove_live(spec: ConfigSpec, run: ServerRun, plan, life, log: Path, listener: Listener) -> None:
    """The rule `bonsai start` applies (live only when the probe drafted tokens): measuring a
    speculative configuration that does not speculate would report plain speed as its own."""
    listener.step(f"{spec.label}: checking speculative decoding")
    proof = life.prove(plan.speculative, plan.api_key)
    run.spec_proof = proof.to_json()
    if not proof.live:
        raise ActionFailed(
            f"{spec.label}: {proof.summary()}",
            f"fix the drafter or its settings, or leave this configuration out of --configs; full log: {log}",
        )


@contextmanager
def attached(spec: ConfigSpec, run: ServerRun, api: str, api_key: str | None) -> Iterator[Endpoint]:
    """URL mode: measure a running server; its memory only when it listens on this machine
    and the OS lets us see the process."""
    assert spec.url is not None
    parsed = urlparse(spec.url)
    pid = None
    if parsed.hostname in ("127.0.0.1", "localhost", "::1") and parsed.port:
        pid = pid_listening_on(parsed.port)
    run.pid = pid
    with session(None, HTTPX_DEFAULT_TIMEOUT) as http:
        model = served_model(http, Endpoint(spec.url, api_key=api_key))
    endpoint = Endpoint(spec.url, api=api, model=model, api_key=api_key)
    if pid is None:
        yield endpoint
        return
    with MemorySampler(pid) as sampler:
        try:
            yield endpoint
        finally:
            run.peak_rss_bytes, run.peak_gpu_bytes = sampler.peak_rss, sampler.peak_gpu
