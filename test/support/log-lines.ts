// A pino logger whose JSON lines a test reads back.
import { Writable } from "node:stream";
import { pino, type Logger } from "pino";

/** A logger at `level` and the lines it has written so far, one JSON object each. */
export function logLines(level: string): { readonly log: Logger; readonly lines: string[] } {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      lines.push(...chunk.toString("utf8").split("\n").filter((line) => line !== ""));
      done();
    },
  });
  return { log: pino({ level }, sink), lines };
}
