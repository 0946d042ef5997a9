// While the ledger's database cannot be reached (restarting, refusing connections), RPCs answer
// Unavailable, which gRPC clients retry, not Internal; the server logs a warning, not an internal
// error, and serves normally once the database is back. The database is cut for real: Keel
// reaches PostgreSQL through a TCP relay the test closes and reopens on the same port.
import { Writable } from "node:stream";
import { Code, ConnectError } from "@connectrpc/connect";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RunService } from "../gen/keel/v1/run_service_pb.js";
import { isDatabaseUnavailable } from "../control-plane/src/ledger/database-errors.js";
import { grpcClient } from "./support/clients.js";
import { createTestDatabase, startTestKeel, type TestKeel } from "./support/keel-fixture.js";
import { TcpRelay } from "./support/tcp-relay.js";

const lines: string[] = [];
const log = pino(
  { level: "warn" },
  new Writable({
    write(chunk: Buffer, _encoding, done) {
      lines.push(chunk.toString());
      done();
    },
  }),
);

let keel: TestKeel;
let relay: TcpRelay;

beforeAll(async () => {
  const direct = await createTestDatabase();
  relay = TcpRelay.toDatabase(direct);
  await relay.open();
  keel = await startTestKeel({ databaseUrl: relay.relayed(direct), workers: 0, log });
}, 60_000);

afterAll(async () => {
  await relay.open();
  await keel?.stop();
  await relay.cut();
});

describe("a database that cannot be reached", () => {
  it("answers Unavailable over gRPC, logs no internal error, and serves again once it is back", async () => {
    const runs = grpcClient(RunService, keel.url, keel.tokens.operator);
    await expect(runs.listRuns({ pageSize: 1 })).resolves.toBeDefined();

    await relay.cut();
    const refused = await runs.listRuns({ pageSize: 1 }).then(
      () => undefined,
      (error: unknown) => ConnectError.from(error),
    );
    expect(refused?.code).toBe(Code.Unavailable);
    expect(refused?.rawMessage).toMatch(/database is unavailable/);
    expect(lines.join("")).not.toMatch(/internal error/);
    expect(lines.join("")).toMatch(/the ledger database is unavailable/);

    await relay.open();
    await expect(runs.listRuns({ pageSize: 1 })).resolves.toBeDefined();
  }, 30_000);
});

describe("isDatabaseUnavailable", () => {
  it("knows a refused connection, a server starting up and a cut connection, and nothing else", () => {
    const refused = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5432"), { code: "ECONNREFUSED", syscall: "connect" });
    expect(isDatabaseUnavailable(refused)).toBe(true);
    expect(isDatabaseUnavailable(new AggregateError([refused], "all addresses failed"))).toBe(true);
    expect(isDatabaseUnavailable(Object.assign(new Error("the database system is starting up"), { code: "57P03" }))).toBe(true);
    expect(isDatabaseUnavailable(Object.assign(new Error("terminating connection due to administrator command"), { code: "57P01" }))).toBe(true);
    expect(isDatabaseUnavailable(Object.assign(new Error("connection failure"), { code: "08006" }))).toBe(true);
    expect(isDatabaseUnavailable(new Error("Connection terminated unexpectedly"))).toBe(true);
    expect(isDatabaseUnavailable(Object.assign(new Error("duplicate key"), { code: "23505" }))).toBe(false);
    expect(isDatabaseUnavailable(Object.assign(new Error("no such file"), { code: "ENOENT" }))).toBe(false);
    expect(isDatabaseUnavailable(new TypeError("x is undefined"))).toBe(false);
    expect(isDatabaseUnavailable("ECONNREFUSED")).toBe(false);
  });
});
