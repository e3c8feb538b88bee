"""One llama-server: from settings to a plan, from the plan to a supervised process.

inputs.py        the edge between the user's world and the plan: selection, files, hardware, binary
prepare.py       before a launch (start, run, chat, bench, tune, fleet): fetch, convert, build, plan
model_codec.py   the weights llama-server gets for a Bonsai 2 file: refused, repacked into Q2_0, or as is
passthrough.py   llama-server arguments given after `--`, read with the binary's own option table
slots.py         how many requests run at once, and what each slot needs (ub/b sizing)
prompt_cache.py  prompt-cache flags for long, repeated chats
plan/            the launch plan: a pure function from what we know to the exact command, with reasons
process.py       one llama-server child: spawn, wait until it serves, stop, read its log; stop signals
lifecycle.py     one llama-server's named states (starting, proving, running, restarting, stopping),
                 the one door start, restart, bench and the self-test spawn and prove through
supervisor.py    running a plan: checks before spawning, readiness, proof of speculation, serving
restart.py       restarting a server that died on its own: backoff, crash loop, notes in its log
service_files.py the text of a login service running `bonsai start`: systemd unit, launchd agent, task XML
service.py       `bonsai service`: writes that file in the user's folders and hands it to the manager
watch.py         whether speculation still pays on a running server's work, from its /metrics
prompt_sample.py BONSAI_TUNE_SAMPLE: the prompts a server was sent, from its /slots, for `tune --prompts recent`
traffic.py       auto re-decided from that sample: the server's own answers replayed through the n-gram candidates
keeper.py        the parent of a detached server, so that it is restarted with its exit cause known
router.py        `bonsai serve`: every model behind one port on llama-server's router, each planned as start does
router_inputs.py what `bonsai serve` is asked to serve (profiles, files, pairs, folders) and each model's plan
router_watch.py  a router's models: idle unload that ends the child, pins, proof per model, state for `ps`
instances.py     running servers bonsai knows about (`bonsai ps`), one state file each
liveness.py      is speculation live? one probe and one rule for every command, on one slot or several
client.py        a small client for llama-server and OpenAI-compatible servers
verify.py        checking any running server: health, model, speed, speculation
selftest.py      the build self-test: which checks a build gets, running them, its verdict kept with the build
selftest_checks.py  the checks: CPU kernels, 2 slots on a hybrid target, speculation lossless, GPU vs CPU
"""
