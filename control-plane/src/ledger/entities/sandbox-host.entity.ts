import { defineEntity } from "@mikro-orm/core";

const p = defineEntity.properties;

/** A registered sandbox host and its declared capacity. */
export const SandboxHostEntity = defineEntity({
  name: "SandboxHost",
  tableName: "sandbox_hosts",
  properties: {
    id: p.text().primary(),
    capacity: p.json<Record<string, number>>(),
    labels: p.json<Record<string, string>>(),
    backends: p.json<string[]>(),
    images: p.json<string[]>(),
    /** The agent process last registered under this id; another one means the host restarted. */
    instanceId: p.text().default(""),
    connected: p.boolean().default(false),
    /** The control-plane replica holding the host's Attach stream ("" when none): where its commands go. */
    replicaId: p.text().default(""),
    lastHeartbeatAt: p.datetime().nullable(),
    registeredAt: p.datetime().defaultRaw("now()"),
  },
});
