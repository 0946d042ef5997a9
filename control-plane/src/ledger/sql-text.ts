/**
 * SQL text with numbered parameters, built without rewriting placeholders: each parameter is a
 * template slot, so a `?` operator or a '?' literal in the text is only text. Two forms:
 * `statement(name)` for the fixed statements of the hot paths (registered, so a test can prepare
 * every one against the migrated schema, and sent as named prepared statements), and `sql` for
 * the few whose shape depends on the request.
 */

/** Constant SQL text spliced as is: a rule rendered from domain/, a column list. Never user input. */
export class RawSql {
  constructor(readonly text: string) {}
}

export const raw = (text: string): RawSql => new RawSql(text);

/** Ad-hoc SQL: text pieces with a value between each two; `text` numbers the values `$1…$n`. */
export class SqlQuery {
  constructor(
    readonly pieces: readonly string[],
    readonly values: readonly unknown[],
  ) {}

  get text(): string {
    return this.pieces.reduce((text, piece, i) => (i === 0 ? piece : `${text}$${i}${piece}`), "");
  }
}

/** `${value}` is a parameter; `${raw(text)}` is inlined; a nested sql`` is spliced in place. */
export function sql(strings: TemplateStringsArray, ...parts: readonly unknown[]): SqlQuery {
  const pieces: string[] = [strings[0] ?? ""];
  const values: unknown[] = [];
  const append = (text: string) => {
    pieces[pieces.length - 1] += text;
  };
  parts.forEach((part, i) => {
    if (part instanceof RawSql) append(part.text);
    else if (part instanceof SqlQuery) {
      part.pieces.forEach((piece, j) => (j === 0 ? append(piece) : pieces.push(piece)));
      values.push(...part.values);
    } else {
      values.push(part);
      pieces.push("");
    }
    append(strings[i + 1] ?? "");
  });
  return new SqlQuery(pieces, values);
}

/** A fixed statement: parameters are read from one params object by the functions in its slots. */
export interface Statement<P, R> {
  readonly name: string;
  readonly text: string;
  /**
   * "generic": run outside a transaction, it goes to the connections that plan generically
   * (TransactionOptions.plans), so a statement run once per run is not planned on every call.
   */
  readonly plans?: "generic";
  bind(params: P): unknown[];
  /** Phantom: the row type, for inference only. */
  readonly row?: R;
}

/** A reusable piece of a statement, with parameter slots of its own (a rule rendered once). */
export class StatementFragment<P> {
  constructor(
    readonly strings: readonly string[],
    readonly parts: readonly StatementPart<P>[],
  ) {}
}

export type StatementPart<P> = ((params: P) => unknown) | RawSql | StatementFragment<P>;

/** A fragment for statement(): the same slots, numbered where the statement uses it. */
export function fragment<P>(strings: TemplateStringsArray, ...parts: readonly StatementPart<P>[]): StatementFragment<P> {
  return new StatementFragment<P>([...strings], parts);
}

const registry = new Map<string, Statement<never, unknown>>();

/**
 * Defines a named statement: `${(p) => p.runId}` is a parameter (the same function object
 * twice is the same `$n`), `${raw(...)}` is inlined. Names are unique across the ledger.
 */
export function statement<P, R = Record<string, unknown>>(name: string, options: { readonly plans?: "generic" } = {}) {
  return (strings: TemplateStringsArray, ...parts: readonly StatementPart<P>[]): Statement<P, R> => {
    const readers: ((params: P) => unknown)[] = [];
    const slot = (part: unknown): string => {
      if (part instanceof StatementFragment) return render(part.strings, part.parts, slot);
      const reader = part as (params: P) => unknown;
      let index = readers.indexOf(reader);
      if (index < 0) index = readers.push(reader) - 1;
      return `$${index + 1}`;
    };
    const text = render(strings, parts, slot);
    const defined: Statement<P, R> = {
      name: `keel_${name}`,
      text,
      ...(options.plans === undefined ? {} : { plans: options.plans }),
      bind: (params) => readers.map((read, i) => {
        const value = read(params);
        if (value === undefined) throw new Error(`statement ${name}: parameter $${i + 1} is undefined`);
        return value;
      }),
    };
    const existing = registry.get(defined.name);
    if (existing !== undefined && existing.text !== text) throw new Error(`two statements are named ${name}`);
    registry.set(defined.name, defined);
    return defined;
  };
}

/** Every statement defined so far (those of every module imported), for the schema check. */
export function registeredStatements(): readonly Statement<never, unknown>[] {
  return [...registry.values()];
}

function render(strings: readonly string[], parts: readonly unknown[], slot: (part: unknown) => string): string {
  let text = strings[0] ?? "";
  parts.forEach((part, i) => {
    text += part instanceof RawSql ? part.text : slot(part);
    text += strings[i + 1] ?? "";
  });
  return text;
}
