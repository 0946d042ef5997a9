import { describe, expect, it } from "vitest";
import { fragment, raw, registeredStatements, sql, statement } from "./sql-text.js";

describe("sql``", () => {
  it("numbers each value in order and keeps ? and '?' as text", () => {
    const q = sql`SELECT id FROM runs WHERE meta ? 'key' AND note = '?' AND id = ${"r1"} AND n > ${3}`;
    expect(q.text).toBe(`SELECT id FROM runs WHERE meta ? 'key' AND note = '?' AND id = $1 AND n > $2`);
    expect(q.values).toEqual(["r1", 3]);
  });

  it("splices nested fragments and renumbers their values after the outer ones", () => {
    const where = sql`status = ${"queued"} AND agent_id = ${"a1"}`;
    const q = sql`SELECT ${raw("id, status")} FROM runs WHERE id > ${"r0"} AND ${where} LIMIT ${10}`;
    expect(q.text).toBe("SELECT id, status FROM runs WHERE id > $1 AND status = $2 AND agent_id = $3 LIMIT $4");
    expect(q.values).toEqual(["r0", "queued", "a1", 10]);
  });

  it("takes a literal $1 inside a nested fragment's text as text", () => {
    const inner = sql`note = '$1' AND id = ${"x"}`;
    const q = sql`SELECT 1 WHERE n = ${5} AND ${inner}`;
    expect(q.text).toBe("SELECT 1 WHERE n = $1 AND note = '$1' AND id = $2");
    expect(q.values).toEqual([5, "x"]);
  });
});

describe("statement()", () => {
  const byId = (p: { id: string }) => p.id;
  const select = statement<{ id: string; limit: number }, { id: string }>("sql_text_test_select")`
    SELECT id FROM runs WHERE id = ${byId} OR parent_run_id = ${byId} ${raw("ORDER BY id")} LIMIT ${(p) => p.limit}`;

  it("gives one $n per reader function and binds from the params object", () => {
    expect(select.text).toBe(`
    SELECT id FROM runs WHERE id = $1 OR parent_run_id = $1 ORDER BY id LIMIT $2`);
    expect(select.bind({ id: "r1", limit: 5 })).toEqual(["r1", 5]);
    expect(select.name).toBe("keel_sql_text_test_select");
  });

  it("registers every statement and refuses a second text under the same name", () => {
    expect(registeredStatements()).toContain(select);
    expect(() => statement("sql_text_test_select")`SELECT 2`).toThrow(/two statements are named sql_text_test_select/);
  });

  it("refuses an undefined parameter, naming its position", () => {
    expect(() => select.bind({ id: "r1", limit: undefined as unknown as number })).toThrow(/parameter \$2 is undefined/);
  });
});

describe("fragment()", () => {
  it("numbers a fragment's slots where the statement uses it, sharing reader functions", () => {
    const now = (p: { now: Date; id: string }) => p.now;
    const due = fragment<{ now: Date; id: string }>`not_before <= ${now}`;
    const s = statement<{ now: Date; id: string }>("sql_text_test_fragment")`
      SELECT id FROM runs WHERE id = ${(p) => p.id} AND ${due} AND created_at < ${now}`;
    expect(s.text).toBe(`
      SELECT id FROM runs WHERE id = $1 AND not_before <= $2 AND created_at < $2`);
    const at = new Date(0);
    expect(s.bind({ now: at, id: "r" })).toEqual(["r", at]);
  });
});
