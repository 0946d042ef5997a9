// A tiny OpenAI-compatible chat-completions server on loopback, so tests drive the real
// `openai` SDK over real HTTP without a network or a key.

import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { ChatCompletionCreateParams } from "openai/resources/chat/completions";

/** What the SDK sends; parsed from JSON, so tests should treat it as evidence, not as trusted. */
export type ChatCompletionRequestBody = ChatCompletionCreateParams;

export interface ScriptedToolCallReply {
  /** Defaults to `call_<request index>_<position>`. */
  readonly id?: string;
  readonly name: string;
  readonly arguments: string;
}

export interface ScriptedUsage {
  readonly promptTokens: number;
  readonly completionTokens: number;
}

interface Delayed {
  /** Wait this long before answering; a client that gives up first gets nothing. */
  readonly delayMs?: number;
}

export type ScriptedCompletion =
  | (Delayed & {
      readonly kind: "reply";
      readonly text?: string | null;
      readonly toolCalls?: readonly ScriptedToolCallReply[];
      /** null leaves `usage` out of the response, as some local servers do. */
      readonly usage?: ScriptedUsage | null;
      readonly finishReason?: string;
    })
  | (Delayed & { readonly kind: "error"; readonly status: number; readonly message?: string })
  | (Delayed & { readonly kind: "raw"; readonly body: string; readonly status?: number; readonly contentType?: string });

export type CompletionScript = (
  request: ChatCompletionRequestBody,
  index: number,
) => ScriptedCompletion | Promise<ScriptedCompletion>;

export interface OpenAiCompatibleServerOptions {
  /** When set, requests without `Authorization: Bearer <apiKey>` get 401. */
  readonly apiKey?: string;
}

export interface OpenAiCompatibleServer {
  /** Base URL including `/v1`, ready for `new OpenAI({ baseURL })`. */
  readonly url: string;
  /** Every chat-completions body received, in arrival order (including refused ones). */
  readonly requests: ChatCompletionRequestBody[];
  /** The headers of each request, index-aligned with `requests`. */
  readonly headers: IncomingHttpHeaders[];
  close(): Promise<void>;
}

const COMPLETIONS_PATH = "/v1/chat/completions";

export async function startOpenAiCompatibleServer(
  script: CompletionScript,
  options: OpenAiCompatibleServerOptions = {},
): Promise<OpenAiCompatibleServer> {
  const requests: ChatCompletionRequestBody[] = [];
  const headers: IncomingHttpHeaders[] = [];

  const server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      if (!res.headersSent) sendError(res, 500, `test server failed: ${String(error)}`);
      else res.destroy();
    });
  });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (req.method !== "POST" || req.url?.split("?")[0] !== COMPLETIONS_PATH) {
      sendError(res, 404, `no route for ${req.method ?? "?"} ${req.url ?? "?"}`);
      return;
    }
    const raw = await readBody(req);
    let body: ChatCompletionRequestBody;
    try {
      body = JSON.parse(raw) as ChatCompletionRequestBody;
    } catch {
      sendError(res, 400, "request body is not JSON");
      return;
    }
    const index = requests.length;
    requests.push(body);
    headers.push(req.headers);
    if (options.apiKey !== undefined && req.headers.authorization !== `Bearer ${options.apiKey}`) {
      sendError(res, 401, "Incorrect API key provided", "invalid_api_key");
      return;
    }
    const scripted = await script(body, index);
    if (!(await delay(scripted.delayMs ?? 0, res))) return;
    respond(res, scripted, body, index);
  }

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve());
  });
  const { port } = server.address() as AddressInfo;

  return {
    url: `http://127.0.0.1:${port}/v1`,
    requests,
    headers,
    close: () =>
      new Promise<void>((resolve, reject) => {
        // Keep-alive sockets from the SDK would otherwise hold close() open.
        server.closeAllConnections();
        server.close((error) => (error ? reject(error) : resolve()));
      }),
  };
}

function respond(res: ServerResponse, scripted: ScriptedCompletion, body: ChatCompletionRequestBody, index: number): void {
  switch (scripted.kind) {
    case "error":
      sendError(res, scripted.status, scripted.message ?? `scripted HTTP ${scripted.status}`);
      return;
    case "raw":
      res.writeHead(scripted.status ?? 200, { "content-type": scripted.contentType ?? "application/json" });
      res.end(scripted.body);
      return;
    case "reply":
      if (body.stream === true) sendStream(res, scripted, body, index);
      else sendJson(res, 200, completionObject(scripted, body, index));
      return;
  }
}

type ReplyCompletion = Extract<ScriptedCompletion, { kind: "reply" }>;

interface WireToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

function wireToolCalls(scripted: ReplyCompletion, index: number): WireToolCall[] {
  return (scripted.toolCalls ?? []).map((call, i) => ({
    id: call.id ?? `call_${index}_${i}`,
    type: "function",
    function: { name: call.name, arguments: call.arguments },
  }));
}

function finishReasonOf(scripted: ReplyCompletion): string {
  return scripted.finishReason ?? ((scripted.toolCalls ?? []).length > 0 ? "tool_calls" : "stop");
}

/** Scripted usage, or a rough ~4-characters-a-token estimate so replies always carry some. */
function usageOf(scripted: ReplyCompletion, body: ChatCompletionRequestBody): Record<string, number> | undefined {
  if (scripted.usage === null) return undefined;
  const promptTokens = scripted.usage?.promptTokens ?? Math.ceil(JSON.stringify(body.messages).length / 4);
  const completionTokens = scripted.usage?.completionTokens ?? Math.ceil((scripted.text ?? "").length / 4);
  return { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens };
}

function completionObject(scripted: ReplyCompletion, body: ChatCompletionRequestBody, index: number): object {
  const toolCalls = wireToolCalls(scripted, index);
  const usage = usageOf(scripted, body);
  return {
    id: `chatcmpl-test-${index}`,
    object: "chat.completion",
    created: Math.floor(Date.now() / 1000),
    model: body.model,
    choices: [
      {
        index: 0,
        message: {
          role: "assistant",
          content: scripted.text ?? null,
          refusal: null,
          ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {}),
        },
        logprobs: null,
        finish_reason: finishReasonOf(scripted),
      },
    ],
    ...(usage === undefined ? {} : { usage }),
  };
}

/** Server-sent events as OpenAI streams them: role, content, tool calls, finish, usage, [DONE]. */
function sendStream(res: ServerResponse, scripted: ReplyCompletion, body: ChatCompletionRequestBody, index: number): void {
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
  const base = { id: `chatcmpl-test-${index}`, object: "chat.completion.chunk", created: Math.floor(Date.now() / 1000), model: body.model };
  const chunk = (delta: object, finishReason: string | null): void => {
    res.write(`data: ${JSON.stringify({ ...base, choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }] })}\n\n`);
  };
  chunk({ role: "assistant", content: "" }, null);
  if (scripted.text) chunk({ content: scripted.text }, null);
  wireToolCalls(scripted, index).forEach((call, i) => chunk({ tool_calls: [{ index: i, ...call }] }, null));
  chunk({}, finishReasonOf(scripted));
  const usage = usageOf(scripted, body);
  if (body.stream_options?.include_usage === true && usage !== undefined) {
    res.write(`data: ${JSON.stringify({ ...base, choices: [], usage })}\n\n`);
  }
  res.end("data: [DONE]\n\n");
}

function sendJson(res: ServerResponse, status: number, payload: object): void {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(payload));
}

function sendError(res: ServerResponse, status: number, message: string, code: string | null = null): void {
  sendJson(res, status, { error: { message, type: status === 401 ? "invalid_request_error" : "server_error", param: null, code } });
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}

/** Resolves true after `ms`, or false as soon as the client hangs up. */
function delay(ms: number, res: ServerResponse): Promise<boolean> {
  if (ms <= 0) return Promise.resolve(true);
  return new Promise((resolve) => {
    const onClose = (): void => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(() => {
      res.off("close", onClose);
      resolve(true);
    }, ms);
    res.once("close", onClose);
  });
}
