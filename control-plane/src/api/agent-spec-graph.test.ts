// AgentSpec.graph on the wire: the write gate setting survives the proto both ways, and an agent
// that never set it reads as off.
import { describe, expect, it } from "vitest";
import { DEFAULT_GRAPH_CEILINGS } from "../domain/agent.js";
import { DEMO_AGENT } from "../fixtures/demo-agent.js";
import { agentSpecFromProto, agentSpecToProto, type AgentSpecBounds } from "./agent-spec-convert.js";

const bounds: AgentSpecBounds = { secretEnvPrefixes: ["KEEL_SECRET_"], modelEndpoints: ["loopback"], allowUnlistedEndpoints: false, isLoopbackHost: () => true };

describe("AgentSpec.graph through the proto", () => {
  it("round-trips require_gate_before_writes", () => {
    const spec = { ...DEMO_AGENT, graph: { ...DEFAULT_GRAPH_CEILINGS, requireGateBeforeWrites: true } };
    const wire = agentSpecToProto(spec);
    expect(wire.graph?.requireGateBeforeWrites).toBe(true);
    expect(agentSpecFromProto(wire, bounds).graph).toEqual(spec.graph);
  });

  it("leaves it off when unset", () => {
    const back = agentSpecFromProto(agentSpecToProto({ ...DEMO_AGENT, graph: DEFAULT_GRAPH_CEILINGS }), bounds);
    expect(back.graph.requireGateBeforeWrites).toBeUndefined();
    expect(back.graph).toEqual(DEFAULT_GRAPH_CEILINGS);
  });
});
