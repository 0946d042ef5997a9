import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** A bearer token. Only its SHA-256 is stored; the secret is shown once, at creation. */
export const ApiTokenEntity = defineEntity({
  name: "ApiToken",
  tableName: "api_tokens",
  properties: {
    id: p.uuid().primary(),
    tokenHash: p.text().unique(),
    role: p.text(),
    label: p.text().default(""),
    createdAt: p.datetime().defaultRaw("now()"),
    /** What it may act as (domain/token-scope.ts): a host binding, connector names, or nothing beyond its role. */
    scope: p.json<Record<string, unknown>>().defaultRaw("'{}'"),
    expiresAt: p.datetime().nullable(),
    revokedAt: p.datetime().nullable(),
  },
});
