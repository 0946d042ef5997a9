// How a join node reconciles the workspaces of its inputs (issue #14 item 4). Each input that ran
// in a workspace of its own hands on the files it left there; the join applies them in its input
// order, and a path two inputs left different is a conflict: the earlier input's version stays
// and the later one is reported, never silently overwritten. Pure: the graph layer reads the files
// and writes the result, this decides what goes where.

/** A file an input left in its workspace, by content digest. */
export interface WorkspaceFileChange {
  readonly path: string;
  readonly sha256: string;
  readonly sizeBytes: number;
}

/** What one input left in its workspace, and what could not be carried (links, special files). */
export interface InputWorkspace {
  readonly key: string;
  readonly files: readonly WorkspaceFileChange[];
  readonly skipped: readonly string[];
}

export interface WorkspaceConflict {
  readonly path: string;
  /** The input whose version was applied. */
  readonly kept: string;
  /** Later inputs that left a different version, which was not applied. */
  readonly dropped: readonly string[];
}

export interface WorkspaceMerge {
  /** Files to write into the reconciled workspace, each from the input whose version won. */
  readonly apply: readonly { readonly path: string; readonly from: string; readonly sizeBytes: number }[];
  readonly conflicts: readonly WorkspaceConflict[];
}

/** Applies the inputs' files in input order; the same content from two inputs is no conflict. */
export function mergeWorkspaces(inputs: readonly InputWorkspace[]): WorkspaceMerge {
  const winner = new Map<string, { from: string; sha256: string; sizeBytes: number }>();
  const dropped = new Map<string, string[]>();
  for (const input of inputs) {
    for (const file of input.files) {
      const first = winner.get(file.path);
      if (first === undefined) winner.set(file.path, { from: input.key, sha256: file.sha256, sizeBytes: file.sizeBytes });
      else if (first.sha256 !== file.sha256) dropped.set(file.path, [...(dropped.get(file.path) ?? []), input.key]);
    }
  }
  const apply = [...winner].map(([path, file]) => ({ path, from: file.from, sizeBytes: file.sizeBytes }));
  const conflicts = [...dropped].map(([path, later]) => ({ path, kept: winner.get(path)!.from, dropped: later }));
  return { apply, conflicts };
}

/** Lines listed per section before the rest is counted instead: a join's report stays bounded. */
const LISTED = 50;

function listed(lines: readonly string[]): string[] {
  return lines.length <= LISTED ? [...lines] : [...lines.slice(0, LISTED), `… and ${lines.length - LISTED} more`];
}

/** The join's report, as the nodes after it and the root read it. */
export function describeMerge(inputs: readonly InputWorkspace[], merge: WorkspaceMerge): string {
  const keys = inputs.map((input) => input.key);
  const lines = [
    `Reconciled the workspaces of ${keys.map((k) => `"${k}"`).join(", ")} into the root run's workspace: ${merge.apply.length} file(s) applied, ${merge.conflicts.length} conflict(s).`,
  ];
  for (const key of keys) {
    const files = merge.apply.filter((file) => file.from === key).map((file) => `  ${file.path} (${file.sizeBytes} bytes)`);
    if (files.length > 0) lines.push(`From "${key}":`, ...listed(files));
  }
  if (merge.conflicts.length > 0) {
    lines.push("Conflicts (the earlier input's version was kept; the others were not applied):");
    lines.push(...listed(merge.conflicts.map((c) => `  ${c.path}: "${c.kept}" kept; ${c.dropped.map((d) => `"${d}"`).join(", ")} left a different version`)));
  }
  const skipped = inputs.flatMap((input) => input.skipped.map((path) => `  ${path} (in "${input.key}")`));
  if (skipped.length > 0) lines.push("Not carried (links and special files):", ...listed(skipped));
  return lines.join("\n");
}
