// The TLS flags of `keel serve` and `keel sandbox-agent`, and what they become: settings for
// the server's config, file paths for the agent's dialer.

export const SERVE_TLS_FLAGS = {
  "tls-cert": { type: "string" },
  "tls-key": { type: "string" },
  "tls-client-ca": { type: "string" },
  insecure: { type: "boolean" },
} as const;

/** Flags win over the environment; loadConfig validates the result (pairs, loopback rule). */
export function serveTlsSettings(values: {
  "tls-cert"?: string | undefined;
  "tls-key"?: string | undefined;
  "tls-client-ca"?: string | undefined;
  insecure?: boolean | undefined;
}): Record<string, string> {
  return {
    ...(values["tls-cert"] === undefined ? {} : { KEEL_TLS_CERT: values["tls-cert"] }),
    ...(values["tls-key"] === undefined ? {} : { KEEL_TLS_KEY: values["tls-key"] }),
    ...(values["tls-client-ca"] === undefined ? {} : { KEEL_TLS_CLIENT_CA: values["tls-client-ca"] }),
    ...(values.insecure === true ? { KEEL_INSECURE: "1" } : {}),
  };
}

export const AGENT_TLS_FLAGS = {
  ca: { type: "string" },
  "tls-cert": { type: "string" },
  "tls-key": { type: "string" },
  insecure: { type: "boolean", default: false },
} as const;

export interface AgentTlsFiles {
  /** The CA that signed the control plane's certificate; undefined: the system CAs. */
  readonly caFile: string | undefined;
  /** A client certificate and key for a control plane that requires mTLS of sandbox hosts. */
  readonly certFile: string | undefined;
  readonly keyFile: string | undefined;
  /** Accept a plaintext http:// control plane that is not on loopback. */
  readonly insecure: boolean;
}

export function agentTlsOptions(
  values: { ca?: string | undefined; "tls-cert"?: string | undefined; "tls-key"?: string | undefined; insecure?: boolean | undefined },
  env: Readonly<Record<string, string | undefined>>,
): AgentTlsFiles {
  const nonEmpty = (value: string | undefined) => (value === undefined || value === "" ? undefined : value);
  return {
    caFile: nonEmpty(values.ca ?? env["KEEL_CA"]),
    certFile: nonEmpty(values["tls-cert"] ?? env["KEEL_SANDBOX_TLS_CERT"]),
    keyFile: nonEmpty(values["tls-key"] ?? env["KEEL_SANDBOX_TLS_KEY"]),
    insecure: values.insecure === true,
  };
}
