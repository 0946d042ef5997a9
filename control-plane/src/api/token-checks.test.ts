import { describe, expect, it } from "vitest";
import type { TokenRole } from "../ledger/api-token.repository.js";
import { createTokenChecks, MAX_UNPROVEN_CHECKS, UNTAGGED_LOOKUPS_PER_SECOND } from "./token-checks.js";

/** A verifier whose lookups of unknown secrets hang until released, as a slow database would. */
function slowVerifier(valid: Map<string, TokenRole>) {
  let inFlight = 0;
  let peak = 0;
  const waiting: (() => void)[] = [];
  return {
    verifier: {
      async roleOf(secret: string): Promise<TokenRole | undefined> {
        const role = valid.get(secret);
        if (role !== undefined) return role;
        inFlight++;
        peak = Math.max(peak, inFlight);
        await new Promise<void>((resolve) => waiting.push(resolve));
        inFlight--;
        return undefined;
      },
      principalOf: () => Promise.resolve(undefined),
    },
    peak: () => peak,
    release: () => waiting.splice(0).forEach((resolve) => resolve()),
  };
}

describe("token checks", () => {
  it("runs at most a few lookups of unproven secrets at once and tells the rest to retry", async () => {
    const fake = slowVerifier(new Map());
    const checks = createTokenChecks(fake.verifier);
    const pending = Array.from({ length: 20 }, (_, i) => checks.check(`random-${i}`));
    await new Promise((resolve) => setTimeout(resolve, 10));
    fake.release();
    const results = await Promise.all(pending);
    expect(fake.peak()).toBe(MAX_UNPROVEN_CHECKS);
    expect(results.filter((r) => r.kind === "busy")).toHaveLength(20 - MAX_UNPROVEN_CHECKS);
    expect(results.filter((r) => r.kind === "unknown")).toHaveLength(MAX_UNPROVEN_CHECKS);
  });

  it("gives a new client's first calls, arriving together with one secret, one lookup and one slot", async () => {
    let lookups = 0;
    let answer = (): void => {};
    const answered = new Promise<void>((resolve) => (answer = resolve));
    const checks = createTokenChecks({
      async roleOf() {
        lookups++;
        await answered;
        return "connector";
      },
      principalOf: () => Promise.resolve(undefined),
    });
    const burst = Array.from({ length: 200 }, () => checks.check("fresh"));
    await new Promise((resolve) => setTimeout(resolve, 10));
    answer();
    const results = await Promise.all(burst);
    expect(lookups).toBe(1);
    expect(results.every((r) => r.kind === "valid")).toBe(true);
  });

  it("lets a secret that passed before through while the bound is saturated, and drops it once revoked", async () => {
    const valid = new Map<string, TokenRole>([["good", "connector"]]);
    const fake = slowVerifier(valid);
    const checks = createTokenChecks(fake.verifier);
    expect(await checks.check("good")).toEqual({ kind: "valid", role: "connector" });
    const flood = Array.from({ length: MAX_UNPROVEN_CHECKS }, (_, i) => checks.check(`random-${i}`));
    await new Promise((resolve) => setTimeout(resolve, 10));
    expect(await checks.check("another-unknown")).toEqual({ kind: "busy" });
    expect(await checks.check("good")).toEqual({ kind: "valid", role: "connector" });
    valid.delete("good"); // revoked: the next check asks the verifier and fails
    const revoked = checks.check("good");
    fake.release();
    await Promise.all(flood);
    await new Promise((resolve) => setTimeout(resolve, 10));
    fake.release();
    expect(await revoked).toEqual({ kind: "unknown" });
  });

  it("rations lookups of made-up secrets in the untagged shape per second, not those of tagged ones", async () => {
    let clock = 0;
    let lookups = 0;
    const checks = createTokenChecks(
      {
        roleOf() {
          lookups++;
          return Promise.resolve(undefined);
        },
        principalOf: () => Promise.resolve(undefined),
      },
      MAX_UNPROVEN_CHECKS,
      () => clock,
    );
    const untagged = (i: number) => `keel_connector_${String(i).padStart(32, "A")}`;
    const tagged = (i: number) => `keel_connector_${String(i).padStart(43, "A")}`;
    const first = [];
    for (let i = 0; i < 3 * UNTAGGED_LOOKUPS_PER_SECOND; i++) first.push(await checks.check(untagged(i)));
    expect(first.filter((r) => r.kind === "unknown")).toHaveLength(UNTAGGED_LOOKUPS_PER_SECOND);
    expect(first.filter((r) => r.kind === "busy")).toHaveLength(2 * UNTAGGED_LOOKUPS_PER_SECOND);
    expect(lookups).toBe(UNTAGGED_LOOKUPS_PER_SECOND);
    // Tagged secrets are the verifier's to refuse by their tag, at no query's cost: not rationed here.
    for (let i = 0; i < 3 * UNTAGGED_LOOKUPS_PER_SECOND; i++) expect(await checks.check(tagged(i))).toEqual({ kind: "unknown" });
    // Half a second refills half the allowance.
    clock += 500;
    const later = [];
    for (let i = 0; i < UNTAGGED_LOOKUPS_PER_SECOND; i++) later.push(await checks.check(untagged(1000 + i)));
    expect(later.filter((r) => r.kind === "unknown")).toHaveLength(UNTAGGED_LOOKUPS_PER_SECOND / 2);
  });

  it("screens at once, consuming nothing: a forged tag is unknown, an untagged unproven secret busy while lookups are spent", async () => {
    let clock = 0;
    const checks = createTokenChecks(
      {
        roleOf: (secret) => Promise.resolve(secret.endsWith("good") ? "connector" : undefined),
        principalOf: () => Promise.resolve(undefined),
        forged: (secret) => secret.endsWith("forged"),
      },
      MAX_UNPROVEN_CHECKS,
      () => clock,
    );
    const untagged = (suffix: string) => `keel_connector_${suffix.padStart(32, "A")}`;
    expect(checks.screen(`keel_connector_${"forged".padStart(43, "A")}`)).toBe("unknown");
    expect(checks.screen(`keel_connector_${"fine".padStart(43, "A")}`)).toBeUndefined();
    expect(checks.screen(untagged("good"))).toBeUndefined();
    expect(await checks.check(untagged("good"))).toEqual({ kind: "valid", role: "connector" });
    // Screening took nothing: the whole allowance is still there for the checks.
    for (let i = 0; i < 5; i++) expect(checks.screen(untagged(`x${i}`))).toBeUndefined();
    for (let i = 1; i < UNTAGGED_LOOKUPS_PER_SECOND; i++) expect(await checks.check(untagged(`y${i}`))).toEqual({ kind: "unknown" });
    expect(checks.screen(untagged("z"))).toBe("busy");
    // A secret that passed before is never held back.
    expect(checks.screen(untagged("good"))).toBeUndefined();
    clock += 1000;
    expect(checks.screen(untagged("z"))).toBeUndefined();
  });
});
