#!/usr/bin/env bash
# `nginx -t` on deploy/nginx/nginx.conf.template rendered for two replicas, in a
# temporary prefix (CTest deploy_nginx_config). Nothing listens: -t only parses and
# opens the files the configuration names.
set -euo pipefail
cd "$(dirname "$0")/.."
NGINX="${1:-nginx}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/logs" "$dir/temp"
chmod 755 "$dir"
python3 nginx/render.py --http-listen 127.0.0.1:18000 --grpc-listen 127.0.0.1:18001 \
  --http-server 10.0.0.11:8000 --http-server 10.0.0.12:8000 \
  --grpc-server 10.0.0.11:8001 --grpc-server 10.0.0.12:8001 --out "$dir/nginx.conf"
grep -q "server 10.0.0.12:8001 max_fails=2 fail_timeout=5s;" "$dir/nginx.conf"
if grep -nE "@(HTTP|GRPC)_(SERVERS|LISTEN)@" "$dir/nginx.conf"; then
  echo "markers left unreplaced" >&2
  exit 1
fi
"$NGINX" -t -q -p "$dir" -c "$dir/nginx.conf" -e stderr
echo OK
