import { create, type MessageInitShape } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import {
  AttachResponseSchema,
  OutputStream,
  SandboxService,
  type AttachRequest,
  type AttachResponse,
  WorkspaceCommandSchema,
  type HostRegistration as HostRegistrationProto,
} from "../../../gen/keel/v1/sandbox_service_pb.js";
import { InvalidArgumentError, PermissionDeniedError } from "../domain/errors.js";
import { hostRegistrationViolation } from "../domain/token-scope.js";
import { requireSlug } from "../domain/ids.js";
import type { HostCommand, HostMessage, HostRegistration } from "../sandbox/host-protocol.js";
import { MAX_OBSERVATION_BYTES } from "../sandbox/observation-pump.js";
import type { SandboxHub } from "../sandbox/sandbox-hub.js";
import { principalOf } from "./auth.js";

const MAX_LABELS = 64;
const MAX_LABEL_CHARS = 256;
const MAX_RUNNING_WORKSPACES = 10_000;
const MAX_ID_CHARS = 200;
const MAX_LIST_ITEMS = 64;
const MAX_RUNNING_COMMANDS = 1_000;
/** A stream that sends no registration this long after opening is ended: it would hold a stream slot forever. */
const REGISTRATION_WAIT_MS = 10_000;
/**
 * Output chunks hosts may send: big enough that a fast stream costs few messages (per-message
 * work dominates below a few hundred KiB), small enough to keep one message's latency and
 * memory modest, and no larger than one observation (a bigger chunk would make a bigger one).
 * Never above the server's message limit, less room for the rest of the message.
 */
const MAX_OUTPUT_CHUNK_BYTES = MAX_OBSERVATION_BYTES;
const MESSAGE_ROOM_BYTES = 1024;
const DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

export interface SandboxServiceDeps {
  readonly hub: SandboxHub;
  /** The server's limit on one message (KEEL_MAX_MESSAGE_BYTES); output chunks are sized below it. */
  readonly maxMessageBytes?: number;
  /** How long Attach waits for the registration (default REGISTRATION_WAIT_MS). */
  readonly registrationWaitMs?: number;
}

/**
 * One Attach stream per sandbox host: the registration first, then heartbeats, command
 * output and results from the host, and workspace commands to it, both ways at once.
 */
export function createSandboxService(deps: SandboxServiceDeps): ServiceImpl<typeof SandboxService> {
  const maxMessageBytes = deps.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
  const maxOutputChunkBytes = Math.max(1, Math.min(MAX_OUTPUT_CHUNK_BYTES, maxMessageBytes - MESSAGE_ROOM_BYTES));
  return {
    async *attach(requests, context) {
      const inbound = requests[Symbol.asyncIterator]();
      const first = await firstWithin(inbound, deps.registrationWaitMs ?? REGISTRATION_WAIT_MS);
      if (first.done === true) throw new InvalidArgumentError("register", "the stream ended before a host registration");
      if (first.value.message.case !== "register") {
        throw new InvalidArgumentError("register", "the first message on Attach must be a host registration");
      }
      const principal = principalOf(context);
      const registration = registrationFromProto(first.value.message.value);
      // The token decides which host this is, how much it may take on and which labels it may claim.
      const violation = hostRegistrationViolation(principal.scope, {
        hostId: registration.hostId,
        workspaces: registration.capacity.workspaces,
        labels: registration.labels,
      });
      if (violation !== undefined) throw new PermissionDeniedError(`${violation.field}: ${violation.reason}`);
      const host = await deps.hub.attach(registration, { tokenId: principal.tokenId });
      yield create(AttachResponseSchema, {
        message: {
          case: "registered",
          value: {
            hostId: host.registered.hostId,
            heartbeatIntervalMs: host.registered.heartbeatIntervalMs,
            reapWorkspaceIds: [...host.registered.reapWorkspaceIds],
            maxOutputChunkBytes,
          },
        },
      });

      let protocolError: InvalidArgumentError | undefined;
      const reading = (async () => {
        for (;;) {
          const next = await inbound.next();
          if (next.done === true) return "the host ended the stream";
          const message = hostMessageFromProto(next.value);
          if (message === undefined) {
            protocolError = new InvalidArgumentError("register", "a host registers once, as the first message of the stream");
            return "protocol error";
          }
          host.receive(message);
          // A consumer that is behind holds the stream: HTTP/2 flow control then slows the host.
          const held = host.holdOff();
          if (held !== undefined) await held;
        }
      })();
      reading.then(
        (reason) => host.close(reason),
        (error: unknown) => host.close(`the stream failed: ${error instanceof Error ? error.message : String(error)}`),
      );
      const onAbort = () => host.close("the stream was cancelled");
      context.signal.addEventListener("abort", onAbort, { once: true });
      try {
        for await (const command of host.commands) yield commandToProto(command);
      } finally {
        context.signal.removeEventListener("abort", onAbort);
        host.close("the stream ended");
      }
      if (protocolError !== undefined) throw protocolError;
    },
  };
}

/** The stream's first message, or InvalidArgument on register when none comes within waitMs. */
async function firstWithin<T>(inbound: AsyncIterator<T>, waitMs: number): Promise<IteratorResult<T>> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new InvalidArgumentError("register", `no host registration within ${waitMs} ms of opening the stream`)), waitMs);
  });
  try {
    return await Promise.race([inbound.next(), late]);
  } finally {
    clearTimeout(timer);
  }
}

function registrationFromProto(register: HostRegistrationProto): HostRegistration {
  requireSlug("register.host_id", register.hostId);
  const workspaces = register.capacity?.workspaces ?? 0;
  if (workspaces < 1) throw new InvalidArgumentError("register.capacity.workspaces", "must be at least 1");
  const labels = Object.entries(register.labels);
  if (labels.length > MAX_LABELS) throw new InvalidArgumentError("register.labels", `at most ${MAX_LABELS} labels`);
  for (const [key, value] of labels) {
    if (key === "" || key.length > MAX_LABEL_CHARS || value.length > MAX_LABEL_CHARS) {
      throw new InvalidArgumentError("register.labels", `label keys must be 1-${MAX_LABEL_CHARS} characters and values at most ${MAX_LABEL_CHARS}`);
    }
  }
  // Every string a host sends is kept in memory and logs while it is attached: each is bounded.
  const bounded: [string, string, number][] = [["register.instance_id", register.instanceId, MAX_ID_CHARS], ["register.agent_version", register.agentVersion, MAX_ID_CHARS]];
  for (const [field, list, max] of [["register.images", register.images, 512], ["register.backends", register.backends, MAX_ID_CHARS]] as const) {
    if (list.length > MAX_LIST_ITEMS) throw new InvalidArgumentError(field, `at most ${MAX_LIST_ITEMS} entries`);
    list.forEach((value, i) => bounded.push([`${field}[${i}]`, value, max]));
  }
  for (const [field, value, max] of bounded) if (value.length > max) throw new InvalidArgumentError(field, `must be at most ${max} characters`);
  if (register.running.length > MAX_RUNNING_WORKSPACES) throw new InvalidArgumentError("register.running", `at most ${MAX_RUNNING_WORKSPACES} workspaces`);
  // An id this control plane never issued is not refused: it ends up in the reap list.
  register.running.forEach((workspace, i) => {
    if (workspace.workspaceId === "" || workspace.workspaceId.length > MAX_ID_CHARS) {
      throw new InvalidArgumentError(`register.running[${i}].workspace_id`, `must be 1-${MAX_ID_CHARS} characters`);
    }
    if (workspace.runId.length > MAX_ID_CHARS) throw new InvalidArgumentError(`register.running[${i}].run_id`, `must be at most ${MAX_ID_CHARS} characters`);
    if (workspace.runningCommandIds.length > MAX_RUNNING_COMMANDS || workspace.runningCommandIds.some((id) => id.length > MAX_ID_CHARS)) {
      throw new InvalidArgumentError(`register.running[${i}].running_command_ids`, `at most ${MAX_RUNNING_COMMANDS} ids of at most ${MAX_ID_CHARS} characters`);
    }
  });
  return {
    hostId: register.hostId,
    instanceId: register.instanceId,
    capacity: {
      workspaces,
      cpuMillis: register.capacity?.cpuMillis ?? 0,
      memoryBytes: Number(register.capacity?.memoryBytes ?? 0n),
    },
    labels: { ...register.labels },
    backends: [...register.backends],
    images: [...register.images],
    running: register.running.map((w) => ({ workspaceId: w.workspaceId, runId: w.runId, runningCommandIds: [...w.runningCommandIds] })),
    agentVersion: register.agentVersion,
  };
}

function hostMessageFromProto(request: AttachRequest): HostMessage | undefined {
  const message = request.message;
  switch (message.case) {
    case "heartbeat":
      return { kind: "heartbeat", freeWorkspaces: message.value.freeWorkspaces };
    case "output":
      return {
        kind: "output",
        commandId: message.value.commandId,
        stream: message.value.stream === OutputStream.STDERR ? "stderr" : "stdout",
        chunk: message.value.chunk,
      };
    case "result": {
      const r = message.value;
      return {
        kind: "result",
        outcome: {
          commandId: r.commandId,
          ok: r.ok,
          exitCode: r.exitCode,
          durationMs: r.durationMs,
          timedOut: r.timedOut,
          outputTruncated: r.outputTruncated,
          error: r.error,
          errorReason: r.errorReason,
          data: r.data,
          outputTail: r.outputTail,
          outputBytes: Number(r.outputBytes),
          unknownCommand: r.unknownCommand,
        },
      };
    }
    case "register":
    case undefined:
      return undefined;
  }
}

type CommandAction = NonNullable<MessageInitShape<typeof WorkspaceCommandSchema>["action"]>;

function actionToProto(action: HostCommand["action"]): CommandAction {
  switch (action.kind) {
    case "acquire":
      return {
        case: "acquire",
        value: { workspaceId: action.workspaceId, runId: action.runId, image: action.image, networkAccess: action.networkAccess, env: { ...action.env } },
      };
    case "release":
      return { case: "release", value: { workspaceId: action.workspaceId } };
    case "exec":
      return {
        case: "exec",
        value: {
          workspaceId: action.workspaceId,
          argv: [...action.argv],
          workingDirectory: action.workingDirectory,
          env: { ...action.env },
          timeoutMs: action.timeoutMs,
          maxOutputBytes: BigInt(action.maxOutputBytes),
        },
      };
    case "read_file":
      return { case: "readFile", value: { workspaceId: action.workspaceId, path: action.path, maxBytes: BigInt(action.maxBytes) } };
    case "write_file":
      return { case: "writeFile", value: { workspaceId: action.workspaceId, path: action.path, content: action.content } };
    case "list_files":
      return { case: "listFiles", value: { workspaceId: action.workspaceId, path: action.path } };
    case "reattach":
      return { case: "reattach", value: { workspaceId: action.workspaceId } };
  }
}

function commandToProto(command: HostCommand): AttachResponse {
  return create(AttachResponseSchema, {
    message: { case: "command", value: create(WorkspaceCommandSchema, { commandId: command.commandId, action: actionToProto(command.action), leaseEpoch: BigInt(command.leaseEpoch ?? 0) }) },
  });
}
