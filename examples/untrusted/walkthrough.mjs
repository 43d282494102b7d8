// The untrusted-code walkthrough with the TypeScript client: a sandbox
// that may only reach PyPI over HTTPS runs job.py as an unprivileged user,
// then goes away.
//
//   (cd sdk/typescript && npm ci)          # builds sdk/typescript/dist
//   eval "$(scripts/devserver.sh)"         # or point HAREBOX_URL / HAREBOX_API_KEY at a server
//   node examples/untrusted/walkthrough.mjs
//
// Published, the import is: import { HareBox } from "harebox";
import { readFile } from "node:fs/promises";

import { HareBox } from "../../sdk/typescript/dist/index.js";

const hb = new HareBox(); // reads HAREBOX_URL and HAREBOX_API_KEY
const box = await hb.create({ name: "untrusted", size: { preset: "small" }, no_env: true, ttl_seconds: 900 });
try {
  await hb.setFirewall(box.id, { body: { default_outbound: "deny", outbound: [
    { action: "allow", protocol: "tcp", ports: "443", hosts: ["pypi.org", "files.pythonhosted.org"] }] } });
  const job = await readFile(new URL("./job.py", import.meta.url));
  await hb.writeFile(box.id, { query: { path: "/home/user/job.py" }, body: job });
  const r = await box.run("python3 /home/user/job.py", { timeout_seconds: 300 });
  console.log(r.exit_code, r.stdout);
} finally {
  await hb.deleteSandbox(box.id);
}
