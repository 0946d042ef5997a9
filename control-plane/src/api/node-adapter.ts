// Connect's router served to Node's HTTP/1.1 and HTTP/2 servers, as connect-node's own adapter
// does, except for what happens when answering fails: connect-node prints a plain-text line to
// stderr for each such call, including every client that simply went away (a closed browser tab
// on a WatchRun, a connector leaving a stream). Keel's logs are JSON lines: a client that left is
// a debug line, any other failure an error line.
import type http from "node:http";
import type http2 from "node:http2";
import { Code, ConnectError, createConnectRouter } from "@connectrpc/connect";
import {
  compressionBrotli,
  compressionGzip,
  universalRequestFromNodeRequest,
  universalResponseToNodeResponse,
  type ConnectNodeAdapterOptions,
} from "@connectrpc/connect-node";
import type { Logger } from "pino";

type Request = http.IncomingMessage | http2.Http2ServerRequest;
type Response = http.ServerResponse | http2.Http2ServerResponse;

export interface NodeAdapterOptions extends ConnectNodeAdapterOptions {
  /** Plain paths that are not RPCs; required, so no request goes unanswered. */
  readonly fallback: NonNullable<ConnectNodeAdapterOptions["fallback"]>;
  readonly log: Logger;
}

/** Socket errors that mean the peer is gone, not that Keel failed. */
const PEER_GONE = new Set(["EPIPE", "ECONNRESET", "ERR_STREAM_PREMATURE_CLOSE", "ERR_STREAM_DESTROYED", "ERR_HTTP2_INVALID_STREAM", "ERR_HTTP2_STREAM_ERROR"]);

/** True when a failed answer failed because the client left: nothing is wrong on Keel's side. */
export function clientLeft(request: Request, response: Response, reason: unknown): boolean {
  const error = ConnectError.from(reason);
  if (error.code === Code.Aborted || error.code === Code.Canceled) return true;
  const cause = error.cause as { code?: unknown } | undefined;
  if (typeof cause?.code === "string" && PEER_GONE.has(cause.code)) return true;
  const stream = "stream" in request ? request.stream : undefined;
  return response.destroyed || request.socket?.destroyed === true || stream?.destroyed === true;
}

export function connectRequestHandler(options: NodeAdapterOptions): (request: Request, response: Response) => void {
  // connect-node's default: requests compressed with gzip or brotli are accepted.
  const router = createConnectRouter({ ...options, acceptCompression: options.acceptCompression ?? [compressionGzip, compressionBrotli] });
  options.routes(router);
  const prefix = options.requestPathPrefix ?? "";
  const paths = new Map(router.handlers.map((handler) => [prefix + handler.requestPath, handler]));
  return (request, response) => {
    const handler = paths.get(request.url?.split("?", 2)[0] ?? "");
    if (handler === undefined) {
      options.fallback(request, response);
      return;
    }
    const universal = universalRequestFromNodeRequest(request, response, undefined, options.contextValues?.(request));
    handler(universal)
      .then((answer) => universalResponseToNodeResponse(answer, response))
      .catch((reason: unknown) => {
        const rpc = `${handler.service.typeName}/${handler.method.name}`;
        if (clientLeft(request, response, reason)) options.log.debug({ rpc, err: reason }, "the client left before its answer was written");
        else options.log.error({ rpc, err: reason }, "answering an RPC failed");
      });
  };
}
