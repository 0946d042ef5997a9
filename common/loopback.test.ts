import { describe, expect, it } from "vitest";
import { isLoopbackHost, plaintextUrlProblem } from "./loopback.js";

describe("isLoopbackHost", () => {
  it.each(["127.0.0.1", "127.1.2.3", "localhost", "LOCALHOST", "api.localhost", "::1", "[::1]", "::ffff:127.0.0.1"])("%s is loopback", (host) => {
    expect(isLoopbackHost(host)).toBe(true);
  });
  it.each(["0.0.0.0", "::", "10.0.0.1", "192.0.2.10", "example.com", "localhost.example.com", "128.0.0.1", "[::2]"])("%s is not", (host) => {
    expect(isLoopbackHost(host)).toBe(false);
  });
});

describe("plaintextUrlProblem", () => {
  it("allows https anywhere and http on loopback", () => {
    expect(plaintextUrlProblem("https://keel.example.com:7070", false)).toBeUndefined();
    expect(plaintextUrlProblem("http://127.0.0.1:7070", false)).toBeUndefined();
    expect(plaintextUrlProblem("http://[::1]:7070", false)).toBeUndefined();
  });
  it("refuses http off loopback unless insecure, and other schemes always", () => {
    expect(plaintextUrlProblem("http://keel.example.com:7070", false)).toMatch(/refusing plaintext.*--insecure/);
    expect(plaintextUrlProblem("http://keel.example.com:7070", true)).toBeUndefined();
    expect(plaintextUrlProblem("ftp://x", true)).toMatch(/https/);
    expect(plaintextUrlProblem("not a url", false)).toMatch(/not a URL/);
  });
});
