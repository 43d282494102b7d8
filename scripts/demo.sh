#!/usr/bin/env bash
# make demo: start hareboxd on a temporary data directory, run the CLI
# walkthrough against it with a printed transcript, and clean up.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
echo "==> building the binaries and the Debian guest image (cached after the first run)"
export HAREBOX_NFT_TABLE=harebox_demo
# (One sandbox: a golden boot beside it would only share the cores.)
eval "$(scripts/devserver.sh --golden-snapshots=false)"
cleanup() {
  # Delete whatever the walkthrough left (on failure), then stop the server.
  for id in $(bin/harebox list 2>/dev/null | jq -r '.sandboxes[].id' 2>/dev/null); do
    bin/harebox delete "$id" >/dev/null 2>&1 || true
  done
  kill "$HAREBOX_PID" 2>/dev/null || true
  wait "$HAREBOX_PID" 2>/dev/null || true
  rm -rf "$HAREBOX_DATA_DIR"
  # The table outlives a server on purpose (running VMs keep their rules);
  # the demo's own goes with it.
  nft delete table inet "$HAREBOX_NFT_TABLE" 2>/dev/null || true
}
trap cleanup EXIT
export PATH="$root/bin:$PATH"
echo "==> hareboxd is listening on $HAREBOX_URL (data in $HAREBOX_DATA_DIR)"
echo "==> the walkthrough (examples/untrusted/walkthrough.sh), command by command:"
echo
# bash -x prints each command ("+ ...") before its output.
bash -x examples/untrusted/walkthrough.sh 2>&1
echo
echo "==> done: the sandbox is deleted; stopping the server"
