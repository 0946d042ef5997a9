import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** A typed result with provenance (model, observed, verified). */
export const ArtifactEntity = defineEntity({
  name: "Artifact",
  tableName: "artifacts",
  indexes: [{ properties: ["runId"] }],
  properties: {
    id: p.uuid().primary(),
    runId: p.uuid(),
    toolInvocationId: p.uuid().nullable(),
    type: p.text(),
    schemaVersion: p.text(),
    provenance: p.text(),
    inlineData: p.text().nullable(),
    reference: p.text().nullable(),
    subjectArtifactId: p.uuid().nullable(),
    conclusion: p.text().nullable(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
