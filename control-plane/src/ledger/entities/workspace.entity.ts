import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { RunEntity } from "./run.entity.js";
import { SandboxHostEntity } from "./sandbox-host.entity.js";

const p = defineEntity.properties;

/** A workspace leased to one run (later, one graph node) on one host. */
export const WorkspaceEntity = defineEntity({
  name: "Workspace",
  tableName: "workspaces",
  indexes: [{ properties: ["hostId", "status"] }, { properties: ["runId", "status"] }],
  properties: {
    id: p.uuid().primary(),
    hostId: () => references(SandboxHostEntity, "host_id"),
    runId: () => references(RunEntity, "run_id"),
    image: p.text(),
    /** active, released (the run ended and its inspection time passed), lost (its host went away) or failed. */
    status: p.text(),
    acquiredAt: p.datetime().defaultRaw("now()"),
    releasedAt: p.datetime().nullable(),
    keepUntil: p.datetime().nullable(),
  },
});
