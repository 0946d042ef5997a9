// The outbound side's durable state: the Subscribe cursor, and the emission being sent, written
// before the POST so a crash between sending and acknowledging is recorded AMBIGUOUS on restart
// instead of being sent a second time.
import { readFileSync, renameSync, writeFileSync } from "node:fs";

export interface InFlight {
  readonly emissionId: string;
  readonly seq: number;
  /** The outcome, once known, so a failed AcknowledgeEmission is retried with it rather than guessed. */
  readonly outcome?: { readonly status: "delivered" | "failed" | "ambiguous"; readonly remoteRef: string; readonly detail: string };
}

export interface OutboundState {
  readonly afterSeq: number;
  readonly inFlight: InFlight | null;
}

export function loadState(file: string): OutboundState {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return { afterSeq: 0, inFlight: null };
    throw error;
  }
  const parsed = JSON.parse(text) as { after_seq?: unknown; in_flight?: InFlight | null };
  const afterSeq = typeof parsed.after_seq === "number" && parsed.after_seq >= 0 ? parsed.after_seq : 0;
  return { afterSeq, inFlight: parsed.in_flight ?? null };
}

/** Written to a temporary file and renamed over the old one, so a crash leaves one or the other. */
export function saveState(file: string, state: OutboundState): void {
  const temporary = `${file}.tmp`;
  writeFileSync(temporary, JSON.stringify({ after_seq: state.afterSeq, in_flight: state.inFlight }));
  renameSync(temporary, file);
}
