// AgentSpec between proto and domain. Validates on the way in: every error names its field.
import { create } from "@bufbuild/protobuf";
import {
  AgentSpecSchema,
  InterruptScopeSchema,
  type AgentSpec as AgentSpecProto,
  type ModelSpec as ModelSpecProto,
} from "../../../gen/keel/v1/agent_pb.js";
import { ToolEffectSchema } from "../../../gen/keel/v1/run_pb.js";
import {
  AGENT_SPEC_LIMITS,
  DEFAULT_GRAPH_CEILINGS,
  DEFAULT_INTERRUPT_SETTINGS,
  DEFAULT_MAX_CONCURRENT_ROOT_RUNS,
  DEFAULT_MODEL_TIMEOUT_MS,
  DEFAULT_SANDBOX_IMAGE,
  modelEndpointAllowed,
  secretEnvAllowed,
  withBudgetDefaults,
  type AgentSpec,
  type InterruptScope,
  type ModelSpec,
  type Policy,
  type ToolEffect,
} from "../domain/agent.js";
import type { ProgressCadence } from "../domain/progress.js";
import { InvalidArgumentError } from "../domain/errors.js";
import { requireSlug } from "../domain/ids.js";
import { fromEnum, toEnum } from "./convert.js";

const TOOL_NAME = /^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*\.v[1-9][0-9]*$/;
const ENV_VAR = /^[A-Za-z_][A-Za-z0-9_]*$/;
const LIMITS = AGENT_SPEC_LIMITS;

/** What a submitted spec may name beyond its own numbers: where secrets and model endpoints may come from. */
export interface AgentSpecBounds {
  /** Prefixes of the control plane's variables a secret or API key may be read from. */
  readonly secretEnvPrefixes: readonly string[];
  /** Allowed model base URLs (`loopback` for any on this machine); see modelEndpointAllowed. */
  readonly modelEndpoints: readonly string[];
  /** An admin asked for an endpoint off the list explicitly. */
  readonly allowUnlistedEndpoints: boolean;
  readonly isLoopbackHost: (host: string) => boolean;
}

/** A number within [0, max] (zero keeps meaning "the default"), or InvalidArgument naming the field. */
function upTo(field: string, value: number | bigint, max: number): number {
  if (value < 0 || value > max) throw new InvalidArgumentError(field, `must be between 0 and ${max}, not ${value}`);
  return Number(value);
}

function secretEnv(field: string, name: string, bounds: AgentSpecBounds): string {
  if (!ENV_VAR.test(name)) throw new InvalidArgumentError(field, "must be an environment variable name");
  if (!secretEnvAllowed(name, bounds.secretEnvPrefixes)) {
    throw new InvalidArgumentError(field, `must start with ${bounds.secretEnvPrefixes.join(" or ")} (secrets are read only from such variables)`);
  }
  return name;
}

/** An agent that names no model gets the offline, deterministic one. */
const SCRIPTED_MODEL: ModelSpec = {
  provider: "scripted",
  model: "",
  endpoint: "",
  apiKeyEnv: "",
  prices: { inputMicroUsdPerMtok: 0, outputMicroUsdPerMtok: 0 },
  scriptedTurns: [],
  timeoutMs: DEFAULT_MODEL_TIMEOUT_MS,
};

function modelFromProto(field: string, model: ModelSpecProto | undefined, fallback: ModelSpec | undefined, bounds: AgentSpecBounds): ModelSpec {
  if (model === undefined) return fallback ?? SCRIPTED_MODEL;
  const provider = model.provider === "" ? "scripted" : model.provider;
  if (provider !== "scripted" && provider !== "openai") {
    throw new InvalidArgumentError(`${field}.provider`, `must be "scripted" or "openai", not ${JSON.stringify(provider)}`);
  }
  if (provider === "openai") {
    if (model.model === "") throw new InvalidArgumentError(`${field}.model`, "is required for provider openai");
    if (!/^https?:\/\//.test(model.endpoint)) {
      throw new InvalidArgumentError(`${field}.endpoint`, "must be an http(s) base URL for provider openai");
    }
    // The API key goes to this URL: only listed endpoints, unless an admin says otherwise explicitly.
    if (!bounds.allowUnlistedEndpoints && !modelEndpointAllowed(model.endpoint, bounds.modelEndpoints, bounds.isLoopbackHost)) {
      const listed = bounds.modelEndpoints.length === 0 ? "none are listed" : `allowed: ${bounds.modelEndpoints.join(", ")}`;
      throw new InvalidArgumentError(`${field}.endpoint`, `is not on the model endpoint allow-list (KEEL_MODEL_ENDPOINTS; ${listed})`);
    }
  }
  if (model.apiKeyEnv !== "") secretEnv(`${field}.api_key_env`, model.apiKeyEnv, bounds);
  const price = (name: string, value: bigint | undefined) => upTo(`${field}.prices.${name}`, value ?? 0n, LIMITS.model.microUsdPerMtok);
  return {
    provider,
    model: model.model,
    endpoint: model.endpoint,
    apiKeyEnv: model.apiKeyEnv,
    prices: {
      inputMicroUsdPerMtok: price("input_micro_usd_per_mtok", model.prices?.inputMicroUsdPerMtok),
      outputMicroUsdPerMtok: price("output_micro_usd_per_mtok", model.prices?.outputMicroUsdPerMtok),
    },
    scriptedTurns: model.scriptedTurns.map((turn, i) => ({
      replyText: turn.replyText,
      toolCalls: turn.toolCalls.map((call, j) => {
        if (!TOOL_NAME.test(call.toolName)) {
          throw new InvalidArgumentError(`${field}.scripted_turns[${i}].tool_calls[${j}].tool_name`, "must look like ns.name.vN");
        }
        return { toolName: call.toolName, argumentsJson: call.argumentsJson === "" ? "{}" : call.argumentsJson };
      }),
      delayMs: upTo(`${field}.scripted_turns[${i}].delay_ms`, turn.delayMs, LIMITS.scriptedTurn.delayMs),
      inputTokens: upTo(`${field}.scripted_turns[${i}].input_tokens`, turn.inputTokens, LIMITS.scriptedTurn.tokens),
      outputTokens: upTo(`${field}.scripted_turns[${i}].output_tokens`, turn.outputTokens, LIMITS.scriptedTurn.tokens),
    })),
    timeoutMs: model.timeoutMs > 0 ? upTo(`${field}.timeout_ms`, model.timeoutMs, LIMITS.model.timeoutMs) : DEFAULT_MODEL_TIMEOUT_MS,
  };
}

function policyFromProto(spec: AgentSpecProto): Policy {
  const policy = spec.policy;
  const networkAccess = policy?.networkAccess ?? false;
  if (policy?.kind.case !== "restriction") return { kind: "allow_all", networkAccess };
  const restriction = policy.kind.value;
  return {
    kind: "restriction",
    allowedTools: restriction.allowedTools,
    allowedEffects: restriction.allowedEffects.map((effect, i) => {
      const value = fromEnum<ToolEffect>(ToolEffectSchema, effect);
      if (value === undefined) throw new InvalidArgumentError(`agent.policy.restriction.allowed_effects[${i}]`, "must be READ or WRITE");
      return value;
    }),
    pathRules: restriction.pathRules.map((rule, i) => {
      if (rule.field === "") throw new InvalidArgumentError(`agent.policy.restriction.path_rules[${i}].field`, "is required");
      return { field: rule.field, prefixes: rule.prefixes };
    }),
    networkAccess,
  };
}

export function agentSpecFromProto(spec: AgentSpecProto | undefined, bounds: AgentSpecBounds): AgentSpec {
  if (spec === undefined) throw new InvalidArgumentError("agent", "is required");
  const id = requireSlug("agent.id", spec.id);
  const primary = modelFromProto("agent.models.primary", spec.models?.primary, undefined, bounds);
  const interrupt = spec.interrupt;
  const budget = (name: string, key: keyof typeof LIMITS.budget, value: number | bigint | undefined) =>
    upTo(`agent.budget.${name}`, value ?? 0, LIMITS.budget[key]);
  const graph = (name: string, key: keyof typeof LIMITS.graph, value: number | undefined) => upTo(`agent.graph.${name}`, value ?? 0, LIMITS.graph[key]);
  return {
    id,
    displayName: spec.displayName === "" ? id : spec.displayName,
    systemPrompt: spec.systemPrompt,
    models: {
      primary,
      fast: modelFromProto("agent.models.fast", spec.models?.fast, primary, bounds),
      decision: modelFromProto("agent.models.decision", spec.models?.decision, primary, bounds),
    },
    tools: spec.tools.map((grant, i) => {
      if (!TOOL_NAME.test(grant.toolName)) throw new InvalidArgumentError(`agent.tools[${i}].tool_name`, "must look like ns.name.vN");
      return { toolName: grant.toolName, connectors: grant.connectors, readOnlyCommands: grant.readOnlyCommands };
    }),
    policy: policyFromProto(spec),
    budget: withBudgetDefaults({
      maxWallClockMs: budget("max_wall_clock_ms", "maxWallClockMs", spec.budget?.maxWallClockMs),
      maxIterations: budget("max_iterations", "maxIterations", spec.budget?.maxIterations),
      maxModelCalls: budget("max_model_calls", "maxModelCalls", spec.budget?.maxModelCalls),
      maxToolCalls: budget("max_tool_calls", "maxToolCalls", spec.budget?.maxToolCalls),
      maxInputTokens: budget("max_input_tokens", "maxInputTokens", spec.budget?.maxInputTokens),
      maxOutputTokens: budget("max_output_tokens", "maxOutputTokens", spec.budget?.maxOutputTokens),
      maxOutputBytes: budget("max_output_bytes", "maxOutputBytes", spec.budget?.maxOutputBytes),
      maxCostMicroUsd: budget("max_cost_micro_usd", "maxCostMicroUsd", spec.budget?.maxCostMicroUsd),
    }),
    interrupt: {
      coalesceWindowMs: upTo("agent.interrupt.coalesce_window_ms", interrupt?.coalesceWindowMs ?? DEFAULT_INTERRUPT_SETTINGS.coalesceWindowMs, LIMITS.interrupt.coalesceWindowMs),
      scope: fromEnum<InterruptScope>(InterruptScopeSchema, interrupt?.scope ?? 0) ?? DEFAULT_INTERRUPT_SETTINGS.scope,
      maxSupersessions: upTo("agent.interrupt.max_supersessions", interrupt?.maxSupersessions ?? 0, LIMITS.interrupt.maxSupersessions) || DEFAULT_INTERRUPT_SETTINGS.maxSupersessions,
      supersessionCeilingMs:
        upTo("agent.interrupt.supersession_ceiling_ms", interrupt?.supersessionCeilingMs ?? 0, LIMITS.interrupt.supersessionCeilingMs) ||
        DEFAULT_INTERRUPT_SETTINGS.supersessionCeilingMs,
    },
    graph: {
      maxNodes: graph("max_nodes", "maxNodes", spec.graph?.maxNodes) || DEFAULT_GRAPH_CEILINGS.maxNodes,
      maxDepth: graph("max_depth", "maxDepth", spec.graph?.maxDepth) || DEFAULT_GRAPH_CEILINGS.maxDepth,
      maxParallelism: graph("max_parallelism", "maxParallelism", spec.graph?.maxParallelism) || DEFAULT_GRAPH_CEILINGS.maxParallelism,
      maxRevisions: graph("max_revisions", "maxRevisions", spec.graph?.maxRevisions) || DEFAULT_GRAPH_CEILINGS.maxRevisions,
      maxReplans: graph("max_replans", "maxReplans", spec.graph?.maxReplans) || DEFAULT_GRAPH_CEILINGS.maxReplans,
      ...(spec.graph?.requireGateBeforeWrites === true ? { requireGateBeforeWrites: true } : {}),
    },
    profile: {
      name: spec.profile?.name || "solution_delivered",
      version: upTo("agent.profile.version", spec.profile?.version ?? 0, LIMITS.profileVersion) || 1,
    },
    sandbox: {
      image: spec.sandbox?.image || DEFAULT_SANDBOX_IMAGE,
      labels: spec.sandbox?.labels ?? [],
      secrets: (spec.sandbox?.secrets ?? []).map((secret, i) => {
        if (!ENV_VAR.test(secret.envVar)) throw new InvalidArgumentError(`agent.sandbox.secrets[${i}].env_var`, "must be an environment variable name");
        return { envVar: secret.envVar, sourceEnv: secretEnv(`agent.sandbox.secrets[${i}].source_env`, secret.sourceEnv, bounds) };
      }),
    },
    maxConcurrentRootRuns: upTo("agent.max_concurrent_root_runs", spec.maxConcurrentRootRuns, LIMITS.maxConcurrentRootRuns) || DEFAULT_MAX_CONCURRENT_ROOT_RUNS,
    ...progressFromProto(spec.progress),
    revision: 0,
  };
}

/** Only the delays asked for (non-zero); domain/progress.ts ignores any that would not lower the default. */
function progressFromProto(progress: AgentSpecProto["progress"]): Pick<AgentSpec, "progress"> {
  if (progress === undefined) return {};
  const asked: { -readonly [K in keyof ProgressCadence]?: number } = {};
  if (progress.firstAfterMs > 0) asked.firstAfterMs = progress.firstAfterMs;
  if (progress.everyMs > 0) asked.everyMs = progress.everyMs;
  if (progress.minGapMs > 0) asked.minGapMs = progress.minGapMs;
  return Object.keys(asked).length === 0 ? {} : { progress: asked };
}

function modelToProto(model: ModelSpec) {
  return {
    provider: model.provider,
    model: model.model,
    endpoint: model.endpoint,
    apiKeyEnv: model.apiKeyEnv,
    prices: {
      inputMicroUsdPerMtok: BigInt(model.prices.inputMicroUsdPerMtok),
      outputMicroUsdPerMtok: BigInt(model.prices.outputMicroUsdPerMtok),
    },
    scriptedTurns: model.scriptedTurns.map((turn) => ({ ...turn, toolCalls: [...turn.toolCalls] })),
    timeoutMs: model.timeoutMs,
  };
}

export function agentSpecToProto(spec: AgentSpec): AgentSpecProto {
  const policy = spec.policy;
  return create(AgentSpecSchema, {
    id: spec.id,
    displayName: spec.displayName,
    systemPrompt: spec.systemPrompt,
    models: { primary: modelToProto(spec.models.primary), fast: modelToProto(spec.models.fast), decision: modelToProto(spec.models.decision) },
    tools: spec.tools.map((t) => ({ toolName: t.toolName, connectors: [...t.connectors], readOnlyCommands: [...t.readOnlyCommands] })),
    policy: {
      networkAccess: policy.networkAccess,
      kind:
        policy.kind === "allow_all"
          ? { case: "allowAll", value: {} }
          : {
              case: "restriction",
              value: {
                allowedTools: [...policy.allowedTools],
                allowedEffects: policy.allowedEffects.map((e) => toEnum(ToolEffectSchema, e)),
                pathRules: policy.pathRules.map((r) => ({ field: r.field, prefixes: [...r.prefixes] })),
              },
            },
    },
    budget: {
      maxWallClockMs: spec.budget.maxWallClockMs,
      maxIterations: spec.budget.maxIterations,
      maxModelCalls: spec.budget.maxModelCalls,
      maxToolCalls: spec.budget.maxToolCalls,
      maxInputTokens: BigInt(spec.budget.maxInputTokens),
      maxOutputTokens: BigInt(spec.budget.maxOutputTokens),
      maxOutputBytes: BigInt(spec.budget.maxOutputBytes),
      maxCostMicroUsd: BigInt(spec.budget.maxCostMicroUsd),
    },
    interrupt: {
      coalesceWindowMs: spec.interrupt.coalesceWindowMs,
      scope: toEnum(InterruptScopeSchema, spec.interrupt.scope),
      maxSupersessions: spec.interrupt.maxSupersessions,
      supersessionCeilingMs: spec.interrupt.supersessionCeilingMs,
    },
    graph: { ...spec.graph },
    profile: { ...spec.profile },
    sandbox: { image: spec.sandbox.image, labels: [...spec.sandbox.labels], secrets: spec.sandbox.secrets.map((s) => ({ ...s })) },
    maxConcurrentRootRuns: spec.maxConcurrentRootRuns,
    revision: BigInt(spec.revision),
    ...(spec.progress === undefined
      ? {}
      : { progress: { firstAfterMs: spec.progress.firstAfterMs ?? 0, everyMs: spec.progress.everyMs ?? 0, minGapMs: spec.progress.minGapMs ?? 0 } }),
  });
}
