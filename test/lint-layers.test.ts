// The layer and cycle rules of eslint.config.js, shown by real ESLint runs on our config: each case
// lints a text under the path of a real file in a layer (the type-aware parser needs a file that
// belongs to the TypeScript project) and checks what is reported.
import { readdirSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { ESLint, type Linter } from "eslint";
import { beforeAll, describe, expect, it } from "vitest";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const eslint = new ESLint({ cwd: ROOT });

/** Some source file of a folder: its path stands for the layer; its text is replaced by the case's. */
function fileIn(folder: string): string {
  const name = readdirSync(path.join(ROOT, folder)).find((file) => file.endsWith(".ts") && !file.endsWith(".test.ts"));
  if (name === undefined) throw new Error(`no .ts source in ${folder}`);
  return path.join(ROOT, folder, name);
}

async function lint(filePath: string, code: string): Promise<Linter.LintMessage[]> {
  const [result] = await eslint.lintText(code, { filePath });
  if (result === undefined) throw new Error(`no lint result for ${filePath}`);
  const fatal = result.messages.filter((message) => message.fatal === true);
  expect(fatal, "the text must parse").toEqual([]);
  return result.messages;
}

// The first lint builds the TypeScript program of the whole project (half a minute on a busy machine):
// done once here, under its own time limit, so no case pays for it.
beforeAll(async () => {
  await eslint.lintFiles([path.join(ROOT, "test/support/lint-layers/cycle-end.ts")]);
}, 180_000);

const byRule = (messages: Linter.LintMessage[], ruleId: string) => messages.filter((message) => message.ruleId === ruleId);
const RESTRICTED = "@typescript-eslint/no-restricted-imports";

describe("layer rules", () => {
  it("ledger/ may not import a value from runner/", async () => {
    const messages = await lint(fileIn("control-plane/src/ledger"), 'import { advanceRun } from "../runner/runner.js";\nexport const advance = advanceRun;\n');
    const [violation] = byRule(messages, RESTRICTED);
    expect(violation?.message).toMatch(/ledger\/ implements the ports of runner\/ and conversation\/: import their types only/);
    expect(violation?.line).toBe(1);
  });

  it("ledger/ may import a type from runner/", async () => {
    const messages = await lint(fileIn("control-plane/src/ledger"), 'import type { RunnerDeps } from "../runner/runner.js";\nexport type Deps = RunnerDeps;\n');
    expect(byRule(messages, RESTRICTED)).toEqual([]);
  });

  it("ledger/ may not import even a type from api/", async () => {
    const messages = await lint(fileIn("control-plane/src/ledger"), 'import type { ServerDeps } from "../api/server.js";\nexport type Deps = ServerDeps;\n');
    expect(byRule(messages, RESTRICTED).map((m) => m.message)).toEqual([expect.stringMatching(/never imports api\/ or cli\//)]);
  });

  it("domain/ may not import node:fs", async () => {
    const messages = await lint(fileIn("control-plane/src/domain"), 'import { readFileSync } from "node:fs";\nexport const read = readFileSync;\n');
    expect(byRule(messages, RESTRICTED).map((m) => m.message)).toEqual([expect.stringMatching(/the core is pure: no Node modules/)]);
  });

  it("domain/ may not import generated code, but may import common/", async () => {
    const generated = await lint(fileIn("control-plane/src/domain"), 'import { RunStatus } from "../../../gen/keel/v1/run_pb.js";\nexport const status = RunStatus;\n');
    expect(byRule(generated, RESTRICTED).map((m) => m.message)).toEqual([expect.stringMatching(/the core is pure: no generated code/)]);
    const common = await lint(fileIn("control-plane/src/domain"), 'import { uuidProblem } from "../../../common/ids.js";\nexport const problem = uuidProblem;\n');
    expect(byRule(common, RESTRICTED)).toEqual([]);
  });

  it("models/ may not import api/", async () => {
    const messages = await lint(fileIn("control-plane/src/models"), 'import { createKeelServer } from "../api/server.js";\nexport const server = createKeelServer;\n');
    expect(byRule(messages, RESTRICTED).map((m) => m.message)).toEqual([expect.stringMatching(/never import api\/ or cli\//)]);
  });

  it("sandbox-agent/ may not import from control-plane/", async () => {
    const messages = await lint(fileIn("sandbox-agent/src"), 'import { withBudgetDefaults } from "../../control-plane/src/domain/agent.js";\nexport const defaults = withBudgetDefaults;\n');
    expect(byRule(messages, RESTRICTED).map((m) => m.message)).toEqual([expect.stringMatching(/the sandbox agent is a separate program/)]);
  });

  it("conversation/ may not import the ledger, and takes only types from runner/", async () => {
    const ledger = await lint(fileIn("control-plane/src/conversation"), 'import { createAdmissionLedger } from "../ledger/conversation.repository.js";\nexport const ledger = createAdmissionLedger;\n');
    expect(byRule(ledger, RESTRICTED).map((m) => m.message)).toEqual([expect.stringMatching(/conversation\/ reaches the ledger through its ports/)]);
    const runner = await lint(fileIn("control-plane/src/conversation"), 'import { startWorkerPool } from "../runner/worker-pool.js";\nexport const start = startWorkerPool;\n');
    expect(byRule(runner, RESTRICTED).map((m) => m.message)).toEqual([expect.stringMatching(/conversation\/ hands runs to runner\/ through its own port/)]);
    const type = await lint(fileIn("control-plane/src/conversation"), 'import type { ClaimedRun } from "../runner/run-store.js";\nexport type Claimed = ClaimedRun;\n');
    expect(byRule(type, RESTRICTED)).toEqual([]);
  });

  it("runner/ may not import the ledger, nor a value from conversation/", async () => {
    const ledger = await lint(fileIn("control-plane/src/runner"), 'import { createRunRepository } from "../ledger/run.repository.js";\nexport const store = createRunRepository;\n');
    expect(byRule(ledger, RESTRICTED).map((m) => m.message)).toEqual([expect.stringMatching(/runner\/ reaches the ledger through the RunStore port/)]);
    const value = await lint(fileIn("control-plane/src/runner"), 'import { EarlyStart } from "../conversation/early-start.js";\nexport const start = EarlyStart;\n');
    expect(byRule(value, RESTRICTED).map((m) => m.message)).toEqual([expect.stringMatching(/runner\/ implements conversation\/'s worker-handoff port/)]);
  });

  it("graph/ may not import the ledger; the ledger takes only graph/'s types", async () => {
    const ledger = await lint(fileIn("control-plane/src/graph"), 'import { createWorkGraphRepository } from "../ledger/work-graph.repository.js";\nexport const graphs = createWorkGraphRepository;\n');
    expect(byRule(ledger, RESTRICTED).map((m) => m.message)).toEqual([expect.stringMatching(/graph\/ schedules WorkGraphs over its own ledger port/)]);
    const value = await lint(fileIn("control-plane/src/ledger"), 'import { startWorkGraphScheduler } from "../graph/work-graph-scheduler.js";\nexport const start = startWorkGraphScheduler;\n');
    expect(byRule(value, RESTRICTED).map((m) => m.message)).toEqual([expect.stringMatching(/graph\/'s port likewise/)]);
  });

  it("code that runs agents may not import the dev/test fixtures", async () => {
    const messages = await lint(fileIn("control-plane/src/runner"), 'import { DEMO_AGENT } from "../fixtures/demo-agent.js";\nexport const agent = DEMO_AGENT;\n');
    expect(byRule(messages, "no-restricted-imports").map((m) => m.message)).toEqual([expect.stringMatching(/fixtures\/ are for dev mode, tests and benches only/)]);
  });
});

describe("import cycles", () => {
  const cycleEnd = path.join(ROOT, "test/support/lint-layers/cycle-end.ts");

  it("a module that imports a module importing it back is reported", async () => {
    const messages = await lint(cycleEnd, 'import { CYCLE_START } from "./cycle-start.js";\nexport const CYCLE_END = 1;\nexport const start = CYCLE_START;\n');
    expect(byRule(messages, "import-x/no-cycle").map((m) => m.line)).toEqual([1]);
  });

  it("a type-only import back is not a cycle (it is erased at run time)", async () => {
    const messages = await lint(cycleEnd, 'import type { CYCLE_START } from "./cycle-start.js";\nexport const CYCLE_END = 1;\nexport type Start = typeof CYCLE_START;\n');
    expect(byRule(messages, "import-x/no-cycle")).toEqual([]);
  });

  it("the committed fixtures themselves have no cycle", async () => {
    const results = await eslint.lintFiles([cycleEnd, path.join(ROOT, "test/support/lint-layers/cycle-start.ts")]);
    expect(results.flatMap((result) => result.messages)).toEqual([]);
  });
});
