// The vocabulary of the contract case table (contract-cases.ts and the per-service files it
// spreads in): what a case is, what it is seeded with, and the checks cases share.
import type { JsonObject } from "@bufbuild/protobuf";
import type { Code } from "@connectrpc/connect";
import type { TokenRole } from "../../control-plane/src/ledger/api-token.repository.js";

/** One request; for a client- or bidi-streaming RPC, the messages the client sends, in order. */
export type RpcInput = JsonObject | readonly JsonObject[];

/**
 * What the right role gets for the valid request: "ok", or a code — Unimplemented for an RPC
 * not built yet, FailedPrecondition where the seeded run's state refuses it, NotFound, ...
 */
export type Expected = "ok" | Code;

export interface InvalidInput {
  readonly request: RpcInput;
  /** The proto field the InvalidArgument message must start with ("run_id: must be a UUID"). */
  readonly field: string;
}

export interface ContractCase {
  /** The role the service is for (auth.ts); admin may call everything, every other role is refused. */
  readonly role: TokenRole;
  readonly valid: RpcInput;
  readonly expect: Expected;
  /** Checks on the response (or first streamed message) of the valid request; fields are snake_case. */
  readonly check?: (response: JsonObject) => void;
  /** Bad inputs: InvalidArgument naming the field, never Internal. Empty only with a comment saying why. */
  readonly invalid: readonly InvalidInput[];
  /** Well-formed ids that do not exist: NotFound. */
  readonly notFound?: RpcInput;
}

/**
 * Ledger rows the valid requests point at, created through the API before the matrix runs.
 * The matrix's Keel runs no workers, so each run stays exactly where the seed left it, and
 * every valid request is idempotent: it is sent four times (two clients, role and admin).
 */
export interface Seed {
  /** Queued, and stays queued. */
  readonly liveRunId: string;
  /** Cancelled while queued: terminal. */
  readonly settledRunId: string;
  readonly emissionId: string;
  readonly connector: string;
}

// Well-formed ids that name nothing.
export const MISSING_UUID = "00000000-0000-4000-8000-000000000000";
export const ACTOR = { id: "contract-tester", display_name: "Contract Tester" };
export const LONG_REASON = "x".repeat(4097);

export const field = (value: unknown, ...path: string[]): unknown =>
  path.reduce<unknown>((node, key) => (node !== null && typeof node === "object" ? (node as Record<string, unknown>)[key] : undefined), value);

/** Throws unless the response field at `path` equals `expected`; vitest reports it like any failure. */
export const expectField =
  (expected: unknown, ...path: string[]) =>
  (response: JsonObject): void => {
    const actual = field(response, ...path);
    if (actual !== expected) throw new Error(`response.${path.join(".")}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`);
  };

export const expectArray =
  (...path: string[]) =>
  (response: JsonObject): void => {
    if (!Array.isArray(field(response, ...path))) throw new Error(`response.${path.join(".")}: expected an array`);
  };
