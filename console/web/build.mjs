// Builds the console's assets: src/main.ts bundled into app.js (with
// xterm.js, see xtermCSP below), src/index.html copied unchanged, and
// app.css: xterm.js's stylesheet, then src/app.css. The output depends on
// the sources alone (no timestamps, no absolute paths), so a build into
// another directory can be compared byte for byte with the committed dist.
//
//   node build.mjs [OUTDIR]   (default ../dist)
import { build } from "esbuild";
import { copyFile, mkdir, readFile, writeFile } from "node:fs/promises";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(process.argv[2] ?? resolve(here, "../dist"));

// xtermCSP makes xterm.js (6.0.0, pinned exactly in package.json) run
// under the console's Content Security Policy, which refuses inline style
// (style-src 'self'): its three <style> elements become constructed
// stylesheets (src/xterm-csp.ts), and its one style="..." attribute (24-bit
// colours) a CSSOM assignment. Each rewrite must match exactly as often as
// expected, so another xterm.js version fails the build here rather than
// the policy in the browser.
let xtermPatched = false;
const xtermCSP = {
  name: "xterm-csp",
  setup(b) {
    b.onLoad({ filter: /[\\/]@xterm[\\/]xterm[\\/]lib[\\/]xterm\.mjs$/ }, async (args) => {
      let src = await readFile(args.path, "utf8");
      const rewrite = (what, from, to, count) => {
        const found = src.match(from)?.length ?? 0;
        if (found !== count) {
          throw new Error(`xterm-csp: expected ${count} of ${what} in ${args.path}, found ${found}: check src/xterm-csp.ts against this xterm.js`);
        }
        src = src.replace(from, to);
      };
      rewrite("createElement(\"style\")", /\b([\w$]+(?:\.[\w$]+)*)\.createElement\("style"\)/g, "__xtermStyleSheet($1)", 3);
      rewrite(
        "_addStyle's setAttribute(\"style\", ...)",
        /_addStyle\((\w+),(\w+)\)\{\1\.setAttribute\("style",`\$\{\1\.getAttribute\("style"\)\|\|""\}\$\{\2\};`\)\}/g,
        '_addStyle($1,$2){$1.style.cssText+=$2+";"}',
        1,
      );
      rewrite("a remaining inline style", /createElement\("style"\)|setAttribute\("style"|\.innerHTML\b|insertAdjacentHTML/g, "", 0);
      xtermPatched = true;
      return {
        contents: 'import { styleSheet as __xtermStyleSheet } from "./xterm-csp";\n' + src,
        loader: "js",
        resolveDir: resolve(here, "src"),
      };
    });
  },
};

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
  plugins: [xtermCSP],
});
if (!xtermPatched) throw new Error("xterm-csp: the bundle has no xterm.mjs to make safe for the CSP");
await copyFile(resolve(here, "src/index.html"), resolve(out, "index.html"));
const xtermCSS = await readFile(resolve(here, "node_modules/@xterm/xterm/css/xterm.css"), "utf8");
const appCSS = await readFile(resolve(here, "src/app.css"), "utf8");
await writeFile(resolve(out, "app.css"), "/* @xterm/xterm/css/xterm.css */\n" + xtermCSS.trimEnd() + "\n\n/* src/app.css */\n" + appCSS);
