// Builds the console's assets: src/main.ts bundled into app.js, and
// src/index.html and src/app.css copied unchanged. The output depends on
// the sources alone (no timestamps, no absolute paths), so a build into
// another directory can be compared byte for byte with the committed dist.
//
//   node build.mjs [OUTDIR]   (default ../dist)
import { build } from "esbuild";
import { copyFile, mkdir } from "node:fs/promises";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(process.argv[2] ?? resolve(here, "../dist"));

await mkdir(out, { recursive: true });
await build({
  absWorkingDir: here,
  entryPoints: ["src/main.ts"],
  outfile: resolve(out, "app.js"),
  bundle: true,
  minify: true,
  format: "iife",
  target: "es2020",
  platform: "browser",
  sourcemap: false,
  legalComments: "none",
  charset: "ascii",
  logLevel: "warning",
});
for (const name of ["index.html", "app.css"]) {
  await copyFile(resolve(here, "src", name), resolve(out, name));
}
