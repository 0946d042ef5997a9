// A WorkGraph proposal as the primary model writes it (issue #14 item 2): a zod schema, the
// JSON Schema advertised to the model from that same schema, and the conversion into the domain
// type admission judges. Parsing only checks shape and size; whether the graph may run is
// admission's question (domain/graph-admission.ts), so a well-formed but bad plan parses fine.
import { z } from "zod";
import { AGENT_SPEC_LIMITS } from "../domain/agent.js";
import { WORK_NODE_KINDS, type BudgetSlice, type WorkGraphProposal } from "../domain/work-graph.js";

/** Size bounds on what a model may propose; past them the proposal is refused before admission. */
export const WORK_GRAPH_PROPOSAL_LIMITS = {
  nodes: AGENT_SPEC_LIMITS.graph.maxNodes,
  edges: 10 * AGENT_SPEC_LIMITS.graph.maxNodes,
  keyChars: 64,
  objectiveChars: 2_000,
  toolsPerNode: 64,
  toolNameChars: 128,
  artifactTypesPerNode: 32,
  artifactTypeChars: 100,
} as const;

const L = WORK_GRAPH_PROPOSAL_LIMITS;
const B = AGENT_SPEC_LIMITS.budget;

const key = z
  .string()
  .max(L.keyChars)
  .regex(/^[A-Za-z0-9][A-Za-z0-9_.-]*$/, "a key is letters, digits, '_', '.' or '-', starting with a letter or digit");
const artifactType = z
  .string()
  .max(L.artifactTypeChars)
  .regex(/^[A-Za-z0-9][A-Za-z0-9_./-]*$/, "an artifact type is letters, digits, '_', '.', '/' or '-'");
const amount = (max: number, what: string) => z.number().int().min(0).max(max).default(0).describe(what);

const sliceSchema = z
  .object({
    wall_clock_ms: amount(B.maxWallClockMs, "Wall-clock milliseconds the node may take"),
    iterations: amount(B.maxIterations, "Loop iterations"),
    model_calls: amount(B.maxModelCalls, "Model calls"),
    tool_calls: amount(B.maxToolCalls, "Tool calls"),
    input_tokens: amount(B.maxInputTokens, "Input tokens"),
    output_tokens: amount(B.maxOutputTokens, "Output tokens"),
    output_bytes: amount(B.maxOutputBytes, "Bytes of tool output"),
    cost_micro_usd: amount(B.maxCostMicroUsd, "Cost in millionths of a US dollar"),
  })
  .strict();

const nodeSchema = z
  .object({
    key: key.describe("Unique name of the node; edges and verify subjects refer to it"),
    kind: z
      .enum(WORK_NODE_KINDS)
      .describe("agent_loop does work; verify checks another node's output; join merges its inputs; human_gate waits for a person's approval"),
    objective: z.string().trim().min(1).max(L.objectiveChars).describe("What the node must achieve, in one or two sentences"),
    tools: z
      .array(z.string().min(1).max(L.toolNameChars))
      .max(L.toolsPerNode)
      .default([])
      .describe("Full names of the tools the node may use, a subset of yours; none for join and human_gate"),
    budget: sliceSchema.optional().describe("The node's share of your remaining budget; all nodes together must fit in it"),
    needs_workspace: z.boolean().default(false).describe("Whether the node needs its own workspace"),
    consumes: z.array(artifactType).max(L.artifactTypesPerNode).default([]).describe("Artifact types the node reads from its inputs"),
    produces: z.array(artifactType).max(L.artifactTypesPerNode).default([]).describe("Artifact types the node emits"),
    subject: key.optional().describe("verify only: the key of the node whose output is checked"),
  })
  .strict();

const edgeSchema = z
  .object({
    from: key.describe("The node that runs first"),
    to: key.describe("The node that runs after it and receives its artifacts"),
  })
  .strict();

export const workGraphProposalSchema = z
  .object({
    nodes: z.array(nodeSchema).min(1).max(L.nodes),
    edges: z.array(edgeSchema).max(L.edges).default([]),
  })
  .strict();

export type WorkGraphProposalAnswer = z.output<typeof workGraphProposalSchema>;

/** What the model is shown: the input side of the schema (defaults optional), without $schema. */
export function workGraphProposalJsonSchema(): Record<string, unknown> {
  const schema = z.toJSONSchema(workGraphProposalSchema, { io: "input" });
  delete schema["$schema"];
  return schema;
}

function slice(budget: z.output<typeof sliceSchema> | undefined): BudgetSlice {
  return {
    maxWallClockMs: budget?.wall_clock_ms ?? 0,
    maxIterations: budget?.iterations ?? 0,
    maxModelCalls: budget?.model_calls ?? 0,
    maxToolCalls: budget?.tool_calls ?? 0,
    maxInputTokens: budget?.input_tokens ?? 0,
    maxOutputTokens: budget?.output_tokens ?? 0,
    maxOutputBytes: budget?.output_bytes ?? 0,
    maxCostMicroUsd: budget?.cost_micro_usd ?? 0,
  };
}

/** The domain proposal for a parsed answer. An omitted budget is a zero slice (admission refuses it for a loop). */
export function toWorkGraphProposal(answer: WorkGraphProposalAnswer): WorkGraphProposal {
  return {
    nodes: answer.nodes.map((node) => ({
      key: node.key,
      kind: node.kind,
      objective: node.objective,
      tools: node.tools,
      budget: slice(node.budget),
      needsWorkspace: node.needs_workspace,
      consumes: node.consumes,
      produces: node.produces,
      subject: node.subject,
    })),
    edges: answer.edges.map((edge) => ({ from: edge.from, to: edge.to })),
  };
}

export type ParsedProposal = { readonly ok: true; readonly proposal: WorkGraphProposal } | { readonly ok: false; readonly problems: readonly string[] };

const MAX_PROBLEMS = 20;

/** Checks a structured answer (tool arguments, or JSON already parsed); each problem names its field path. */
export function parseWorkGraphProposal(input: unknown): ParsedProposal {
  const parsed = workGraphProposalSchema.safeParse(input);
  if (parsed.success) return { ok: true, proposal: toWorkGraphProposal(parsed.data) };
  const problems = parsed.error.issues.slice(0, MAX_PROBLEMS).map((issue) => `${issue.path.join(".") || "(proposal)"}: ${issue.message}`);
  if (parsed.error.issues.length > MAX_PROBLEMS) problems.push(`…and ${parsed.error.issues.length - MAX_PROBLEMS} more`);
  return { ok: false, problems };
}

/** Reads a proposal from model text, tolerating prose or a code fence around the JSON object. */
export function readWorkGraphProposal(text: string): ParsedProposal {
  const start = text.indexOf("{");
  const end = text.lastIndexOf("}");
  if (start < 0 || end < start) return { ok: false, problems: ["the answer holds no JSON object"] };
  let json: unknown;
  try {
    json = JSON.parse(text.slice(start, end + 1));
  } catch (error) {
    return { ok: false, problems: [`the answer is not JSON (${(error as Error).message})`] };
  }
  return parseWorkGraphProposal(json);
}
