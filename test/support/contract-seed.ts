// The contract seed (see Seed in contract-cases.ts) for suites that share its case table:
// a queued run, a cancelled run and an emission, created through the public API.
import { EmissionService } from "../../gen/keel/v1/emission_service_pb.js";
import { IngressService } from "../../gen/keel/v1/ingress_service_pb.js";
import { RunStatus } from "../../gen/keel/v1/run_pb.js";
import { connectClient } from "./clients.js";
import { ACTOR, type Seed } from "./contract-cases.js";
import type { TestKeel } from "./keel-fixture.js";

const SEED_CONNECTOR = "contract-seed";

export async function seedContractLedger(keel: TestKeel): Promise<Seed> {
  const ingress = connectClient(IngressService, keel.url, keel.tokens.connector);
  // Separate conversations: a second message in the same one could join the first run.
  const message = (conversationId: string) => ({
    agentId: "demo",
    conversationId,
    actor: { id: ACTOR.id },
    messageId: `${conversationId}-m`,
    text: "seed",
    connector: SEED_CONNECTOR,
  });
  const live = await ingress.submitMessage(message("contract-seed-live"));
  const settled = await ingress.submitMessage(message("contract-seed-settled"));
  const { run } = await ingress.cancelRun({ runId: settled.runId, actor: { id: ACTOR.id }, reason: "seed" });
  if (run?.status !== RunStatus.CANCELLED) throw new Error(`seed run ${settled.runId} did not settle: ${String(run?.status)}`);

  // Ingress reserves the working ack in the same transaction as the run.
  const emissions = connectClient(EmissionService, keel.url, keel.tokens.connector);
  let emissionId: string | undefined;
  const abort = new AbortController();
  for await (const { emission } of emissions.subscribe({ connector: SEED_CONNECTOR }, { signal: abort.signal, timeoutMs: 10_000 })) {
    emissionId = emission?.id;
    break;
  }
  abort.abort();
  if (emissionId === undefined) throw new Error("the seed messages produced no emission");
  return { liveRunId: live.runId, settledRunId: settled.runId, emissionId, connector: SEED_CONNECTOR };
}
