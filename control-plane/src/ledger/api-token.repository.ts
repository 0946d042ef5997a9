import { createHash, createHmac, randomBytes, randomUUID, timingSafeEqual } from "node:crypto";
import {
  TOKEN_ROLES,
  expired,
  scopeFromJson,
  scopeToJson,
  type Principal,
  type TokenRole,
  type TokenScope,
} from "../domain/token-scope.js";
import type { NotificationHub } from "./notification-hub.js";
import { statement, type Sql } from "./sql.js";

export { TOKEN_ROLES, type TokenRole };

export interface TokenCreation {
  readonly scope?: TokenScope;
  readonly expiresAt?: Date;
}

/** A token as `keel token list` shows it: never its secret or its hash. */
export interface TokenListing {
  readonly id: string;
  readonly role: TokenRole;
  readonly label: string;
  readonly scope: TokenScope;
  readonly createdAt: Date;
  readonly expiresAt: Date | undefined;
  readonly revokedAt: Date | undefined;
}

export interface ApiTokenRepository {
  /** Creates a token and returns its secret, which is shown once and stored only as a hash. */
  create(role: TokenRole, label: string, options?: TokenCreation): Promise<{ id: string; secret: string }>;
  /** The principal of a live (not revoked, not expired) token, or undefined. */
  principalOf(secret: string): Promise<Principal | undefined>;
  /** The role of a live token, or undefined. */
  roleOf(secret: string): Promise<TokenRole | undefined>;
  /**
   * True when the secret's tag shows it was never issued here, at no cost; false when it may be
   * live (or the install's key is not read yet: the first check reads it).
   */
  forged(secret: string): boolean;
  list(): Promise<TokenListing[]>;
  /** Revokes a token and tells every process (NOTIFY keel_tokens); false when no live token has that id. */
  revoke(tokenId: string): Promise<boolean>;
  /**
   * Calls `listener` with a token id when that token may have been revoked, or "" when any may
   * have been (the notification connection was lost for a while). Until `listen` is called only
   * this process's own revocations are seen.
   */
  onInvalidated(listener: (tokenId: string) => void): () => void;
  /** Follows revocations made by every process; returns the function that stops it. */
  listen(hub: NotificationHub): () => void;
}

export function hashToken(secret: string): string {
  return createHash("sha256").update(secret).digest("hex");
}

/** How long a verified principal is trusted before it is checked again (revocation also drops it at once). */
const TRUSTED_MS = 5_000;
/** Past TRUSTED_MS a principal is still served while a check runs in the background, for this long at most. */
const STALE_MS = 5_000;
/** How long an unknown secret is remembered as unknown, so repeating it costs no lookup. */
const UNKNOWN_MS = 5_000;
/** Entries kept: the least recently used goes first, one at a time, never the whole cache. */
const MAX_CACHED = 10_000;
/**
 * Every secret this repository issues has this shape; anything else is refused without a lookup.
 * A secret is `keel_<role>_` and 32 random characters, then an 11-character tag: the install's
 * key (api_token_keys) over the rest, so a made-up secret of this shape is refused without a
 * lookup too. Secrets issued before the tag (no tag, 32 characters) still work; lookups of such
 * secrets never seen valid are rationed (api/token-checks.ts), since anyone can make them up.
 */
export const SECRET_SHAPE = /^keel_[a-z_]{5,16}_(?:[A-Za-z0-9_-]{43}|[A-Za-z0-9_-]{32})$/;
const UNTAGGED_SHAPE = /^keel_[a-z_]{5,16}_[A-Za-z0-9_-]{32}$/;
const TAG_LENGTH = 11;

/** True for a secret of the shape issued before secrets carried a tag: its check costs a lookup whatever it is. */
export function isUntaggedSecret(secret: string): boolean {
  return UNTAGGED_SHAPE.test(secret);
}

/** The tag of a secret's first part: 8 bytes of HMAC-SHA256 under the install's key, base64url. */
function tagOf(key: Buffer, body: string): Buffer {
  return Buffer.from(createHmac("sha256", key).update(body).digest().subarray(0, 8).toString("base64url"));
}

/** Whether a secret of the tagged shape ends with its tag. */
function tagMatches(key: Buffer, secret: string): boolean {
  const tag = Buffer.from(secret.slice(-TAG_LENGTH));
  const expected = tagOf(key, secret.slice(0, -TAG_LENGTH));
  return tag.length === expected.length && timingSafeEqual(tag, expected);
}

interface TokenRow {
  id: string;
  role: string;
  label: string;
  scope: unknown;
  created_at: Date;
  expires_at: Date | null;
  revoked_at: Date | null;
}

const selectLiveToken = statement<{ tokenHash: string }, Pick<TokenRow, "id" | "role" | "label" | "scope" | "expires_at">>("select_live_token")`
  SELECT id, role, label, scope, expires_at FROM api_tokens
  WHERE token_hash = ${(p) => p.tokenHash} AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())`;

const insertApiToken = statement<{ id: string; tokenHash: string; role: TokenRole; label: string; scope: string; expiresAt: Date | null }, never>(
  "insert_api_token",
)`
  INSERT INTO api_tokens (id, token_hash, role, label, scope, expires_at)
  VALUES (${(p) => p.id}, ${(p) => p.tokenHash}, ${(p) => p.role}, ${(p) => p.label}, ${(p) => p.scope}::jsonb, ${(p) => p.expiresAt})`;

const listTokens = statement<Record<string, never>, TokenRow>("list_api_tokens")`
  SELECT id, role, label, scope, created_at, expires_at, revoked_at FROM api_tokens ORDER BY created_at, id`;

/** Revoked and announced in one statement: the notification goes out when the revocation commits. */
const revokeToken = statement<{ tokenId: string }, { id: string }>("revoke_api_token")`
  WITH revoked AS (
    UPDATE api_tokens SET revoked_at = now() WHERE id = ${(p) => p.tokenId}::uuid AND revoked_at IS NULL RETURNING id)
  SELECT id, pg_notify('keel_tokens', id::text) FROM revoked`;

const selectTokenKey = statement<Record<string, never>, { key: string }>("select_api_token_key")`
  SELECT key FROM api_token_keys WHERE id = 1`;

const UUID_SHAPE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

interface CacheEntry {
  readonly principal: Principal | undefined;
  until: number;
  checking?: Promise<Principal | undefined>;
}

function principalFromRow(row: Pick<TokenRow, "id" | "role" | "label" | "scope" | "expires_at">): Principal | undefined {
  if (!(TOKEN_ROLES as readonly string[]).includes(row.role)) return undefined;
  const role = row.role as TokenRole;
  return { tokenId: row.id, role, label: row.label, scope: scopeFromJson(role, row.scope), expiresAt: row.expires_at ?? undefined };
}

/** `now` is for tests: milliseconds, as Date.now. */
export function createApiTokenRepository(sql: Sql, now: () => number = Date.now): ApiTokenRepository {
  // Verification is on every RPC; a bounded LRU keeps it off the database, unknown secrets
  // included. A principal past its trusted time is re-checked in the background while it is
  // served, so a busy connector never waits on that check; an idle one is checked inline again.
  const cache = new Map<string, CacheEntry>();
  const lookups = new Map<string, Promise<Principal | undefined>>();
  const listeners = new Set<(tokenId: string) => void>();

  const remember = (hash: string, entry: CacheEntry) => {
    cache.delete(hash);
    cache.set(hash, entry);
    if (cache.size > MAX_CACHED) cache.delete(cache.keys().next().value!);
  };
  const check = (hash: string): Promise<Principal | undefined> => {
    const running = lookups.get(hash);
    if (running !== undefined) return running;
    const lookup = (async () => {
      try {
        const [row] = await sql.run(selectLiveToken, { tokenHash: hash });
        const principal = row === undefined ? undefined : principalFromRow(row);
        remember(hash, { principal, until: now() + (principal === undefined ? UNKNOWN_MS : TRUSTED_MS) });
        return principal;
      } finally {
        lookups.delete(hash);
      }
    })();
    lookups.set(hash, lookup);
    return lookup;
  };
  const invalidate = (tokenId: string) => {
    for (const [hash, entry] of cache) {
      if (tokenId === "") entry.until = Math.min(entry.until, now() - STALE_MS);
      else if (entry.principal?.tokenId === tokenId) cache.delete(hash);
    }
    for (const listener of [...listeners]) listener(tokenId);
  };

  // The key is read once per process; a failed read is tried again by the next caller.
  let key: Buffer | undefined;
  let keyLoad: Promise<Buffer> | undefined;
  const tagKey = async (): Promise<Buffer> => {
    if (key !== undefined) return key;
    keyLoad ??= sql.run(selectTokenKey, {}).then(
      ([row]) => {
        if (row === undefined) throw new Error("the ledger has no token key (api_token_keys); run the migrations");
        key = Buffer.from(row.key, "hex");
        return key;
      },
      (error: unknown) => {
        keyLoad = undefined;
        throw error;
      },
    );
    return keyLoad;
  };

  const principalOf = async (secret: string): Promise<Principal | undefined> => {
    if (!SECRET_SHAPE.test(secret)) return undefined;
    const hash = hashToken(secret);
    const cached = cache.get(hash);
    const at = now();
    let principal: Principal | undefined;
    if (cached !== undefined && cached.until > at) {
      remember(hash, cached);
      principal = cached.principal;
    } else if (cached?.principal !== undefined && cached.until + STALE_MS > at) {
      // A failed background check leaves the principal as it was until the next request tries again.
      cached.checking ??= check(hash)
        .catch(() => undefined)
        .finally(() => delete cached.checking);
      principal = cached.principal;
    } else {
      // Only a lookup needs the tag checked: a cached secret passed it on its way in.
      if (!isUntaggedSecret(secret) && !tagMatches(await tagKey(), secret)) return undefined;
      principal = await check(hash);
    }
    // Expiry needs no lookup: a cached token stops working the moment it expires.
    return principal !== undefined && expired(principal, new Date(at)) ? undefined : principal;
  };

  return {
    async create(role, label, options = {}) {
      const body = `keel_${role.replace("-", "_")}_${randomBytes(24).toString("base64url")}`;
      const secret = `${body}${tagOf(await tagKey(), body).toString()}`;
      const id = randomUUID();
      const scope = options.scope ?? (role === "operator" || role === "admin" ? { kind: "role" } : { kind: "unbound" });
      await sql.run(insertApiToken, {
        id,
        tokenHash: hashToken(secret),
        role,
        label,
        scope: JSON.stringify(scopeToJson(scope)),
        expiresAt: options.expiresAt ?? null,
      });
      return { id, secret };
    },
    principalOf,
    async roleOf(secret) {
      return (await principalOf(secret))?.role;
    },
    forged(secret) {
      return key !== undefined && SECRET_SHAPE.test(secret) && !isUntaggedSecret(secret) && !tagMatches(key, secret);
    },
    async list() {
      const rows = await sql.run(listTokens, {});
      return rows.flatMap((row) => {
        const principal = principalFromRow(row);
        if (principal === undefined) return [];
        return [{ ...principal, id: row.id, createdAt: row.created_at, expiresAt: row.expires_at ?? undefined, revokedAt: row.revoked_at ?? undefined }];
      });
    },
    async revoke(tokenId) {
      if (!UUID_SHAPE.test(tokenId)) return false;
      const revoked = (await sql.run(revokeToken, { tokenId })).length > 0;
      // This process need not wait for its own notification to stop honouring the token.
      if (revoked) invalidate(tokenId.toLowerCase());
      return revoked;
    },
    onInvalidated(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    listen(hub) {
      return hub.subscribe("keel_tokens", invalidate);
    },
  };
}
