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
    max_tokens: int = 64,
    temperature: float = 0.0,
    binary: Path | None = None,
):
    """Fetch what is missing (model, drafter, llama-server), then measure with a progress bar."""
    from bonsai_launch.cli._progress import ProgressListener
    from bonsai_launch.server.prepare import prepare_launch
    from bonsai_launch.tune.session import TuneOptions, check_options, run_tune
    from bonsai_launch.tune.subject import TuneRequest

    options = TuneOptions(
        budget_s=budget, max_tokens=max_tokens, temperature=temperature, prompts_path=prompts, configs=configs
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
