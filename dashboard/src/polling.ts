// A view that refreshes on a timer: read now, then `everyMs` after each answer, until the
// component unmounts or `deps` change (the read in flight is aborted). Keeps the last value, the
// last error's text (cleared by the next success) and when the last read finished.
import { useEffect, useState } from "preact/hooks";
import { errorText } from "./format.js";

export interface Polled<T> {
  readonly value: T | undefined;
  readonly error: string;
  /** Date.now() when the last read finished: ages shown beside the value count from it. */
  readonly at: number;
}

export function usePolling<T>(read: (signal: AbortSignal) => Promise<T>, everyMs: number, deps: readonly unknown[]): Polled<T> {
  const [state, setState] = useState<Polled<T>>({ value: undefined, error: "", at: Date.now() });
  useEffect(() => {
    const stop = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const poll = async () => {
      try {
        const value = await read(stop.signal);
        setState({ value, error: "", at: Date.now() });
      } catch (caught) {
        if (!stop.signal.aborted) setState((last) => ({ ...last, error: errorText(caught), at: Date.now() }));
      }
      if (!stop.signal.aborted) timer = setTimeout(() => void poll(), everyMs);
    };
    void poll();
    return () => {
      stop.abort();
      clearTimeout(timer);
    };
    // The caller names what the read depends on, as with useEffect.
  }, deps);
  return state;
}
