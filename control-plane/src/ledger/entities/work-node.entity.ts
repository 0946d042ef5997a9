import { defineEntity } from "@mikro-orm/core";
import { references } from "./references.js";
import { WorkGraphEntity } from "./work-graph.entity.js";

const p = defineEntity.properties;

export const WorkNodeEntity = defineEntity({
  name: "WorkNode",
  tableName: "work_nodes",
  uniques: [{ properties: ["graphId", "key"] }],
  properties: {
    id: p.uuid().primary(),
    graphId: () => references(WorkGraphEntity, "graph_id"),
    key: p.text(),
    kind: p.text(),
    status: p.text(),
    objective: p.text(),
    dependsOn: p.json<string[]>(),
    gateDecision: p.text().nullable(),
    // No foreign key: gates are decided by operators, who need not be conversation actors.
    gateDecidedByActorId: p.text().nullable(),
    /** Why the gate was decided so, in the decider's words. */
    gateReason: p.text().nullable(),
    gateDecidedAt: p.datetime().nullable(),
    /** verify only: the key of the node whose output it checks. */
    subject: p.text().nullable(),
    /** The child run works in a workspace of its own, which a join after it reconciles. */
    needsWorkspace: p.boolean().default(false),
    /** Position in the admitted (topological) order: passes walk nodes in it. */
    ordinal: p.integer().default(0),
    /** What the node's child run overrides in the agent spec: its tools, policy and budget slice. */
    childSpec: p.json<Record<string, unknown>>().nullable(),
    /** The child's reply, a join's combined inputs, or why the node failed. */
    output: p.text().nullable(),
    finishedAt: p.datetime().nullable(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
