#!/usr/bin/env bash
# Set up (first run only) and run every test, the slow end-to-end suite included.
# Needs the Mosquitto broker and Prometheus (prometheus, promtool) on PATH (Debian:
# apt-get install mosquitto prometheus); the tests that need them fail, not skip, without them.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-venv.sh test
if ! command -v mosquitto >/dev/null && [ ! -x /usr/sbin/mosquitto ]; then
  echo "warning: mosquitto not found; the integration tests will fail (apt-get install mosquitto)" >&2
fi
for tool in prometheus promtool; do
  if ! command -v "$tool" >/dev/null && [ ! -x "/usr/bin/$tool" ]; then
    echo "warning: $tool not found; the tests that need it will fail (apt-get install prometheus)" >&2
  fi
done
exec python -m pytest "$@"
