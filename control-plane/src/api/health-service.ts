// The standard gRPC health service, reachable without a token (auth.ts lists it public):
// SERVING while the ledger's database answers and the server is not draining. Load
// balancers and compose health checks ask it; /healthz stays for plain HTTP probes.
import type { DescService } from "@bufbuild/protobuf";
import type { ConnectRouter } from "@connectrpc/connect";
import { Health, HealthCheckResponse_ServingStatus as Status } from "../../../gen/grpc/health/v1/health_pb.js";
import { NotFoundError } from "../domain/errors.js";

export interface HealthDeps {
  /** Whether the ledger's database answers now; bounded in time by the caller. */
  readonly databaseAnswers: () => Promise<boolean>;
  /** Aborted when the server starts draining: from then on everything is NOT_SERVING. */
  readonly draining: AbortSignal;
  /** How often Watch looks again (default 1 s). */
  readonly watchEveryMs?: number;
  /** How long one database answer is reused, so a crowd of probes costs one query (default 500 ms). */
  readonly reuseMs?: number;
}

export const HEALTH_SERVICE_NAME = Health.typeName;

export function registerHealth(router: ConnectRouter, services: readonly DescService[], deps: HealthDeps): void {
  const known = new Set(["", ...services.map((service) => service.typeName)]);
  const reuseMs = deps.reuseMs ?? 500;
  let last: { at: number; answer: Promise<boolean> } | undefined;
  const databaseAnswers = (): Promise<boolean> => {
    const now = Date.now();
    if (last === undefined || now - last.at >= reuseMs) last = { at: now, answer: deps.databaseAnswers().catch(() => false) };
    return last.answer;
  };
  const status = async (): Promise<Status> => (!deps.draining.aborted && (await databaseAnswers()) ? Status.SERVING : Status.NOT_SERVING);
  const watchEveryMs = deps.watchEveryMs ?? 1_000;

  router.service(Health, {
    async check(request) {
      if (!known.has(request.service)) throw new NotFoundError("service", request.service);
      return { status: await status() };
    },
    async *watch(request, context) {
      if (!known.has(request.service)) {
        yield { status: Status.SERVICE_UNKNOWN };
        return;
      }
      let previous: Status | undefined;
      while (!context.signal.aborted) {
        const now = await status();
        if (now !== previous) yield { status: now };
        previous = now;
        await new Promise<void>((resolve) => {
          const timer = setTimeout(done, watchEveryMs);
          function done(): void {
            clearTimeout(timer);
            context.signal.removeEventListener("abort", done);
            deps.draining.removeEventListener("abort", done);
            resolve();
          }
          context.signal.addEventListener("abort", done, { once: true });
          deps.draining.addEventListener("abort", done, { once: true });
        });
      }
    },
  });
}
