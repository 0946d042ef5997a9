import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { DEFAULT_SANDBOX_IMAGE, type ModelSpec } from "./agent.js";
import {
  createLogLineRedactor,
  createRunRedactor,
  createStreamRedactor,
  partialSecretSuffix,
  redactJsonText,
  redactOutputTail,
  runSecrets,
  type GrantedSecret,
} from "./redaction.js";

/** Secrets of 4 to 24 characters from a small alphabet, so generated text often holds their starts. */
const secretValue = fc.string({ unit: fc.constantFrom("a", "b", "c", "x", "-", "é"), minLength: 4, maxLength: 24 });
const secretsArb = fc.uniqueArray(secretValue, { minLength: 1, maxLength: 3 }).map((values) => values.map((value, i): GrantedSecret => ({ name: `S${i}`, value })));

/** Text that mixes secrets whole, secrets' starts, and filler. */
function textWith(secrets: readonly GrantedSecret[]) {
  const piece = fc.oneof(
    fc.constantFrom(...secrets.map((s) => s.value)),
    fc.constantFrom(...secrets.map((s) => s.value)).chain((v) => fc.integer({ min: 1, max: v.length - 1 }).map((n) => v.slice(0, n))),
    fc.string({ unit: fc.constantFrom("a", "b", "c", "x", " ", "\n"), maxLength: 8 }),
  );
  return fc.array(piece, { maxLength: 12 }).map((parts) => parts.join(""));
}

/**
 * The starts of secrets the cap cut through: for each occurrence in the whole text that begins
 * before `cap` and ends after it, what of it lies before the cap.
 */
function fragmentsAtCut(text: string, cap: number, secrets: readonly GrantedSecret[]): string[] {
  const fragments: string[] = [];
  for (const { value } of secrets) {
    for (let p = Math.max(0, cap - value.length + 1); p < cap; p++) if (text.startsWith(value, p)) fragments.push(text.slice(p, cap));
  }
  return fragments;
}

describe("stream redaction across chunks and the output cap (issue #12, item 9)", () => {
  it("for random secrets, chunkings and caps: no secret kept, and no secret's start at the cut", () => {
    fc.assert(
      fc.property(
        secretsArb.chain((secrets) => fc.tuple(fc.constant(secrets), textWith(secrets), fc.array(fc.nat(), { maxLength: 6 }), fc.nat())),
        ([secrets, text, cuts, capSeed]) => {
          const cap = capSeed % (text.length + 1);
          const kept = text.slice(0, cap);
          const truncated = cap < text.length;
          const points = [...new Set(cuts.map((c) => c % (kept.length + 1)))].sort((a, b) => a - b);
          const redactor = createStreamRedactor(secrets);
          let stored = "";
          let from = 0;
          for (const point of [...points, kept.length]) {
            stored += redactor.push(kept.slice(from, point));
            from = point;
          }
          stored += redactor.flush(truncated);
          for (const s of secrets) expect(stored).not.toContain(s.value);
          // What is stored is the whole-text redaction of the kept part, less a tail that holds
          // every fragment: compared by position, since the same letters may also occur by chance.
          const whole = createRunRedactor(secrets).text(kept);
          expect(whole.startsWith(stored)).toBe(true);
          for (const fragment of fragmentsAtCut(text, cap, secrets)) {
            if (whole.endsWith(fragment)) expect(stored.length).toBeLessThanOrEqual(whole.length - fragment.length);
          }
          if (!truncated) expect(stored).toBe(createRunRedactor(secrets).text(text));
        },
      ),
      { numRuns: 400 },
    );
  });

  it("drops a secret's start at a cut, and keeps text that only looks like one", () => {
    const secrets = [{ name: "TOKEN", value: "s3cr3t-value" }];
    const redactor = createStreamRedactor(secrets);
    expect(redactor.push("token=s3cr") + redactor.flush(true)).toBe("token=");
    const whole = createStreamRedactor(secrets);
    expect(whole.push("token=s3cr") + whole.flush(false)).toBe("token=s3cr");
    expect(partialSecretSuffix("abab", [{ name: "X", value: "abc" }])).toBe(4);
    expect(partialSecretSuffix("abx", [{ name: "X", value: "abc" }])).toBe(0);
  });

  it("a tail cut at both ends keeps neither fragment", () => {
    const secrets = [{ name: "TOKEN", value: "s3cr3t-value" }];
    expect(redactOutputTail("3t-value\nmiddle s3cr3t-value\nend s3c", true, secrets, true)).toBe("middle [redacted:TOKEN]\nend ");
    expect(redactOutputTail("end s3c", false, secrets, false)).toBe("end s3c");
  });
});

describe("run redaction", () => {
  const secrets = [{ name: "KEY", value: 'p"w\\d-1234' }];

  it("redacts tool-call arguments however the JSON spells the secret", () => {
    const escaped = JSON.stringify({ command: `echo ${secrets[0]!.value}` });
    expect(redactJsonText(escaped, secrets)).toBe(JSON.stringify({ command: "echo [redacted:KEY]" }));
    const unicode = '{"a":"\\u0070\\"w\\\\d-1234"}';
    expect(JSON.parse(redactJsonText(unicode, secrets))).toEqual({ a: "[redacted:KEY]" });
    expect(redactJsonText('{"a": "nothing"}', secrets)).toBe('{"a": "nothing"}');
    expect(redactJsonText(`not json ${escaped}`, secrets)).not.toContain("1234");
  });

  it("redacts a model turn's text and calls", () => {
    const redactor = createRunRedactor(secrets);
    const turn = redactor.turn({
      text: `the key is ${secrets[0]!.value}`,
      toolCalls: [{ id: "c1", name: "t.x.v1", argumentsJson: JSON.stringify({ v: secrets[0]!.value }) }],
      usage: { inputTokens: 1, outputTokens: 1 },
      finishReason: "stop",
    });
    expect(turn.text).toBe("the key is [redacted:KEY]");
    expect(turn.toolCalls[0]!.argumentsJson).toBe('{"v":"[redacted:KEY]"}');
    expect(redactor.message({ role: "user", content: `x ${secrets[0]!.value}` })).toEqual({ role: "user", content: "x [redacted:KEY]" });
    expect(redactor.message({ role: "assistant", content: "", toolCalls: turn.toolCalls })).toMatchObject({ toolCalls: [{ argumentsJson: '{"v":"[redacted:KEY]"}' }] });
    expect(createRunRedactor([]).active).toBe(false);
  });

  it("reads a run's secrets from its grants and its models' key variables", () => {
    const scripted: ModelSpec = { provider: "scripted", model: "", endpoint: "", apiKeyEnv: "", prices: { inputMicroUsdPerMtok: 0, outputMicroUsdPerMtok: 0 }, scriptedTurns: [], timeoutMs: 1000 };
    const model: ModelSpec = { ...scripted, provider: "openai", apiKeyEnv: "KEEL_SECRET_OPENAI" };
    const agent = {
      models: { primary: model, fast: model, decision: scripted },
      sandbox: { image: DEFAULT_SANDBOX_IMAGE, labels: [], secrets: [{ envVar: "TOKEN", sourceEnv: "KEEL_SECRET_T" }] },
    };
    expect(runSecrets(agent, { KEEL_SECRET_T: "t-value", KEEL_SECRET_OPENAI: "sk-1" })).toEqual([
      { name: "TOKEN", value: "t-value" },
      { name: "KEEL_SECRET_OPENAI", value: "sk-1" },
      { name: "KEEL_SECRET_OPENAI", value: "sk-1" },
    ]);
  });

  it("redacts a log line's JSON spelling of a value", () => {
    const redact = createLogLineRedactor(['a"b']);
    expect(redact(JSON.stringify({ msg: 'x a"b y' }))).toBe('{"msg":"x [redacted:secret] y"}');
  });
});
