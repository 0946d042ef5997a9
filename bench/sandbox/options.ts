// The sandbox benchmark's command-line options and the constants its phases and report share.
import { parseArgs } from "node:util";
import { benchDurability, DURABILITY_OPTION, integerOption, type Durability } from "../support.js";

export const DEFAULT_IMAGE = "keel/sandbox-base:busybox";
export const MiB = 1024 * 1024;
/** Streams timed after the first one; the figure is their median. */
export const TIMED_STREAMS = 5;

export interface Options {
  readonly acquisitions: number;
  readonly cold: number;
  readonly poolSize: number;
  readonly execs: number;
  readonly warmup: number;
  readonly streamMib: number;
  readonly image: string;
  readonly durability: Durability;
}

export function parseOptions(args: readonly string[]): Options {
  const { values } = parseArgs({
    args: [...args],
    options: {
      acquisitions: { type: "string", default: "30" },
      cold: { type: "string", default: "30" },
      "pool-size": { type: "string", default: "4" },
      execs: { type: "string", default: "100" },
      warmup: { type: "string", default: "10" },
      "stream-mib": { type: "string", default: "64" },
      image: { type: "string", default: DEFAULT_IMAGE },
      ...DURABILITY_OPTION,
    },
  });
  return {
    acquisitions: integerOption("acquisitions", values.acquisitions, 1, 10_000),
    cold: integerOption("cold", values.cold, 1, 10_000),
    poolSize: integerOption("pool-size", values["pool-size"], 1, 100),
    execs: integerOption("execs", values.execs, 1, 100_000),
    warmup: integerOption("warmup", values.warmup, 0, 10_000),
    // The control plane's output cap tops out at 256 MiB (KEEL_SANDBOX_MAX_OUTPUT_BYTES).
    streamMib: integerOption("stream-mib", values["stream-mib"], 1, 255),
    image: values.image,
    durability: benchDurability(values.durability),
  };
}
