#!/bin/sh
# Start llama-server for a Bonsai model: a thin wrapper around `bonsai start`.
#
# Same environment variables as before (BONSAI_FAMILY, BONSAI_MODEL, BONSAI_SPECULATIVE,
# BONSAI_CTX, BONSAI_NGL, BONSAI_HOST, BONSAI_KV4, ... see environment_variables.md); bonsai
# reads them itself and checks every value. Arguments go to llama-server unchanged.
#
#   BONSAI_SPECULATIVE=1 ./scripts/start_llama_server.sh
#   BONSAI_PROFILE=demo ./scripts/start_llama_server.sh --threads 2
#
# POSIX sh (bash, dash, busybox ash); uses no external commands before it hands over.
set -eu

here=${0%/*}
[ "$here" = "$0" ] && here=.

if command -v bonsai >/dev/null 2>&1; then
    exec bonsai start -- "$@"
fi
# A checkout with its own virtual environment (python -m venv .venv && pip install -e .).
if [ -x "$here/../.venv/bin/bonsai" ]; then
    exec "$here/../.venv/bin/bonsai" start -- "$@"
fi
for py in python3 python; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import bonsai_launch' >/dev/null 2>&1; then
        exec "$py" -m bonsai_launch start -- "$@"
    fi
done

printf '%s\n' \
    "error: bonsai is not installed (no 'bonsai' command on PATH, no python with bonsai_launch)" \
    "  install it:            pip install 'bonsai-launch[demo]'" \
    "  or from this checkout: pip install '.[demo]'" \
    "then run this script again." >&2
exit 127
