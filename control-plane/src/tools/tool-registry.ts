import { z } from "zod";
import type { AgentSpec, ToolEffect, ToolGrant } from "../domain/agent.js";
import { mayAdvertise } from "../domain/policy.js";
import type { ToolSpec } from "../domain/transcript.js";
import type { ObservationText } from "../domain/sandbox.js";

/** An artifact a trusted tool reports. Tools never report model provenance. */
export interface ArtifactDraft {
  readonly type: string;
  readonly schemaVersion: string;
  readonly provenance: "observed" | "verified";
  readonly inlineData?: string;
  readonly reference?: string;
  /** For verified artifacts: the id of the artifact that was verified. */
  readonly subjectArtifactId?: string;
  readonly conclusion?: "passed" | "failed";
}

export interface ToolResult {
  readonly ok: boolean;
  /** What the model is shown. */
  readonly text: string;
  readonly exitCode?: number;
  readonly truncated?: boolean;
  readonly artifacts?: readonly ArtifactDraft[];
  /** The tool parked the run in the ledger itself (an admitted work graph): the call stays pending and the claim ends. */
  readonly parked?: boolean;
}

export interface ToolExecutionContext {
  readonly runId: string;
  readonly invocationId: string;
  readonly signal: AbortSignal;
  readonly grant: ToolGrant | undefined;
  /** The run's agent as the run sees it (its sandbox settings, secret grants and policy). */
  readonly agent: AgentSpec;
  /** The worker's run-lease epoch: effects sent to a sandbox host carry it as their fence. */
  readonly leaseEpoch?: number;
  /** Persists a chunk of what the tool sees as it arrives (bytes: valid UTF-8 without NUL, see ObservationText). */
  observe(stream: string, text: ObservationText): Promise<void>;
}

export type LookupOutcome = "applied" | "not_applied" | "unknown";

export interface ToolDefinition<Args extends Record<string, unknown> = Record<string, unknown>> {
  /** Lowercase namespace and name: `ns.name`. */
  readonly name: string;
  readonly version: number;
  readonly description: string;
  readonly parameters: z.ZodObject;
  /** Read, or write (an external effect). A function lets a tool classify one call (a read-only command). */
  readonly effect: ToolEffect | ((args: Args, grant: ToolGrant | undefined) => ToolEffect);
  /** Parks the run for an actor's answer instead of executing (keel.ask_user). */
  readonly parksForInput?: boolean;
  execute(args: Args, context: ToolExecutionContext): Promise<ToolResult>;
  /** Finds out whether a write whose outcome is unknown took effect, so recovery need not wait for an operator. */
  lookup?(args: Args, context: Omit<ToolExecutionContext, "observe">): Promise<LookupOutcome>;
  /**
   * Re-attaches to this call's execution if it still runs, or finished, where the tool can
   * see it (a sandbox host that outlived a control-plane restart); recovery then commits its
   * real outcome instead of declaring it unknown. Undefined when there is nothing to attach to.
   */
  reattach?(args: Args, context: ToolExecutionContext): Promise<ToolResult | undefined>;
}

/**
 * Thrown by an executor when the call's fate cannot be known (the host running it vanished
 * mid-call). The runner treats it like a dead worker: a read is interrupted, a write's
 * outcome is unknown and the run waits.
 */
export class ToolOutcomeUnknownError extends Error {}

export interface RegisteredTool {
  readonly fullName: string;
  readonly definition: ToolDefinition;
  readonly schema: z.ZodObject;
  readonly spec: ToolSpec;
}

export class ToolRegistrationError extends Error {}

const NAME = /^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$/;

export interface ToolRegistry {
  get(fullName: string): RegisteredTool | undefined;
  all(): readonly RegisteredTool[];
  /** Tools an agent may be offered on a connector: enabled for the agent, gated for the connector, allowed by policy. */
  catalogFor(agent: AgentSpec, connector: string): readonly RegisteredTool[];
  grantFor(agent: AgentSpec, fullName: string): ToolGrant | undefined;
  effectOf(tool: RegisteredTool, args: Record<string, unknown>, grant: ToolGrant | undefined): ToolEffect;
}

/** Built-in `keel.*` tools are available to every agent; others must be granted. */
const BUILT_IN_NAMESPACE = "keel.";

/** Validates every definition up front: a bad or colliding tool stops start-up, never a run. */
export function createToolRegistry(definitions: readonly ToolDefinition[]): ToolRegistry {
  const tools = new Map<string, RegisteredTool>();
  for (const definition of definitions) {
    if (!NAME.test(definition.name)) throw new ToolRegistrationError(`tool name ${JSON.stringify(definition.name)} must look like ns.name`);
    if (!Number.isInteger(definition.version) || definition.version < 1) {
      throw new ToolRegistrationError(`tool ${definition.name}: version must be a positive integer`);
    }
    if (!(definition.parameters instanceof z.ZodObject)) throw new ToolRegistrationError(`tool ${definition.name}: parameters must be a zod object`);
    if (definition.description.trim() === "") throw new ToolRegistrationError(`tool ${definition.name}: a description is required`);
    const fullName = `${definition.name}.v${definition.version}`;
    if (tools.has(fullName)) throw new ToolRegistrationError(`tool ${fullName} is registered twice`);
    // Closed schemas: an argument the tool did not declare is an error, not silently ignored.
    const schema = definition.parameters.strict();
    let parametersJsonSchema: Record<string, unknown>;
    try {
      parametersJsonSchema = z.toJSONSchema(schema, { io: "input" });
    } catch (error) {
      throw new ToolRegistrationError(`tool ${fullName}: parameters cannot be expressed as JSON Schema (${(error as Error).message})`);
    }
    delete parametersJsonSchema["$schema"];
    tools.set(fullName, {
      fullName,
      definition,
      schema,
      // Frozen: the same spec objects go into every request, and tool-sets.ts knows a list of them by identity.
      spec: deepFrozen({ name: fullName, description: definition.description, parametersJsonSchema }),
    });
  }

  const grantFor = (agent: AgentSpec, fullName: string) => agent.tools.find((grant) => grant.toolName === fullName);
  const effectOf = (tool: RegisteredTool, args: Record<string, unknown>, grant: ToolGrant | undefined): ToolEffect =>
    typeof tool.definition.effect === "function" ? tool.definition.effect(args, grant) : tool.definition.effect;
  // For advertisement, a tool whose effect depends on its arguments counts as a write.
  const advertisedEffect = (tool: RegisteredTool): ToolEffect => (typeof tool.definition.effect === "function" ? "write" : tool.definition.effect);

  return {
    get: (fullName) => tools.get(fullName),
    all: () => [...tools.values()],
    grantFor,
    effectOf,
    catalogFor(agent, connector) {
      return [...tools.values()].filter((tool) => {
        const grant = grantFor(agent, tool.fullName);
        if (grant === undefined && !tool.fullName.startsWith(BUILT_IN_NAMESPACE)) return false;
        if (grant !== undefined && grant.connectors.length > 0 && !grant.connectors.includes(connector)) return false;
        return mayAdvertise(agent.policy, { fullName: tool.fullName, effect: advertisedEffect(tool) }).allowed;
      });
    },
  };
}

/** Erases a tool's argument type for the registry; its schema still checks every call. */
export function defineTool<Args extends Record<string, unknown>>(definition: ToolDefinition<Args>): ToolDefinition {
  return definition as unknown as ToolDefinition;
}

/** `value` with every object and array in it frozen. */
function deepFrozen<T>(value: T): T {
  if (typeof value === "object" && value !== null && !Object.isFrozen(value)) {
    for (const inner of Object.values(value)) deepFrozen(inner);
    Object.freeze(value);
  }
  return value;
}
