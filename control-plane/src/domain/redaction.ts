// Keeping a run's granted secret values out of everything Keel stores, sends or logs: whole
// texts, JSON, model turns, and output that arrives in chunks and may be cut at a byte cap.
// Pure: the runner builds one RunRedactor per claim and applies it before each commit.

import type { AgentSpec } from "./agent.js";
import type { ModelMessage, ModelTurn, ToolCallRequest } from "./transcript.js";

export interface GrantedSecret {
  /** The variable name inside the workspace; the redaction marker names it. */
  readonly name: string;
  readonly value: string;
}

export const redactionMarker = (name: string): string => `[redacted:${name}]`;

/** A run's secret grant (variable name to value) as the list redaction works from. */
export function grantedSecrets(values: Readonly<Record<string, string>>): GrantedSecret[] {
  return Object.entries(values).map(([name, value]) => ({ name, value }));
}

function usable(secrets: readonly GrantedSecret[]): GrantedSecret[] {
  return secrets.filter((s) => s.value !== "");
}

/**
 * Every secret value a run of `agent` can come across, read from the control plane's
 * environment: its workspace secrets (named as inside the workspace) and its models' API keys.
 */
export function runSecrets(agent: Pick<AgentSpec, "sandbox" | "models">, env: Readonly<Record<string, string | undefined>>): GrantedSecret[] {
  const found: GrantedSecret[] = [];
  for (const grant of agent.sandbox.secrets) found.push({ name: grant.envVar, value: env[grant.sourceEnv] ?? "" });
  for (const model of [agent.models.primary, agent.models.fast, agent.models.decision]) {
    if (model.apiKeyEnv !== "") found.push({ name: model.apiKeyEnv, value: env[model.apiKeyEnv] ?? "" });
  }
  return usable(found);
}

/**
 * An observation's text on its way to the ledger: a string, or the output's own bytes where they
 * are already what the ledger stores (valid UTF-8, no NUL, nothing to redact), so a fast stream is
 * not decoded into strings only to be encoded back for the database.
 */
export type ObservationText = string | Uint8Array;

/** Postgres text cannot hold NUL; binary output keeps its shape with a visible stand-in. */
export function storableText(text: string): string {
  return text.includes("\0") ? text.replaceAll("\0", "\u2400") : text;
}

/**
 * Redacts every match that starts before `upTo`: the earliest first, the longest on a tie.
 * Returns the redacted text and how far into `text` it got (a match may end past `upTo`).
 */
function scan(text: string, upTo: number, secrets: readonly GrantedSecret[]): { out: string; consumed: number } {
  let out = "";
  let i = 0;
  while (i < upTo) {
    let at = -1;
    let found: GrantedSecret | undefined;
    for (const secret of secrets) {
      const j = text.indexOf(secret.value, i);
      if (j < 0 || j >= upTo) continue;
      if (at < 0 || j < at || (j === at && secret.value.length > found!.value.length)) {
        at = j;
        found = secret;
      }
    }
    if (found === undefined) {
      out += text.slice(i, upTo);
      return { out, consumed: upTo };
    }
    out += text.slice(i, at) + redactionMarker(found.name);
    i = at + found.value.length;
  }
  return { out, consumed: i };
}

/** Replaces every occurrence of every granted secret's value with its marker. */
export function redactSecrets(text: string, secrets: readonly GrantedSecret[]): string {
  const active = usable(secrets);
  return active.length === 0 ? text : scan(text, text.length, active).out;
}

/**
 * How many characters to drop from the end of `text` so that it no longer ends in the start
 * of a secret. Dropping one such start can expose another ("abab" against "abc"), so this goes
 * on until none is left; it never drops more than the longest secret minus one per round.
 */
export function partialSecretSuffix(text: string, secrets: readonly GrantedSecret[]): number {
  let end = text.length;
  for (;;) {
    let drop = 0;
    for (const { value } of secrets) {
      for (let n = Math.min(value.length - 1, end); n > drop; n--) {
        if (text.startsWith(value.slice(0, n), end - n)) {
          drop = n;
          break;
        }
      }
    }
    if (drop === 0) return text.length - end;
    end -= drop;
  }
}

/** Redacts `text`, which was cut off at its end: no secret, and no secret's start, is left at the cut. */
function redactCut(text: string, secrets: readonly GrantedSecret[]): string {
  const { out, consumed } = scanAll(text, secrets);
  const rest = text.slice(consumed);
  return out + rest.slice(0, rest.length - partialSecretSuffix(rest, secrets));
}

/** Redacts all of `text`, and says where the last match ended (what follows holds no whole secret). */
function scanAll(text: string, secrets: readonly GrantedSecret[]): { out: string; consumed: number } {
  let out = "";
  let from = 0;
  let lastEnd = 0;
  for (;;) {
    let at = -1;
    let found: GrantedSecret | undefined;
    for (const secret of secrets) {
      const j = text.indexOf(secret.value, from);
      if (j >= 0 && (at < 0 || j < at || (j === at && secret.value.length > found!.value.length))) {
        at = j;
        found = secret;
      }
    }
    if (found === undefined) return { out, consumed: lastEnd };
    out += text.slice(from, at) + redactionMarker(found.name);
    from = at + found.value.length;
    lastEnd = from;
  }
}

export interface StreamRedactor {
  /** No secret to look for: push() returns its text as it is and nothing is ever held back. */
  readonly passesThrough: boolean;
  /** Redacts a chunk; holds back a short tail that could be the start of a secret split across chunks. */
  push(text: string): string;
  /**
   * Everything held back, redacted: call once the stream ends. With `cut` (the stream was
   * truncated, so what follows will never be seen here), a held-back start of a secret is dropped.
   */
  flush(cut?: boolean): string;
}

/**
 * Redaction for text that arrives in chunks. A secret may straddle two chunks, so the last
 * (longest secret - 1) characters are held back until the next chunk shows how they go on;
 * every match starting before that point is then fully visible, so the result is exactly
 * what redacting the whole text at once would give, and nothing handed out ends in a
 * secret's start (that can only be in what is held back).
 */
export function createStreamRedactor(secrets: readonly GrantedSecret[]): StreamRedactor {
  const active = usable(secrets);
  const holdBack = Math.max(0, ...active.map((s) => s.value.length - 1));
  let pending = "";
  return {
    passesThrough: active.length === 0,
    push(text) {
      if (active.length === 0) return text;
      const buffer = pending + text;
      let upTo = Math.max(0, buffer.length - holdBack);
      // Never split a surrogate pair between what goes out and what is held back.
      if (upTo > 0 && upTo < buffer.length && /[\uD800-\uDBFF]/.test(buffer[upTo - 1]!)) upTo -= 1;
      const { out, consumed } = scan(buffer, upTo, active);
      pending = buffer.slice(consumed);
      return out;
    },
    flush(cut = false) {
      const rest = cut ? redactCut(pending, active) : redactSecrets(pending, active);
      pending = "";
      return rest;
    },
  };
}

/**
 * Redacts the tail of an output. When its beginning was cut off (`cutStart`), the cut may have
 * landed inside a secret, leaving a fragment no full-value match would find, so the tail starts
 * after its first line break (or, without one, after as many characters as the longest secret).
 * When the output itself was truncated (`cutEnd`), a secret's start at the very end is dropped.
 */
export function redactOutputTail(tail: string, cutStart: boolean, secrets: readonly GrantedSecret[], cutEnd = false): string {
  let text = tail;
  const active = usable(secrets);
  if (active.length === 0) return storableText(text);
  if (cutStart) {
    const longest = Math.max(...active.map((s) => s.value.length));
    const newline = text.indexOf("\n");
    text = newline >= 0 ? text.slice(newline + 1) : text.slice(Math.min(text.length, longest));
  }
  return storableText(cutEnd ? redactCut(text, active) : redactSecrets(text, active));
}

/** A secret as it appears inside a JSON string literal, when that differs from the value itself. */
function jsonEscaped(secrets: readonly GrantedSecret[]): GrantedSecret[] {
  return secrets.flatMap((s) => {
    const escaped = JSON.stringify(s.value).slice(1, -1);
    return escaped === s.value ? [s] : [s, { name: s.name, value: escaped }];
  });
}

function redactValue(value: unknown, secrets: readonly GrantedSecret[]): unknown {
  if (typeof value === "string") return redactSecrets(value, secrets);
  if (Array.isArray(value)) return value.map((item) => redactValue(item, secrets));
  if (typeof value === "object" && value !== null) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [redactSecrets(k, secrets), redactValue(v, secrets)]));
  }
  return value;
}

/**
 * Redacts JSON text (tool-call arguments): parsed, so a secret written with escapes is still
 * found, and written back only when something was redacted; text that does not parse is
 * redacted as text, in its plain and its JSON-escaped spelling.
 */
export function redactJsonText(text: string, secrets: readonly GrantedSecret[]): string {
  const active = usable(secrets);
  if (active.length === 0) return text;
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return redactSecrets(text, jsonEscaped(active));
  }
  const redacted = JSON.stringify(redactValue(parsed, active));
  return redacted === JSON.stringify(parsed) ? text : redacted;
}

/** One claim's redaction: built once from the run's secrets, applied by the runner before each commit. */
export interface RunRedactor {
  /** Whether there is anything to redact at all (the functions return their input when not). */
  readonly active: boolean;
  text(text: string): string;
  json(text: string): string;
  /** A model's answer: its text and every tool call (name, id and arguments). */
  turn(turn: ModelTurn): ModelTurn;
  /** A message of a model request as stored (the user's text and the system prompt may hold a secret too). */
  message(message: ModelMessage): ModelMessage;
}

export function createRunRedactor(secrets: readonly GrantedSecret[]): RunRedactor {
  const active = usable(secrets);
  const text = (value: string) => (active.length === 0 ? value : redactSecrets(value, active));
  const json = (value: string) => (active.length === 0 ? value : redactJsonText(value, active));
  const call = (c: ToolCallRequest): ToolCallRequest => ({ ...c, id: text(c.id), name: text(c.name), argumentsJson: json(c.argumentsJson) });
  return {
    active: active.length > 0,
    text,
    json,
    turn(turn) {
      if (active.length === 0) return turn;
      return { ...turn, text: text(turn.text), toolCalls: turn.toolCalls.map(call) };
    },
    message(message) {
      if (active.length === 0) return message;
      if (message.role === "assistant") return { ...message, content: text(message.content), toolCalls: message.toolCalls.map(call) };
      return { ...message, content: text(message.content) };
    },
  };
}

/** Redacts the JSON form of a log line: each value in its plain and its JSON-escaped spelling. */
export function createLogLineRedactor(values: readonly string[]): (line: string) => string {
  const secrets = jsonEscaped(usable(values.map((value) => ({ name: "secret", value }))));
  if (secrets.length === 0) return (line) => line;
  return (line) => redactSecrets(line, secrets);
}
