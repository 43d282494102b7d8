# An untrusted job: in a real deployment it fetches packages from PyPI
# through the sandbox firewall; here it reports where it runs and what it
# may do.
import getpass
import os
import platform

print(f"hello from {getpass.getuser()} (uid {os.getuid()}) on {platform.node()}, kernel {platform.release()}")
try:
    with open("/etc/shadow") as f:
        f.read()
    print("read /etc/shadow: allowed?!")
except PermissionError:
    print("read /etc/shadow: denied")
print("sum:", sum(range(1_000_000)))
