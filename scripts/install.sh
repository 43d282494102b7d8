#!/usr/bin/env bash
# Installs HareBox from bin/ (make build): the binaries, the guest agent,
# the systemd unit and, if there is none yet, a config file. Idempotent.
#   PREFIX   where binaries go (default /usr/local)
#   DESTDIR  a staging root (default none: the live system)
#   BIN      where the built binaries are (default bin)
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
BIN=${BIN:-bin}
for b in harebox hareboxd harebox-plugin-qemu harebox-plugin-cloud-hypervisor harebox-image harebox-agent; do
  [ -x "$BIN/$b" ] || { echo "install: $BIN/$b is missing: run make build first" >&2; exit 1; }
done
# hareboxd finds its plugins beside itself.
install -d -m 0755 "$DESTDIR$PREFIX/bin" "$DESTDIR$PREFIX/lib/harebox" "$DESTDIR/etc/systemd/system" "$DESTDIR/etc/harebox"
for b in harebox hareboxd harebox-plugin-qemu harebox-plugin-cloud-hypervisor harebox-image; do
  install -m 0755 "$BIN/$b" "$DESTDIR$PREFIX/bin/$b"
done
# The agent goes into guest images: harebox-image build --agent $PREFIX/lib/harebox/harebox-agent
install -m 0755 "$BIN/harebox-agent" "$DESTDIR$PREFIX/lib/harebox/harebox-agent"
# The unit is replaced on every install: local changes belong in a drop-in
# (systemctl edit hareboxd).
sed "s|@PREFIX@|$PREFIX|g" cmd/hareboxd/dist/hareboxd.service > "$DESTDIR/etc/systemd/system/hareboxd.service.tmp"
chmod 0644 "$DESTDIR/etc/systemd/system/hareboxd.service.tmp"
mv "$DESTDIR/etc/systemd/system/hareboxd.service.tmp" "$DESTDIR/etc/systemd/system/hareboxd.service"
# An operator's config is theirs: written only when there is none.
if [ ! -e "$DESTDIR/etc/harebox/hareboxd.yaml" ] && [ ! -L "$DESTDIR/etc/harebox/hareboxd.yaml" ]; then
  install -m 0644 cmd/hareboxd/dist/hareboxd.yaml "$DESTDIR/etc/harebox/hareboxd.yaml"
fi
if [ -z "$DESTDIR" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
echo "installed under ${DESTDIR:-/}: $PREFIX/bin, $PREFIX/lib/harebox, /etc/systemd/system/hareboxd.service, /etc/harebox/hareboxd.yaml"
