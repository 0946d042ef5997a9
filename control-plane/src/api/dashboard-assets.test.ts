import { mkdtemp, mkdir, writeFile } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { DASHBOARD_CSP, dashboardAssets } from "./dashboard-assets.js";

let server: http.Server | undefined;

afterEach(async () => {
  await new Promise<void>((resolve) => (server === undefined ? resolve() : server.close(() => resolve())));
  server = undefined;
});

/** A loopback server answering with the dashboard handler, 418 for paths it declines. */
async function serve(distDir: string): Promise<string> {
  const handle = dashboardAssets(distDir);
  server = http.createServer((request, response) => {
    if (handle(request, response)) return;
    response.writeHead(418);
    response.end();
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

/** Sends the request target exactly as given (fetch would normalise dots away). */
function request(base: string, target: string, method = "GET"): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: hostname, port, path: target, method }, (response) => {
      let body = "";
      response.on("data", (chunk: Buffer) => (body += chunk.toString("utf8")));
      response.on("end", () => resolve({ status: response.statusCode ?? 0, headers: response.headers, body }));
    });
    req.once("error", reject);
    req.end();
  });
}

describe("dashboard assets", () => {
  it("says how to build the dashboard when dist is missing, and leaves other paths alone", async () => {
    const base = await serve(path.join(await mkdtemp(path.join(tmpdir(), "keel-dash-")), "dist"));
    const page = await request(base, "/");
    expect(page.status).toBe(503);
    expect(page.body).toContain("npm run build:dashboard");
    expect(page.headers["content-security-policy"]).toBe(DASHBOARD_CSP);
    expect((await request(base, "/assets/index-abc.js")).status).toBe(404);
    expect((await request(base, "/healthz")).status).toBe(418);
    expect((await request(base, "/keel.v1.RunService/GetRun")).status).toBe(418);
  });

  it("serves the page and hashed assets with their types and caching, GET and HEAD only, nothing else", async () => {
    const dist = path.join(await mkdtemp(path.join(tmpdir(), "keel-dash-")), "dist");
    await mkdir(path.join(dist, "assets"), { recursive: true });
    await writeFile(path.join(dist, "index.html"), "<!doctype html><p>hi</p>");
    await writeFile(path.join(dist, "assets", "index-abc.js"), "console.log(1)");
    await writeFile(path.join(dist, "assets", "index-abc.css"), "p{}");
    await writeFile(path.join(dist, "assets", "secret.key"), "nope");
    await writeFile(path.join(path.dirname(dist), "outside.js"), "nope");
    const base = await serve(dist);

    const page = await request(base, "/?x=1");
    expect(page).toMatchObject({ status: 200, body: "<!doctype html><p>hi</p>" });
    expect(page.headers).toMatchObject({ "content-type": "text/html; charset=utf-8", "cache-control": "no-cache", "x-content-type-options": "nosniff" });
    const script = await request(base, "/assets/index-abc.js");
    expect(script).toMatchObject({ status: 200, body: "console.log(1)" });
    expect(script.headers).toMatchObject({ "content-type": "text/javascript; charset=utf-8", "cache-control": "public, max-age=31536000, immutable" });
    expect((await request(base, "/assets/index-abc.css")).headers["content-type"]).toBe("text/css; charset=utf-8");
    const head = await request(base, "/assets/index-abc.js", "HEAD");
    expect(head).toMatchObject({ status: 200, body: "" });
    expect(head.headers["content-length"]).toBe("14");
    expect((await request(base, "/", "POST")).status).toBe(405);

    for (const target of ["/assets/secret.key", "/assets/../outside.js", "/assets/..%2foutside.js", "/assets/%2e%2e/outside.js", "/assets/.hidden", "/assets/a/b.js"]) {
      expect((await request(base, target)).status, target).toBe(404);
    }
    expect((await request(base, "/outside.js")).status).toBe(418);
  });
});
