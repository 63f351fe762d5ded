#!/usr/bin/env bash
# Starts `deepinfer serve` (default model) on a free port, and a second one whose output is
# scripted to a DSML tool call (the hidden test hook --debug-force-output), drives both with
# the official `openai` Python package (tools/openai_e2e.py), then stops them with Ctrl-C
# (SIGINT) and checks they exit cleanly. Installs `openai` into target/openai-venv on first
# use.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/openai-venv
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'openai>=1.40,<4'
fi
cargo build --locked -p deepinfer-cli
pids=()
logs=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -f "${logs[@]}"' EXIT

# start_server ARGS...: starts a server, waits until it listens; sets $url and $pid.
start_server() {
    local log
    log=$(mktemp)
    logs+=("$log")
    DEEPINFER_CACHE_DIR=target/deepinfer-cache target/debug/deepinfer serve --port 0 "$@" \
        2>"$log" &
    pid=$!
    pids+=("$pid")
    url=
    for _ in $(seq 1 600); do
        url=$(grep -o 'http://[0-9.:]*' "$log" | head -n1 || true)
        [ -n "$url" ] && break
        kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; echo "the server exited early" >&2; exit 1; }
        sleep 0.2
    done
    [ -n "$url" ] || { cat "$log" >&2; echo "the server did not start" >&2; exit 1; }
}

start_server
main_url=$url main_pid=$pid
script=$("$venv/bin/python" tools/openai_e2e.py --print-tool-script)
start_server --debug-force-output "$script"
tool_url=$url tool_pid=$pid
"$venv/bin/python" tools/openai_e2e.py "$main_url" "$tool_url"
for p in "$main_pid" "$tool_pid"; do
    kill -INT "$p"
    wait "$p"
done
echo "servers stopped cleanly"
