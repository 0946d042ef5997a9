import { availableParallelism } from "node:os";
import { describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "./config.js";

describe("loadConfig", () => {
  it("has bounded defaults for everything", () => {
    const config = loadConfig({});
    expect(config).toMatchObject({ host: "127.0.0.1", port: 7070, http1Port: 7071, workers: 32, databaseUrl: undefined });
    expect(config.maxMessageBytes).toBe(4 * 1024 * 1024);
    expect(config.defaultDeadlineMs).toBeLessThanOrEqual(config.maxDeadlineMs);
  });

  it("reads the deprecated install-setting variables only when they are set (the ledger holds the settings)", () => {
    expect(loadConfig({}).installSettingsFromEnv).toEqual({});
    expect(loadConfig({ KEEL_MAX_CONCURRENT_ROOT_RUNS: "5", KEEL_RETENTION_DAYS: "0" }).installSettingsFromEnv).toEqual({ rootRunCeiling: 5, retentionDays: 0 });
    expect(() => loadConfig({ KEEL_MAX_CONCURRENT_ROOT_RUNS: "0" })).toThrow(/^invalid setting KEEL_MAX_CONCURRENT_ROOT_RUNS=/);
  });

  it("reads and coerces settings", () => {
    const config = loadConfig({ KEEL_PORT: "9000", DATABASE_URL: "postgresql://u:p@db/keel", KEEL_WORKERS: "0" });
    expect(config).toMatchObject({ port: 9000, databaseUrl: "postgresql://u:p@db/keel", workers: 0 });
  });

  it.each([
    ["KEEL_PORT", "seventy"],
    ["KEEL_PORT", "70000"],
    ["DATABASE_URL", "mysql://nope"],
    ["KEEL_LOG_LEVEL", "chatty"],
    ["KEEL_MAX_MESSAGE_BYTES", "-1"],
  ])("refuses %s=%s with one line naming it", (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(ConfigError);
    expect(() => loadConfig({ [name]: value })).toThrow(new RegExp(`^invalid setting ${name}=`));
  });

  it("polls for a lone step commit's reply for 2 ms by default, never with one CPU, and 100 ms at most", () => {
    expect(loadConfig({}).commitPollMs).toBe(availableParallelism() > 1 ? 2 : 0);
    expect(loadConfig({ KEEL_COMMIT_POLL_MS: "0" }).commitPollMs).toBe(0);
    expect(() => loadConfig({ KEEL_COMMIT_POLL_MS: "101" })).toThrow(/^invalid setting KEEL_COMMIT_POLL_MS=/);
  });

  it("has bounded sandbox defaults and refuses an exec timeout above its maximum", () => {
    expect(loadConfig({}).sandbox).toMatchObject({ keepMs: 600_000, placementWaitMs: 30_000, maxOutputBytes: 1024 * 1024 });
    expect(() => loadConfig({ KEEL_SANDBOX_EXEC_TIMEOUT_MS: "5000", KEEL_SANDBOX_MAX_EXEC_TIMEOUT_MS: "1000" })).toThrow(/KEEL_SANDBOX_EXEC_TIMEOUT_MS/);
  });

  it("refuses a default deadline above the maximum", () => {
    expect(() => loadConfig({ KEEL_DEFAULT_DEADLINE_MS: "5000", KEEL_MAX_DEADLINE_MS: "1000" })).toThrow(/KEEL_DEFAULT_DEADLINE_MS/);
  });

  it("serves plaintext only on loopback unless TLS or --insecure is given", () => {
    expect(loadConfig({}).tls).toBeUndefined();
    expect(loadConfig({ KEEL_HOST: "::1" }).host).toBe("::1");
    expect(() => loadConfig({ KEEL_HOST: "0.0.0.0" })).toThrow(/refusing to serve plaintext.*--insecure/);
    expect(loadConfig({ KEEL_HOST: "0.0.0.0", KEEL_INSECURE: "1" }).insecure).toBe(true);
    const tls = loadConfig({ KEEL_HOST: "0.0.0.0", KEEL_TLS_CERT: "c.pem", KEEL_TLS_KEY: "k.pem", KEEL_TLS_CLIENT_CA: "ca.pem" }).tls;
    expect([tls?.certFile, tls?.keyFile, tls?.clientCaFile].map((file) => file?.split("/").pop())).toEqual(["c.pem", "k.pem", "ca.pem"]);
  });

  it("refuses half a TLS setting", () => {
    expect(() => loadConfig({ KEEL_TLS_CERT: "c.pem" })).toThrow(/KEEL_TLS_CERT\/KEEL_TLS_KEY/);
    expect(() => loadConfig({ KEEL_TLS_CLIENT_CA: "ca.pem" })).toThrow(/KEEL_TLS_CLIENT_CA/);
    expect(() => loadConfig({ KEEL_INSECURE: "maybe" })).toThrow(/^invalid setting KEEL_INSECURE=/);
  });

  it("bounds HTTP/2 connections by default", () => {
    expect(loadConfig({}).http2).toEqual({ maxConcurrentStreams: 1_000, idleTimeoutMs: 120_000, maxHeaderBytes: 16 * 1024, maxSessionsPerAddress: 1_024, refusalsPerSecond: 1_000, refusalBudgetPerSecond: 200 });
    expect(() => loadConfig({ KEEL_HTTP2_MAX_CONCURRENT_STREAMS: "0" })).toThrow(/KEEL_HTTP2_MAX_CONCURRENT_STREAMS/);
    expect(() => loadConfig({ KEEL_REFUSAL_BUDGET_PER_SECOND: "0" })).toThrow(/KEEL_REFUSAL_BUDGET_PER_SECOND/);
  });
});
