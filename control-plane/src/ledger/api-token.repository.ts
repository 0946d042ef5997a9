import { createHash, randomBytes, randomUUID } from "node:crypto";
import { statement, type Sql } from "./sql.js";

export const TOKEN_ROLES = ["connector", "sandbox-host", "operator", "admin"] as const;
export type TokenRole = (typeof TOKEN_ROLES)[number];

export interface ApiTokenRepository {
  /** Creates a token and returns its secret, which is shown once and stored only as a hash. */
  create(role: TokenRole, label: string): Promise<{ id: string; secret: string }>;
  /** The role of a live token, or undefined. */
  roleOf(secret: string): Promise<TokenRole | undefined>;
}

export function hashToken(secret: string): string {
  return createHash("sha256").update(secret).digest("hex");
}

/** How long a verified role is trusted before it is checked again. */
const TRUSTED_MS = 5_000;
/** Past TRUSTED_MS a role is still served while a check runs in the background, for this long at most. */
const STALE_MS = 5_000;

const selectLiveTokenRole = statement<{ tokenHash: string }, { role: string }>("select_live_token_role")`
  SELECT role FROM api_tokens WHERE token_hash = ${(p) => p.tokenHash} AND revoked_at IS NULL`;

const insertApiToken = statement<{ id: string; tokenHash: string; role: TokenRole; label: string }, never>("insert_api_token")`
  INSERT INTO api_tokens (id, token_hash, role, label) VALUES (${(p) => p.id}, ${(p) => p.tokenHash}, ${(p) => p.role}, ${(p) => p.label})`;

/** `now` is for tests: milliseconds, as Date.now. */
export function createApiTokenRepository(sql: Sql, now: () => number = Date.now): ApiTokenRepository {
  // Verification is on every RPC; a short cache keeps it off the database. A role past its
  // trusted time is re-checked in the background while it is served, so a busy connector never
  // waits on that check; an idle one (nothing for STALE_MS more) is checked inline again.
  const cache = new Map<string, { role: TokenRole | undefined; until: number; checking?: Promise<TokenRole | undefined> }>();
  const check = (hash: string): Promise<TokenRole | undefined> => {
    const checking = (async () => {
      try {
        const [found] = await sql.run(selectLiveTokenRole, { tokenHash: hash });
        const role = found === undefined ? undefined : (found.role as TokenRole);
        if (cache.size > 10_000) cache.clear();
        cache.set(hash, { role, until: now() + TRUSTED_MS });
        return role;
      } catch (error) {
        const cached = cache.get(hash);
        if (cached !== undefined) cache.set(hash, { role: cached.role, until: cached.until });
        throw error;
      }
    })();
    const cached = cache.get(hash);
    if (cached !== undefined) cache.set(hash, { ...cached, checking });
    return checking;
  };
  return {
    async create(role, label) {
      const secret = `keel_${role.replace("-", "_")}_${randomBytes(24).toString("base64url")}`;
      const id = randomUUID();
      await sql.run(insertApiToken, { id, tokenHash: hashToken(secret), role, label });
      return { id, secret };
    },
    async roleOf(secret) {
      const hash = hashToken(secret);
      const cached = cache.get(hash);
      const at = now();
      if (cached !== undefined && cached.until > at) return cached.role;
      if (cached !== undefined && cached.until + STALE_MS > at) {
        // A failed background check leaves the role as it was until the next request tries again.
        if (cached.checking === undefined) check(hash).catch(() => {});
        return cached.role;
      }
      return cached?.checking ?? check(hash);
    },
  };
}
