import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { PermissionDeniedError, UnauthenticatedError } from "../domain/errors.js";
import type { TokenRole } from "../ledger/api-token.repository.js";

/** Which roles may call each service. Admins may call everything. */
const SERVICE_ROLES: Readonly<Record<string, readonly TokenRole[]>> = {
  "keel.v1.IngressService": ["connector"],
  "keel.v1.EmissionService": ["connector"],
  "keel.v1.RunService": ["operator"],
  "keel.v1.AgentService": ["admin"],
  "keel.v1.SandboxService": ["sandbox-host"],
};

/** Reflection only describes the public contract, so `buf curl` may list it without a token. */
const PUBLIC_SERVICES = new Set(["grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"]);

export interface TokenVerifier {
  roleOf(secret: string): Promise<TokenRole | undefined>;
}

export const AUTH_ROLE_CONTEXT = Symbol("keel.auth.role");

export function rolesFor(serviceTypeName: string): readonly TokenRole[] | undefined {
  return SERVICE_ROLES[serviceTypeName];
}

export function authInterceptor(verifier: TokenVerifier): Interceptor {
  return (next) => async (request) => {
    const service = request.method.parent.typeName;
    if (PUBLIC_SERVICES.has(service)) return next(request);
    const header = request.header.get("authorization") ?? "";
    const match = /^Bearer\s+(\S+)$/i.exec(header);
    if (match?.[1] === undefined) throw new UnauthenticatedError("missing bearer token (authorization: Bearer <token>)");
    const role = await verifier.roleOf(match[1]);
    if (role === undefined) throw new UnauthenticatedError("unknown or revoked token");
    const allowed = SERVICE_ROLES[service] ?? [];
    if (role !== "admin" && !allowed.includes(role)) {
      throw new PermissionDeniedError(`role ${role} may not call ${service}; it needs ${[...allowed, "admin"].join(" or ")}`);
    }
    return next(request);
  };
}

/**
 * Unary calls get the server default deadline as well as any the client set (whichever is first);
 * streams are bounded by their own heartbeats. One controller and one timer per call.
 */
export function defaultDeadlineInterceptor(defaultTimeoutMs: number): Interceptor {
  return (next) => async (request) => {
    if (request.stream || request.method.methodKind !== "unary") return next(request);
    const deadline = new AbortController();
    const cancelled = () => deadline.abort(request.signal.reason);
    if (request.signal.aborted) cancelled();
    else request.signal.addEventListener("abort", cancelled, { once: true });
    let timer: NodeJS.Timeout | undefined;
    const expired = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        const error = new ConnectError(`deadline of ${defaultTimeoutMs} ms exceeded`, Code.DeadlineExceeded);
        deadline.abort(error);
        reject(error);
      }, defaultTimeoutMs);
    });
    try {
      return await Promise.race([next({ ...request, signal: deadline.signal }), expired]);
    } finally {
      clearTimeout(timer);
      request.signal.removeEventListener("abort", cancelled);
    }
  };
}
