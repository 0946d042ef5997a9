// One Web API call and what its failure means for delivery. The WebClient is built with retries
// off and rate limits rejected, so this file alone decides when a call may be made again: only
// when the request provably never reached Slack (refused connection, unknown host, 429).
import { ErrorCode, LogLevel, WebClient, type WebAPICallResult } from "@slack/web-api";

export type CallOutcome =
  | { readonly kind: "ok"; readonly result: WebAPICallResult }
  /** Slack read the request and said no (`ok: false`): the error code, e.g. `channel_not_found`. */
  | { readonly kind: "refused"; readonly error: string }
  /** The request never left, or Slack turned it away unread: safe to make again. */
  | { readonly kind: "not-sent"; readonly reason: string; readonly retryAfterMs: number }
  /** It may have reached Slack (timeout, reset, a 5xx): whether it acted is unknown. */
  | { readonly kind: "ambiguous"; readonly reason: string };

export interface SlackWebOptions {
  readonly token: string;
  /** The Web API base, e.g. https://slack.com/api/ (a local Slack in tests). */
  readonly slackApiUrl?: string;
  /** Per call: connect, send and answer together. */
  readonly timeoutMs: number;
}

export function slackWebClient(options: SlackWebOptions): WebClient {
  return new WebClient(options.token, {
    ...(options.slackApiUrl === undefined ? {} : { slackApiUrl: options.slackApiUrl }),
    timeout: options.timeoutMs,
    // Each call's outcome is reported through the connector's own events; the SDK's warnings would repeat them.
    logLevel: LogLevel.ERROR,
    retryConfig: { retries: 0 },
    rejectRateLimitedCalls: true,
  });
}

const NEVER_CONNECTED = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH"]);

export async function callSlack(client: WebClient, method: string, args: Record<string, unknown>): Promise<CallOutcome> {
  try {
    return { kind: "ok", result: await client.apiCall(method, args) };
  } catch (error) {
    return classify(error);
  }
}

interface CodedError {
  readonly code?: string;
  readonly data?: { readonly error?: string };
  readonly original?: Error & { readonly cause?: { readonly code?: string } };
  readonly statusCode?: number;
  readonly retryAfter?: number;
  readonly message?: string;
}

export function classify(error: unknown): CallOutcome {
  const coded = error as CodedError;
  switch (coded.code) {
    case ErrorCode.PlatformError:
      return { kind: "refused", error: coded.data?.error ?? "unknown_error" };
    case ErrorCode.RateLimitedError:
      return { kind: "not-sent", reason: "rate limited", retryAfterMs: (coded.retryAfter ?? 1) * 1000 };
    case ErrorCode.HTTPError:
      return (coded.statusCode ?? 500) >= 500
        ? { kind: "ambiguous", reason: `Slack answered HTTP ${coded.statusCode}` }
        : { kind: "refused", error: `http_${coded.statusCode}` };
    case ErrorCode.RequestError: {
      const cause = coded.original?.cause?.code;
      if (cause !== undefined && NEVER_CONNECTED.has(cause)) return { kind: "not-sent", reason: cause, retryAfterMs: 0 };
      return { kind: "ambiguous", reason: coded.original?.message ?? coded.message ?? "request failed" };
    }
    default:
      return { kind: "ambiguous", reason: coded.message ?? String(error) };
  }
}
