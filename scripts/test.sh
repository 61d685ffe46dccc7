#!/usr/bin/env bash
# Set up (first run only) and run every test, the slow end-to-end suite included.
# The tests need the Mosquitto broker and Prometheus (prometheus, promtool): when one is
# missing, this installs the Debian packages (as root), or stops with the command to run.
# Tests start their own brokers on free ports; a packaged service may hold 1883, harmlessly.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
if ! command -v mosquitto >/dev/null && [ ! -x /usr/sbin/mosquitto ]; then
  missing+=(mosquitto)
fi
for tool in prometheus promtool; do
  if ! command -v "$tool" >/dev/null && [ ! -x "/usr/bin/$tool" ]; then
    missing+=("$tool")
  fi
done
# The image test (tests/integration/test_images.py) builds with buildah and debootstrap and runs
# with podman and runc; it skips without them, so only root (CI) installs them here, each one
# that is missing (a machine with buildah from an earlier install may lack runc).
containers=()
if [ "$(id -u)" -eq 0 ]; then
  for tool in buildah podman runc skopeo debootstrap; do
    command -v "$tool" >/dev/null || containers+=("$tool")
  done
  missing+=("${containers[@]}")
fi
if [ "${#missing[@]}" -gt 0 ]; then
  install="apt-get install -y --no-install-recommends mosquitto prometheus ${containers[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: not installed: ${missing[*]}. install the packages, then run this again:" >&2
    echo "  sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive $install" >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null; then
    echo "error: not installed: ${missing[*]}, and no apt-get to install them with:" \
         "install Mosquitto and Prometheus (prometheus, promtool) with your package manager" >&2
    exit 1
  fi
  echo "installing the missing packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  $install
fi
source scripts/setup-venv.sh test
# Two workers (tests/conftest.py schedules them): the integration tests whose deadlines fit the work, one at a
# time, on one; the few unhurried ones and the unit tests on the other. -n 0: all in this process.
exec python -m pytest -n 2 "$@"
