import { createClient, createRouterTransport } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { Health, HealthCheckResponse_ServingStatus as Status } from "../../../gen/grpc/health/v1/health_pb.js";
import { IngressService } from "../../../gen/keel/v1/ingress_service_pb.js";
import { registerHealth } from "./health-service.js";

function healthClient(databaseAnswers: () => Promise<boolean>, draining: AbortSignal) {
  const transport = createRouterTransport((router) => registerHealth(router, [IngressService], { databaseAnswers, draining, watchEveryMs: 10, reuseMs: 0 }));
  return createClient(Health, transport);
}

describe("the health service", () => {
  it("is NOT_SERVING once the server drains, even with the database up", async () => {
    const draining = new AbortController();
    const health = healthClient(() => Promise.resolve(true), draining.signal);
    expect((await health.check({ service: "" })).status).toBe(Status.SERVING);
    draining.abort();
    expect((await health.check({ service: "keel.v1.IngressService" })).status).toBe(Status.NOT_SERVING);
  });

  it("takes a failing database probe for NOT_SERVING", async () => {
    const health = healthClient(() => Promise.reject(new Error("connect ECONNREFUSED")), new AbortController().signal);
    expect((await health.check({ service: "" })).status).toBe(Status.NOT_SERVING);
  });

  it("shares one database probe among the checks of its reuse window", async () => {
    let probes = 0;
    const transport = createRouterTransport((router) =>
      registerHealth(router, [], { databaseAnswers: () => Promise.resolve(++probes > 0), draining: new AbortController().signal, reuseMs: 60_000 }),
    );
    const health = createClient(Health, transport);
    await Promise.all(Array.from({ length: 20 }, () => health.check({ service: "" })));
    expect(probes).toBe(1);
  });

  it("Watch tells each change once, and ends its wait when the server drains", async () => {
    const draining = new AbortController();
    let up = true;
    const health = healthClient(() => Promise.resolve(up), draining.signal);
    const seen: Status[] = [];
    for await (const message of health.watch({ service: "" })) {
      seen.push(message.status);
      if (seen.length === 1) up = false;
      if (seen.length === 2) draining.abort();
      if (seen.length === 2) break;
    }
    expect(seen).toEqual([Status.SERVING, Status.NOT_SERVING]);
  });
});
