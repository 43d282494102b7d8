#!/usr/bin/env bash
# The untrusted-code walkthrough with the CLI. Needs HAREBOX_URL and
# HAREBOX_API_KEY (or a server on 127.0.0.1:7070) and harebox on PATH.
set -euo pipefail
cd "$(dirname "$0")"

ID=$(harebox new --name untrusted --size small --no-env --ttl 900 | jq -r .id)
harebox firewall set "$ID" --body '{"default_outbound": "deny", "outbound": [{"action": "allow", "protocol": "tcp", "ports": "443", "hosts": ["pypi.org", "files.pythonhosted.org"]}]}'
harebox file write "$ID" --path /home/user/job.py --from ./job.py
harebox exec "$ID" --timeout 300 -- python3 /home/user/job.py
harebox delete "$ID"
