// Which addresses never leave the machine. Both programs refuse plaintext anywhere else unless
// told --insecure, so this is the one definition of "loopback" they share. Pure.

const IPV4 = /^\d{1,3}(\.\d{1,3}){3}$/;

/** A host name or address (IPv6 with or without brackets) that only this machine can reach. */
export function isLoopbackHost(host: string): boolean {
  const bare = host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host;
  const lower = bare.toLowerCase();
  if (lower === "localhost" || lower.endsWith(".localhost")) return true;
  if (IPV4.test(lower)) return lower.startsWith("127.");
  return lower === "::1" || lower === "0:0:0:0:0:0:0:1" || /^::ffff:127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(lower);
}

/**
 * Why a control-plane URL may not be dialled as given, or undefined when it may: plaintext
 * (http://) is refused off loopback unless the caller accepted it with `insecure`.
 */
export function plaintextUrlProblem(url: string, insecure: boolean): string | undefined {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return `${JSON.stringify(url)} is not a URL`;
  }
  if (parsed.protocol === "https:") return undefined;
  if (parsed.protocol !== "http:") return `${JSON.stringify(url)} must be an https:// (or, on loopback, http://) URL`;
  if (insecure || isLoopbackHost(parsed.hostname)) return undefined;
  return `refusing plaintext http:// to ${parsed.hostname}, which is not loopback: use https:// (with --ca if the server's certificate is not from a system CA), or pass --insecure to send tokens unencrypted`;
}
