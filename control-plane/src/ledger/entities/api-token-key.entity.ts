import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/**
 * The install's key for the check tag at the end of every token secret (api-token.repository.ts):
 * one row, id 1, made by its migration from PostgreSQL's strong random source. It lets any replica
 * refuse a made-up secret without a lookup; it grants nothing, since a secret still has to match
 * a stored hash.
 */
export const ApiTokenKeyEntity = defineEntity({
  name: "ApiTokenKey",
  tableName: "api_token_keys",
  properties: {
    // Always 1: one key, never a sequence.
    id: p.integer().primary().autoincrement(false),
    /** 32 random bytes, hex. */
    key: p.text(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
