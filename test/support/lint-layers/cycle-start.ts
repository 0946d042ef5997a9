// Half of an import cycle for test/lint-layers.test.ts: this file imports cycle-end.ts, and the test
// lints a version of cycle-end.ts that imports this file back. On disk there is no cycle.
import { CYCLE_END } from "./cycle-end.js";

export const CYCLE_START = CYCLE_END + 1;
