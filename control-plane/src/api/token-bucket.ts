// A token bucket: `perSecond` tokens a second, at most `burst` saved up. The gate's rations
// (answers to refused calls, lookups of unknown secrets, work on unproven connections) are each one.

export interface TokenBucket {
  /** Takes one token if there is one. */
  take(): boolean;
  /** Tokens there are now (fractional; below 1 means `take` would fail). */
  available(): number;
}

/** `clock` is for tests: milliseconds, as performance.now. */
export function createTokenBucket(perSecond: number, burst: number, clock: () => number = () => performance.now()): TokenBucket {
  let tokens = burst;
  let refilledAt = clock();
  const refill = () => {
    const now = clock();
    tokens = Math.min(burst, tokens + ((now - refilledAt) * perSecond) / 1000);
    refilledAt = now;
  };
  return {
    take() {
      refill();
      if (tokens < 1) return false;
      tokens--;
      return true;
    },
    available() {
      refill();
      return tokens;
    },
  };
}
