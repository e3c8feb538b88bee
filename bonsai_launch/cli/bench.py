"""`bonsai bench`: does speculative decoding pay on this machine, for this kind of work?

Examples:
    bonsai bench --profile demo --quick                      # a few minutes on a laptop
    bonsai bench --profile demo --configs plain,ngram-mod,ngram-map-k --temps 0,0.7 --repeats 3
    bonsai bench --model T.gguf --drafter D.gguf --configs plain,speculative
    bonsai bench --url http://127.0.0.1:8000 --baseline-url http://127.0.0.1:8001   # vLLM, SGLang, llama.cpp
    bonsai bench --profile demo --prompts my_prompts.jsonl --categories code-edit --json
    bonsai bench --profile demo --quick -- --threads 2       # arguments after -- go to every llama-server
    bonsai bench --profile demo --configs plain,speculative,auto    # check the tuned decision on the bench's prompts
    bonsai bench --profile demo --configs plain,ngram-mod,ngram-simple --save   # store the result for BONSAI_SPECULATIVE=auto
    bonsai bench --profile demo --configs plain,ngram-mod --parallel 1,4 --concurrency 1,2,4,8   # slots x clients

Reports go to --out (default $BONSAI_HOME/bench/<time>): bench.json (schema in
bonsai_launch/bench/schema.json), bench.md, bench.svg and concurrency.svg (the charts).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from bonsai_launch.cli._options import FamilyOpt, JsonOpt, ProfileOpt, SizeOpt, SpecAutoOpt
from bonsai_launch.cli._passthrough import passthrough_args

ConfigsOpt = Annotated[
    str | None,
    typer.Option(
        "--configs",
        help="Comma list: plain, speculative (the profile's own mode), auto (the tuned decision) and/or speculative types (ngram-mod, ngram-map-k, draft-dspark...).",
    ),
]
PromptsOpt = Annotated[str | None, typer.Option("--prompts", help="JSONL prompt file instead of the bundled suite.")]
CategoriesOpt = Annotated[
    str | None, typer.Option("--categories", help="Comma list of categories to run (default: all).")
]
PerCategoryOpt = Annotated[
    int | None,
    typer.Option("--per-category", help="At most this many prompts of each category (default: all; --quick: 2)."),
]
TempsOpt = Annotated[str | None, typer.Option("--temps", help="Comma list of temperatures (default 0,0.7).")]
RepeatsOpt = Annotated[
    int | None, typer.Option("--repeats", help="Runs per configuration (default 3; fewer gives no verdict).")
]
MaxTokensOpt = Annotated[int | None, typer.Option("--max-tokens", help="Tokens generated per request (default 128).")]
ConcurrencyOpt = Annotated[
    str | None, typer.Option("--concurrency", help="Comma list of simultaneous clients (default 1,4).")
]
ParallelListOpt = Annotated[
    str | None,
    typer.Option(
        "--parallel",
        help="Comma list of server slot counts (e.g. 1,4): the concurrency rounds run on one server per count, and the report says which configuration and slot count to use for K users. A single value also comes from BONSAI_PARALLEL.",
    ),
]
QuickOpt = Annotated[
    bool, typer.Option("--quick", help="A small subset: 2 prompts per category, temperature 0, 96 tokens.")
]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Folder for bench.json, bench.md, bench.svg.")]
UrlOpt = Annotated[
    str | None, typer.Option("--url", help="Measure this running OpenAI-compatible server instead of launching one.")
]
BaselineUrlOpt = Annotated[
    str | None, typer.Option("--baseline-url", help="With --url: the same model served without speculation.")
]
ApiOpt = Annotated[str, typer.Option("--api", help="chat (/v1/chat/completions) or completion (/v1/completions).")]
ApiKeyOpt = Annotated[str | None, typer.Option("--api-key", help="API key for --url servers; env BONSAI_API_KEY.")]
ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Benchmark this local GGUF instead of the profile's weights.")
]
DrafterOpt = Annotated[
    str | None, typer.Option("--drafter", help="DSpark/DFlash drafter GGUF for the speculative configuration.")
]
CtxOpt = Annotated[
    int | None, typer.Option("--ctx", "-c", help="Context size for every configuration; env BONSAI_CTX.")
]
NglOpt = Annotated[int | None, typer.Option("--ngl", help="GPU layers; env BONSAI_NGL.")]
TradeoffTokensOpt = Annotated[
    int | None,
    typer.Option("--tradeoff-tokens", help="Tokens per multi-turn and concurrency request (default 48; --quick: 32)."),
]
InterleaveOpt = Annotated[
    bool,
    typer.Option(
        "--interleave-conversations",
        help="Multi-turn: every conversation's turn 1, then every turn 2...: with fewer slots than conversations this measures the prompt cache (BONSAI_CACHE_RAM, BONSAI_CTX_CHECKPOINTS).",
    ),
]
NoTradeoffsOpt = Annotated[
    bool, typer.Option("--no-tradeoffs", help="Skip the multi-turn and concurrency measurements.")
]
NoChartOpt = Annotated[bool, typer.Option("--no-chart", help="Do not draw bench.svg.")]
SaveOpt = Annotated[
    bool,
    typer.Option(
        "--save", help="Store the result as the tuning decision for BONSAI_SPECULATIVE=auto (as `bonsai tune` does)."
    ),
]


def _floats(text: str, option: str) -> tuple[float, ...]:
    from bonsai_launch.core.errors import BonsaiError

    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise BonsaiError(f"{option} {text!r} is not a comma list of numbers", f"for example {option} 0,0.7") from None


def _ints(text: str, option: str) -> tuple[int, ...]:
    from bonsai_launch.core.errors import BonsaiError

    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise BonsaiError(
            f"{option} {text!r} is not a comma list of whole numbers", f"for example {option} 1,4"
        ) from None


def command(
    ctx: typer.Context,
    profile: ProfileOpt = None,
    family: FamilyOpt = None,
    size: SizeOpt = None,
    model: ModelOpt = None,
    drafter: DrafterOpt = None,
    configs: ConfigsOpt = None,
    prompts: PromptsOpt = None,
    categories: CategoriesOpt = None,
    per_category: PerCategoryOpt = None,
    temps: TempsOpt = None,
    repeats: RepeatsOpt = None,
    max_tokens: MaxTokensOpt = None,
    concurrency: ConcurrencyOpt = None,
    parallel: ParallelListOpt = None,
    quick: QuickOpt = False,
    out: OutOpt = None,
    url: UrlOpt = None,
    baseline_url: BaselineUrlOpt = None,
    api: ApiOpt = "chat",
    api_key: ApiKeyOpt = None,
    ctx_size: CtxOpt = None,
    ngl: NglOpt = None,
    tradeoff_tokens: TradeoffTokensOpt = None,
    interleave: InterleaveOpt = False,
    no_tradeoffs: NoTradeoffsOpt = False,
    no_chart: NoChartOpt = False,
    json_output: JsonOpt = False,
    save: SaveOpt = False,
    speculative_auto: SpecAutoOpt = False,
) -> None:
    """Benchmark speculative decoding against plain decoding and say, per kind of work, whether it pays.

    Examples:

        bonsai bench --profile demo --quick

        bonsai bench --profile demo --configs plain,ngram-mod,ngram-map-k --temps 0,0.7

        bonsai bench --url http://127.0.0.1:8000 --baseline-url http://127.0.0.1:8001
    """
    import dataclasses

    from bonsai_launch.bench.data import BenchOptions, parse_config_names
    from bonsai_launch.bench.pipeline import Target, quick_options, run_bench
    from bonsai_launch.cli._output import emit_json
    from bonsai_launch.cli._progress import ProgressListener
    from bonsai_launch.config.settings import resolve
    from bonsai_launch.core.errors import BonsaiError
    from bonsai_launch.core.paths import bonsai_home
    from bonsai_launch.server.client import first_key
    from bonsai_launch.server.prepare import prepare_launch

    given: dict = {}
    if configs is not None:
        given["configs"] = parse_config_names(configs)
    if categories is not None:
        given["categories"] = tuple(c.strip() for c in categories.split(",") if c.strip())
    if per_category is not None:
        if per_category < 1:
            raise BonsaiError(f"--per-category {per_category} must be at least 1", "for example --per-category 3")
        given["per_category"] = per_category
    if temps is not None:
        given["temps"] = _floats(temps, "--temps")
    if repeats is not None:
        given["repeats"] = repeats
    if max_tokens is not None:
        given["max_tokens"] = max_tokens
    if concurrency is not None:
        given["concurrency"] = _ints(concurrency, "--concurrency")
    if tradeoff_tokens is not None:
        if tradeoff_tokens < 2:
            raise BonsaiError(f"--tradeoff-tokens {tradeoff_tokens} is too small", "use 32 or more")
        given["tradeoff_tokens"] = tradeoff_tokens
    if parallel is not None:
        given["parallel"] = _ints(parallel, "--parallel")
        if not given["parallel"]:
            raise BonsaiError("--parallel is empty", "for example --parallel 1,4")
    options = dataclasses.replace(
        BenchOptions(), api=api, prompts_path=prompts, tradeoffs=not no_tradeoffs, interleave=interleave, **given
    )
    if quick:
        options = quick_options(options, set(given))

    if baseline_url and not url:
        raise BonsaiError("--baseline-url needs --url", "pass the speculative server as --url")
    flags = {"profile": profile, "family": family, "size": size, "ctx": ctx_size, "ngl": ngl}
    settings = resolve(flags)
    if configs is None and (speculative_auto or settings["speculative"] == "auto"):
        options = dataclasses.replace(options, configs=("plain", "auto"))  # BONSAI_SPECULATIVE=auto: the tuned choice
    if save and url:
        raise BonsaiError("--save needs servers that bench launches itself", "leave out --url")
    if save and options.repeats < 3:
        raise BonsaiError(
            f"--save needs at least 3 repeats (--repeats {options.repeats}): fewer decide nothing",
            "use --repeats 3 or more",
        )
    if url:
        if passthrough_args(ctx) or model or drafter or configs:
            raise BonsaiError(
                "--url measures running servers: --model, --drafter, --configs and llama-server arguments do not apply",
                "drop them, or leave out --url to launch servers",
            )
        target = Target(url=url, baseline_url=baseline_url, api_key=first_key(api_key or settings.get("api_key")))
    else:
        binary = prepare_launch(flags, model, drafter, options.configs)
        if drafter:  # a legacy `dspark` drafter is measured as its cached conversion, like `bonsai start` runs it
            import os

            from bonsai_launch.server.prepare import usable_for_start

            drafter = usable_for_start(flags, os.environ, model, drafter)
        target = Target(flags=flags, model=model, drafter=drafter, passthrough=passthrough_args(ctx), binary=binary)
    out_dir = out or (bonsai_home() / "bench" / time.strftime("%Y%m%d-%H%M%S"))

    with ProgressListener(enabled=True) as listener:
        doc, paths = run_bench(options, target, out_dir, listener, chart=not no_chart)
    saved = save_decision(doc, options, target, paths) if save else None
    if json_output:
        emit_json(doc)
        return
    from bonsai_launch.bench.terminal import print_terminal
    from bonsai_launch.cli._output import console

    print_terminal(doc, console(), paths)
    if saved is not None:
        console().print(
            f"stored as the tuning decision for BONSAI_SPECULATIVE=auto: {saved.choice.describe()}", markup=False
        )


def save_decision(doc: dict, options, target, paths: dict):
    """`--save`: the tuning rule over this run, stored like a `bonsai tune` decision."""
    from bonsai_launch.bench import prompts as suite
    from bonsai_launch.decisions.store import save
    from bonsai_launch.tune.subject import decision_from_bench, with_report

    chosen = suite.select(
        suite.load_prompts(options.prompts_path),
        list(options.categories) if options.categories else None,
        options.per_category,
    )
    name = options.prompts_path or "bench suite"
    if options.categories or options.per_category:
        name += (
            f" ({', '.join(options.categories or ['all categories'])}; {options.per_category or 'all'} per category)"
        )
    decision = with_report(
        decision_from_bench(
            doc, target.flags, target.model, target.drafter, target.binary, chosen, name, target.passthrough
        ),
        paths.get("json"),
    )
    save(decision)
    return decision
