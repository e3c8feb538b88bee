"""The whole benchmark, end to end: options -> servers and requests -> summary -> files.

`bonsai bench` (cli/bench.py) is a thin wrapper around `run_bench`; tests call it directly.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bonsai_launch.bench import prompts as suite
from bonsai_launch.bench import report, runner, servers, summary
from bonsai_launch.bench.data import QUICK, BenchOptions, Listener
from bonsai_launch.core.errors import BonsaiError


@dataclass(frozen=True)
class Target:
    """What to measure: servers bonsai starts (settings flags, files, binary) or URLs."""

    flags: dict[str, Any] = dataclasses.field(default_factory=dict)
    model: str | None = None
    drafter: str | None = None
    passthrough: tuple[str, ...] = ()
    binary: Path | None = None
    url: str | None = None
    baseline_url: str | None = None
    api_key: str | None = None


def quick_options(options: BenchOptions, given: set[str]) -> BenchOptions:
    """--quick: a small subset for a laptop; options the user gave explicitly still win."""
    changes: dict[str, Any] = {k: v for k, v in QUICK.items() if k not in given}
    return dataclasses.replace(options, quick=True, **changes)


def check_options(options: BenchOptions) -> None:
    if options.repeats < 1:
        raise BonsaiError(f"--repeats {options.repeats} must be at least 1", "use 3 or more for a verdict")
    if options.max_tokens < 2:
        raise BonsaiError(f"--max-tokens {options.max_tokens} is too small", "use 64 or more")
    if not options.temps:
        raise BonsaiError("--temps is empty", "for example --temps 0,0.7")
    for t in options.temps:
        if t < 0 or t > 2:
            raise BonsaiError(f"--temps: {t:g} is outside 0-2", "for example --temps 0,0.7")
    for c in options.concurrency:
        if c < 1 or c > 64:
            raise BonsaiError(f"--concurrency: {c} is outside 1-64", "for example --concurrency 1,4")
    for n in options.parallel or ():
        if n < 1 or n > 256:
            raise BonsaiError(f"--parallel: {n} is outside 1-256", "for example --parallel 1,4")
    if options.parallel and len(set(options.parallel)) != len(options.parallel):
        raise BonsaiError("--parallel names a slot count twice", "list each once, for example --parallel 1,4")
    if options.api not in ("chat", "completion"):
        raise BonsaiError(f"--api {options.api!r} is not known", "use chat or completion")


def busy_note(environment: dict[str, Any]) -> str | None:
    """A warning when other work competed for the CPU. The load average counts runnable
    processes: at the start of the run (no server of ours yet) above half the logical cores,
    or at the end above the cores our own server keeps busy plus that half."""
    cores = (environment.get("hardware") or {}).get("logical_cores") or 1
    spare = max(1.0, cores / 2)
    start, end = environment.get("load_average_start"), environment.get("load_average_end")
    seen = [x for x in ((start or [None])[0], (end or [None])[0]) if x is not None]
    if (start and start[0] > spare) or (end and end[0] > cores + spare):
        return (
            f"the machine was busy (load average up to {max(seen):.1f} on {cores} logical cores): other work "
            "competed with the servers, so timings are noisier and slower than on an idle machine"
        )
    return None


def run_bench(
    options: BenchOptions, target: Target, out_dir: Path | None, listener: Listener | None = None, chart: bool = True
) -> tuple[dict[str, Any], dict[str, str]]:
    """Measure, summarise and write the reports. Returns (report document, written paths)."""
    check_options(options)
    all_prompts = suite.load_prompts(options.prompts_path)
    prompts = suite.select(all_prompts, list(options.categories) if options.categories else None, options.per_category)
    if target.url and options.parallel:
        raise BonsaiError(
            "--parallel sets the slots of servers bonsai starts; a --url server keeps its own",
            "drop --parallel, or leave out --url to launch servers",
        )
    if target.url:
        data = runner.run_urls(options, target.url, target.baseline_url, prompts, all_prompts, target.api_key, listener)
    else:
        if target.binary is None:
            raise BonsaiError(
                "no llama-server to benchmark", "run `bonsai build`, set BONSAI_LLAMA_SERVER, or pass --url"
            )
        configs = servers.plan_configs(
            options.configs,
            target.flags,
            target.model,
            target.drafter,
            target.passthrough,
            target.binary,
            options.parallel,
        )
        from bonsai_launch.core.paths import logs_dir

        log_dir = logs_dir() / "bench" / time.strftime("%Y%m%d-%H%M%S")
        data = runner.run_launch(options, configs, prompts, all_prompts, log_dir, listener)
    busy = busy_note(data.environment)
    if busy:
        data.notes.append(busy)
    if options.repeats < 3:
        data.notes.append(f"only {options.repeats} repeat(s): no verdict is claimed (3 or more are needed)")
    doc = summary.summarize(data)
    paths = report.write_reports(doc, out_dir, chart) if out_dir is not None else {}
    return doc, paths
