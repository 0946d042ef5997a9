// What a bearer token may do: its role says which services it may call, its scope which host
// or connectors it may act as. Pure rules; the ledger stores the scope as JSON and api/ asks
// these functions on every call, so a token never reaches beyond what it was created for.

export const TOKEN_ROLES = ["connector", "sandbox-host", "operator", "admin"] as const;
export type TokenRole = (typeof TOKEN_ROLES)[number];

/** Workspaces a host token allows when its creator named no number. */
export const DEFAULT_HOST_CAPACITY = 64;
/** No host token may claim more: capacity attracts workspaces, and each carries its run's secrets. */
export const MAX_HOST_CAPACITY = 4096;
const MAX_SCOPE_NAMES = 64;

export interface HostScope {
  readonly kind: "sandbox-host";
  readonly hostId: string;
  readonly maxCapacity: number;
  /** The labels (key=value) the host may claim; a registration may claim a subset. */
  readonly labels: Readonly<Record<string, string>>;
}

export interface ConnectorScope {
  readonly kind: "connector";
  /** The connector names it may act as, or "any" (tokens from before scopes, or a trusted bridge). */
  readonly connectors: readonly string[] | "any";
  /** The agents it may address, or "any". */
  readonly agents: readonly string[] | "any";
}

/** Operators and admins act by role alone. A host token without a host binding may do nothing. */
export type TokenScope = HostScope | ConnectorScope | { readonly kind: "role" } | { readonly kind: "unbound" };

export interface Principal {
  readonly tokenId: string;
  readonly role: TokenRole;
  readonly label: string;
  readonly scope: TokenScope;
  readonly expiresAt: Date | undefined;
}

/** A refusal naming the request field that went beyond the scope. */
export interface ScopeViolation {
  readonly field: string;
  readonly reason: string;
}

/** Reads a stored scope; anything malformed becomes "unbound", which grants nothing. */
export function scopeFromJson(role: TokenRole, json: unknown): TokenScope {
  const value = (typeof json === "object" && json !== null ? json : {}) as Record<string, unknown>;
  switch (role) {
    case "operator":
    case "admin":
      return { kind: "role" };
    case "sandbox-host": {
      const { hostId, maxCapacity, labels } = value;
      if (typeof hostId !== "string" || hostId === "" || typeof maxCapacity !== "number") return { kind: "unbound" };
      if (!isStringRecord(labels)) return { kind: "unbound" };
      return { kind: "sandbox-host", hostId, maxCapacity: Math.min(maxCapacity, MAX_HOST_CAPACITY), labels };
    }
    case "connector": {
      const connectors = namesOrAny(value["connectors"]);
      const agents = namesOrAny(value["agents"] ?? "any");
      if (connectors === undefined || agents === undefined) return { kind: "unbound" };
      return { kind: "connector", connectors, agents };
    }
  }
}

export function scopeToJson(scope: TokenScope): Record<string, unknown> {
  switch (scope.kind) {
    case "sandbox-host":
      return { hostId: scope.hostId, maxCapacity: scope.maxCapacity, labels: scope.labels };
    case "connector":
      return { connectors: scope.connectors, agents: scope.agents };
    case "role":
    case "unbound":
      return {};
  }
}

/** One line for `keel token list`. */
export function describeScope(scope: TokenScope): string {
  switch (scope.kind) {
    case "sandbox-host": {
      const labels = Object.entries(scope.labels).map(([k, v]) => `${k}=${v}`);
      return `host=${scope.hostId} max-capacity=${scope.maxCapacity}${labels.length > 0 ? ` labels=${labels.join(",")}` : ""}`;
    }
    case "connector": {
      const list = (names: readonly string[] | "any") => (names === "any" ? "*" : names.join(","));
      return `connectors=${list(scope.connectors)} agents=${list(scope.agents)}`;
    }
    case "role":
      return "-";
    case "unbound":
      return "unbound (refused everywhere)";
  }
}

/** Checks what a host registers against its token; the first field that goes beyond it is refused. */
export function hostRegistrationViolation(
  scope: TokenScope,
  registration: { readonly hostId: string; readonly workspaces: number; readonly labels: Readonly<Record<string, string>> },
): ScopeViolation | undefined {
  if (scope.kind === "role") return undefined; // an admin may stand in for any host
  if (scope.kind !== "sandbox-host") {
    return { field: "register.host_id", reason: "this token is bound to no host; create one with `keel token create --role sandbox-host --host-id <id>`" };
  }
  if (registration.hostId !== scope.hostId) {
    return { field: "register.host_id", reason: `this token may register only as host ${scope.hostId}` };
  }
  if (registration.workspaces > scope.maxCapacity) {
    return { field: "register.capacity.workspaces", reason: `this token allows at most ${scope.maxCapacity} workspaces` };
  }
  for (const [key, value] of Object.entries(registration.labels)) {
    if (scope.labels[key] !== value) return { field: "register.labels", reason: `this token does not allow the label ${key}=${value}` };
  }
  return undefined;
}

/** Checks a connector name and, when the call names one, an agent id against the token. */
export function connectorViolation(
  scope: TokenScope,
  target: { readonly connector: string; readonly agentId?: string },
  fields: { readonly connector: string; readonly agentId?: string } = { connector: "connector", agentId: "agent_id" },
): ScopeViolation | undefined {
  if (scope.kind === "role") return undefined;
  if (scope.kind !== "connector") return { field: fields.connector, reason: "this token is bound to no connector" };
  if (scope.connectors !== "any" && !scope.connectors.includes(target.connector)) {
    return { field: fields.connector, reason: `this token may act only as connector ${scope.connectors.join(", ")}, not ${target.connector}` };
  }
  return target.agentId === undefined ? undefined : agentViolation(scope, target.agentId, fields.agentId ?? "agent_id");
}

/** Checks an agent id alone (a connector token limited to some agents). */
export function agentViolation(scope: TokenScope, agentId: string, field: string): ScopeViolation | undefined {
  if (scope.kind === "role") return undefined;
  if (scope.kind !== "connector") return { field, reason: "this token is bound to no connector" };
  if (scope.agents !== "any" && !scope.agents.includes(agentId)) {
    return { field, reason: `this token may address only agent ${scope.agents.join(", ")}, not ${agentId}` };
  }
  return undefined;
}

/** Whether a token is past its expiry at `now`. */
export function expired(principal: Pick<Principal, "expiresAt">, now: Date): boolean {
  return principal.expiresAt !== undefined && principal.expiresAt.getTime() <= now.getTime();
}

const DURATION_UNITS: Readonly<Record<string, number>> = { s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };

/** Parses `90s`, `15m`, `12h`, `30d`, `2w` into milliseconds; undefined when it does not parse. */
export function parseDuration(text: string): number | undefined {
  const match = /^(\d{1,6})([smhdw])$/.exec(text.trim());
  if (match?.[1] === undefined || match[2] === undefined) return undefined;
  const amount = Number(match[1]);
  const unit = DURATION_UNITS[match[2]];
  return amount > 0 && unit !== undefined ? amount * unit : undefined;
}

/** Parses `key=value` (the value may be empty); undefined when there is no key. */
export function parseLabel(text: string): [string, string] | undefined {
  const at = text.indexOf("=");
  if (at <= 0) return undefined;
  return [text.slice(0, at), text.slice(at + 1)];
}

function namesOrAny(value: unknown): readonly string[] | "any" | undefined {
  if (value === "any") return "any";
  if (!Array.isArray(value) || value.length === 0 || value.length > MAX_SCOPE_NAMES) return undefined;
  return value.every((name) => typeof name === "string" && name !== "") ? (value as string[]) : undefined;
}

function isStringRecord(value: unknown): value is Record<string, string> {
  return typeof value === "object" && value !== null && !Array.isArray(value) && Object.values(value).every((v) => typeof v === "string");
}
