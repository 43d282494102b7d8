#!/usr/bin/env bash
# Installs what HareBox needs on a Debian 12 host, idempotently: nothing is
# fetched when everything is already there.
set -euo pipefail

pkgs=(
  qemu-system-x86 qemu-utils   # the QEMU backend and qcow2 overlays
  linux-image-amd64            # the guest kernel and its modules
  busybox-static               # the minimal image's userland
  debootstrap e2fsprogs        # the default image (Debian 12 root disk)
  xz-utils                     # the images' kernel: its ELF image out of the bzImage
  iproute2 nftables jq         # host networking, firewall, the CLI walkthrough
  python3 python3-pytest       # the Python client and its tests
  python3-ipython python3-matplotlib python3-pandas  # the code interpreter's server, kernel and charts, tested on the host
  python3-pip python3-setuptools python3-wheel  # its wheel, built and installed by the tests
  gcc libc6-dev                # cgo, for the race detector in make test
  ca-certificates openssl      # TLS, and the SDKs' test certificates
  tmux                         # drives harebox shell in a real terminal (tests)
  systemd                      # systemd-analyze verify of the unit (tests)
  git                          # the upgrade test builds the previous release
  chromium                     # a real browser: a published URL, the console (tests)
  postgresql                   # the PostgreSQL store (its tests run their own server)
  runsc                        # gVisor, measured side by side with HareBox (make bench)
  nginx-light                  # the credentials proxy measured against nginx (make bench)
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# The TypeScript client needs node and npm; a host may have them from
# another source (whose nodejs package conflicts with Debian's npm).
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The benchmark runs nginx itself; the package's own server (its
  # default site on port 80), started where services start, is not wanted.
  if [[ " ${missing[*]} " == *" nginx-light "* ]]; then
    { systemctl disable --now nginx || service nginx stop; } >/dev/null 2>&1 || true
  fi
fi

if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
  export PATH=/usr/local/go/bin:$PATH
fi
if ! command -v go >/dev/null; then
  echo "deps: Go 1.26 or newer is required (install it to /usr/local/go)" >&2
  exit 1
fi
go mod download

# The TypeScript client's dependency (undici) and build tools (typescript,
# @types/node), from its lock file: again whenever the lock file changed.
if [ ! -f sdk/typescript/node_modules/.package-lock.json ] ||
  [ sdk/typescript/package-lock.json -nt sdk/typescript/node_modules/.package-lock.json ]; then
  (cd sdk/typescript && npm ci --no-audit --no-fund --loglevel=error &&
    # The e2e suite installs the packed client into a fresh project
    # offline: npm needs undici's metadata in its cache for that.
    npm cache add "undici@$(node -p 'require("./package.json").dependencies.undici')" --loglevel=error)
fi

# The E2B SDKs the e2e suite runs, unmodified (e2e/e2bsdk): installed
# here, not by the tests, two of which use them at once.
if [ ! -f e2e/e2bsdk/node_modules/.package-lock.json ] ||
  [ e2e/e2bsdk/package-lock.json -nt e2e/e2bsdk/node_modules/.package-lock.json ]; then
  (cd e2e/e2bsdk && npm ci --no-audit --no-fund --loglevel=error)
fi

# The web console's toolchain (esbuild, TypeScript) and its browser
# tests' (playwright-core, which drives Debian's Chromium, and axe-core),
# from its lock file.
if [ ! -f console/web/node_modules/.package-lock.json ] ||
  [ console/web/package-lock.json -nt console/web/node_modules/.package-lock.json ]; then
  (cd console/web && npm ci --no-audit --no-fund --loglevel=error)
fi

# Redocly CLI (pinned, scripts/openapi-lint), for make test's lint of the
# OpenAPI document: again whenever its lock file changed.
if [ ! -f scripts/openapi-lint/node_modules/.package-lock.json ] ||
  [ scripts/openapi-lint/package-lock.json -nt scripts/openapi-lint/node_modules/.package-lock.json ]; then
  (cd scripts/openapi-lint && npm ci --no-audit --no-fund --loglevel=error)
fi
