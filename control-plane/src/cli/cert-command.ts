// `keel cert dev`: a development CA and the certificates signed by it, for TLS and mTLS on one
// machine. Keys come from node:crypto; signing needs the openssl binary (Node cannot issue
// X.509 certificates). Every file is 0600. Not for production: the CA key sits beside the rest.
import { execFile } from "node:child_process";
import { generateKeyPairSync, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { chmod, mkdir, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);
const DAYS = "825";

export interface DevCertificates {
  readonly dir: string;
  /** The CA certificate: the agent's and CLI's --ca / KEEL_CA, and the server's --tls-client-ca. */
  readonly ca: string;
  readonly serverCert: string;
  readonly serverKey: string;
  /** A client certificate for sandbox hosts (extendedKeyUsage clientAuth). */
  readonly clientCert: string;
  readonly clientKey: string;
}

function newKey(): string {
  return generateKeyPairSync("ec", { namedCurve: "prime256v1" }).privateKey.export({ type: "pkcs8", format: "pem" }).toString();
}

async function openssl(args: readonly string[]): Promise<void> {
  try {
    await run("openssl", [...args]);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT") throw new Error("keel cert dev needs the openssl command; install it, or use the openssl lines in README.md (TLS)");
    const stderr = (error as { stderr?: string }).stderr ?? "";
    throw new Error(`openssl ${args[0] ?? ""} failed: ${stderr.trim() || String(error)}`);
  }
}

/**
 * Writes ca.crt (and ca.key), server.crt/server.key (for localhost, 127.0.0.1, ::1 and `hosts`)
 * and client.crt/client.key into `dir`.
 */
export async function writeDevCertificates(dir: string, hosts: readonly string[] = []): Promise<DevCertificates> {
  const names = ["DNS:localhost", "IP:127.0.0.1", "IP:::1", ...hosts.map(subjectAltName)];
  const files: DevCertificates = {
    dir,
    ca: path.join(dir, "ca.crt"),
    serverCert: path.join(dir, "server.crt"),
    serverKey: path.join(dir, "server.key"),
    clientCert: path.join(dir, "client.crt"),
    clientKey: path.join(dir, "client.key"),
  };
  if (existsSync(files.ca)) throw new Error(`${files.ca} already exists; remove ${dir} to make new certificates`);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const caKey = path.join(dir, "ca.key");
  for (const key of [caKey, files.serverKey, files.clientKey]) await writeFile(key, newKey(), { mode: 0o600 });

  await openssl(["req", "-x509", "-new", "-key", caKey, "-sha256", "-days", DAYS, "-subj", "/CN=Keel development CA",
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", files.ca]);
  const leaf = async (name: string, key: string, cert: string, subject: string, extensions: string) => {
    const csr = path.join(dir, `${name}.csr`);
    const ext = path.join(dir, `${name}.ext`);
    await writeFile(ext, extensions, { mode: 0o600 });
    try {
      await openssl(["req", "-new", "-key", key, "-subj", subject, "-out", csr]);
      await openssl(["x509", "-req", "-in", csr, "-CA", files.ca, "-CAkey", caKey, "-set_serial", `0x${randomBytes(12).toString("hex")}`,
        "-days", DAYS, "-sha256", "-extfile", ext, "-out", cert]);
    } finally {
      await rm(csr, { force: true });
      await rm(ext, { force: true });
    }
  };
  await leaf("server", files.serverKey, files.serverCert, "/CN=localhost",
    `basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=${names.join(",")}\n`);
  await leaf("client", files.clientKey, files.clientCert, "/CN=keel-sandbox-host",
    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n");
  for (const file of [files.ca, files.serverCert, files.clientCert]) await chmod(file, 0o600);
  return files;
}

/** A --host value as a subjectAltName entry: an IP address or a DNS name. */
function subjectAltName(host: string): string {
  if (/^[0-9.]+$/.test(host) || host.includes(":")) return `IP:${host}`;
  if (!/^[A-Za-z0-9*]([A-Za-z0-9.-]{0,252})$/.test(host)) throw new Error(`--host ${JSON.stringify(host)} is not a host name or IP address`);
  return `DNS:${host}`;
}

export async function certDevCommand(outDir: string, hosts: readonly string[], out: (line: string) => void): Promise<number> {
  const files = await writeDevCertificates(path.resolve(outDir), hosts);
  out(`wrote a development CA and certificates to ${files.dir} (files 0600; the CA key is ca.key)`);
  out("");
  out(`  keel serve --tls-cert ${files.serverCert} --tls-key ${files.serverKey} [--tls-client-ca ${files.ca}]`);
  out(`  keel sandbox-agent --control-plane https://localhost:7070 --ca ${files.ca} [--tls-cert ${files.clientCert} --tls-key ${files.clientKey}] ...`);
  out(`  KEEL_URL=https://localhost:7070 KEEL_CA=${files.ca} keel runs`);
  return 0;
}
