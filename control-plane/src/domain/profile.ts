// Versioned Profiles and the completion evaluators their contracts select.
//
// A Profile shapes a run: it adds instructions to the prompt and turns the model's non-tool output
// into the final text plus, optionally, a model-authored artifact. Whether the run actually reached
// its goal is decided by a completion evaluator, chosen by the Profile's contract (name + version).
//
// Evaluators weigh artifacts by provenance:
//   - model:    something the model wrote. It can BE a deliverable (a proposed solution), but it is
//               never evidence that anything happened outside the conversation.
//   - observed: a trusted tool adapter reported an action or an external object.
//   - verified: a trusted adapter checked a subject artifact and reported passed or failed.
// A verification only counts when its subject is an observed artifact in the same set.
import type { ArtifactProvenance } from "./records.js";

export interface ArtifactFacts {
  readonly id: string;
  readonly type: string;
  readonly provenance: ArtifactProvenance;
  readonly subjectArtifactId: string | undefined;
  readonly conclusion: "passed" | "failed" | undefined;
}

export type Completion = { readonly complete: true } | { readonly complete: false; readonly missing: string };

export interface CompletionInput {
  readonly finalText: string;
  readonly artifacts: readonly ArtifactFacts[];
}

export interface CompletionEvaluator {
  readonly name: string;
  readonly version: number;
  evaluate(input: CompletionInput): Completion;
}

export interface ProposedArtifact {
  readonly type: string;
  readonly inlineData: string;
}

export interface Profile {
  readonly name: string;
  readonly version: number;
  readonly evaluator: { readonly name: string; readonly version: number };
  /** System instructions this profile adds to the agent's prompt. */
  instructions(): string;
  /** Non-tool model output → the final text and any model-provenance artifact it proposes. */
  interpretOutput(text: string): { readonly finalText: string; readonly proposed: ProposedArtifact | undefined };
}

const COMPLETE: Completion = { complete: true };

function incomplete(missing: string): Completion {
  return { complete: false, missing };
}

/** Observed artifacts of the set, by id. */
function observedById(artifacts: readonly ArtifactFacts[]): ReadonlyMap<string, ArtifactFacts> {
  return new Map(artifacts.filter((a) => a.provenance === "observed").map((a) => [a.id, a]));
}

/** Verifications in the set whose subject is an observed artifact of the same set. */
function verificationsOfObserved(artifacts: readonly ArtifactFacts[]): ArtifactFacts[] {
  const observed = observedById(artifacts);
  return artifacts.filter(
    (a) => a.provenance === "verified" && a.subjectArtifactId !== undefined && observed.has(a.subjectArtifactId),
  );
}

// ---- evaluators ----

const solutionDelivered: CompletionEvaluator = {
  name: "solution_delivered",
  version: 1,
  evaluate({ finalText, artifacts }) {
    if (finalText.trim() !== "") return COMPLETE;
    const solution = artifacts.some(
      (a) => a.type === "solution" && (a.provenance === "model" || a.provenance === "observed"),
    );
    return solution ? COMPLETE : incomplete("a non-empty final answer or a solution artifact");
  },
};

const actionWithVerification: CompletionEvaluator = {
  name: "action_with_verification",
  version: 1,
  evaluate({ artifacts }) {
    const observed = observedById(artifacts);
    if (observed.size === 0) {
      const modelOnly = artifacts.some((a) => a.provenance === "model");
      return incomplete(
        modelOnly
          ? "an observed artifact from a trusted tool recording the action; model-authored artifacts do not prove an external effect"
          : "an observed artifact from a trusted tool recording the action",
      );
    }
    const verifications = verificationsOfObserved(artifacts);
    if (verifications.some((v) => v.conclusion === "passed")) return COMPLETE;
    const failed = verifications.find((v) => v.conclusion === "failed");
    if (failed !== undefined) {
      return incomplete(
        `a passed verification of the action; verification ${failed.id} of artifact ${failed.subjectArtifactId ?? ""} failed`,
      );
    }
    return incomplete(`a passed verification of an observed artifact (${[...observed.keys()].join(", ")})`);
  },
};

const observedRemoteBranch: CompletionEvaluator = {
  name: "observed_remote_branch",
  version: 1,
  evaluate({ artifacts }) {
    const branches = artifacts.filter((a) => a.type === "remote_branch");
    if (branches.some((a) => a.provenance === "observed")) return COMPLETE;
    return incomplete(
      branches.some((a) => a.provenance === "model")
        ? "an observed remote_branch artifact reported by a trusted tool; the model's own remote_branch claim does not count"
        : "an observed remote_branch artifact reported by a trusted tool",
    );
  },
};

const pipelineVerification: CompletionEvaluator = {
  name: "pipeline_verification",
  version: 1,
  evaluate({ artifacts }) {
    const results = verificationsOfObserved(artifacts).filter((a) => a.type === "pipeline_result");
    if (results.some((a) => a.conclusion === "passed")) return COMPLETE;
    const failed = results.find((a) => a.conclusion === "failed");
    if (failed !== undefined) {
      return incomplete(
        `a passed pipeline_result verification; pipeline result ${failed.id} for artifact ${failed.subjectArtifactId ?? ""} failed`,
      );
    }
    return incomplete("a verified pipeline_result artifact with a passed conclusion about an observed artifact");
  },
};

export const EVALUATORS: readonly CompletionEvaluator[] = [
  solutionDelivered,
  actionWithVerification,
  observedRemoteBranch,
  pipelineVerification,
];

export function evaluatorFor(name: string, version: number): CompletionEvaluator | undefined {
  return EVALUATORS.find((e) => e.name === name && e.version === version);
}

// ---- profiles ----

function profile(
  name: string,
  instructions: string,
  interpret: (text: string) => ProposedArtifact | undefined = () => undefined,
): Profile {
  return {
    name,
    version: 1,
    evaluator: { name, version: 1 },
    instructions: () => instructions,
    interpretOutput: (text) => ({ finalText: text, proposed: interpret(text) }),
  };
}

export const PROFILES: readonly Profile[] = [
  profile(
    "solution_delivered",
    "Your task is done when you give the requester a complete answer. Put the answer itself in your final message, not only a description of it.",
    (text) => (text.trim() === "" ? undefined : { type: "solution", inlineData: text }),
  ),
  profile(
    "action_with_verification",
    "Your task is done only when a tool has carried out the requested action and a verification tool has confirmed it passed. Saying that something was done is not enough; if verification fails, report that plainly.",
  ),
  profile(
    "observed_remote_branch",
    "Your task is done only when a tool reports that the branch exists on the remote. Describing or naming a branch yourself does not count; push it with the provided tools.",
  ),
  profile(
    "pipeline_verification",
    "Your task is done only when the pipeline run for your change is reported as passed by the pipeline tool. If it fails, say which step failed and what you would try next.",
  ),
];

export function profileFor(name: string, version: number): Profile | undefined {
  return PROFILES.find((p) => p.name === name && p.version === version);
}
