#!/usr/bin/env node
// Keel runs its TypeScript sources directly through tsx's loader: no build step to forget.
import { register } from "tsx/esm/api";

register();
const { main } = await import("../control-plane/src/main.ts");
process.exitCode = await main(process.argv.slice(2), process.env);
