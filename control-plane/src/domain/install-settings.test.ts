import { describe, expect, it } from "vitest";
import { InvalidArgumentError } from "./errors.js";
import { describeChange, validateInstallSettingsChange } from "./install-settings.js";

describe("install settings", () => {
  it("accepts values in range and leaves out what is not given", () => {
    expect(validateInstallSettingsChange({ rootRunCeiling: 1 })).toEqual({ rootRunCeiling: 1 });
    expect(validateInstallSettingsChange({ rootRunCeiling: 100_000, retentionDays: 0 })).toEqual({ rootRunCeiling: 100_000, retentionDays: 0 });
    expect(validateInstallSettingsChange({})).toEqual({});
  });

  it.each([
    [{ rootRunCeiling: 0 }, "root_run_ceiling"],
    [{ rootRunCeiling: 100_001 }, "root_run_ceiling"],
    [{ rootRunCeiling: 1.5 }, "root_run_ceiling"],
    [{ retentionDays: 36_501 }, "retention_days"],
    [{ retentionDays: -1 }, "retention_days"],
  ])("refuses %j naming %s", (change, field) => {
    expect(() => validateInstallSettingsChange(change)).toThrow(InvalidArgumentError);
    expect(() => validateInstallSettingsChange(change)).toThrow(new RegExp(`^${field}: must be a whole number from`));
  });

  it("describes a change as old -> new, for the settings that changed", () => {
    expect(describeChange({ rootRunCeiling: 64, retentionDays: 30 }, { rootRunCeiling: 8, retentionDays: 30 })).toEqual({ root_run_ceiling: "64 -> 8" });
  });
});
