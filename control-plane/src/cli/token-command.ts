import { pino } from "pino";
import { openKeelLedger } from "../app.js";
import type { KeelConfig } from "../config.js";
import { createApiTokenRepository, TOKEN_ROLES, type TokenRole } from "../ledger/api-token.repository.js";

/** Creates a token straight in the ledger (the server need not run) and prints its secret once. */
export async function tokenCreateCommand(config: KeelConfig, role: string, label: string, out: (line: string) => void): Promise<number> {
  if (!(TOKEN_ROLES as readonly string[]).includes(role)) {
    out(`--role must be one of: ${TOKEN_ROLES.join(", ")}`);
    return 2;
  }
  const ledger = await openKeelLedger(config, pino({ level: "silent" }));
  try {
    const { id, secret } = await createApiTokenRepository(ledger.sql).create(role as TokenRole, label);
    out(secret);
    process.stderr.write(`created ${role} token ${id}; the secret above is shown once and stored only as a hash\n`);
    return 0;
  } finally {
    await ledger.close();
  }
}
