#!/usr/bin/env bash
# Scale-out benchmark: three `shoal serve` replicas of the example identity model behind
# nginx (deploy/nginx), a closed-loop HTTP client through nginx; one replica gets SIGKILL
# under load and is restarted. Requests, client-visible errors, throughput and p50/p99
# before, while the replica is down, while it restarts and after. Writes
# bench/results/scale-out.md (and scale-out.json).
#   bench/scale_out/run.sh [--replicas N] [--concurrency C] [--kill-at S] [--restart-at S]
#                          [--duration S] [--fail-timeout 5s] [--out DIR]
# ~50 s. Needs a build (SHOAL_BUILD, default build) and nginx (scripts/install-deps.sh).
# Everything listens on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=bench/results
ARGS=(--kill-at 15 --restart-at 30 --duration 50)
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 2; }; OUT="$2"; shift 2 ;;
    --replicas|--concurrency|--kill-at|--restart-at|--duration|--fail-timeout)
      [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 2; }
      ARGS+=("$1" "$2"); shift 2 ;;
    *) echo "usage: bench/scale_out/run.sh [--replicas N] [--concurrency C] [--kill-at S]" \
            "[--restart-at S] [--duration S] [--fail-timeout 5s] [--out DIR]" >&2; exit 2 ;;
  esac
done
SHOAL="${SHOAL_BUILD:-build}/src/cli/shoal"
[ -x "$SHOAL" ] || { echo "build first: scripts/build.sh ${SHOAL_BUILD:-build} (no $SHOAL)" >&2; exit 1; }
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { echo "nginx missing: scripts/install-deps.sh" >&2; exit 1; }
mkdir -p "$OUT"
export SHOAL_BUILD="${SHOAL_BUILD:-build}"
NOTE="Machine: $(nproc) CPU(s) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
NOTE+=", shared with other work while this ran: the client, nginx and every replica compete"
NOTE+=" for the same cores, so the absolute figures are noisy and only their shape across"
NOTE+=" the phases means something (load average $(cut -d' ' -f1-3 /proc/loadavg) at the start)."
NOTE+=" $(date -u +'%Y-%m-%d %H:%M UTC'), nginx $(nginx -v 2>&1 | cut -d/ -f2)."
/usr/bin/env python3 deploy/tests/scale_out.py "${ARGS[@]}" --report "$OUT/scale-out.md" \
  --json "$OUT/scale-out.json" --note "$NOTE"
echo "wrote $OUT/scale-out.md"
