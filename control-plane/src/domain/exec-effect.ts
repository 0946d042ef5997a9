// Whether a sandbox.exec is a read or a write (issue #12, finding 8). The model controls the
// whole command line and the env, so a program name alone proves nothing: `find -exec rm`,
// `sort -o f`, `git -c core.pager=sh` and `LD_PRELOAD=x cat` all write or run something.
// A read is an exec that sets no env, is one program declared read-only by the agent AND
// listed in READ_ONLY_PROGRAMS below, with arguments that table allows. Anything else
// (unknown programs included) is a write: it is journaled and never re-run after a crash.

import type { ToolEffect, ToolGrant } from "./agent.js";

/**
 * How a program's arguments are checked.
 *  - any: no option of the program writes a file or runs another program.
 *  - options: GNU-style; `short` letters and `long` names (or any abbreviation of them, as
 *    getopt_long accepts) that write or execute make the exec a write.
 *  - words: whole-word options (find's style) that write or execute.
 *  - git: a read subcommand first (no global options such as -c/--config-env/-C before it),
 *    then no option that writes a file or runs a configured program.
 */
type ArgumentRule =
  | { readonly kind: "any" }
  | { readonly kind: "options"; readonly short: string; readonly long: readonly string[] }
  | { readonly kind: "words"; readonly forbidden: readonly string[] }
  | { readonly kind: "git" };

const ANY: ArgumentRule = { kind: "any" };

/**
 * The read allow-list. A program missing here is never a read, whatever the agent declares.
 *
 * | program                                   | a write when an argument is                              |
 * |-------------------------------------------|-----------------------------------------------------------|
 * | cat ls head tail wc grep egrep fgrep stat  | (never: no option writes or executes)                     |
 * | du df pwd echo true false sleep diff cmp   |                                                           |
 * | md5sum sha1sum sha256sum sha512sum nl od   |                                                           |
 * | basename dirname realpath readlink id      |                                                           |
 * | whoami uname printenv strings jq test      |                                                           |
 * | sort                                      | -o, --output, --compress-program (runs a program)         |
 * | find                                      | -exec -execdir -ok -okdir -delete -fprint -fprint0        |
 * |                                           | -fprintf -fls                                             |
 * | rg                                        | --pre (runs a program per file)                           |
 * | file                                      | -C, --compile (writes a .mgc file)                        |
 * | tree                                      | -o (writes its listing to a file)                         |
 * | date                                      | -s, --set                                                 |
 * | git                                       | a subcommand other than status log diff show rev-parse    |
 * |                                           | ls-files ls-tree blame cat-file describe shortlog grep;   |
 * |                                           | any option before it (-c, --config-env, -C, --exec-path); |
 * |                                           | --output, --ext-diff, --textconv, -O/--open-files-in-pager|
 *
 * Left out on purpose: env, xargs, sed and awk (their scripts run commands or write files),
 * tee, uniq and xxd (an operand can be an output file). Known gap: git obeys the workspace
 * repository's own config (core.fsmonitor, a diff driver); a workspace the run has written
 * to could make `git status` run a program.
 */
const READ_ONLY_PROGRAMS: ReadonlyMap<string, ArgumentRule> = new Map<string, ArgumentRule>([
  ...[
    "cat", "ls", "head", "tail", "wc", "grep", "egrep", "fgrep", "stat", "du", "df", "pwd", "echo", "true", "false", "sleep",
    "diff", "cmp", "md5sum", "sha1sum", "sha256sum", "sha512sum", "nl", "od", "basename", "dirname", "realpath", "readlink",
    "id", "whoami", "uname", "printenv", "strings", "jq", "test",
  ].map((program) => [program, ANY] as const),
  ["sort", { kind: "options", short: "o", long: ["--output", "--compress-program"] }],
  ["find", { kind: "words", forbidden: ["-exec", "-execdir", "-ok", "-okdir", "-delete", "-fprint", "-fprint0", "-fprintf", "-fls"] }],
  ["rg", { kind: "options", short: "", long: ["--pre"] }],
  ["file", { kind: "options", short: "C", long: ["--compile"] }],
  ["tree", { kind: "options", short: "o", long: [] }],
  ["date", { kind: "options", short: "s", long: ["--set"] }],
  ["git", { kind: "git" }],
]);

const GIT_READ_SUBCOMMANDS = new Set(["status", "log", "diff", "show", "rev-parse", "ls-files", "ls-tree", "blame", "cat-file", "describe", "shortlog", "grep"]);
const GIT_FORBIDDEN: ArgumentRule = { kind: "options", short: "O", long: ["--output", "--ext-diff", "--textconv", "--open-files-in-pager"] };

/** Shell syntax that chains, redirects, substitutes or groups: a command using any of it is never a plain read. */
const SHELL_COMPOSITION = /[;&|<>`()\n\r]|\$\(/;

interface Word {
  readonly text: string;
  /** Has an unquoted * ? or [: the shell may replace it with file names, which may look like options. */
  readonly globbed: boolean;
}

/**
 * Splits a command line into words the way sh would for the simple cases, with quotes removed.
 * Returns undefined for anything this does not model exactly (expansions with $, backslashes,
 * unterminated quotes): such a command is a write.
 */
export function shellWords(command: string): Word[] | undefined {
  const words: Word[] = [];
  let text = "";
  let globbed = false;
  let inWord = false;
  for (let i = 0; i < command.length; i++) {
    const c = command[i]!;
    if (c === " " || c === "\t") {
      if (inWord) words.push({ text, globbed });
      text = "";
      globbed = false;
      inWord = false;
      continue;
    }
    inWord = true;
    if (c === "'" || c === '"') {
      const end = command.indexOf(c, i + 1);
      if (end < 0) return undefined;
      const quoted = command.slice(i + 1, end);
      if (c === '"' && /[$`\\]/.test(quoted)) return undefined;
      text += quoted;
      i = end;
    } else if (c === "$" || c === "\\") {
      return undefined;
    } else {
      if (c === "*" || c === "?" || c === "[") globbed = true;
      text += c;
    }
  }
  if (inWord) words.push({ text, globbed });
  return words;
}

/** Whether one argument is an option the rule forbids (GNU style: short clusters, abbreviated long names). */
function forbiddenOption(word: string, short: string, long: readonly string[]): boolean {
  if (word.startsWith("--")) {
    const name = word.split("=", 1)[0]!;
    return name.length > 2 && long.some((option) => option.startsWith(name));
  }
  if (word.startsWith("-") && word.length > 1) return [...word.slice(1)].some((letter) => short.includes(letter));
  return false;
}

function argumentsAllowed(rule: ArgumentRule, args: readonly Word[]): boolean {
  switch (rule.kind) {
    case "any":
      return true;
    case "options":
      return args.every((arg) => !arg.globbed && !forbiddenOption(arg.text, rule.short, rule.long));
    case "words":
      return args.every((arg) => !arg.globbed && !rule.forbidden.includes(arg.text));
    case "git": {
      const [subcommand, ...rest] = args;
      return subcommand !== undefined && !subcommand.globbed && GIT_READ_SUBCOMMANDS.has(subcommand.text) && argumentsAllowed(GIT_FORBIDDEN, rest);
    }
  }
}

/**
 * An exec is a read only when it sets no env, and its command is one program from
 * READ_ONLY_PROGRAMS that the agent also declared read-only, with arguments that program's rule
 * allows: `sort a` may be a read, `sort -o a a` and `sleep 5; rm -rf x` never are.
 */
export function execEffect(command: string, grant: ToolGrant | undefined, env: Readonly<Record<string, string>> = {}): ToolEffect {
  const readOnly = grant?.readOnlyCommands ?? [];
  if (readOnly.length === 0 || Object.keys(env).length > 0 || SHELL_COMPOSITION.test(command)) return "write";
  const words = shellWords(command);
  const program = words?.[0];
  if (words === undefined || program === undefined || program.globbed || !readOnly.includes(program.text)) return "write";
  // A leading NAME=value sets env for the program, e.g. PATH or LD_PRELOAD; the table then sees no such program.
  const rule = READ_ONLY_PROGRAMS.get(program.text);
  return rule !== undefined && argumentsAllowed(rule, words.slice(1)) ? "read" : "write";
}
