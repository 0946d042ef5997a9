// The deployment files: docker-compose.yml is valid as Debian's docker-compose reads it, refuses
// to start without a database password, and wires what README "Running in production" says.
// (Images are not built here: this machine reaches no container registry for their bases.)
import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { ROOT } from "./support/child-processes.js";

const compose = (env: Record<string, string>, ...args: string[]) =>
  spawnSync("docker-compose", ["-f", "docker-compose.yml", ...args], { cwd: ROOT, env: { ...process.env, ...env }, encoding: "utf8" });

const probe = spawnSync("docker-compose", ["version"], { encoding: "utf8" });
const missing = probe.error !== undefined || probe.status !== 0 ? "docker-compose is not installed (apt-get install docker-compose)" : undefined;

if (missing !== undefined && process.env["KEEL_REQUIRE_DOCKER"] !== "1") {
  console.warn(`deployment files skipped: ${missing}`);
} else {
  describe("docker-compose.yml", () => {
    it("is valid, with PostgreSQL 17, two replicas behind one port, one sandbox agent and health checks", () => {
      if (missing !== undefined) throw new Error(`${missing} (KEEL_REQUIRE_DOCKER=1)`);
      const checked = compose({ KEEL_DB_PASSWORD: "not-a-real-password" }, "config");
      expect(checked.stderr).toBe("");
      expect(checked.status).toBe(0);
      const config = checked.stdout;
      expect(config).toMatch(/image: postgres:17/);
      for (const service of ["keel-1", "keel-2", "lb", "sandbox-1", "postgres"]) expect(config).toMatch(new RegExp(`^  ${service}:`, "m"));
      expect(config.match(/bin\/keel\.js", "health"|- health/g)?.length ?? 0).toBeGreaterThanOrEqual(1);
      expect(config).toMatch(/\/var\/run\/docker\.sock:\/var\/run\/docker\.sock/);
      expect(config).toMatch(/published: 7443|7443:7443/);
    });

    it("refuses to start without a database password", () => {
      if (missing !== undefined) throw new Error(`${missing} (KEEL_REQUIRE_DOCKER=1)`);
      const env = { ...process.env };
      delete env["KEEL_DB_PASSWORD"];
      const refused = spawnSync("docker-compose", ["-f", "docker-compose.yml", "config", "-q"], { cwd: ROOT, env, encoding: "utf8" });
      expect(refused.status).not.toBe(0);
      expect(refused.stderr).toMatch(/set KEEL_DB_PASSWORD/);
    });
  });
}
