"""The top wing: one thin module per `bonsai` command over the library, and the helpers they share.

main.py             the `bonsai` app: every command registers here
build.py pull.py    `bonsai build`, `bonsai pull`
start.py            `bonsai start`: plan, launch, prove speculation, supervise (or --detach)
serve.py            `bonsai serve`: several models behind one port (llama-server's router)
run.py chat.py      one answer, or a conversation, in the terminal
verify.py           check any OpenAI-compatible server
bench.py tune.py    measure plain against speculative; decide what BONSAI_SPECULATIVE=auto runs
ps.py logs.py stop.py  servers started with --detach
service.py          `bonsai start` as a login service (systemd user unit, launchd agent, logon task)
models.py rm.py     the catalog and what is downloaded
config.py           every setting's value and where it came from
inspect.py          what a GGUF declares; whether a drafter fits a target
convert_drafter.py  legacy DSpark drafter -> dflash
doctor.py           hardware, toolchains, builds, models, port: each problem with its fix
fleet.py export.py  replicas behind the LiteLLM proxy; a profile as a vLLM/SGLang command line

Shared helpers (a command imports these and the library, never another command):
_options.py      option types every command spells the same way
_launch.py       the launch options start, run and chat share (LaunchOptions)
_passthrough.py  the arguments after `--`
_serve.py        what `serve` and `service install --serve` share: the dry run, the start, the summary
_output.py       human output (rich) or --json; warnings on stderr
_progress.py     the progress bar of measuring commands
_target.py       the server run and chat talk to, and the answer's stats line
_decision.py     tuning now, and the decision table

Each command module imports only typer at the top; heavy libraries (gguf/numpy, httpx,
huggingface_hub, psutil) are imported inside the command so `bonsai --help` stays fast.
"""
