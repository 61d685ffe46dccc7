#!/usr/bin/env bash
# Set up (first run only) and run the one-machine demo: embedded broker, coordinator,
# a heterogeneous fleet of agents, live progress, a summary and a report under runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-venv.sh demo
exec fl-demo "$@"
