import { createHash, randomBytes, randomUUID } from "node:crypto";
import { ApiTokenEntity } from "./entities/api-token.entity.js";
import type { LedgerOrm } from "./orm.js";

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

export function createApiTokenRepository(orm: LedgerOrm): ApiTokenRepository {
  // Verification is on every RPC; a short cache keeps it off the database.
  const cache = new Map<string, { role: TokenRole | undefined; until: number }>();
  return {
    async create(role, label) {
      const secret = `keel_${role.replace("-", "_")}_${randomBytes(24).toString("base64url")}`;
      const id = randomUUID();
      const em = orm.em.fork();
      em.create(ApiTokenEntity, { id, tokenHash: hashToken(secret), role, label });
      await em.flush();
      return { id, secret };
    },
    async roleOf(secret) {
      const hash = hashToken(secret);
      const cached = cache.get(hash);
      if (cached !== undefined && cached.until > Date.now()) return cached.role;
      const found = await orm.em.fork().findOne(ApiTokenEntity, { tokenHash: hash, revokedAt: null });
      const role = found === null ? undefined : (found.role as TokenRole);
      if (cache.size > 10_000) cache.clear();
      cache.set(hash, { role, until: Date.now() + 5_000 });
      return role;
    },
  };
}
