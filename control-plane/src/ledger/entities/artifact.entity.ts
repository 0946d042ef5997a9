import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { RunEntity } from "./run.entity.js";
import { ToolInvocationEntity } from "./tool-invocation.entity.js";

const p = defineEntity.properties;

/** A typed result with provenance (model, observed, verified). */
export const ArtifactEntity = defineEntity({
  name: "Artifact",
  tableName: "artifacts",
  indexes: [{ properties: ["runId"] }, { name: "artifacts_tool_invocation_id_index", expression: 'create index "artifacts_tool_invocation_id_index" on "artifacts" ("tool_invocation_id") where "tool_invocation_id" is not null' }],
  properties: {
    id: p.uuid().primary(),
    runId: () => references(RunEntity, "run_id"),
    toolInvocationId: () => references(ToolInvocationEntity, "tool_invocation_id").nullable(),
    type: p.text(),
    schemaVersion: p.text(),
    provenance: p.text(),
    inlineData: p.text().nullable(),
    reference: p.text().nullable(),
    // No foreign key: a verifier's result names its subject as the tool reported it; a wrong id must not fail the step's commit.
    subjectArtifactId: p.uuid().nullable(),
    conclusion: p.text().nullable(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
