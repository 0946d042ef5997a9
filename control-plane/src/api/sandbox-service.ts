import type { ServiceImpl } from "@connectrpc/connect";
import { SandboxService } from "../../../gen/keel/v1/sandbox_service_pb.js";
import { InvalidArgumentError, UnimplementedError } from "../domain/errors.js";
import { requireSlug } from "../domain/ids.js";

export function createSandboxService(): ServiceImpl<typeof SandboxService> {
  return {
    async *attach(requests) {
      for await (const request of requests) {
        if (request.message.case !== "register") {
          throw new InvalidArgumentError("register", "the first message on Attach must be a host registration");
        }
        requireSlug("register.host_id", request.message.value.hostId);
        throw new UnimplementedError("SandboxService.Attach is not implemented yet; it arrives with the sandbox-host work");
      }
      throw new InvalidArgumentError("register", "the stream ended before a host registration");
    },
  };
}
