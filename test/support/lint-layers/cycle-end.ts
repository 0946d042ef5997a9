// See cycle-start.ts: the test lints this file's path with a text that imports cycle-start.ts.
export const CYCLE_END = 1;
