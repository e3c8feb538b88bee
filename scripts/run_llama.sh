#!/bin/sh
# Ask a Bonsai model one question in the terminal: a thin wrapper around `bonsai run`.
#
# Uses the running server of the profile (see `bonsai ps`), or starts a temporary one.
# Same environment variables as start_llama_server.sh; arguments go to `bonsai run`.
#
#   ./scripts/run_llama.sh "Write a haiku about bonsai trees"
#   BONSAI_PROFILE=demo BONSAI_SPECULATIVE=1 ./scripts/run_llama.sh "List 1 to 50" --max-tokens 200
#
# POSIX sh (bash, dash, busybox ash); uses no external commands before it hands over.
set -eu

here=${0%/*}
[ "$here" = "$0" ] && here=.

if [ "$#" -eq 0 ]; then
    printf '%s\n' "usage: $0 \"PROMPT\" [bonsai run options]" >&2
    exit 2
fi
if command -v bonsai >/dev/null 2>&1; then
    exec bonsai run "$@"
fi
if [ -x "$here/../.venv/bin/bonsai" ]; then
    exec "$here/../.venv/bin/bonsai" run "$@"
fi
for py in python3 python; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import bonsai_launch' >/dev/null 2>&1; then
        exec "$py" -m bonsai_launch run "$@"
    fi
done

printf '%s\n' \
    "error: bonsai is not installed (no 'bonsai' command on PATH, no python with bonsai_launch)" \
    "  install it:            pip install 'bonsai-launch[demo]'" \
    "  or from this checkout: pip install '.[demo]'" \
    "then run this script again." >&2
exit 127
