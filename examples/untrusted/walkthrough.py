"""The untrusted-code walkthrough with the Python client, verbatim as in
the README: create a sandbox with no stored environment and a 15-minute
TTL, let it reach only PyPI over HTTPS, copy job.py (beside this file)
into it, run it as the unprivileged user under a timeout, print the
result, delete the sandbox. (Should it fail half way, the TTL still
removes the sandbox.)

    eval "$(scripts/devserver.sh)"   # or set HAREBOX_URL and HAREBOX_API_KEY
    PYTHONPATH=sdk/python python3 examples/untrusted/walkthrough.py
"""

import os

import harebox

os.chdir(os.path.dirname(os.path.abspath(__file__)))  # job.py is beside this file

hb = harebox.Client()            # reads HAREBOX_URL and HAREBOX_API_KEY
box = hb.create(name="untrusted", size={"preset": "small"}, no_env=True, ttl_seconds=900)
hb.set_firewall(box.id, body={"default_outbound": "deny", "outbound": [
    {"action": "allow", "protocol": "tcp", "ports": "443", "hosts": ["pypi.org", "files.pythonhosted.org"]}]})
hb.write_file(box.id, query={"path": "/home/user/job.py"}, body=open("job.py", "rb").read())
result = box.run("python3 /home/user/job.py", timeout=300)
print(result["exit_code"], result["stdout"])
box.delete()
