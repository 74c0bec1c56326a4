#!/usr/bin/env bash
# Front-end benchmark: shoal's HTTP (binary tensor extension) and gRPC front ends on the
# `identity` plugin with a small tensor, side by side with nginx answering a static
# response of the same size, on this machine in one run. Load comes from wrk (HTTP) and
# bench/grpc_load (gRPC), all on loopback.
#   bench/frontends.sh [--seconds S] [--connections C] [--elements N]
# Needs: a build in build/ (scripts/build.sh), and wrk + nginx-light (installed on demand).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=10
CONNECTIONS=64
ELEMENTS=16
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_PER_RUN="$2"; shift 2 ;;
    --connections) CONNECTIONS="$2"; shift 2 ;;
    --elements) ELEMENTS="$2"; shift 2 ;;
    *) echo "usage: bench/frontends.sh [--seconds S] [--connections C] [--elements N]" >&2; exit 2 ;;
  esac
done
for p in wrk nginx-light curl; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || {
    echo "installing $p" >&2; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$p" >/dev/null; }
done
SHOAL=build/src/cli/shoal
[ -x "$SHOAL" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }

WORK=$(mktemp -d)
cleanup() {
  [ -n "${SHOAL_PID:-}" ] && kill "$SHOAL_PID" 2>/dev/null && wait "$SHOAL_PID" 2>/dev/null || true
  [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HTTP_PORT=$(free_port); GRPC_PORT=$(free_port); METRICS_PORT=$(free_port); NGINX_PORT=$(free_port)

mkdir -p "$WORK/repo/identity/1"
cat > "$WORK/repo/identity/config.pbtxt" <<CFG
name: "identity"
backend: "identity"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
CFG
"$SHOAL" serve --model-repository "$WORK/repo" --http-address 127.0.0.1 --http-port "$HTTP_PORT" \
  --grpc-port "$GRPC_PORT" --metrics-port "$METRICS_PORT" >"$WORK/shoal.log" 2>&1 &
SHOAL_PID=$!
for _ in $(seq 100); do curl -sf "localhost:$HTTP_PORT/v2/health/ready" >/dev/null && break; sleep 0.1; done

# The binary-extension request: a JSON header, then the raw tensor bytes.
BYTES=$((ELEMENTS * 4))
HEADER="{\"inputs\":[{\"name\":\"INPUT0\",\"shape\":[1,$ELEMENTS],\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":$BYTES}}],\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"binary_data\":true}}]}"
head -c "$BYTES" /dev/zero > "$WORK/tensor.bin"
{ printf '%s' "$HEADER"; cat "$WORK/tensor.bin"; } > "$WORK/body.bin"
RESPONSE_BYTES=$(curl -s -X POST -H "Inference-Header-Content-Length: ${#HEADER}" --data-binary @"$WORK/body.bin" \
  "localhost:$HTTP_PORT/v2/models/identity/infer" | wc -c)
[ "$RESPONSE_BYTES" -gt 0 ] || { echo "shoal did not answer; log:" >&2; cat "$WORK/shoal.log" >&2; exit 1; }

cat > "$WORK/post.lua" <<LUA
local f = io.open("$WORK/body.bin", "rb")
wrk.method = "POST"
wrk.body = f:read("*all")
f:close()
wrk.headers["Inference-Header-Content-Length"] = "${#HEADER}"
wrk.headers["Content-Type"] = "application/octet-stream"
LUA

# nginx: the same number of response bytes from memory, 2 workers (one per core).
BODY=$(head -c "$RESPONSE_BYTES" /dev/zero | tr '\0' 'x')
cat > "$WORK/nginx.conf" <<NGX
worker_processes 2;
pid $WORK/nginx.pid;
error_log $WORK/nginx.err;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx_body;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / { default_type application/octet-stream; return 200 "$BODY"; }
  }
}
NGX
nginx -c "$WORK/nginx.conf" -p "$WORK"
for _ in $(seq 50); do curl -sf -X POST "localhost:$NGINX_PORT/" >/dev/null && break; sleep 0.1; done

run_wrk() {  # url -> "req/s p50_us p99_us"
  wrk -t2 -c"$CONNECTIONS" -d"${SECONDS_PER_RUN}s" --latency -s "$WORK/post.lua" "$1" > "$WORK/wrk.out"
  awk '
    function us(v) { if (v ~ /us$/) return v+0; if (v ~ /ms$/) return (v+0)*1000; if (v ~ /s$/) return (v+0)*1e6; return v }
    /Requests\/sec/ { rps=$2 }
    $1=="50.000%" || $1=="50%" { p50=us($2) }
    $1=="99.000%" || $1=="99%" { p99=us($2) }
    /Non-2xx/ { bad=$NF }
    END { printf "%.0f %.0f %.0f %d\n", rps, p50, p99, bad }' "$WORK/wrk.out"
}

echo "# Front ends vs nginx (identity, $ELEMENTS FP32 elements, response $RESPONSE_BYTES bytes, $CONNECTIONS connections, ${SECONDS_PER_RUN}s each, $(nproc) CPUs)"
echo
echo "| server | protocol | req/s | p50 us | p99 us | errors | vs nginx |"
echo "|---|---|---|---|---|---|---|"
read -r N_RPS N_P50 N_P99 N_BAD < <(run_wrk "http://127.0.0.1:$NGINX_PORT/")
read -r H_RPS H_P50 H_P99 H_BAD < <(run_wrk "http://127.0.0.1:$HTTP_PORT/v2/models/identity/infer")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
echo "| nginx (static, same size) | HTTP/1.1 | $N_RPS | $N_P50 | $N_P99 | $N_BAD | 1.00 |"
echo "| shoal | HTTP binary infer | $H_RPS | $H_P50 | $H_P99 | $H_BAD | $(ratio "$H_RPS" "$N_RPS") |"
if [ -x build/bench/grpc_load ]; then
  read -r G_RPS G_P50 G_P99 G_BAD < <(build/bench/grpc_load --target "127.0.0.1:$GRPC_PORT" --model identity \
    --elements "$ELEMENTS" --concurrency "$CONNECTIONS" --seconds "$SECONDS_PER_RUN")
  echo "| shoal | gRPC ModelInfer (raw) | $G_RPS | $G_P50 | $G_P99 | $G_BAD | $(ratio "$G_RPS" "$N_RPS") |"
fi
echo
echo "Target: shoal HTTP >= 0.5x nginx requests/s. Load generators share the machine's cores with the servers."
