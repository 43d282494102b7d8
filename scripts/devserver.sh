#!/usr/bin/env bash
# Starts hareboxd on a fresh temporary data directory, with the images
# built under .cache/images, and prints the URL, the key and the pid as
# shell variables: eval "$(scripts/devserver.sh [HAREBOXD FLAGS...])". Stop it with
# kill $HAREBOX_PID (sandboxes keep running; delete them first).
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build >&2
bin/harebox-image build --quiet --name minimal --agent bin/harebox-agent --out "$PWD/.cache/images" >/dev/null
if [ "${HAREBOX_DEFAULT_IMAGE:-1}" = 1 ]; then
  bin/harebox-image build --quiet --name default --agent bin/harebox-agent --out "$PWD/.cache/images" >/dev/null
fi
dir=$(mktemp -d /tmp/hbd.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# A firewall table and address pool of its own (HAREBOX_NFT_TABLE,
# HAREBOX_POOL), so a server that runs on this host is left alone.
bin/hareboxd --data-dir "$dir" --listen "127.0.0.1:$port" --image-dir "$PWD/.cache/images" \
  --plugin "$PWD/bin/harebox-plugin-qemu" --nft-table "${HAREBOX_NFT_TABLE:-harebox_dev}" \
  --address-pool "${HAREBOX_POOL:-10.238.0.0/24}" "$@" >"$dir/hareboxd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { cat "$dir/hareboxd.log" >&2; exit 1; }
  sleep 0.1
done
echo "export HAREBOX_URL=http://127.0.0.1:$port HAREBOX_API_KEY=$(cat "$dir/root.key") HAREBOX_PID=$pid HAREBOX_DATA_DIR=$dir"
