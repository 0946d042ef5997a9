import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/**
 * A tool list as sent to a model, stored once under the digest of its JSON; a stored model
 * request names it ("toolSet") instead of repeating it (ledger/tool-sets.ts). Never deleted:
 * there is one per distinct list, and any request may name it.
 */
export const ModelToolSetEntity = defineEntity({
  name: "ModelToolSet",
  tableName: "model_tool_sets",
  properties: {
    digest: p.text().primary(),
    tools: p.json<unknown>(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
