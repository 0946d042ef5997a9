import { describe, expect, it } from "vitest";
import type { OutputStreamName } from "../workspace-backend.js";
import { createDemuxer } from "./demuxer.js";

/** One frame of Docker's multiplexed attach stream. */
function frame(type: number, payload: string): Buffer {
  const body = Buffer.from(payload);
  const header = Buffer.alloc(8);
  header[0] = type;
  header.writeUInt32BE(body.length, 4);
  return Buffer.concat([header, body]);
}

function demux(chunks: readonly Buffer[]): [OutputStreamName, string][] {
  const out: [OutputStreamName, string][] = [];
  const feed = createDemuxer((stream, chunk) => {
    const last = out.at(-1);
    if (last !== undefined && last[0] === stream) last[1] += Buffer.from(chunk).toString();
    else out.push([stream, Buffer.from(chunk).toString()]);
  });
  for (const chunk of chunks) feed(chunk);
  return out;
}

describe("docker attach stream demuxer", () => {
  const stream = Buffer.concat([frame(1, "hello "), frame(2, "oops"), frame(1, "world"), frame(0, "!"), frame(3, "engine")]);

  it("splits whole frames into stdout (types 0 and 1) and stderr (types 2 and 3)", () => {
    expect(demux([stream])).toEqual([
      ["stdout", "hello "],
      ["stderr", "oops"],
      ["stdout", "world!"],
      ["stderr", "engine"],
    ]);
  });

  it("gives the same result when headers and payloads are split across reads at every byte", () => {
    const bytewise = [...stream].map((b) => Buffer.from([b]));
    expect(demux(bytewise)).toEqual(demux([stream]));
    for (let cut = 1; cut < stream.length; cut++) {
      expect(demux([stream.subarray(0, cut), stream.subarray(cut)])).toEqual(demux([stream]));
    }
  });
});
