// The operator dashboard's static files (built by `npm run build:dashboard` into dashboard/dist),
// served at `/` on both listeners. Only two shapes of path are served: the page itself and a flat
// file name under /assets/, so no request can name anything outside the build folder. The page
// carries no secret (sign-in happens in the browser), so it needs no token; its data comes
// through the RPCs, which do.
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** What is used of Node's HTTP/1.1 and HTTP/2 request and response objects, which both satisfy it. */
interface Request {
  readonly url?: string | undefined;
  readonly method?: string | undefined;
}
interface Response {
  writeHead(status: number, headers: Record<string, string>): unknown;
  end(): unknown;
  end(body: string | Uint8Array): unknown;
}

export const DEFAULT_DASHBOARD_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "dashboard", "dist");

/** Same-origin code, styles and RPCs only: no inline script, no framing, no third party. */
export const DASHBOARD_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "font-src 'self'",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join("; ");

const CONTENT_TYPES: Readonly<Record<string, string>> = {
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
  ".woff2": "font/woff2",
  ".json": "application/json",
  ".txt": "text/plain; charset=utf-8",
};

/** A flat file name as Vite writes them (name-hash.ext); no separators, no leading dot. */
const ASSET_NAME = /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$/;

const COMMON_HEADERS = {
  "content-security-policy": DASHBOARD_CSP,
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "x-frame-options": "DENY",
  "cross-origin-opener-policy": "same-origin",
};

const MISSING_PAGE = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Keel</title></head>
<body><h1>The Keel dashboard is not built</h1>
<p>Build it from the repository with <code>npm run build:dashboard</code> (or start with <code>npm start</code>, which builds it when needed), then reload.</p>
<p>The RPC API on this port works without it.</p></body></html>
`;

/**
 * Returns a handler that answers dashboard paths and returns true, or returns false for any
 * other path (health, metrics, not found) so the caller can go on.
 */
export function dashboardAssets(distDir: string = DEFAULT_DASHBOARD_DIR): (request: Request, response: Response) => boolean {
  return (request, response) => {
    const url = request.url ?? "/";
    const bare = url.split("?")[0] ?? "/";
    let file: string;
    let immutable: boolean;
    if (bare === "/" || bare === "/index.html") {
      file = path.join(distDir, "index.html");
      immutable = false;
    } else if (bare.startsWith("/assets/")) {
      const name = bare.slice("/assets/".length);
      if (!ASSET_NAME.test(name) || name.includes("..")) {
        notFound(response);
        return true;
      }
      file = path.join(distDir, "assets", name);
      immutable = true;
    } else {
      return false;
    }
    if (request.method !== "GET" && request.method !== "HEAD") {
      response.writeHead(405, { allow: "GET, HEAD", "content-type": "text/plain; charset=utf-8" });
      response.end("method not allowed\n");
      return true;
    }
    const head = request.method === "HEAD";
    readFile(file).then(
      (body) => {
        const type = immutable ? CONTENT_TYPES[path.extname(file)] : "text/html; charset=utf-8";
        if (type === undefined) {
          notFound(response);
          return;
        }
        response.writeHead(200, {
          ...COMMON_HEADERS,
          "content-type": type,
          "content-length": String(body.length),
          // Asset names carry a content hash, so they never change; the page must be revalidated.
          "cache-control": immutable ? "public, max-age=31536000, immutable" : "no-cache",
        });
        if (head) response.end();
        else response.end(body);
      },
      () => {
        if (immutable) {
          notFound(response);
          return;
        }
        response.writeHead(503, { ...COMMON_HEADERS, "content-type": "text/html; charset=utf-8", "cache-control": "no-store" });
        if (head) response.end();
        else response.end(MISSING_PAGE);
      },
    );
    return true;
  };
}

function notFound(response: Response): void {
  response.writeHead(404, { "content-type": "text/plain; charset=utf-8", "x-content-type-options": "nosniff" });
  response.end("not found\n");
}
