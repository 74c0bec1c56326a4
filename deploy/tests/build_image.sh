#!/usr/bin/env bash
# Builds deploy/Dockerfile for real and checks the image: runs `shoal serve` in it, waits
# for /v2/health/ready from the host, checks that it runs as user 10001, runs the image's
# HEALTHCHECK, asks for the model index and the dashboard, and stops it with SIGTERM.
# Prints the build time, the image size and the time to ready.
#
# Slow (the image compiles shoal from scratch): NOT part of CTest or CI; run it by hand,
# as root, from anywhere in the repository:
#   deploy/tests/build_image.sh [--jobs N] [--tag NAME] [--base-root DIR] [--mirror URL]
#                               [--rebuild-base] [--no-build] [--keep]
#
# Needs podman, buildah and debootstrap (Debian packages; on a host with hybrid or v1
# cgroups also runc, which is then used instead of crun). No registry is needed: the
# Debian 12 base the Dockerfile names (debian:12, debian:12-slim) is made here with
# `debootstrap --variant=minbase bookworm` from the Debian mirror (--mirror), or taken
# from an existing root folder (--base-root), and imported into podman's local store.
# The build itself needs Debian's archive and the npm registry (the dashboard's uPlot).
#
#   --jobs N        compile jobs in the image (build arg SHOAL_JOBS; default 1)
#   --tag NAME      image name (default localhost/shoal:test)
#   --base-root DIR a Debian 12 root folder to import instead of running debootstrap
#   --mirror URL    Debian mirror for debootstrap (default http://deb.debian.org/debian)
#   --rebuild-base  make the base image again even if debian:12 exists
#   --no-build      check an image built before (--tag)
#   --keep          leave the container running (its name is printed)
# Environment: SHOAL_IMAGE_STORAGE_DRIVER (podman/buildah storage driver, default vfs,
# which works everywhere, overlay included inside containers).
set -euo pipefail
cd "$(dirname "$0")/../.."

JOBS=1
TAG=localhost/shoal:test
BASE_ROOT=""
MIRROR=http://deb.debian.org/debian
REBUILD_BASE=0
BUILD=1
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) JOBS="$2"; shift 2 ;;
    --tag) TAG="$2"; shift 2 ;;
    --base-root) BASE_ROOT="$2"; shift 2 ;;
    --mirror) MIRROR="$2"; shift 2 ;;
    --rebuild-base) REBUILD_BASE=1; shift ;;
    --no-build) BUILD=0; shift ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d;s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

for tool in podman buildah curl python3; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install podman buildah curl)" >&2; exit 2; }
done
STORAGE=(--storage-driver "${SHOAL_IMAGE_STORAGE_DRIVER:-vfs}")
PODMAN=(podman "${STORAGE[@]}")
# crun refuses hosts whose cgroups are hybrid (v1 controllers beside a v2 mount); runc
# runs there.
if [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ] && command -v runc >/dev/null; then
  PODMAN+=(--runtime "$(command -v runc)")
fi
# podman asks for more open files than an unprivileged VM or container may allow, and
# the runtime may be refused raising the process limit of a non-root user to the host's:
# ask for this shell's open files and for 4096 processes (lowering is always allowed;
# shoal runs far fewer threads).
RUN_LIMITS=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096)

step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

# ---- base image -------------------------------------------------------------------------
if [ "$REBUILD_BASE" = 1 ] || ! "${PODMAN[@]}" image exists debian:12; then
  step "base image debian:12 and debian:12-slim (Debian 12 minbase)"
  tmp=""
  if [ -z "$BASE_ROOT" ]; then
    command -v debootstrap >/dev/null || { echo "needs debootstrap" >&2; exit 2; }
    tmp=$(mktemp -d)
    BASE_ROOT="$tmp/root"
    debootstrap --variant=minbase bookworm "$BASE_ROOT" "$MIRROR" >"$tmp/debootstrap.log" 2>&1 ||
      { tail -20 "$tmp/debootstrap.log" >&2; fail "debootstrap"; }
  fi
  tar -C "$BASE_ROOT" -c . | "${PODMAN[@]}" import - debian:12 >/dev/null
  "${PODMAN[@]}" tag debian:12 debian:12-slim
  [ -n "$tmp" ] && rm -rf "$tmp"
fi

# ---- build ------------------------------------------------------------------------------
if [ "$BUILD" = 1 ]; then
  step "buildah bud -f deploy/Dockerfile (SHOAL_JOBS=$JOBS)"
  # --format docker: the OCI image format has no HEALTHCHECK and buildah would drop it.
  # --isolation chroot: works without user namespaces or cgroups.
  # --ignorefile: what buildah reads beside the Dockerfile anyway, named to be sure.
  t0=$(date +%s)
  buildah "${STORAGE[@]}" bud --format docker --isolation chroot --layers \
    --ignorefile deploy/Dockerfile.dockerignore --build-arg "SHOAL_JOBS=$JOBS" \
    -f deploy/Dockerfile -t "$TAG" .
  BUILD_S=$(($(date +%s) - t0))
  echo "build: ${BUILD_S} s"
fi

# ---- what the image says about itself ---------------------------------------------------
step "image $TAG"
"${PODMAN[@]}" image inspect "$TAG" >"${TMPDIR:-/tmp}/shoal-image-inspect.$$.json"
python3 - "${TMPDIR:-/tmp}/shoal-image-inspect.$$.json" <<'EOF' || fail "image configuration"
import json, sys
image = json.load(open(sys.argv[1]))[0]
config = image.get("Config", {})
print(f"size: {image['Size'] / 1e6:.0f} MB ({image['Size']} bytes)")
print(f"user: {config.get('User')!r}, entrypoint: {config.get('Entrypoint')}, cmd: {config.get('Cmd')}")
health = image.get("Healthcheck") or config.get("Healthcheck") or image.get("HealthCheck")
print(f"healthcheck: {health}")
problems = []
if config.get("User") != "10001:10001":
    problems.append(f"USER is {config.get('User')!r}, not 10001:10001")
if not health or "/v2/health/ready" not in " ".join(health.get("Test", [])):
    problems.append("no HEALTHCHECK on /v2/health/ready in the image")
for p in problems:
    print("FAIL:", p, file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
rm -f "${TMPDIR:-/tmp}/shoal-image-inspect.$$.json"

# ---- run it -----------------------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HTTP_PORT=$(free_port)
METRICS_PORT=$(free_port)
NAME="shoal-image-test-$$"
cleanup() {
  if [ "$KEEP" = 0 ]; then "${PODMAN[@]}" rm -f -t 0 "$NAME" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

step "podman run $TAG (its own CMD: serve the example models), ports on 127.0.0.1"
t0=$(date +%s.%N)
# Published on loopback; inside, the image's default ports (8000 HTTP, 8002 metrics), so
# the HEALTHCHECK is the image's own, unchanged. Confined as deploy/kubernetes runs it:
# read-only root, an empty /tmp, no capabilities, no privilege escalation.
"${PODMAN[@]}" run -d --name "$NAME" "${RUN_LIMITS[@]}" \
  --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges \
  -p "127.0.0.1:$HTTP_PORT:8000" -p "127.0.0.1:$METRICS_PORT:8002" "$TAG" >/dev/null
ready=""
for _ in $(seq 1 1200); do
  if curl -fsS -o /dev/null "http://127.0.0.1:$HTTP_PORT/v2/health/ready" 2>/dev/null; then
    ready=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
    break
  fi
  if [ "$("${PODMAN[@]}" inspect -f '{{.State.Running}}' "$NAME")" != true ]; then
    "${PODMAN[@]}" logs "$NAME" >&2 || true
    fail "the container exited before it was ready"
  fi
  sleep 0.1
done
[ -n "$ready" ] || { "${PODMAN[@]}" logs "$NAME" >&2; fail "not ready within 120 s"; }
echo "ready: $ready s after podman run (HTTP 200 from 127.0.0.1:$HTTP_PORT/v2/health/ready)"

# Non-root: the server process (PID 1 in the container) runs as 10001.
uid=$("${PODMAN[@]}" exec "$NAME" sh -c 'while read -r k r _; do [ "$k" = Uid: ] && echo "$r"; done </proc/1/status; true')
comm=$("${PODMAN[@]}" exec "$NAME" cat /proc/1/comm)
echo "PID 1: $comm, uid $uid"
[ "$uid" = 10001 ] && [ "$comm" = shoal ] || fail "PID 1 is $comm with uid $uid, not shoal with 10001"

# deploy/kubernetes' preStop hook runs `sleep 5` in the container: the image must have it.
"${PODMAN[@]}" exec "$NAME" sleep 0 || fail "no sleep in the image (the preStop hook)"

# The image's HEALTHCHECK command, run by podman in the container. (Without systemd,
# podman logs that it cannot schedule the periodic check: harmless, it is run here.)
"${PODMAN[@]}" healthcheck run "$NAME" || fail "HEALTHCHECK failed"
echo "healthcheck: healthy"

# The example models are served, and the dashboard (uPlot embedded at build time).
index=$(curl -fsS -X POST "http://127.0.0.1:$HTTP_PORT/v2/repository/index" -d '{}')
echo "$index" | python3 -c '
import json, sys
models = json.load(sys.stdin)
ready = sorted(m["name"] for m in models if m.get("state") == "READY")
print("models ready:", len(ready), "of", len(models), ":", " ".join(ready))
sys.exit(0 if ready else 1)' || fail "no model READY"
curl -fsS "http://127.0.0.1:$METRICS_PORT/dashboard/" | grep -q uplot.min.js || fail "no dashboard page"
curl -fsS -o /dev/null "http://127.0.0.1:$METRICS_PORT/dashboard/uplot.min.js" || fail "no uPlot"
curl -fsS "http://127.0.0.1:$METRICS_PORT/dashboard/uplot-LICENSE.txt" | grep -q MIT ||
  fail "no uPlot licence"
echo "dashboard: served with uPlot and its licence"

if [ "$KEEP" = 1 ]; then
  echo "left running: $NAME (HTTP 127.0.0.1:$HTTP_PORT, metrics 127.0.0.1:$METRICS_PORT)"
  exit 0
fi

# SIGTERM drains and exits 0.
"${PODMAN[@]}" stop -t 30 "$NAME" >/dev/null
code=$("${PODMAN[@]}" inspect -f '{{.State.ExitCode}}' "$NAME")
echo "stopped with SIGTERM: exit $code"
[ "$code" = 0 ] || fail "exit $code after SIGTERM"
echo "OK${BUILD_S:+ (build ${BUILD_S} s)}"
