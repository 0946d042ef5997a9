// AgentSpec.progress on the wire: an agent written through AgentService keeps its lowered cadence,
// and an unset or zero delay stays unset (the default), so the wire cannot switch progress off.
import { describe, expect, it } from "vitest";
import { progressCadence, DEFAULT_PROGRESS_CADENCE } from "../domain/progress.js";
import { DEMO_AGENT } from "../fixtures/demo-agent.js";
import { agentSpecFromProto, agentSpecToProto, type AgentSpecBounds } from "./agent-spec-convert.js";

const bounds: AgentSpecBounds = { secretEnvPrefixes: ["KEEL_SECRET_"], modelEndpoints: ["loopback"], allowUnlistedEndpoints: false, isLoopbackHost: () => true };

describe("AgentSpec.progress through the proto", () => {
  it("round-trips a lowered cadence", () => {
    const spec = { ...DEMO_AGENT, progress: { firstAfterMs: 500, everyMs: 2_000, minGapMs: 100 } };
    const back = agentSpecFromProto(agentSpecToProto(spec), bounds);
    expect(back.progress).toEqual({ firstAfterMs: 500, everyMs: 2_000, minGapMs: 100 });
    expect(progressCadence(back.progress)).toEqual({ firstAfterMs: 500, everyMs: 2_000, minGapMs: 100 });
  });

  it("keeps only the delays that were asked for", () => {
    const back = agentSpecFromProto(agentSpecToProto({ ...DEMO_AGENT, progress: { everyMs: 900 } }), bounds);
    expect(back.progress).toEqual({ everyMs: 900 });
    expect(progressCadence(back.progress)).toEqual({ ...DEFAULT_PROGRESS_CADENCE, everyMs: 900 });
  });

  it("leaves an agent without settings, or with zeros, on the default cadence", () => {
    expect(DEMO_AGENT.progress).toBeUndefined();
    const plain = agentSpecToProto(DEMO_AGENT);
    expect(plain.progress).toBeUndefined();
    expect(agentSpecFromProto(plain, bounds).progress).toBeUndefined();
    const zeros = agentSpecToProto({ ...DEMO_AGENT, progress: { firstAfterMs: 0, everyMs: 0, minGapMs: 0 } });
    expect(agentSpecFromProto(zeros, bounds).progress).toBeUndefined();
    // A value above the default is carried but cannot raise the delay.
    const high = agentSpecFromProto(agentSpecToProto({ ...DEMO_AGENT, progress: { firstAfterMs: 3_600_000 } }), bounds);
    expect(progressCadence(high.progress)).toEqual(DEFAULT_PROGRESS_CADENCE);
  });
});
