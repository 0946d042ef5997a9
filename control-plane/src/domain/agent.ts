// The agent specification in domain terms, with the defaults that keep every run bounded.
import type { ProgressCadence } from "./progress.js";

export type ToolEffect = "read" | "write";

export interface ModelPrices {
  readonly inputMicroUsdPerMtok: number;
  readonly outputMicroUsdPerMtok: number;
}

export interface ScriptedToolCall {
  readonly toolName: string;
  readonly argumentsJson: string;
}

export interface ScriptedTurn {
  readonly replyText: string;
  readonly toolCalls: readonly ScriptedToolCall[];
  readonly delayMs: number;
  readonly inputTokens: number;
  readonly outputTokens: number;
}

export type ModelProviderName = "scripted" | "openai";

export interface ModelSpec {
  readonly provider: ModelProviderName;
  readonly model: string;
  readonly endpoint: string;
  readonly apiKeyEnv: string;
  readonly prices: ModelPrices;
  readonly scriptedTurns: readonly ScriptedTurn[];
  readonly timeoutMs: number;
}

export interface ModelRoles {
  readonly primary: ModelSpec;
  readonly fast: ModelSpec;
  readonly decision: ModelSpec;
}

export interface ToolGrant {
  readonly toolName: string;
  /** Empty means every connector may reach the tool. */
  readonly connectors: readonly string[];
  readonly readOnlyCommands: readonly string[];
}

export interface PathRule {
  readonly field: string;
  readonly prefixes: readonly string[];
}

export type Policy =
  | { readonly kind: "allow_all"; readonly networkAccess: boolean }
  | {
      readonly kind: "restriction";
      readonly allowedTools: readonly string[];
      readonly allowedEffects: readonly ToolEffect[];
      readonly pathRules: readonly PathRule[];
      readonly networkAccess: boolean;
    };

export interface RunBudget {
  readonly maxWallClockMs: number;
  readonly maxIterations: number;
  readonly maxModelCalls: number;
  readonly maxToolCalls: number;
  readonly maxInputTokens: number;
  readonly maxOutputTokens: number;
  readonly maxOutputBytes: number;
  readonly maxCostMicroUsd: number;
}

export type InterruptScope = "same_actor_only" | "thread_scoped" | "addressed_actor_only";

export interface InterruptSettings {
  readonly coalesceWindowMs: number;
  readonly scope: InterruptScope;
  readonly maxSupersessions: number;
  readonly supersessionCeilingMs: number;
}

export interface GraphCeilings {
  readonly maxNodes: number;
  readonly maxDepth: number;
  readonly maxParallelism: number;
  readonly maxRevisions: number;
  readonly maxReplans: number;
  /** A node that may write must have a human_gate before it (GraphCeilings.require_gate_before_writes). */
  readonly requireGateBeforeWrites?: boolean;
}

export interface ProfileRef {
  readonly name: string;
  readonly version: number;
}

export interface SecretGrant {
  readonly envVar: string;
  readonly sourceEnv: string;
}

export interface SandboxSettings {
  readonly image: string;
  readonly labels: readonly string[];
  readonly secrets: readonly SecretGrant[];
}

export interface AgentSpec {
  readonly id: string;
  readonly displayName: string;
  readonly systemPrompt: string;
  readonly models: ModelRoles;
  readonly tools: readonly ToolGrant[];
  readonly policy: Policy;
  readonly budget: RunBudget;
  readonly interrupt: InterruptSettings;
  readonly graph: GraphCeilings;
  readonly profile: ProfileRef;
  readonly sandbox: SandboxSettings;
  readonly maxConcurrentRootRuns: number;
  readonly revision: number;
  /** Lowers the progress cadence for this agent (tests, demos); it can never switch progress off (domain/progress.ts). */
  readonly progress?: Partial<ProgressCadence>;
}

/** Server defaults. A zero in a submitted spec means "use this", never "unbounded". */
export const DEFAULT_RUN_BUDGET: RunBudget = {
  maxWallClockMs: 15 * 60_000,
  maxIterations: 50,
  maxModelCalls: 60,
  maxToolCalls: 200,
  maxInputTokens: 2_000_000,
  maxOutputTokens: 200_000,
  maxOutputBytes: 16 * 1024 * 1024,
  maxCostMicroUsd: 5_000_000,
};

export const DEFAULT_INTERRUPT_SETTINGS: InterruptSettings = {
  coalesceWindowMs: 2_000,
  scope: "thread_scoped",
  maxSupersessions: 3,
  supersessionCeilingMs: 120_000,
};

export const DEFAULT_GRAPH_CEILINGS: GraphCeilings = {
  maxNodes: 16,
  maxDepth: 4,
  maxParallelism: 4,
  maxRevisions: 3,
  maxReplans: 2,
};

export const DEFAULT_MAX_CONCURRENT_ROOT_RUNS = 16;

export const DEFAULT_MODEL_TIMEOUT_MS = 60_000;

/** The image scripts/build-sandbox-image.sh builds locally, for agents that name none. */
export const DEFAULT_SANDBOX_IMAGE = "keel/sandbox-base:busybox";

export function withBudgetDefaults(budget: Partial<RunBudget>): RunBudget {
  const pick = (key: keyof RunBudget): number => {
    const value = budget[key];
    return value === undefined || value <= 0 ? DEFAULT_RUN_BUDGET[key] : value;
  };
  return {
    maxWallClockMs: pick("maxWallClockMs"),
    maxIterations: pick("maxIterations"),
    maxModelCalls: pick("maxModelCalls"),
    maxToolCalls: pick("maxToolCalls"),
    maxInputTokens: pick("maxInputTokens"),
    maxOutputTokens: pick("maxOutputTokens"),
    maxOutputBytes: pick("maxOutputBytes"),
    maxCostMicroUsd: pick("maxCostMicroUsd"),
  };
}

/**
 * The largest value each number of a submitted agent spec may take (zero still means "the
 * default"): within the SQL type it ends up in (an int column, a jsonb number the SQL casts)
 * and far beyond what a sane agent needs, so a typo is refused at PutAgent, not failed later.
 */
export const AGENT_SPEC_LIMITS = {
  maxConcurrentRootRuns: 10_000,
  budget: {
    maxWallClockMs: 7 * 24 * 3_600_000,
    maxIterations: 10_000,
    maxModelCalls: 10_000,
    maxToolCalls: 100_000,
    maxInputTokens: 1_000_000_000,
    maxOutputTokens: 1_000_000_000,
    maxOutputBytes: 1024 ** 4,
    maxCostMicroUsd: 1_000_000_000_000,
  } satisfies RunBudget,
  interrupt: { coalesceWindowMs: 3_600_000, maxSupersessions: 1_000, supersessionCeilingMs: 24 * 3_600_000 },
  graph: { maxNodes: 1_000, maxDepth: 100, maxParallelism: 1_000, maxRevisions: 100, maxReplans: 100 } satisfies GraphCeilings,
  profileVersion: 1_000,
  model: { timeoutMs: 3_600_000, microUsdPerMtok: 1_000_000_000 },
  scriptedTurn: { delayMs: 3_600_000, tokens: 100_000_000 },
} as const;

/** Secret variables are read only from names with an allowed prefix (never DATABASE_URL and the like). */
export const DEFAULT_SECRET_ENV_PREFIXES: readonly string[] = ["KEEL_SECRET_"];

/** Whether a secret may be read from the control plane's variable `name`. */
export function secretEnvAllowed(name: string, prefixes: readonly string[]): boolean {
  return prefixes.some((prefix) => prefix !== "" && name.startsWith(prefix) && name.length > prefix.length);
}

/** The allow-list entry that admits every model endpoint on this machine's loopback. */
export const LOOPBACK_ENDPOINTS = "loopback";

/**
 * Whether a model endpoint is on the allow-list: an entry admits URLs with its scheme, host and
 * port whose path is its path or below it; `loopback` admits any loopback http(s) URL.
 */
export function modelEndpointAllowed(endpoint: string, allowList: readonly string[], isLoopbackHost: (host: string) => boolean): boolean {
  const url = parseUrl(endpoint);
  if (url === undefined || url.username !== "" || url.password !== "") return false;
  return allowList.some((entry) => {
    if (entry === LOOPBACK_ENDPOINTS) return isLoopbackHost(url.hostname);
    const allowed = parseUrl(entry);
    if (allowed === undefined || allowed.origin !== url.origin) return false;
    const base = allowed.pathname.endsWith("/") ? allowed.pathname : `${allowed.pathname}/`;
    return url.pathname === allowed.pathname || `${url.pathname}/` === base || url.pathname.startsWith(base);
  });
}

function parseUrl(text: string): URL | undefined {
  try {
    const url = new URL(text);
    return url.protocol === "http:" || url.protocol === "https:" ? url : undefined;
  } catch {
    return undefined;
  }
}
