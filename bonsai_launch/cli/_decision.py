"""Tuning as the commands share it: measure now (`bonsai tune`, and `bonsai start` with
BONSAI_SPECULATIVE=auto and no decision yet), and the decision table (tune, start, config)."""

from __future__ import annotations

from pathlib import Path


def tune_now(
    flags: dict,
    model: str | None,
    drafter: str | None,
    passthrough: tuple[str, ...],
    *,
    prompts: str | None = None,
    budget: float | None = None,
    configs: tuple[str, ...] | None = None,
    max_tokens: int | None = None,
    temperature: float = 0.0,
    binary: Path | None = None,
    clients: int | None = None,
):
    """Fetch what is missing (model, drafter, llama-server), then measure with a progress bar.
    `clients` at once per run; None: as many as the launch has slots (--parallel/BONSAI_PARALLEL)."""
    from bonsai_launch.cli._progress import ProgressListener
    from bonsai_launch.config.settings import resolve
    from bonsai_launch.server.prepare import prepare_launch
    from bonsai_launch.tune.session import TuneOptions, check_options, run_tune
    from bonsai_launch.tune.subject import TuneRequest

    if clients is None:
        clients = int(resolve({k: v for k, v in flags.items() if v is not None}).get("parallel") or 1)
    options = TuneOptions(
        budget_s=budget,
        max_tokens=max_tokens,
        temperature=temperature,
        prompts_path=prompts,
        configs=configs,
        clients=clients,
    )
    check_options(options)  # a bad value is refused before any model is downloaded or built
    if binary is None:
        binary = prepare_launch(flags, model, drafter, ("plain", "speculative"))
    with ProgressListener(enabled=True) as listener:
        return run_tune(TuneRequest(flags, model, drafter, passthrough, binary), options, listener)


def print_decision(out, decision: dict, title: str | None = None) -> None:
    """The decision table and the choice, as `bonsai tune` and the start summary show them."""
    from rich.table import Table

    from bonsai_launch.tune.decide import COLUMNS, RATIO_NOTE, format_rows

    choice = decision["choice"]
    table = Table(
        title=title or f"tuning decision {decision['id'][:8]} ({decision['prompts']}, {decision['created']})",
        title_justify="left",
    )
    for col, justify in COLUMNS:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in format_rows(decision["table"]):
        table.add_row(*row)
    out.print(table)
    out.print(measured_on(decision), markup=False, highlight=False)
    if any(row.get("ratio") for row in decision["table"]):
        out.print(RATIO_NOTE, markup=False, highlight=False)
    # A stored decision (tune, config) or the plan's view of it (start): the same facts, two shapes.
    conditions = decision.get("server_settings") or (decision.get("key") or {}).get("conditions")
    if conditions:  # a launch uses the decision only with these same settings
        out.print(f"measured with: {conditions}", markup=False, highlight=False)
    notes = decision.get("notes") or (decision.get("evidence") or {}).get("notes") or []
    for note in notes:  # a busy machine, a budget that ran out: what makes the numbers less sure
        out.print(f"note: {note}", markup=False, highlight=False)
    if choice["speculative"]:
        out.print(f"choice: [bold]{choice['label']}[/] ({choice['reason']})")
    else:
        out.print("choice: [bold]plain[/]: no speculative configuration was faster than plain beyond noise")


def show_decision(flags: dict, model: str | None, drafter: str | None, passthrough: tuple[str, ...], as_json: bool):
    """`bonsai tune --show`: the decision a launch with these settings would use (the lookup
    `start` and `config` make), with the prompts and clients it was measured with."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.server.inputs import select
    from bonsai_launch.server.prepare import describe_for_config

    selection = select({**{k: v for k, v in flags.items() if v is not None}, "speculative": None})
    tuning = describe_for_config(selection, model, drafter, passthrough)
    if as_json:
        emit_json(tuning)
        return
    out = console()
    if tuning.get("table"):
        print_decision(out, tuning)
    out.print(tuning.get("message", ""), markup=False, highlight=False)


def measured_on(decision: dict) -> str:
    """`figures for: 8 prompts (bundled tuning prompts), 4 clients at once, 64 tokens each`."""
    evidence = decision.get("evidence") or {}  # the stored decision's, or the plan's copy of it
    n = evidence.get("prompts") if isinstance(evidence.get("prompts"), int) else None
    clients = evidence.get("clients") or 1  # decisions from before clients were measured: one
    where = decision.get("prompts") if isinstance(decision.get("prompts"), str) else "?"
    words = f"figures for: {n} prompts ({where})" if n else f"figures for: prompts {where}"
    words += f", {clients} client{'s' if clients != 1 else ''} at once"
    if evidence.get("answer_lengths"):  # the prompts' own lengths (a sample's), or one for all
        words += f", {evidence['answer_lengths']}"
    elif evidence.get("max_tokens"):
        words += f", {evidence['max_tokens']} tokens each"
    return words
