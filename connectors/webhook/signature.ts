// HMAC-SHA256 request signatures, the same both ways: over `<timestamp>.<body>` so a captured body
// cannot be replayed under a fresh timestamp, sent as `X-Keel-Signature: sha256=<hex>` beside
// `X-Keel-Timestamp: <unix seconds>`.
import { createHmac, timingSafeEqual } from "node:crypto";

export const SIGNATURE_HEADER = "x-keel-signature";
export const TIMESTAMP_HEADER = "x-keel-timestamp";
export const IDEMPOTENCY_HEADER = "idempotency-key";
/** How far a request's timestamp may be from our clock, either way. */
export const REPLAY_WINDOW_MS = 5 * 60_000;

export function sign(secret: string, timestamp: string, body: string | Buffer): string {
  return `sha256=${createHmac("sha256", secret).update(`${timestamp}.`).update(body).digest("hex")}`;
}

/** Why a signed request is refused, or undefined when it is genuine and fresh. */
export function signatureProblem(
  secret: string,
  headers: { readonly signature: string | undefined; readonly timestamp: string | undefined },
  body: Buffer,
  nowMs: number,
): string | undefined {
  const { signature, timestamp } = headers;
  if (timestamp === undefined || !/^\d{1,12}$/.test(timestamp)) return `${TIMESTAMP_HEADER} must be unix seconds`;
  if (Math.abs(nowMs - Number(timestamp) * 1000) > REPLAY_WINDOW_MS) return `${TIMESTAMP_HEADER} is outside the 5-minute window`;
  if (signature === undefined) return `${SIGNATURE_HEADER} is missing`;
  const expected = Buffer.from(sign(secret, timestamp, body));
  const given = Buffer.from(signature);
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) return `${SIGNATURE_HEADER} does not match`;
  return undefined;
}
