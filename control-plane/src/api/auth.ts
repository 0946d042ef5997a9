import { Code, ConnectError, createContextKey, type HandlerContext, type Interceptor } from "@connectrpc/connect";
import { PermissionDeniedError, UnauthenticatedError } from "../domain/errors.js";
import type { Principal, TokenRole } from "../domain/token-scope.js";

/** Which roles may call each service. Admins may call everything. */
const SERVICE_ROLES: Readonly<Record<string, readonly TokenRole[]>> = {
  "keel.v1.IngressService": ["connector"],
  "keel.v1.EmissionService": ["connector"],
  "keel.v1.RunService": ["operator"],
  "keel.v1.AgentService": ["admin"],
  "keel.v1.SandboxService": ["sandbox-host"],
};

/** Reflection only describes the public contract (`buf curl` may list it), and health checkers hold no token. */
const PUBLIC_SERVICES = new Set(["grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection", "grpc.health.v1.Health"]);

/** Longest a timer may wait (setTimeout's limit); a later expiry is re-armed when it fires. */
const MAX_TIMER_MS = 2 ** 31 - 1;

export interface TokenVerifier {
  /** The principal of a live bearer secret, or undefined; cached, so cheap to call on every request. */
  principalOf(secret: string): Promise<Principal | undefined>;
  /** The role alone, for callers that need no more. */
  roleOf(secret: string): Promise<TokenRole | undefined>;
  /** True when the secret surely is no token (a wrong tag), decided without I/O; optional. */
  forged?(secret: string): boolean;
  /** Calls `listener` with a token id that may have been revoked ("" for any); open streams re-check then. */
  onInvalidated?(listener: (tokenId: string) => void): () => void;
}

/** The authenticated caller, set by authInterceptor for every handler behind it. */
export const PRINCIPAL = createContextKey<Principal | undefined>(undefined, { description: "keel.auth.principal" });

/** The caller's principal; a handler behind authInterceptor always has one. */
export function principalOf(context: HandlerContext): Principal {
  const principal = context.values.get(PRINCIPAL);
  if (principal === undefined) throw new UnauthenticatedError("no authenticated principal for this call");
  return principal;
}

export function rolesFor(serviceTypeName: string): readonly TokenRole[] | undefined {
  return SERVICE_ROLES[serviceTypeName];
}

/** The secret of an `authorization: Bearer <secret>` header, or undefined. */
export function bearerSecret(header: string | null): string | undefined {
  const match = /^Bearer\s+(\S+)$/i.exec(header ?? "");
  return match?.[1];
}

export function authInterceptor(verifier: TokenVerifier): Interceptor {
  return (next) => async (request) => {
    const service = request.method.parent.typeName;
    if (PUBLIC_SERVICES.has(service)) return next(request);
    const secret = bearerSecret(request.header.get("authorization"));
    if (secret === undefined) throw new UnauthenticatedError("missing bearer token (authorization: Bearer <token>)");
    const principal = await verifier.principalOf(secret);
    if (principal === undefined) throw new UnauthenticatedError("unknown, revoked or expired token");
    const allowed = SERVICE_ROLES[service] ?? [];
    if (principal.role !== "admin" && !allowed.includes(principal.role)) {
      throw new PermissionDeniedError(`role ${principal.role} may not call ${service}; it needs ${[...allowed, "admin"].join(" or ")}`);
    }
    request.contextValues.set(PRINCIPAL, principal);
    if (request.method.methodKind === "unary") return next(request);

    // A stream outlives the check above: it ends with Unauthenticated when its token is revoked or expires.
    const revoked = new AbortController();
    // The handler's signal: the call's, or the revocation. Linked by hand, as a composite from
    // AbortSignal.any() may be collected (its listeners with it) while the handler waits on it.
    const signal = new AbortController();
    const cancelled = () => signal.abort(request.signal.reason);
    if (request.signal.aborted) cancelled();
    else request.signal.addEventListener("abort", cancelled, { once: true });
    const stopWatching = watchToken(verifier, secret, principal, (why) => {
      const error = new UnauthenticatedError(why);
      signal.abort(error);
      revoked.abort(error);
    });
    try {
      const response = await next({ ...request, signal: signal.signal });
      if (!response.stream) {
        stopWatching();
        return response;
      }
      return { ...response, message: endOnRevocation(response.message, revoked.signal, stopWatching) };
    } catch (error) {
      stopWatching();
      throw error;
    }
  };
}

/** Re-checks the token when it may have been revoked, and at its expiry; `end` is called once if it is no longer live. */
function watchToken(verifier: TokenVerifier, secret: string, principal: Principal, end: (why: string) => void): () => void {
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  const stop = () => {
    stopped = true;
    clearTimeout(timer);
    unsubscribe();
  };
  const recheck = () => {
    verifier.principalOf(secret).then(
      (current) => {
        if (stopped || current !== undefined) return;
        stop();
        end(`token ${principal.tokenId} was revoked or has expired`);
      },
      () => {}, // the ledger is unreachable: the next notification or the expiry tries again
    );
  };
  const unsubscribe = verifier.onInvalidated?.((tokenId) => (tokenId === "" || tokenId === principal.tokenId) && recheck()) ?? (() => {});
  const armExpiry = () => {
    if (principal.expiresAt === undefined || stopped) return;
    const left = principal.expiresAt.getTime() - Date.now();
    if (left <= 0) {
      stop();
      end(`token ${principal.tokenId} has expired`);
      return;
    }
    timer = setTimeout(armExpiry, Math.min(left, MAX_TIMER_MS));
    timer.unref();
  };
  armExpiry();
  return stop;
}

/**
 * Passes a stream's messages on until `revoked` fires, then throws its reason. The handler sees
 * the same signal aborted and cleans up; one still waiting on its input is not waited for. A plain
 * iterator, not an async generator: it sits on every message of every stream.
 */
function endOnRevocation<T>(messages: AsyncIterable<T>, revoked: AbortSignal, done: () => void): AsyncIterable<T> {
  return {
    [Symbol.asyncIterator](): AsyncIterator<T> {
      const inner = messages[Symbol.asyncIterator]();
      // Each wait gets its own reject: racing every message against one pending promise left a
      // reaction on it per message, kept (with the message) for as long as the stream lived.
      let fail: ((reason: Error) => void) | undefined;
      const onAbort = (): void => fail?.(revoked.reason as Error);
      revoked.addEventListener("abort", onAbort, { once: true });
      let finished = false;
      /** Once: the watch stops and the inner stream is ended (not waited for after a revocation). */
      const finish = async (): Promise<void> => {
        if (finished) return;
        finished = true;
        done();
        revoked.removeEventListener("abort", onAbort);
        if (revoked.aborted) void inner.return?.(undefined)?.catch(() => {});
        else await inner.return?.(undefined);
      };
      const failed = async (error: unknown): Promise<never> => {
        fail = undefined;
        await finish();
        throw error;
      };
      return {
        next(): Promise<IteratorResult<T>> {
          if (finished) return Promise.resolve({ done: true, value: undefined });
          if (revoked.aborted) return failed(revoked.reason);
          return new Promise<IteratorResult<T>>((resolve, reject) => {
            fail = reject;
            inner.next().then(resolve, reject);
          }).then((next) => {
            fail = undefined;
            return next.done === true ? finish().then(() => next) : next;
          }, failed);
        },
        async return(): Promise<IteratorResult<T>> {
          await finish();
          return { done: true, value: undefined };
        },
      };
    },
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
