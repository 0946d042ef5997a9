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
  DEFAULT_GRAPH_CEILINGS,
  DEFAULT_INTERRUPT_SETTINGS,
  DEFAULT_MAX_CONCURRENT_ROOT_RUNS,
  DEFAULT_MODEL_TIMEOUT_MS,
  DEFAULT_SANDBOX_IMAGE,
  withBudgetDefaults,
  type AgentSpec,
  type InterruptScope,
  type ModelSpec,
  type Policy,
  type ToolEffect,
} from "../domain/agent.js";
import { InvalidArgumentError } from "../domain/errors.js";
import { requireSlug } from "../domain/ids.js";
import { fromEnum, toEnum } from "./convert.js";

const TOOL_NAME = /^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*\.v[1-9][0-9]*$/;
const ENV_VAR = /^[A-Za-z_][A-Za-z0-9_]*$/;

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

function modelFromProto(field: string, model: ModelSpecProto | undefined, fallback: ModelSpec | undefined): ModelSpec {
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
  }
  if (model.apiKeyEnv !== "" && !ENV_VAR.test(model.apiKeyEnv)) {
    throw new InvalidArgumentError(`${field}.api_key_env`, "must be an environment variable name");
  }
  return {
    provider,
    model: model.model,
    endpoint: model.endpoint,
    apiKeyEnv: model.apiKeyEnv,
    prices: {
      inputMicroUsdPerMtok: Number(model.prices?.inputMicroUsdPerMtok ?? 0n),
      outputMicroUsdPerMtok: Number(model.prices?.outputMicroUsdPerMtok ?? 0n),
    },
    scriptedTurns: model.scriptedTurns.map((turn, i) => ({
      replyText: turn.replyText,
      toolCalls: turn.toolCalls.map((call, j) => {
        if (!TOOL_NAME.test(call.toolName)) {
          throw new InvalidArgumentError(`${field}.scripted_turns[${i}].tool_calls[${j}].tool_name`, "must look like ns.name.vN");
        }
        return { toolName: call.toolName, argumentsJson: call.argumentsJson === "" ? "{}" : call.argumentsJson };
      }),
      delayMs: turn.delayMs,
      inputTokens: turn.inputTokens,
      outputTokens: turn.outputTokens,
    })),
    timeoutMs: model.timeoutMs > 0 ? model.timeoutMs : DEFAULT_MODEL_TIMEOUT_MS,
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

export function agentSpecFromProto(spec: AgentSpecProto | undefined): AgentSpec {
  if (spec === undefined) throw new InvalidArgumentError("agent", "is required");
  const id = requireSlug("agent.id", spec.id);
  const primary = modelFromProto("agent.models.primary", spec.models?.primary, undefined);
  const interrupt = spec.interrupt;
  return {
    id,
    displayName: spec.displayName === "" ? id : spec.displayName,
    systemPrompt: spec.systemPrompt,
    models: {
      primary,
      fast: modelFromProto("agent.models.fast", spec.models?.fast, primary),
      decision: modelFromProto("agent.models.decision", spec.models?.decision, primary),
    },
    tools: spec.tools.map((grant, i) => {
      if (!TOOL_NAME.test(grant.toolName)) throw new InvalidArgumentError(`agent.tools[${i}].tool_name`, "must look like ns.name.vN");
      return { toolName: grant.toolName, connectors: grant.connectors, readOnlyCommands: grant.readOnlyCommands };
    }),
    policy: policyFromProto(spec),
    budget: withBudgetDefaults({
      maxWallClockMs: spec.budget?.maxWallClockMs ?? 0,
      maxIterations: spec.budget?.maxIterations ?? 0,
      maxModelCalls: spec.budget?.maxModelCalls ?? 0,
      maxToolCalls: spec.budget?.maxToolCalls ?? 0,
      maxInputTokens: Number(spec.budget?.maxInputTokens ?? 0n),
      maxOutputTokens: Number(spec.budget?.maxOutputTokens ?? 0n),
      maxOutputBytes: Number(spec.budget?.maxOutputBytes ?? 0n),
      maxCostMicroUsd: Number(spec.budget?.maxCostMicroUsd ?? 0n),
    }),
    interrupt: {
      coalesceWindowMs: interrupt?.coalesceWindowMs ?? DEFAULT_INTERRUPT_SETTINGS.coalesceWindowMs,
      scope: fromEnum<InterruptScope>(InterruptScopeSchema, interrupt?.scope ?? 0) ?? DEFAULT_INTERRUPT_SETTINGS.scope,
      maxSupersessions: interrupt?.maxSupersessions || DEFAULT_INTERRUPT_SETTINGS.maxSupersessions,
      supersessionCeilingMs: interrupt?.supersessionCeilingMs || DEFAULT_INTERRUPT_SETTINGS.supersessionCeilingMs,
    },
    graph: {
      maxNodes: spec.graph?.maxNodes || DEFAULT_GRAPH_CEILINGS.maxNodes,
      maxDepth: spec.graph?.maxDepth || DEFAULT_GRAPH_CEILINGS.maxDepth,
      maxParallelism: spec.graph?.maxParallelism || DEFAULT_GRAPH_CEILINGS.maxParallelism,
      maxRevisions: spec.graph?.maxRevisions || DEFAULT_GRAPH_CEILINGS.maxRevisions,
      maxReplans: spec.graph?.maxReplans || DEFAULT_GRAPH_CEILINGS.maxReplans,
    },
    profile: {
      name: spec.profile?.name || "solution_delivered",
      version: spec.profile?.version || 1,
    },
    sandbox: {
      image: spec.sandbox?.image || DEFAULT_SANDBOX_IMAGE,
      labels: spec.sandbox?.labels ?? [],
      secrets: (spec.sandbox?.secrets ?? []).map((secret, i) => {
        if (!ENV_VAR.test(secret.envVar)) throw new InvalidArgumentError(`agent.sandbox.secrets[${i}].env_var`, "must be an environment variable name");
        if (!ENV_VAR.test(secret.sourceEnv)) throw new InvalidArgumentError(`agent.sandbox.secrets[${i}].source_env`, "must be an environment variable name");
        return { envVar: secret.envVar, sourceEnv: secret.sourceEnv };
      }),
    },
    maxConcurrentRootRuns: spec.maxConcurrentRootRuns || DEFAULT_MAX_CONCURRENT_ROOT_RUNS,
    revision: 0,
  };
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
  });
}
