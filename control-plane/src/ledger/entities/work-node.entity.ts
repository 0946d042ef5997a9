import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

export const WorkNodeEntity = defineEntity({
  name: "WorkNode",
  tableName: "work_nodes",
  uniques: [{ properties: ["graphId", "key"] }],
  properties: {
    id: p.uuid().primary(),
    graphId: p.uuid(),
    key: p.text(),
    kind: p.text(),
    status: p.text(),
    objective: p.text(),
    dependsOn: p.json<string[]>(),
    gateDecision: p.text().nullable(),
    gateDecidedByActorId: p.text().nullable(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
