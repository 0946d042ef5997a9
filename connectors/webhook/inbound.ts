// HTTP in: a signed JSON POST becomes IngressService.SubmitMessage. The signature is checked before
// the body is parsed, so an unsigned caller learns nothing about the schema.
import type { IncomingMessage, ServerResponse } from "node:http";
import { Code, ConnectError } from "@connectrpc/connect";
import type { KeelClients } from "../shared/keel-client.js";
import { SIGNATURE_HEADER, signatureProblem, TIMESTAMP_HEADER } from "./signature.js";

export interface InboundOptions {
  readonly ingress: KeelClients["ingress"];
  readonly secret: string;
  readonly agentId: string;
  /** The connector name emissions for these conversations go to (what the outbound side subscribes to). */
  readonly connector: string;
  readonly maxBodyBytes?: number;
  readonly now?: () => number;
}

interface Submission {
  readonly conversationId: string;
  readonly messageId: string;
  readonly actor: { id: string; displayName: string };
  readonly text: string;
}

class BadRequest extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

const KEEL_TO_HTTP: Partial<Record<Code, number>> = {
  [Code.InvalidArgument]: 400,
  [Code.ResourceExhausted]: 413,
  [Code.NotFound]: 404,
  [Code.FailedPrecondition]: 409,
  [Code.Unavailable]: 503,
  [Code.DeadlineExceeded]: 504,
};

export function createInboundHandler(options: InboundOptions): (request: IncomingMessage, response: ServerResponse) => void {
  const now = options.now ?? Date.now;
  const maxBodyBytes = options.maxBodyBytes ?? 1024 * 1024;
  return (request, response) => {
    handle(request).then(
      (result) => reply(response, 202, result),
      (error: unknown) => {
        if (error instanceof BadRequest) return reply(response, error.status, { error: error.message });
        // Keel's own answer: the caller's mistakes keep their meaning; ours (token, scope) are a bad gateway.
        const keel = ConnectError.from(error);
        reply(response, KEEL_TO_HTTP[keel.code] ?? 502, { error: keel.rawMessage, code: Code[keel.code] });
      },
    );
  };

  async function handle(request: IncomingMessage): Promise<Record<string, unknown>> {
    if (request.method !== "POST") throw new BadRequest(405, "only POST is accepted");
    const body = await readBody(request, maxBodyBytes);
    const problem = signatureProblem(options.secret, { signature: header(request, SIGNATURE_HEADER), timestamp: header(request, TIMESTAMP_HEADER) }, body, now());
    if (problem !== undefined) throw new BadRequest(401, problem);
    const submission = parseSubmission(body);
    const submitted = await options.ingress.submitMessage({ agentId: options.agentId, connector: options.connector, ...submission });
    return { run_id: submitted.runId, duplicate: submitted.duplicate };
  }
}

function header(request: IncomingMessage, name: string): string | undefined {
  const value = request.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

async function readBody(request: IncomingMessage, limit: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of request as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > limit) throw new BadRequest(413, `body is larger than ${limit} bytes`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

/** The body as a submission, or a 400 naming the first field that is wrong. */
export function parseSubmission(body: Buffer): Submission {
  let value: unknown;
  try {
    value = JSON.parse(body.toString("utf8"));
  } catch {
    throw new BadRequest(400, "body is not JSON");
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new BadRequest(400, "body must be a JSON object");
  const fields = value as Record<string, unknown>;
  const text = (name: string): string => {
    const field = fields[name];
    if (typeof field !== "string" || field === "") throw new BadRequest(400, `${name} must be a non-empty string`);
    return field;
  };
  const actor = fields["actor"];
  let actorId: string;
  let displayName = "";
  if (typeof actor === "string" && actor !== "") actorId = actor;
  else if (typeof actor === "object" && actor !== null && typeof (actor as Record<string, unknown>)["id"] === "string") {
    const { id, display_name: name } = actor as Record<string, unknown>;
    actorId = id as string;
    if (typeof name === "string") displayName = name;
  } else throw new BadRequest(400, "actor must be a non-empty string or an object with a string id");
  return { conversationId: text("conversation_id"), messageId: text("message_id"), actor: { id: actorId, displayName }, text: text("text") };
}

function reply(response: ServerResponse, status: number, body: Record<string, unknown>): void {
  if (response.headersSent) return;
  response.writeHead(status, { "content-type": "application/json" });
  response.end(JSON.stringify(body));
}
