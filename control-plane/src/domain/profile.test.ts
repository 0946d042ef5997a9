import { describe, expect, it } from "vitest";
import { EVALUATORS, evaluatorFor, PROFILES, profileFor, type ArtifactFacts, type Completion } from "./profile.js";
import type { ArtifactProvenance } from "./records.js";

function artifact(
  id: string,
  type: string,
  provenance: ArtifactProvenance,
  extra: { subject?: string; conclusion?: "passed" | "failed" } = {},
): ArtifactFacts {
  return { id, type, provenance, subjectArtifactId: extra.subject, conclusion: extra.conclusion };
}

function evaluate(name: string, finalText: string, artifacts: readonly ArtifactFacts[]): Completion {
  const evaluator = evaluatorFor(name, 1);
  if (evaluator === undefined) throw new Error(`no evaluator ${name}`);
  return evaluator.evaluate({ finalText, artifacts });
}

type Row = readonly [string, string, readonly ArtifactFacts[], boolean];

describe("solution_delivered v1", () => {
  const rows: readonly Row[] = [
    ["non-empty final text", "Here is the fix: …", [], true],
    ["empty text, nothing else", "", [], false],
    ["whitespace-only text", "  \n\t", [], false],
    ["model-authored solution artifact delivers a solution", "", [artifact("m1", "solution", "model")], true],
    ["observed solution artifact", "", [artifact("o1", "solution", "observed")], true],
    ["model artifact of another type", "", [artifact("m1", "note", "model")], false],
  ];
  it.each(rows)("%s", (_, text, artifacts, complete) => {
    expect(evaluate("solution_delivered", text, artifacts).complete).toBe(complete);
  });

  it("names what is missing", () => {
    expect(evaluate("solution_delivered", "", [])).toEqual({
      complete: false,
      missing: "a non-empty final answer or a solution artifact",
    });
  });
});

describe("action_with_verification v1", () => {
  const rows: readonly Row[] = [
    [
      "observed action with a passed verification",
      "",
      [artifact("o1", "deploy", "observed"), artifact("v1", "check", "verified", { subject: "o1", conclusion: "passed" })],
      true,
    ],
    [
      "model-authored action with a passed verification never proves the effect",
      "Deployed!",
      [artifact("m1", "deploy", "model"), artifact("v1", "check", "verified", { subject: "m1", conclusion: "passed" })],
      false,
    ],
    ["observed action without verification", "", [artifact("o1", "deploy", "observed")], false],
    [
      "verification about an unknown subject",
      "",
      [artifact("o1", "deploy", "observed"), artifact("v1", "check", "verified", { subject: "zz", conclusion: "passed" })],
      false,
    ],
    [
      "verification without a conclusion",
      "",
      [artifact("o1", "deploy", "observed"), artifact("v1", "check", "verified", { subject: "o1" })],
      false,
    ],
    [
      "failed verification",
      "",
      [artifact("o1", "deploy", "observed"), artifact("v1", "check", "verified", { subject: "o1", conclusion: "failed" })],
      false,
    ],
    [
      "a later passed verification after a failed one",
      "",
      [
        artifact("o1", "deploy", "observed"),
        artifact("v1", "check", "verified", { subject: "o1", conclusion: "failed" }),
        artifact("v2", "check", "verified", { subject: "o1", conclusion: "passed" }),
      ],
      true,
    ],
    ["final text alone", "All done, I deployed it.", [], false],
  ];
  it.each(rows)("%s", (_, text, artifacts, complete) => {
    expect(evaluate("action_with_verification", text, artifacts).complete).toBe(complete);
  });

  it("explains that a model artifact is not proof", () => {
    const result = evaluate("action_with_verification", "", [artifact("m1", "deploy", "model")]);
    expect(result).toEqual({
      complete: false,
      missing:
        "an observed artifact from a trusted tool recording the action; model-authored artifacts do not prove an external effect",
    });
  });

  it("reports a failed verification clearly", () => {
    const result = evaluate("action_with_verification", "", [
      artifact("o1", "deploy", "observed"),
      artifact("v1", "check", "verified", { subject: "o1", conclusion: "failed" }),
    ]);
    expect(result).toEqual({
      complete: false,
      missing: "a passed verification of the action; verification v1 of artifact o1 failed",
    });
  });

  it("asks for a verification when only the action is observed", () => {
    const result = evaluate("action_with_verification", "", [artifact("o1", "deploy", "observed")]);
    expect(result).toEqual({ complete: false, missing: "a passed verification of an observed artifact (o1)" });
  });
});

describe("observed_remote_branch v1", () => {
  const rows: readonly Row[] = [
    ["observed remote branch", "", [artifact("o1", "remote_branch", "observed")], true],
    ["model-authored remote branch does not count", "pushed fix/x", [artifact("m1", "remote_branch", "model")], false],
    ["observed artifact of another type", "", [artifact("o1", "commit", "observed")], false],
    ["nothing", "done", [], false],
  ];
  it.each(rows)("%s", (_, text, artifacts, complete) => {
    expect(evaluate("observed_remote_branch", text, artifacts).complete).toBe(complete);
  });

  it("says why a model claim is not enough", () => {
    const result = evaluate("observed_remote_branch", "", [artifact("m1", "remote_branch", "model")]);
    expect(result.complete).toBe(false);
    if (!result.complete) expect(result.missing).toContain("does not count");
  });
});

describe("pipeline_verification v1", () => {
  const rows: readonly Row[] = [
    [
      "passed pipeline result about an observed artifact",
      "",
      [
        artifact("o1", "remote_branch", "observed"),
        artifact("v1", "pipeline_result", "verified", { subject: "o1", conclusion: "passed" }),
      ],
      true,
    ],
    [
      "failed pipeline result",
      "",
      [
        artifact("o1", "remote_branch", "observed"),
        artifact("v1", "pipeline_result", "verified", { subject: "o1", conclusion: "failed" }),
      ],
      false,
    ],
    [
      "passed pipeline result about a model artifact",
      "",
      [
        artifact("m1", "remote_branch", "model"),
        artifact("v1", "pipeline_result", "verified", { subject: "m1", conclusion: "passed" }),
      ],
      false,
    ],
    [
      "passed verification of another type",
      "",
      [artifact("o1", "remote_branch", "observed"), artifact("v1", "lint", "verified", { subject: "o1", conclusion: "passed" })],
      false,
    ],
    [
      "pipeline_result reported as observed, not verified",
      "",
      [artifact("o1", "remote_branch", "observed"), artifact("o2", "pipeline_result", "observed", { subject: "o1", conclusion: "passed" })],
      false,
    ],
    ["model claims a passing pipeline", "CI is green", [artifact("m1", "pipeline_result", "model", { conclusion: "passed" })], false],
  ];
  it.each(rows)("%s", (_, text, artifacts, complete) => {
    expect(evaluate("pipeline_verification", text, artifacts).complete).toBe(complete);
  });

  it("reports a failed pipeline clearly", () => {
    const result = evaluate("pipeline_verification", "", [
      artifact("o1", "remote_branch", "observed"),
      artifact("v1", "pipeline_result", "verified", { subject: "o1", conclusion: "failed" }),
    ]);
    expect(result).toEqual({
      complete: false,
      missing: "a passed pipeline_result verification; pipeline result v1 for artifact o1 failed",
    });
  });
});

describe("the provenance rule across evaluators", () => {
  // A model-authored artifact may deliver a solution, but can never stand in for an external effect.
  const modelOnly = [
    artifact("m1", "solution", "model"),
    artifact("m2", "remote_branch", "model"),
    artifact("m3", "pipeline_result", "model", { conclusion: "passed" }),
    artifact("v1", "pipeline_result", "verified", { subject: "m2", conclusion: "passed" }),
  ];
  it.each([
    ["solution_delivered", true],
    ["action_with_verification", false],
    ["observed_remote_branch", false],
    ["pipeline_verification", false],
  ] as const)("%s with only model evidence → complete=%s", (name, complete) => {
    expect(evaluate(name, "", modelOnly).complete).toBe(complete);
  });
});

describe("registries", () => {
  it("ships the four evaluators and profiles at v1, each profile paired with its evaluator", () => {
    const names = ["solution_delivered", "action_with_verification", "observed_remote_branch", "pipeline_verification"];
    expect(EVALUATORS.map((e) => `${e.name}@${e.version}`)).toEqual(names.map((n) => `${n}@1`));
    expect(PROFILES.map((p) => `${p.name}@${p.version}`)).toEqual(names.map((n) => `${n}@1`));
    for (const profile of PROFILES) {
      expect(profile.evaluator).toEqual({ name: profile.name, version: profile.version });
      expect(evaluatorFor(profile.evaluator.name, profile.evaluator.version)).toBeDefined();
      expect(profile.instructions().trim()).not.toBe("");
    }
  });

  it("looks up by name and version", () => {
    expect(profileFor("solution_delivered", 1)?.name).toBe("solution_delivered");
    expect(profileFor("solution_delivered", 2)).toBeUndefined();
    expect(profileFor("nope", 1)).toBeUndefined();
    expect(evaluatorFor("pipeline_verification", 1)?.name).toBe("pipeline_verification");
    expect(evaluatorFor("pipeline_verification", 0)).toBeUndefined();
  });
});

describe("interpretOutput", () => {
  it("solution_delivered proposes a model solution artifact for non-empty text", () => {
    const profile = profileFor("solution_delivered", 1);
    expect(profile?.interpretOutput("Use a mutex.")).toEqual({
      finalText: "Use a mutex.",
      proposed: { type: "solution", inlineData: "Use a mutex." },
    });
    expect(profile?.interpretOutput("  ")).toEqual({ finalText: "  ", proposed: undefined });
  });

  it.each(["action_with_verification", "observed_remote_branch", "pipeline_verification"])(
    "%s proposes nothing: the model cannot author proof",
    (name) => {
      expect(profileFor(name, 1)?.interpretOutput("Deployed and verified!")).toEqual({
        finalText: "Deployed and verified!",
        proposed: undefined,
      });
    },
  );

  it("a proposed solution completes solution_delivered once recorded as a model artifact", () => {
    const profile = profileFor("solution_delivered", 1);
    const out = profile?.interpretOutput("answer");
    const recorded = out?.proposed === undefined ? [] : [artifact("a1", out.proposed.type, "model")];
    expect(evaluate("solution_delivered", "", recorded)).toEqual({ complete: true });
  });
});
