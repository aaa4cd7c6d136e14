#!/usr/bin/env bash
# The main job: build Lamina, start the local CPU cluster of deploy/topologies/local-cpu.yaml
# (a coordinator, one compute node and two memory nodes, each its own process, serving the bundled
# demo model), print a completion from it, and stop the cluster.
#   bash deploy/demo.sh ["PROMPT"]
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh >&2  # its progress on stderr; the completion alone on stdout
topology=deploy/topologies/local-cpu.yaml
log=$(mktemp)
build/bin/lamina up "$topology" >"$log" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
  grep -q "Lamina is up" "$log" && break
  if ! kill -0 $up 2>/dev/null; then cat "$log" >&2; exit 1; fi
  sleep 0.1
done
grep -q "Lamina is up" "$log" || { cat "$log" >&2; exit 1; }
grep "Lamina is up" "$log" >&2
prompt="${1:-In this paper, we}"
echo "> $prompt" >&2
build/bin/lamina generate --topology "$topology" --prompt "$prompt" --max-tokens 48
