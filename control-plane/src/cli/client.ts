import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import type { DescService } from "@bufbuild/protobuf";

export const DEV_TOKEN_FILE = "dev-token";

export interface ClientOptions {
  readonly url: string;
  readonly token: string;
  /** PEM of the CA that signed the server's certificate (https:// only); default: the system CAs. */
  readonly ca?: string;
}

/** KEEL_CA: the CA file for an https:// server whose certificate is not from a system CA. */
export function clientTls(env: Readonly<Record<string, string | undefined>>): { ca?: string } {
  const file = env["KEEL_CA"];
  return file === undefined || file === "" ? {} : { ca: readFileSync(file, "utf8") };
}

/** --url, KEEL_URL, or the default local server. */
export function resolveUrl(flag: string | undefined, env: Readonly<Record<string, string | undefined>>): string {
  return flag ?? env["KEEL_URL"] ?? "http://127.0.0.1:7070";
}

/** --token, KEEL_TOKEN, or the token `keel serve --dev` left in the data folder. */
export function resolveToken(flag: string | undefined, env: Readonly<Record<string, string | undefined>>): string {
  const explicit = flag ?? env["KEEL_TOKEN"];
  if (explicit !== undefined && explicit !== "") return explicit;
  const file = path.resolve(env["KEEL_DATA_DIR"] ?? ".keel", DEV_TOKEN_FILE);
  if (existsSync(file)) return readFileSync(file, "utf8").trim();
  throw new Error(`no token: pass --token, set KEEL_TOKEN, or start the server with \`keel serve --dev\` (which writes ${file})`);
}

export function connect<T extends DescService>(service: T, options: ClientOptions): Client<T> {
  const bearer: Interceptor = (next) => (request) => {
    request.header.set("authorization", `Bearer ${options.token}`);
    return next(request);
  };
  return createClient(
    service,
    createGrpcTransport({ baseUrl: options.url, interceptors: [bearer], ...(options.ca === undefined ? {} : { nodeOptions: { ca: options.ca } }) }),
  );
}
