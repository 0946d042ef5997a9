// Stopping Keel while a client holds a stream it never ended: a connect-node client that breaks
// out of Subscribe leaves the HTTP/2 stream open. Shutdown waits a grace period, then cuts the
// connection; before, app.stop() never returned.
import { describe, expect, it } from "vitest";
import { EmissionService } from "../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../gen/keel/v1/ingress_service_pb.js";
import { connectClient } from "./support/clients.js";
import { startTestKeel } from "./support/keel-fixture.js";

describe("shutdown with a stream its client left open", () => {
  it("finishes within the grace period and a little", async () => {
    const keel = await startTestKeel({ workers: 1 });
    await connectClient(IngressService, keel.url, keel.tokens.connector).submitMessage({
      agentId: "demo",
      conversationId: "shutdown",
      actor: { id: "a" },
      messageId: "m1",
      text: "hi",
      connector: "test",
    });
    for await (const message of connectClient(EmissionService, keel.url, keel.tokens.connector).subscribe({ connector: "test" })) {
      expect(message.emission).toBeDefined();
      break; // the stream is left open on the wire
    }
    const started = Date.now();
    await keel.stop();
    expect(Date.now() - started).toBeLessThan(5_000);
  }, 30_000);
});
