// The gate's token lookups, bounded. A secret never seen valid costs the verifier a database
// query (its cache cannot help a random one), and those queries share the pool with the
// workers. So only a few such checks run at once; past that a caller with an unproven secret
// is told to retry (ResourceExhausted). Secrets that have passed before skip the bound: their
// check is a cache hit, and a flood of random tokens must not lock out known clients. A secret
// made up in today's shape is refused by its tag without a query; one in the untagged shape of
// older secrets cannot be, so those lookups are also rationed per second.
import { createHash } from "node:crypto";
import { isUntaggedSecret, type TokenRole } from "../ledger/api-token.repository.js";
import type { TokenVerifier } from "./auth.js";
import { createTokenBucket } from "./token-bucket.js";

/** Checks of never-seen-valid secrets in flight at once, process-wide. */
export const MAX_UNPROVEN_CHECKS = 8;
/** Lookups per second (and at once, after a quiet spell) of untagged secrets never seen valid. */
export const UNTAGGED_LOOKUPS_PER_SECOND = 20;
/** Hashes of secrets that passed, least recently used dropped first. */
const MAX_PROVEN = 10_000;

export type TokenCheck = { readonly kind: "valid"; readonly role: TokenRole } | { readonly kind: "unknown" } | { readonly kind: "busy" };

export interface TokenChecks {
  /** Rejects (the verifier's error) when the lookup itself fails. */
  check(secret: string): Promise<TokenCheck>;
  /**
   * What can be told at once, before a request is built: "unknown" for a forged tag, "busy" for
   * an unproven untagged secret while no lookup is allowed; undefined when `check` must decide.
   * Consumes nothing: `check` still applies the bounds.
   */
  screen(secret: string): "unknown" | "busy" | undefined;
}

/** `now` is for tests: milliseconds, as performance.now. */
export function createTokenChecks(verifier: TokenVerifier, maxUnproven = MAX_UNPROVEN_CHECKS, now: () => number = () => performance.now()): TokenChecks {
  const proven = new Map<string, true>();
  let unprovenInFlight = 0;
  // Refills at UNTAGGED_LOOKUPS_PER_SECOND and holds as many.
  const untaggedLookups = createTokenBucket(UNTAGGED_LOOKUPS_PER_SECOND, UNTAGGED_LOOKUPS_PER_SECOND, now);
  const hashOf = (secret: string): string => createHash("sha256").update(secret).digest("base64url");
  const lookup = async (hash: string, secret: string): Promise<TokenCheck> => {
    const role = await verifier.roleOf(secret);
    if (role === undefined) {
      proven.delete(hash);
      return { kind: "unknown" };
    }
    proven.delete(hash);
    proven.set(hash, true);
    if (proven.size > MAX_PROVEN) proven.delete(proven.keys().next().value!);
    return { kind: "valid", role };
  };
  // A new client's first calls arrive together with one secret: they share one check and one slot.
  const checking = new Map<string, Promise<TokenCheck>>();
  return {
    screen(secret) {
      // A secret that passed before costs one hash here, not its tag's HMAC again.
      const hash = hashOf(secret);
      if (proven.has(hash) || checking.has(hash)) return undefined;
      if (!isUntaggedSecret(secret)) return verifier.forged?.(secret) === true ? "unknown" : undefined;
      return unprovenInFlight < maxUnproven && untaggedLookups.available() >= 1 ? undefined : "busy";
    },
    async check(secret) {
      const hash = hashOf(secret);
      // Every check still asks the verifier, so a revoked token fails here at once.
      if (proven.has(hash)) return lookup(hash, secret);
      const running = checking.get(hash);
      if (running !== undefined) return running;
      if (unprovenInFlight >= maxUnproven) return { kind: "busy" };
      if (isUntaggedSecret(secret) && !untaggedLookups.take()) return { kind: "busy" };
      unprovenInFlight++;
      const check = lookup(hash, secret).finally(() => {
        unprovenInFlight--;
        checking.delete(hash);
      });
      checking.set(hash, check);
      return check;
    },
  };
}
