import { describe, expect, it } from "vitest";
import { byteLength, externalIdProblem, REQUIRED, slugProblem, uuidProblem } from "./ids.js";

describe("id shapes", () => {
  it("accepts UUIDs in either case and names what is wrong otherwise", () => {
    expect(uuidProblem("0f8fad5b-d9cb-469f-a165-70867728950e")).toBeUndefined();
    expect(uuidProblem("0F8FAD5B-D9CB-469F-A165-70867728950E")).toBeUndefined();
    expect(uuidProblem("")).toBe(REQUIRED);
    expect(uuidProblem("not-a-uuid")).toBe("must be a UUID");
  });

  it("accepts slugs of 1-64 lower-case characters starting with a letter or digit", () => {
    expect(slugProblem("host-1.a_b")).toBeUndefined();
    expect(slugProblem("a".repeat(64))).toBeUndefined();
    expect(slugProblem("a".repeat(65))).toMatch(/^must be 1-64 characters/);
    expect(slugProblem("-host")).toMatch(/^must be 1-64 characters/);
    expect(slugProblem("Host")).toMatch(/^must be 1-64 characters/);
    expect(slugProblem("")).toBe(REQUIRED);
  });

  it("accepts external ids of printable ASCII without spaces, up to 256 characters", () => {
    expect(externalIdProblem("1712345678.000100")).toBeUndefined();
    expect(externalIdProblem("x".repeat(256))).toBeUndefined();
    expect(externalIdProblem("x".repeat(257))).toMatch(/^must be 1-256/);
    expect(externalIdProblem("a b")).toMatch(/^must be 1-256/);
    expect(externalIdProblem("")).toBe(REQUIRED);
  });

  it("counts UTF-8 bytes as Buffer does", () => {
    for (const text of ["", "ascii", "é", "€", "😀", "a😀é€z"]) expect(byteLength(text)).toBe(Buffer.byteLength(text, "utf8"));
  });
});
