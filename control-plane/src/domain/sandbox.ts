// Sandbox rules in domain terms: where a workspace path may point, which commands count as
// reads, and how granted secrets are kept out of everything Keel stores or logs.

import type { ToolEffect, ToolGrant } from "./agent.js";

export const WORKSPACE_ROOT = "/workspace";

export type WorkspacePath = { readonly ok: true; readonly path: string } | { readonly ok: false; readonly reason: string };

/**
 * Resolves a path given by a model against /workspace (relative paths are inside it) and
 * refuses anything that lands outside it once `.` and `..` are applied.
 */
export function resolveWorkspacePath(input: string): WorkspacePath {
  if (input.includes("\0")) return { ok: false, reason: "must not contain NUL bytes" };
  if (input.trim() === "") return { ok: false, reason: "is empty" };
  const absolute = input.startsWith("/") ? input : `${WORKSPACE_ROOT}/${input}`;
  const parts: string[] = [];
  for (const part of absolute.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") {
      if (parts.length === 0) return { ok: false, reason: `${JSON.stringify(input)} escapes ${WORKSPACE_ROOT}` };
      parts.pop();
      continue;
    }
    parts.push(part);
  }
  const resolved = `/${parts.join("/")}`;
  if (resolved !== WORKSPACE_ROOT && !resolved.startsWith(`${WORKSPACE_ROOT}/`)) {
    return { ok: false, reason: `${JSON.stringify(input)} is outside ${WORKSPACE_ROOT}` };
  }
  return { ok: true, path: resolved };
}

/** Shell syntax that chains, redirects or substitutes: a command using any of it is never a plain read. */
const SHELL_COMPOSITION = /[;&|<>`\n\r]|\$\(/;

/**
 * An exec is a read only when the agent declared its program read-only and the command is
 * that one program with arguments: `sleep 5` may be a read, `sleep 5; rm -rf x` never is.
 */
export function execEffect(command: string, grant: ToolGrant | undefined): ToolEffect {
  const readOnly = grant?.readOnlyCommands ?? [];
  if (readOnly.length === 0 || SHELL_COMPOSITION.test(command)) return "write";
  const program = command.trim().split(/\s+/)[0] ?? "";
  return program !== "" && readOnly.includes(program) ? "read" : "write";
}

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

export interface StreamRedactor {
  /** No secret to look for: push() returns its text as it is and nothing is ever held back. */
  readonly passesThrough: boolean;
  /** Redacts a chunk; holds back a short tail that could be the start of a secret split across chunks. */
  push(text: string): string;
  /** Everything held back, redacted: call once the stream ends. */
  flush(): string;
}

/**
 * Redaction for text that arrives in chunks. A secret may straddle two chunks, so the last
 * (longest secret - 1) characters are held back until the next chunk shows how they go on;
 * every match starting before that point is then fully visible, so the result is exactly
 * what redacting the whole text at once would give.
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
    flush() {
      const rest = redactSecrets(pending, active);
      pending = "";
      return rest;
    },
  };
}

/**
 * Redacts the tail of an output whose beginning was cut off: the cut may have landed inside
 * a secret, leaving a fragment no full-value match would find, so the tail starts after its
 * first line break (or, without one, after as many characters as the longest secret).
 */
export function redactOutputTail(tail: string, cut: boolean, secrets: readonly GrantedSecret[]): string {
  let text = tail;
  const active = usable(secrets);
  if (cut && active.length > 0) {
    const longest = Math.max(...active.map((s) => s.value.length));
    const newline = text.indexOf("\n");
    text = newline >= 0 ? text.slice(newline + 1) : text.slice(Math.min(text.length, longest));
  }
  return storableText(redactSecrets(text, active));
}
