#!/usr/bin/env node
// Keel runs its TypeScript sources directly through tsx's loader: no build step to forget.
import { register } from "tsx/esm/api";

// A reader that stops early (`keel runs | head -1`) closes the pipe: that ends the output, not
// the program with an unhandled EPIPE.
for (const stream of [process.stdout, process.stderr]) {
  stream.on("error", (error) => {
    if (error.code === "EPIPE") process.exit(process.exitCode ?? 0);
    throw error;
  });
}

register();
const { main } = await import("../control-plane/src/main.ts");
process.exitCode = await main(process.argv.slice(2), process.env);
