#!/usr/bin/env bash
# Starts `deepinfer serve` (default model) on a free port, drives it with the official
# `openai` Python package (tools/openai_e2e.py), then stops it with Ctrl-C (SIGINT) and
# checks it exits cleanly. Installs `openai` into target/openai-venv on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/openai-venv
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'openai>=1.40,<4'
fi
cargo build --locked -p deepinfer-cli
log=$(mktemp)
DEEPINFER_CACHE_DIR=target/deepinfer-cache target/debug/deepinfer serve --port 0 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
    url=$(grep -o 'http://[0-9.:]*' "$log" | head -n1 || true)
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; echo "the server exited early" >&2; exit 1; }
    sleep 0.2
done
[ -n "$url" ] || { cat "$log" >&2; echo "the server did not start" >&2; exit 1; }
"$venv/bin/python" tools/openai_e2e.py "$url"
kill -INT "$pid"
wait "$pid"
echo "server stopped cleanly"
