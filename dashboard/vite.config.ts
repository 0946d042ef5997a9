// Builds the operator dashboard into dashboard/dist, which `keel serve` serves at `/`.
import path from "node:path";
import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

const here = path.dirname(fileURLToPath(import.meta.url));

export default defineConfig({
  root: here,
  base: "/",
  // Preact's automatic JSX runtime, without a Babel-based plugin.
  oxc: { jsx: { runtime: "automatic", importSource: "preact" } },
  build: {
    outDir: path.join(here, "dist"),
    emptyOutDir: true,
    // The server's Content-Security-Policy forbids inline code, so nothing may be inlined.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    sourcemap: false,
    reportCompressedSize: false,
  },
  logLevel: "warn",
});
