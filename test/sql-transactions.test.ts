// Keel's SQL pool sends BEGIN in the same round trip as a transaction's first statement. These
// tests hold it to what a separate BEGIN gave: every statement of the transaction in one
// transaction (one snapshot time, one transaction id), a rollback that undoes the first
// statement too, errors in the first statement reported and the connection still usable, and
// a named statement's first use on a connection (where BEGIN goes on its own) the same.
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pipelinedBeginUnsupportedReason } from "../control-plane/src/ledger/pg-pipelined-begin.js";
import { NOTIFY_SPACING_MS } from "../control-plane/src/ledger/notification-hub.js";
import { createSqlPool, registeredStatements, sql as sqlText, statement, type SqlPool, type SqlTransaction } from "../control-plane/src/ledger/sql.js";
import { createTestDatabase } from "./support/keel-fixture.js";

type Seen = { xid: string; at: string };
type Note = { id: number; body: string };

// Named statements, each prepared on the pool's one connection by its first use below.
const insertSeen = statement<Note, Seen>("sql_transactions_test_insert_seen")`
  INSERT INTO notes (id, body) VALUES (${(p) => p.id}, ${(p) => p.body}) RETURNING txid_current()::text AS xid, now()::text AS at`;
const insertForRollback = statement<Note>("sql_transactions_test_insert_rollback")`
  INSERT INTO notes (id, body) VALUES (${(p) => p.id}, ${(p) => p.body})`;
const planMode = statement<Record<string, never>, { mode: string; xid: string }>("sql_transactions_test_plan_mode")`
  SELECT current_setting('plan_cache_mode') AS mode, txid_current()::text AS xid`;
const genericPlanMode = statement<Record<string, never>, { mode: string }>("sql_transactions_test_generic_plan_mode", { plans: "generic" })`
  SELECT current_setting('plan_cache_mode') AS mode`;
// A row lock, then a read of what other transactions committed: runBoth's pair.
const lockNote = statement<{ id: number }, { body: string; xid: string }>("sql_transactions_test_lock_note")`
  UPDATE notes SET body = body || '+' WHERE id = ${(p) => p.id} RETURNING body, txid_current()::text AS xid`;
const readNotes = statement<{ from: number; to: number }, { id: number; xid: string }>("sql_transactions_test_read_notes")`
  SELECT id, txid_current()::text AS xid FROM notes WHERE id BETWEEN ${(p) => p.from} AND ${(p) => p.to} ORDER BY id`;
const insertForConflict = statement<Note>("sql_transactions_test_insert_conflict")`
  INSERT INTO notes (id, body) VALUES (${(p) => p.id}, ${(p) => p.body})`;

describe("SQL transactions with BEGIN sent alongside their first statement", () => {
  let url: string;
  let sql: SqlPool;
  let db: pg.Client;
  let connections: SqlPool;

  beforeAll(async () => {
    url = await createTestDatabase();
    // One connection: every transaction below reuses it, so named statements are prepared on it.
    sql = createSqlPool({ url, max: 1 });
    connections = createSqlPool({ url, max: 4 });
    db = new pg.Client({ connectionString: url });
    await db.connect();
    await db.query("CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL)");
  });

  afterAll(async () => {
    await db?.end();
    await sql?.close();
    await connections?.close();
  });

  const count = async (id: number) => Number((await db.query<{ n: string }>("SELECT count(*) AS n FROM notes WHERE id = $1", [id])).rows[0]?.n);

  it("relies only on the pg version and internals pipelined BEGIN was written against", () => {
    // Failing here means pg changed under us: re-check pg-pipelined-begin.ts against the new
    // version's Query and Connection before moving the pin (transactions meanwhile send BEGIN alone).
    expect(pipelinedBeginUnsupportedReason()).toBeUndefined();
  });

  it("runs the first statement inside the transaction, unnamed and named alike", async () => {
    const cases = [
      {
        label: "unnamed",
        first: (trx: SqlTransaction, id: number) =>
          trx.query<Seen>(sqlText`INSERT INTO notes (id, body) VALUES (${id}, 'first') RETURNING txid_current()::text AS xid, now()::text AS at`),
      },
      // Its first use prepares the statement on the connection (BEGIN then goes on its own) ...
      { label: "named, first use", first: (trx: SqlTransaction, id: number) => trx.run(insertSeen, { id, body: "first" }) },
      // ... and from then on BEGIN goes with it.
      { label: "named, prepared", first: (trx: SqlTransaction, id: number) => trx.run(insertSeen, { id, body: "first" }) },
    ];
    for (const [i, { label, first }] of cases.entries()) {
      const id = 100 + i;
      const [inserted, later] = await sql.transaction(async (trx) => {
        const [row] = await first(trx, id);
        const [after] = await trx.query<Seen>(sqlText`SELECT txid_current()::text AS xid, now()::text AS at`);
        return [row, after] as const;
      });
      // One transaction: the same id and the same statement-start time in both statements.
      expect(inserted?.xid, label).toMatch(/^\d+$/);
      expect(later?.xid, label).toBe(inserted?.xid);
      expect(later?.at, label).toBe(inserted?.at);
      expect(await count(id), label).toBe(1);
    }
  });

  it("rolls back the first statement when the work throws", async () => {
    await expect(
      sql.transaction(async (trx) => {
        await trx.query(sqlText`INSERT INTO notes (id, body) VALUES (${200}, ${"doomed"})`);
        throw new Error("changed my mind");
      }),
    ).rejects.toThrow("changed my mind");
    expect(await count(200)).toBe(0);

    // The same through an already prepared named statement (prepared by the first round).
    await sql.transaction((trx) => trx.run(insertForRollback, { id: 201, body: "kept" }));
    await expect(
      sql.transaction(async (trx) => {
        await trx.run(insertForRollback, { id: 202, body: "doomed" });
        throw new Error("changed my mind again");
      }),
    ).rejects.toThrow("changed my mind again");
    expect(await count(201)).toBe(1);
    expect(await count(202)).toBe(0);
  });

  it("reports an error in the first statement and keeps the connection usable", async () => {
    await sql.transaction((trx) => trx.run(insertForConflict, { id: 300, body: "one" }));
    // Pipelined (prepared) and failing: a unique violation.
    await expect(sql.transaction((trx) => trx.run(insertForConflict, { id: 300, body: "again" }))).rejects.toMatchObject({ code: "23505" });
    // Unnamed and failing at parse time.
    await expect(sql.transaction((trx) => trx.query(sqlText`SELEC 1`))).rejects.toMatchObject({ code: "42601" });
    // The one connection is still good, outside and inside transactions.
    expect(await sql.query<{ one: number }>(sqlText`SELECT 1 AS one`)).toEqual([{ one: 1 }]);
    await sql.transaction((trx) => trx.run(insertForConflict, { id: 301, body: "two" }));
    expect(await count(301)).toBe(1);
  });

  it("plans generically only inside a transaction that asks to, its first statement included", async () => {
    const generic = { plans: "generic" } as const;
    // First use of the named statement (BEGIN goes on its own), then prepared (BEGIN goes with
    // it), then unnamed; the settings come with the connection.
    for (const label of ["named, first use", "named, prepared"]) {
      const [first, second] = await sql.transaction(async (trx) => [...(await trx.run(planMode, {})), ...(await trx.run(planMode, {}))], undefined, generic);
      expect(first?.mode, label).toBe("force_generic_plan");
      expect(second?.xid, label).toBe(first?.xid);
    }
    const [unnamed] = await sql.transaction((trx) => trx.query<{ mode: string }>(sqlText`SELECT current_setting('plan_cache_mode') AS mode`), undefined, generic);
    expect(unnamed?.mode).toBe("force_generic_plan");
    // SET LOCAL ends with its transaction: the connection's next transaction, and a statement outside one, plan as before.
    const [after] = await sql.transaction((trx) => trx.run(planMode, {}));
    expect(after?.mode).toBe("auto");
    expect((await sql.run(planMode, {}))[0]?.mode).toBe("auto");
    // A failed generic transaction leaves nothing behind either.
    await expect(sql.transaction((trx) => trx.query(sqlText`SELECT 1/0`), undefined, generic)).rejects.toMatchObject({ code: "22012" });
    expect((await sql.run(planMode, {}))[0]?.mode).toBe("auto");
  });

  it("runs a statement declared generic on the generic-plan connections outside a transaction, on the transaction's inside one", async () => {
    for (const label of ["first use", "prepared"]) expect((await sql.run(genericPlanMode, {}))[0]?.mode, label).toBe("force_generic_plan");
    expect((await sql.runLast(genericPlanMode, {}))[0]?.mode).toBe("force_generic_plan");
    const [inside] = await sql.transaction((trx) => trx.run(genericPlanMode, {}));
    expect(inside?.mode).toBe("auto");
    expect((await sql.run(planMode, {}))[0]?.mode).toBe("auto");
  });

  it("runs two statements in one round trip, the second on a snapshot taken after the first's lock wait", async () => {
    await connections.query(sqlText`INSERT INTO notes (id, body) VALUES (${500}, ${"v"})`);
    // Every path: first use (each statement on its own), prepared (pipelined, opening the
    // transaction), and after another statement (pipelined, nothing to open).
    for (const [round, label] of ["first use", "prepared", "after a statement"].entries()) {
      let release!: () => void;
      const held = new Promise<void>((resolve) => (release = resolve));
      let locked!: () => void;
      const didLock = new Promise<void>((resolve) => (locked = resolve));
      // Another transaction holds the row and, before it commits, adds a note the second statement must see.
      const other = connections.transaction(async (trx) => {
        await trx.query(sqlText`UPDATE notes SET body = body WHERE id = ${500}`);
        await trx.query(sqlText`INSERT INTO notes (id, body) VALUES (${501 + round}, ${"added"})`);
        locked();
        await held;
      });
      await didLock;
      const pair = sql.transaction(async (trx) => {
        if (label === "after a statement") await trx.query(sqlText`SELECT 1`);
        return trx.runBoth(lockNote, { id: 500 }, readNotes, { from: 501, to: 510 });
      });
      await new Promise((resolve) => setTimeout(resolve, 50));
      release();
      await other;
      const [[lockedRow], notes] = await pair;
      expect(lockedRow?.body, label).toBe(`v${"+".repeat(round + 1)}`);
      expect(notes.map((n) => n.id), label).toEqual(Array.from({ length: round + 1 }, (_, i) => 501 + i));
      expect(notes[0]?.xid, label).toBe(lockedRow?.xid);
    }
    // An error in the first statement fails the pair, and the connection stays good.
    await expect(sql.transaction((trx) => trx.runBoth(insertForConflict, { id: 500, body: "dup" }, readNotes, { from: 0, to: 1 }))).rejects.toMatchObject({ code: "23505" });
    await expect(sql.transaction((trx) => trx.runBoth(insertForConflict, { id: 500, body: "dup" }, readNotes, { from: 0, to: 1 }))).rejects.toMatchObject({ code: "23505" });
    expect(await sql.query<{ one: number }>(sqlText`SELECT 1 AS one`)).toEqual([{ one: 1 }]);
  });

  it("commits with its last statement: committed when it returns, nothing committed when it or its COMMIT fails", async () => {
    const insertLast = statement<Note, Seen>("sql_transactions_test_insert_last")`
      INSERT INTO notes (id, body) VALUES (${(p) => p.id}, ${(p) => p.body}) RETURNING txid_current()::text AS xid, now()::text AS at`;
    const listener = new pg.Client({ connectionString: url });
    await listener.connect();
    const heard: string[] = [];
    listener.on("notification", (n) => heard.push(n.payload ?? ""));
    await listener.query("LISTEN keel_runs");
    try {
      // Every path: first use (each on its own), prepared (BEGIN, the statement and COMMIT in
      // one round trip), and after another statement.
      for (const [round, label] of ["first use", "prepared", "after a statement"].entries()) {
        const id = 600 + round * 2;
        const result = await sql.transaction(async (trx) => {
          const earlier = label === "after a statement" ? await trx.run(insertSeen, { id: id + 1, body: "earlier" }) : undefined;
          trx.notify("keel_runs", `last-${round}`);
          const [last] = await trx.runLast(insertLast, { id, body: label });
          // Committed before the work returns: another connection sees it now.
          const seenNow = await count(id);
          await expect(trx.query(sqlText`SELECT 1`)).rejects.toThrow(/committed with its last statement/);
          return { last, earlier: earlier?.[0], seenNow };
        });
        expect(result.seenNow, label).toBe(1);
        if (result.earlier !== undefined) {
          expect(result.earlier.xid).toBe(result.last?.xid);
          expect(await count(id + 1)).toBe(1);
        }
      }
      await expect.poll(() => heard.filter((p) => p.startsWith("last-")).sort()).toEqual(["last-0", "last-1", "last-2"]);

      // The statement fails: PostgreSQL skips the COMMIT, the whole transaction rolls back.
      await expect(
        sql.transaction(async (trx) => {
          await trx.run(insertSeen, { id: 610, body: "rolled back" });
          trx.notify("keel_runs", "failed-statement");
          return trx.runLast(insertLast, { id: 600, body: "dup" });
        }),
      ).rejects.toMatchObject({ code: "23505" });
      expect(await count(610)).toBe(0);

      // The statement runs but its COMMIT fails (a deferred foreign key checked at commit).
      await db.query("CREATE TABLE IF NOT EXISTS note_links (id int PRIMARY KEY, note_id int REFERENCES notes (id) DEFERRABLE INITIALLY DEFERRED)");
      const insertLink = statement<{ id: number; note: number }>("sql_transactions_test_insert_link")`
        INSERT INTO note_links (id, note_id) VALUES (${(p) => p.id}, ${(p) => p.note})`;
      for (let i = 0; i < 2; i++) {
        await expect(
          sql.transaction(async (trx) => {
            await trx.run(insertSeen, { id: 611 + i, body: "rolled back" });
            return trx.runLast(insertLink, { id: 1 + i, note: 99_999 });
          }),
        ).rejects.toMatchObject({ code: "23503" });
        expect(await count(611 + i)).toBe(0);
      }
      expect(Number((await db.query<{ n: string }>("SELECT count(*) AS n FROM note_links")).rows[0]?.n)).toBe(0);

      // A transaction of that one statement goes without BEGIN and COMMIT, as a transaction of its
      // own: a check deferred to its commit still fails it, and a later one commits.
      await expect(sql.transaction((trx) => trx.runLast(insertLink, { id: 3, note: 99_999 }))).rejects.toMatchObject({ code: "23503" });
      await expect(sql.transaction((trx) => trx.runLast(insertLast, { id: 600, body: "dup" }))).rejects.toMatchObject({ code: "23505" });
      expect(await sql.transaction((trx) => trx.runLast(insertLink, { id: 4, note: 600 }))).toEqual([]);
      expect((await db.query<{ id: number }>("SELECT id FROM note_links")).rows).toEqual([{ id: 4 }]);
      await db.query("DELETE FROM note_links");

      // Committed work whose result is not to be kept is a mistake, said loudly; what committed stays.
      await expect(sql.transaction((trx) => trx.runLast(insertLast, { id: 620, body: "kept anyway" }), () => false)).rejects.toThrow(/cannot be rolled back/);
      expect(await count(620)).toBe(1);

      // The connection is clean after all that, and nothing of the failed ones was heard.
      expect(await sql.query<{ one: number }>(sqlText`SELECT 1 AS one`)).toEqual([{ one: 1 }]);
      await new Promise((resolve) => setTimeout(resolve, 50));
      expect(heard).not.toContain("failed-statement");
      // Outside a transaction, runLast is a statement on its own.
      expect(await sql.runLast(insertLast, { id: 621, body: "alone" })).toHaveLength(1);
      expect(await count(621)).toBe(1);
    } finally {
      await listener.end();
    }
  });

  it("sends nothing for a transaction that runs no statement", async () => {
    await expect(sql.transaction(() => Promise.resolve("nothing to do"))).resolves.toBe("nothing to do");
    expect(await sql.query<{ one: number }>(sqlText`SELECT 1 AS one`)).toEqual([{ one: 1 }]);
  });

  it("keeps transactions on different connections apart", async () => {
    // The second transaction's first statement waits on the first's row lock, then sees its commit.
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let updated!: () => void;
    const didUpdate = new Promise<void>((resolve) => (updated = resolve));
    await connections.query(sqlText`INSERT INTO notes (id, body) VALUES (${400}, ${"v0"})`);
    const first = connections.transaction(async (trx) => {
      await trx.query(sqlText`UPDATE notes SET body = 'v1' WHERE id = ${400}`);
      updated();
      await held;
    });
    await didUpdate;
    let secondDone = false;
    const second = connections.transaction(async (trx) => trx.query<{ body: string }>(sqlText`SELECT body FROM notes WHERE id = ${400} FOR UPDATE`));
    void second.finally(() => (secondDone = true));
    await new Promise((resolve) => setTimeout(resolve, 100));
    // Still blocked: the first transaction (BEGIN and its UPDATE in it) holds the row.
    expect(secondDone).toBe(false);
    release();
    await first;
    expect(await second).toEqual([{ body: "v1" }]);
  });
});

describe("Sql.notify: wake-ups sent after the commit", () => {
  let sql: SqlPool;
  let listener: pg.Client;
  const heard: { channel: string; payload: string; at: number }[] = [];

  beforeAll(async () => {
    const url = await createTestDatabase();
    sql = createSqlPool({ url, max: 2 });
    listener = new pg.Client({ connectionString: url });
    await listener.connect();
    listener.on("notification", (n) => heard.push({ channel: n.channel, payload: n.payload ?? "", at: performance.now() }));
    await listener.query("LISTEN keel_runs");
    await listener.query("LISTEN keel_run_events");
  });

  afterAll(async () => {
    await listener?.end();
    await sql?.close();
  });

  const until = async (check: () => boolean, what: string) => {
    for (let i = 0; i < 200 && !check(); i++) await new Promise((resolve) => setTimeout(resolve, 5));
    if (!check()) throw new Error(`never heard ${what}`);
  };

  it("sends a transaction's notifications only once it commits, and none after a rollback", async () => {
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    const committed = sql.transaction(async (trx) => {
      await trx.query(sqlText`SELECT 1`);
      trx.notify("keel_runs", "committed-run");
      await held;
    });
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(heard.filter((n) => n.payload === "committed-run")).toEqual([]);
    await expect(
      sql.transaction(async (trx) => {
        await trx.query(sqlText`SELECT 1`);
        trx.notify("keel_runs", "rolled-back-run");
        throw new Error("abandoned");
      }),
    ).rejects.toThrow("abandoned");
    release();
    await committed;
    await until(() => heard.some((n) => n.payload === "committed-run"), "the committed run");
    sql.notify("keel_runs", "marker");
    await until(() => heard.some((n) => n.payload === "marker"), "the marker");
    expect(heard.filter((n) => n.payload === "rolled-back-run")).toEqual([]);
  });

  it("sends notifications in a transaction that does not wait for its WAL flush", async () => {
    // A notifying transaction gets a transaction id and a commit record; what it announces has committed already.
    const notify = registeredStatements().find((s) => s.name === "keel_ledger_notify")!;
    await listener.query("SET synchronous_commit = on");
    await listener.query("BEGIN");
    try {
      await listener.query({ text: notify.text, values: notify.bind({ channels: ["keel_runs"], payloads: ["flush-check"] } as never) });
      const { rows } = await listener.query<{ synchronous_commit: string }>("SHOW synchronous_commit");
      expect(rows[0]?.synchronous_commit).toBe("off");
    } finally {
      await listener.query("COMMIT");
    }
    const { rows } = await listener.query<{ synchronous_commit: string }>("SHOW synchronous_commit");
    expect(rows[0]?.synchronous_commit).toBe("on");
    await listener.query("RESET synchronous_commit");
    await until(() => heard.some((n) => n.payload === "flush-check"), "the notice");
  });

  it("spaces a spaced channel's sends and carries what waited in the next one", async () => {
    sql.notify("keel_run_events", "run-a");
    await until(() => heard.some((n) => n.payload === "run-a"), "run-a");
    // Within the spacing of run-a's send: these wait for the next send, together, once each.
    sql.notify("keel_run_events", "run-b");
    sql.notify("keel_run_events", "run-c");
    sql.notify("keel_run_events", "run-b");
    // Another channel is not held back by the spacing.
    sql.notify("keel_runs", "unspaced");
    await until(() => heard.some((n) => n.payload === "unspaced"), "the unspaced wake-up");
    await until(() => heard.some((n) => n.payload === "run-c"), "run-c");
    const at = (payload: string) => heard.filter((n) => n.payload === payload).map((n) => n.at);
    expect(at("run-b")).toHaveLength(1);
    expect(at("run-c")).toHaveLength(1);
    expect(at("unspaced")[0]!).toBeLessThan(at("run-b")[0]!);
    expect(at("run-b")[0]! - at("run-a")[0]!).toBeGreaterThanOrEqual(NOTIFY_SPACING_MS.keel_run_events! - 5);
  });
});
