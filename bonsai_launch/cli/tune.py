"""`bonsai tune`: measure plain against the speculative configurations this build and model
allow, and store which one to run with BONSAI_SPECULATIVE=auto.

Examples:
    bonsai tune --profile demo                       # about a minute; then BONSAI_SPECULATIVE=auto bonsai start --profile demo
    bonsai tune --profile demo --budget 180 --json
    bonsai tune --model T.gguf --drafter D.gguf --configs plain,draft-dspark
    bonsai tune --profile demo --prompts my_prompts.jsonl -- --threads 2   # arguments after -- go to every llama-server
    bonsai tune --profile demo --parallel 4          # a decision for `start --parallel 4`, measured with 4 clients at once
    bonsai tune --profile demo --prompts my_work.jsonl   # decide on your own prompts (JSONL: messages or prompt)
    BONSAI_TUNE_SAMPLE=200 bonsai start --profile demo --detach   # keep a sample of the work it gets
    bonsai tune --profile demo --prompts recent      # ... then decide on that sample
    bonsai tune --profile demo --show                # the stored decision for this launch, and what it was made on
"""

from __future__ import annotations

from typing import Annotated

import typer

from bonsai_launch.cli._options import (
    CtxOpt,
    DrafterOpt,
    FamilyOpt,
    JsonOpt,
    ModelOpt,
    NglOpt,
    ParallelOpt,
    ProfileOpt,
    SizeOpt,
)
from bonsai_launch.cli._passthrough import passthrough_args

BudgetOpt = Annotated[
    float | None,
    typer.Option(
        "--budget", help="Seconds to spend at most (default: about 16 plain runs, a minute or two on the demo)."
    ),
]
PromptsOpt = Annotated[
    str | None,
    typer.Option(
        "--prompts",
        help="JSONL prompt file instead of the bundled tuning prompts; `recent`: the requests BONSAI_TUNE_SAMPLE kept.",
    ),
]
ConfigsOpt = Annotated[
    str | None,
    typer.Option(
        "--configs",
        help="Comma list of candidates only (e.g. plain,ngram-mod,ngram-mod/n16,draft-dspark; draft-mtp: n-max 1-3 of an MTP model).",
    ),
]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--max-tokens",
        help="Tokens generated per prompt (default: as many as the server generated for each, with --prompts recent; else 128).",
    ),
]
ClientsOpt = Annotated[
    int | None,
    typer.Option("--clients", help="Concurrent clients per measurement (default: the slot count, --parallel)."),
]
ShowOpt = Annotated[bool, typer.Option("--show", help="Print the stored decision for this launch; measure nothing.")]
TempOpt = Annotated[float, typer.Option("--temperature", help="Sampling temperature of the measurements.")]


def command(
    ctx: typer.Context,
    profile: ProfileOpt = None,
    family: FamilyOpt = None,
    size: SizeOpt = None,
    model: ModelOpt = None,
    drafter: DrafterOpt = None,
    prompts: PromptsOpt = None,
    budget: BudgetOpt = None,
    configs: ConfigsOpt = None,
    max_tokens: MaxTokensOpt = None,
    temperature: TempOpt = 0.0,
    ctx_size: CtxOpt = None,
    ngl: NglOpt = None,
    parallel: ParallelOpt = None,
    clients: ClientsOpt = None,
    show: ShowOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Decide, by measuring on this machine, whether speculative decoding pays for this model.

    Stores the decision for BONSAI_SPECULATIVE=auto (start, run, chat, bench)."""
    from bonsai_launch.cli._decision import print_decision, tune_now
    from bonsai_launch.cli._output import emit_json

    flags = {"profile": profile, "family": family, "size": size, "ctx": ctx_size, "ngl": ngl, "parallel": parallel}
    names = tuple(c.strip() for c in configs.split(",") if c.strip()) if configs else None
    if show:
        from bonsai_launch.cli._decision import show_decision

        show_decision(flags, model, drafter, passthrough_args(ctx), json_output)
        return
    outcome = tune_now(
        flags,
        model,
        drafter,
        passthrough_args(ctx),
        prompts=prompts,
        budget=budget,
        configs=names,
        max_tokens=max_tokens,
        temperature=temperature,
        clients=clients,
    )
    if json_output:
        emit_json(
            {
                "decision": outcome.decision.to_json(),
                "stored": str(outcome.stored),
                "reports": outcome.paths,
                "budget_s": round(outcome.budget_s, 1),
                "elapsed_s": round(outcome.elapsed_s, 1),
                "notes": outcome.notes,
            }
        )
        return
    from bonsai_launch.cli._output import console

    out = console()
    print_decision(out, outcome.decision.to_json())
    out.print(f"[dim]{outcome.elapsed_s:.0f} s; stored {outcome.stored}; report {outcome.paths.get('markdown')}[/]")
    who = f"--profile {outcome.decision.profile}" if outcome.decision.profile else f"--model {outcome.decision.model}"
    out.print(f"use it: BONSAI_SPECULATIVE=auto bonsai start {who}", markup=False)
