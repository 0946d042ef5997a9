import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/**
 * A message between control-plane replicas about a sandbox command: the command for a host
 * attached to another replica, or that command's output and outcome on their way back. Taken
 * (deleted) by its recipient in id order; never holds a workspace's secrets.
 */
export const SandboxRelayEntity = defineEntity({
  name: "SandboxRelay",
  tableName: "sandbox_relays",
  indexes: [{ properties: ["toReplica", "id"] }],
  properties: {
    id: p.bigint("number").autoincrement().primary(),
    toReplica: p.text(),
    commandId: p.text(),
    /** command, output, result or failed. */
    kind: p.text(),
    body: p.json<Record<string, unknown>>(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
