#!/usr/bin/env bash
# Set up (first run only) and run every test, the slow end-to-end suite included.
# Needs the Mosquitto broker on PATH (Debian: apt-get install mosquitto); the tests
# that need it fail, not skip, without it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-venv.sh test
if ! command -v mosquitto >/dev/null && [ ! -x /usr/sbin/mosquitto ]; then
  echo "warning: mosquitto not found; the integration tests will fail (apt-get install mosquitto)" >&2
fi
exec python -m pytest "$@"
