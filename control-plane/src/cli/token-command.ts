// `keel token create|list|revoke`: straight on the ledger (the server need not run). A secret
// is printed once, at creation; list shows everything else about a token, never its secret.
import { parseArgs, type ParseArgsConfig } from "node:util";
import { pino } from "pino";
import { openKeelLedger } from "../app.js";
import type { KeelConfig } from "../config.js";
import { slugProblem } from "../../../common/ids.js";
import {
  DEFAULT_HOST_CAPACITY,
  MAX_HOST_CAPACITY,
  TOKEN_ROLES,
  describeScope,
  parseDuration,
  parseLabel,
  type TokenRole,
  type TokenScope,
} from "../domain/token-scope.js";
import { createApiTokenRepository, type ApiTokenRepository } from "../ledger/api-token.repository.js";
import { formatTable } from "./table.js";

export const TOKEN_USAGE = `keel token create --role sandbox-host --host-id H [--max-capacity N] [--label k=v]... [--expires-in 30d] [--name L]
  keel token create --role connector (--connector NAME... | --any-connector) [--agent ID]... [--expires-in 30d] [--name L]
  keel token create --role operator|admin [--expires-in 30d] [--name L]
  keel token list
  keel token revoke TOKEN_ID`;

/** A flag that makes no sense: the one line the user sees, with exit code 2. */
class TokenUsageError extends Error {}

const OPTIONS = {
  role: { type: "string" },
  // --label names the token for roles without labels of their own (as before scopes); a host's are k=v.
  label: { type: "string", multiple: true, default: [] as string[] },
  name: { type: "string" },
  "host-id": { type: "string" },
  "max-capacity": { type: "string" },
  connector: { type: "string", multiple: true, default: [] as string[] },
  "any-connector": { type: "boolean", default: false },
  agent: { type: "string", multiple: true, default: [] as string[] },
  "expires-in": { type: "string" },
} satisfies ParseArgsConfig["options"];

type TokenFlags = ReturnType<typeof parseArgs<{ options: typeof OPTIONS; allowPositionals: true }>>["values"];

export async function tokenCommand(args: readonly string[], config: () => KeelConfig, out: (line: string) => void): Promise<number> {
  try {
    const { values, positionals } = parseArgs({ args: [...args], allowPositionals: true, options: OPTIONS });
    const [action, ...operands] = positionals;
    switch (action) {
      case "create": {
        if (operands.length > 0) throw new TokenUsageError(`unexpected argument ${operands[0]}`);
        const request = creationFrom(values);
        return await withTokens(config(), async (tokens) => {
          const { id, secret } = await tokens.create(request.role, request.label, {
            scope: request.scope,
            ...(request.expiresAt === undefined ? {} : { expiresAt: request.expiresAt }),
          });
          out(secret);
          process.stderr.write(`created ${request.role} token ${id}; the secret above is shown once and stored only as a hash\n`);
          return 0;
        });
      }
      case "list":
        return await withTokens(config(), async (tokens) => {
          const rows = (await tokens.list()).map((t) => [
            t.id,
            t.role,
            t.label,
            describeScope(t.scope),
            t.createdAt.toISOString(),
            t.expiresAt?.toISOString() ?? "-",
            t.revokedAt?.toISOString() ?? "-",
          ]);
          out(formatTable(["ID", "ROLE", "LABEL", "SCOPE", "CREATED", "EXPIRES", "REVOKED"], rows));
          return 0;
        });
      case "revoke": {
        const [tokenId, extra] = operands;
        if (tokenId === undefined || extra !== undefined) throw new TokenUsageError("revoke takes exactly one token id (see `keel token list`)");
        return await withTokens(config(), async (tokens) => {
          if (!(await tokens.revoke(tokenId))) {
            process.stderr.write(`keel: no live token with id ${tokenId}\n`);
            return 1;
          }
          out(`revoked ${tokenId}`);
          return 0;
        });
      }
      default:
        throw new TokenUsageError(action === undefined ? "token needs create, list or revoke" : `unknown token command ${action}`);
    }
  } catch (error) {
    // parseArgs reports unknown flags and missing values as TypeErrors with a readable message.
    if (!(error instanceof TokenUsageError) && !(error instanceof TypeError)) throw error;
    process.stderr.write(`keel: ${error.message}\n\n  ${TOKEN_USAGE}\n`);
    return 2;
  }
}

async function withTokens(config: KeelConfig, work: (tokens: ApiTokenRepository) => Promise<number>): Promise<number> {
  const ledger = await openKeelLedger(config, pino({ level: "silent" }));
  try {
    return await work(createApiTokenRepository(ledger.sql));
  } finally {
    await ledger.close();
  }
}

interface Creation {
  readonly role: TokenRole;
  readonly label: string;
  readonly scope: TokenScope;
  readonly expiresAt: Date | undefined;
}

function creationFrom(values: TokenFlags): Creation {
  const role = values.role;
  if (role === undefined) throw new TokenUsageError("--role is required");
  if (!(TOKEN_ROLES as readonly string[]).includes(role)) throw new TokenUsageError(`--role must be one of: ${TOKEN_ROLES.join(", ")}`);
  const expiresIn = values["expires-in"];
  let expiresAt: Date | undefined;
  if (expiresIn !== undefined) {
    const ms = parseDuration(expiresIn);
    if (ms === undefined) throw new TokenUsageError("--expires-in must be a number and a unit, as 90s, 15m, 12h, 30d or 2w");
    expiresAt = new Date(Date.now() + ms);
  }
  const only = (allowed: readonly string[]) => {
    const given = (["host-id", "max-capacity", "connector", "any-connector", "agent"] as const).filter((flag) => {
      const value = values[flag];
      return Array.isArray(value) ? value.length > 0 : value !== undefined && value !== false;
    });
    const stray = given.find((flag) => !allowed.includes(flag));
    if (stray !== undefined) throw new TokenUsageError(`--${stray} does not apply to a ${role} token`);
  };
  switch (role as TokenRole) {
    case "sandbox-host": {
      only(["host-id", "max-capacity"]);
      const hostId = values["host-id"];
      if (hostId === undefined) throw new TokenUsageError("a sandbox-host token is bound to one host: --host-id is required");
      const problem = slugProblem(hostId);
      if (problem !== undefined) throw new TokenUsageError(`--host-id ${problem}`);
      const capacity = values["max-capacity"] === undefined ? DEFAULT_HOST_CAPACITY : Number(values["max-capacity"]);
      if (!Number.isInteger(capacity) || capacity < 1 || capacity > MAX_HOST_CAPACITY) {
        throw new TokenUsageError(`--max-capacity must be a whole number from 1 to ${MAX_HOST_CAPACITY}`);
      }
      const labels: Record<string, string> = {};
      for (const text of values.label) {
        const label = parseLabel(text);
        if (label === undefined) throw new TokenUsageError(`--label ${text}: a host's labels are key=value`);
        labels[label[0]] = label[1];
      }
      return { role: "sandbox-host", label: values.name ?? hostId, scope: { kind: "sandbox-host", hostId, maxCapacity: capacity, labels }, expiresAt };
    }
    case "connector": {
      only(["connector", "any-connector", "agent"]);
      if (values.connector.length === 0 && !values["any-connector"]) {
        throw new TokenUsageError("a connector token is bound to its connectors: give --connector NAME (repeatable), or --any-connector");
      }
      if (values.connector.length > 0 && values["any-connector"]) throw new TokenUsageError("--connector and --any-connector exclude each other");
      for (const name of [...values.connector, ...values.agent]) {
        const problem = slugProblem(name);
        if (problem !== undefined) throw new TokenUsageError(`${name}: ${problem}`);
      }
      const connectors: readonly string[] | "any" = values["any-connector"] ? "any" : [...new Set<string>(values.connector)];
      const agents: readonly string[] | "any" = values.agent.length === 0 ? "any" : [...new Set<string>(values.agent)];
      return { role: "connector", label: nameOf(values), scope: { kind: "connector", connectors, agents }, expiresAt };
    }
    case "operator":
    case "admin":
      only([]);
      return { role: role as TokenRole, label: nameOf(values), scope: { kind: "role" }, expiresAt };
  }
}

/** --name, or (as before scopes) a single --label. */
function nameOf(values: TokenFlags): string {
  if (values.name !== undefined) return values.name;
  if (values.label.length > 1) throw new TokenUsageError("--label names the token once; use --name");
  return values.label[0] ?? "";
}
