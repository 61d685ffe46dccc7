#!/usr/bin/env bash
# Build the coordinator and CPU edge-agent images from deploy/*/Dockerfile with buildah, with no
# registry: the base (a python:3.11-slim-bookworm stand-in) is made with debootstrap from Debian's
# mirror. Tags match the Helm chart's default image: edgefl/coordinator:<version in pyproject.toml>.
#
#   scripts/build-images.sh                       # both images
#   scripts/build-images.sh coordinator           # one of: base coordinator agent
#   scripts/build-images.sh --export build/images # also docker-archive tarballs for k3s/kind
#   scripts/build-images.sh --arch arm64 agent    # for another architecture (amd64, arm64): tags end in
#                                                 # -arm64; needs qemu-user-static's binfmt handlers
#
# An image is rebuilt only when the digest of its inputs (Dockerfile, the files it copies, build
# arguments, base image id) differs from the one in its io.edgefl.inputs label; the base only when
# its recipe changes. Environment:
#   EDGEFL_BASE_IMAGE   use this base instead of debootstrapping one (e.g. python:3.11-slim-bookworm)
#   EDGEFL_TORCH_WHEELS a folder holding torch-<TORCH_VERSION>+cpu wheel(s), mounted into the agent
#                       build; default: pip's find-links folders if they hold one for the target
#                       architecture, else the image installs from download.pytorch.org's CPU index
#                       (PyPI's own aarch64 torch is a CUDA build from 2.11 on: never a Raspberry Pi's)
#   EDGEFL_TORCH_VERSION the agent's torch (default 2.13.0, the Dockerfile's); with
#   EDGEFL_TORCH_INDEX_URL where to get it, e.g. 2.10.0 from https://pypi.org/simple, PyPI's newest
#                       CPU build for aarch64, where PyTorch's CPU index cannot be reached
#   DEBIAN_MIRROR       default http://deb.debian.org/debian
#   EDGEFL_BUILD_CA     a CA bundle that RUN steps trust instead of the image's (mounted over
#                       /etc/ssl/certs/ca-certificates.crt, which Debian's pip reads), for a network
#                       behind a TLS-inspecting proxy; default $PIP_CERT. Never stored in the image.
# Needs root (or a rootless buildah set up), buildah, debootstrap and, with --export, skopeo.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)
PREFIX=edgefl
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE_PACKAGES=python3,python3-venv,python-is-python3,ca-certificates
LOCAL_BASE=localhost/$PREFIX/python:3.11-$SUITE
TORCH_VERSION=${EDGEFL_TORCH_VERSION:-2.13.0}
LABEL=io.edgefl.inputs
export BUILDAH_ISOLATION=chroot  # RUN steps need no OCI runtime (crun cannot set rlimits in some sandboxes)

export_dir=""
targets=()
host_arch=$(dpkg --print-architecture 2>/dev/null || uname -m | sed 's/x86_64/amd64/; s/aarch64/arm64/')
arch=$host_arch
while [ $# -gt 0 ]; do
  case "$1" in
    --export) export_dir=$2; shift 2 ;;
    base|coordinator|agent) targets+=("$1"); shift ;;
    --arch) arch=${2:?--arch takes amd64 or arm64}; shift 2 ;;
    -h|--help) sed -n '2,/^# Needs root/p' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "${#targets[@]}" -gt 0 ] || targets=(coordinator agent)
case "$arch" in
  amd64) machine=x86_64 ;;  # uname -m, and the name of qemu's binfmt handler and of wheels' platform tag
  arm64) machine=aarch64 ;;
  *) echo "error: --arch $arch: amd64 or arm64" >&2; exit 2 ;;
esac
# Another architecture's images are tagged as such (edgefl/edge-agent:0.1.0-arm64), so that they never
# replace the host's under the chart's default tag; their RUN steps run under qemu's binfmt handler.
suffix=""
if [ "$arch" != "$host_arch" ]; then
  suffix=-$arch
  grep -qx enabled "/proc/sys/fs/binfmt_misc/qemu-$machine" 2>/dev/null || {
    echo "error: building for $arch on $host_arch needs qemu's binfmt handler for $machine programs:" \
         "apt-get install qemu-user-static binfmt-support (where /proc/sys/fs/binfmt_misc is not mounted:" \
         "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc, then update-binfmts --enable qemu-$machine)" >&2
    exit 1; }
fi
LOCAL_BASE=$LOCAL_BASE$suffix
for tool in buildah ${export_dir:+skopeo}; do
  command -v "$tool" >/dev/null || { echo "error: $tool is not installed (apt-get install $tool)" >&2; exit 1; }
done

log() { printf '[build-images %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
label_of() {  # image label, or nothing when the image is absent
  buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$2\"}}" "$1" 2>/dev/null || true
}
image_id() { buildah inspect --type image --format '{{.FromImageID}}' "$1"; }
digest_of() {  # sha256 of the named files' contents and of the extra strings on stdin
  { find "$@" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    cat; } | sha256sum | cut -d' ' -f1
}

base_image() {  # prints the base image reference, building the local one when needed
  if [ -n "${EDGEFL_BASE_IMAGE:-}" ]; then echo "$EDGEFL_BASE_IMAGE"; return; fi
  # The recipe is the function's own text: edit it and the base is rebuilt.
  local key; key=$(printf '%s\n%s\n%s\n%s\n' "$SUITE" "$arch" "$BASE_PACKAGES" "$(declare -f base_image make_base)" | sha256sum | cut -d' ' -f1)
  if [ "$(label_of "$LOCAL_BASE" "$LABEL")" = "$key" ]; then
    log "base $LOCAL_BASE: reused (recipe unchanged)"
  else
    make_base "$key"
  fi
  echo "$LOCAL_BASE"
}

make_base() {
  local key=$1 root ctr
  root=$(mktemp -d /var/tmp/edgefl-rootfs.XXXXXX)
  log "base: debootstrap $SUITE for $arch ($BASE_PACKAGES) from $MIRROR"
  debootstrap --arch "$arch" --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$root/fs" "$MIRROR" >"$root/debootstrap.log" 2>&1 \
    || { tail -20 "$root/debootstrap.log" >&2; rm -rf "$root"; return 1; }
  # What python:*-slim leaves out too: package caches, docs, man pages, translations; the runtime
  # provides /dev, hostname and resolv.conf. Packages installed later skip docs the same way.
  rm -rf "$root"/fs/var/cache/apt/* "$root"/fs/var/lib/apt/lists/* "$root"/fs/usr/share/doc/* \
         "$root"/fs/usr/share/man/* "$root"/fs/usr/share/info/* "$root"/fs/usr/share/locale/* \
         "$root"/fs/usr/share/lintian "$root"/fs/var/log/* "$root"/fs/dev/* \
         "$root"/fs/etc/hostname "$root"/fs/etc/resolv.conf
  printf '%s\n' 'path-exclude=/usr/share/doc/*' 'path-exclude=/usr/share/man/*' 'path-exclude=/usr/share/locale/*' \
    >"$root/fs/etc/dpkg/dpkg.cfg.d/edgefl-slim"
  tar --numeric-owner -C "$root/fs" -cf "$root/rootfs.tar" .
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$root/rootfs.tar" / >/dev/null
  buildah config --arch "$arch" --os linux --env LANG=C.UTF-8 --cmd python3 --label "$LABEL=$key" \
    --label org.opencontainers.image.title="Debian $SUITE with python3 (edgefl build base)" "$ctr"
  buildah commit --quiet --rm "$ctr" "$LOCAL_BASE" >/dev/null
  rm -rf "$root"
  log "base $LOCAL_BASE: built"
}

torch_wheels() {  # a folder holding only the CPU torch wheel for $arch, or nothing
  local dir wheel
  if [ -n "${EDGEFL_TORCH_WHEELS:-}" ]; then echo "$EDGEFL_TORCH_WHEELS"; return; fi
  for dir in ${PIP_FIND_LINKS:-} /opt/wheels; do
    wheel=$(ls "$dir"/torch-"$TORCH_VERSION"+cpu-*_"$machine".whl 2>/dev/null | head -1) || true
    if [ -n "$wheel" ]; then
      mkdir -p build/wheelhouse && rm -f build/wheelhouse/torch-*.whl
      ln -f "$wheel" build/wheelhouse/ 2>/dev/null || cp "$wheel" build/wheelhouse/
      echo "$PWD/build/wheelhouse"; return
    fi
  done
}

build() {  # build <name> <dockerfile> [buildah bud arguments...]
  local name=$1 dockerfile=$2; shift 2
  local ref=localhost/$PREFIX/$name:$VERSION$suffix sources key start
  # Whatever the Dockerfile COPYs from the build context, as the unit tests read it.
  mapfile -t sources < <(awk '/^COPY/ && !/--from=/ {for (i = 2; i < NF; i++) print $i}' "$dockerfile")
  key=$(printf '%s\n' "$arch" "$@" "$(image_id "$base")" | digest_of "$dockerfile" "${sources[@]}")
  if [ "$(label_of "$ref" "$LABEL")" = "$key" ]; then
    log "$ref: reused (inputs unchanged, $LABEL=${key:0:12})"
    return
  fi
  log "$ref: building from $dockerfile"
  start=$SECONDS
  local previous; previous=$(buildah inspect --type image --format '{{.FromImageID}}' "$ref" 2>/dev/null || true)
  local ca=${EDGEFL_BUILD_CA:-${PIP_CERT:-}} mounts=()
  [ -z "$ca" ] || mounts=(--volume "$(readlink -f "$ca"):/etc/ssl/certs/ca-certificates.crt:ro")
  # --format docker keeps the Dockerfile's HEALTHCHECK, which the OCI format has no field for.
  buildah bud --quiet --isolation chroot --arch "$arch" --format docker --pull=missing -f "$dockerfile" --build-arg PYTHON_IMAGE="$base" \
    --label "$LABEL=$key" --label org.opencontainers.image.version="$VERSION" -t "$ref" "${mounts[@]}" "$@" . >/dev/null
  log "$ref: built in $((SECONDS - start)) s"
  # The image the tag named before is now nameless: drop it (kept while a container uses it).
  [ -z "$previous" ] || buildah rmi "$previous" >/dev/null 2>&1 || true
}

export_archive() {  # a docker-archive that `k3s ctr images import` and `kind load image-archive` take
  local name=$1 out
  out=$export_dir/$PREFIX-$name-$VERSION$suffix.tar
  mkdir -p "$export_dir" && rm -f "$out"
  skopeo copy --quiet "containers-storage:localhost/$PREFIX/$name:$VERSION$suffix" \
    "docker-archive:$out:docker.io/$PREFIX/$name:$VERSION$suffix"
  log "exported $out ($(du -h "$out" | cut -f1))"
}

base=$(base_image)
for target in "${targets[@]}"; do
  case "$target" in
    base) ;;
    coordinator) build coordinator deploy/coordinator/Dockerfile ;;
    agent)
      wheels=$(torch_wheels)
      version=()  # named only when overridden, so that the default build's inputs (and reuse) stay as they were
      [ -z "${EDGEFL_TORCH_VERSION:-}" ] || version=(--build-arg TORCH_VERSION="$TORCH_VERSION")
      if [ -n "$wheels" ]; then
        # The mounted wheel wins over PyPI's (a +cpu local version sorts higher); torch's own
        # dependencies come from PyPI.
        build edge-agent deploy/edge-agent/Dockerfile "${version[@]}" --volume "$wheels:/wheelhouse:ro" \
          --label io.edgefl.torch-wheel="$(cd "$wheels" && ls torch-*.whl)" \
          --build-arg TORCH_FIND_LINKS=/wheelhouse --build-arg TORCH_INDEX_URL=https://pypi.org/simple
      else
        build edge-agent deploy/edge-agent/Dockerfile "${version[@]}" \
          ${EDGEFL_TORCH_INDEX_URL:+--build-arg TORCH_INDEX_URL="$EDGEFL_TORCH_INDEX_URL"}
      fi ;;
  esac
  if [ -n "$export_dir" ] && [ "$target" != base ]; then
    export_archive "$([ "$target" = agent ] && echo edge-agent || echo coordinator)"
  fi
done
buildah images --filter reference="localhost/$PREFIX/*" >&2
