// As root, the embedded PostgreSQL runs as the postgres user. A data folder that user cannot
// reach (a checkout under /root, mode 0700) used to crash with an unhandled `spawn … initdb
// EACCES`; now it is one line saying what happened and what to do, before anything starts.
import { mkdtemp, mkdir, rm, chmod } from "node:fs/promises";
import { tmpdir, userInfo } from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { startEmbeddedPostgres } from "../control-plane/src/ledger/embedded-postgres.js";
import { freePort } from "./support/global-setup.js";

const closed: string[] = [];
afterAll(async () => {
  for (const folder of closed) await rm(folder, { recursive: true, force: true });
});

if (userInfo().uid !== 0) {
  console.warn("embedded PostgreSQL access check skipped: it applies only when Keel runs as root");
} else {
  describe("the embedded PostgreSQL as root", () => {
    it("refuses a data folder the postgres user cannot reach, in one line naming it and the way out", async () => {
      const home = await mkdtemp(path.join(tmpdir(), "keel-closed-home-"));
      closed.push(home);
      await chmod(home, 0o700); // like /root
      const dataDir = path.join(home, "checkout", ".keel", "postgres");
      await mkdir(path.dirname(dataDir), { recursive: true });
      const failure = await startEmbeddedPostgres({ dataDir, port: await freePort() }).then(
        async (handle) => {
          await handle.stop();
          return undefined;
        },
        (error: unknown) => (error instanceof Error ? error.message : String(error)),
      );
      expect(failure).toMatch(/postgres user .* cannot reach/);
      expect(failure).toContain(path.dirname(dataDir));
      expect(failure).toMatch(/DATABASE_URL/);
      expect(failure).not.toMatch(/EACCES/);
    }, 60_000);
  });
}
