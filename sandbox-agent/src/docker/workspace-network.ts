// The network of workspaces granted one: a dedicated bridge with inter-container traffic off,
// and firewall rules, installed by this agent, so a workspace reaches the internet and nothing
// else: not other workspaces, not the host, not link-local (cloud metadata at 169.254.169.254)
// and not private ranges. Ungranted workspaces have no network at all (NetworkMode none).
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import type Dockerode from "dockerode";
import { statusCode } from "./engine-errors.js";

const run = promisify(execFile);

export const WORKSPACE_NETWORK = "keel-workspaces";
/** The bridge's interface name, fixed so the firewall rules match it, not a subnet Docker picks. */
export const WORKSPACE_BRIDGE = "keel-ws0";

/** Destinations a workspace never reaches through the forward path (the host itself is INPUT). */
export const BLOCKED_RANGES = [
  "169.254.0.0/16", // link-local, cloud metadata
  "10.0.0.0/8",
  "172.16.0.0/12", // includes Docker's default bridge and other networks
  "192.168.0.0/16",
  "100.64.0.0/10", // carrier-grade NAT, used by some clouds for internal services
  "0.0.0.0/8",
  "224.0.0.0/4",
  "240.0.0.0/4",
] as const;

/** The iptables rules, as argument lists after the chain name, in the order they must hold. */
export function firewallRules(): { chain: string; rule: string[] }[] {
  return [
    // Forwarded traffic from the bridge: Docker evaluates DOCKER-USER before its own rules.
    ...BLOCKED_RANGES.map((range) => ({ chain: "DOCKER-USER", rule: ["-i", WORKSPACE_BRIDGE, "-d", range, "-j", "DROP"] })),
    // Traffic to any of the host's own addresses (the gateway, the host's public address,
    // a port bound to 0.0.0.0): the host accepts nothing from workspaces. Docker's DNS for
    // the network answers inside each container's namespace, so it does not need this path.
    { chain: "INPUT", rule: ["-i", WORKSPACE_BRIDGE, "-j", "DROP"] },
  ];
}

async function ensureRule(chain: string, rule: string[]): Promise<void> {
  try {
    await run("iptables", ["-w", "-C", chain, ...rule]);
  } catch {
    await run("iptables", ["-w", "-I", chain, ...rule]);
  }
}

export interface WorkspaceNetwork {
  /** Creates the network and installs the rules once per process; later calls cost nothing. */
  ensure(): Promise<string>;
}

export function createWorkspaceNetwork(docker: Dockerode, log: (msg: string) => void): WorkspaceNetwork {
  let ready: Promise<string> | undefined;

  async function ensureNow(): Promise<string> {
    let info: Dockerode.NetworkInspectInfo;
    try {
      info = (await docker.getNetwork(WORKSPACE_NETWORK).inspect());
    } catch (error) {
      if (statusCode(error) !== 404) throw error;
      try {
        await docker.createNetwork({
          Name: WORKSPACE_NETWORK,
          Driver: "bridge",
          CheckDuplicate: true,
          Options: {
            "com.docker.network.bridge.name": WORKSPACE_BRIDGE,
            "com.docker.network.bridge.enable_icc": "false",
            "com.docker.network.bridge.enable_ip_masquerade": "true",
          },
          Labels: { "keel.managed": "true" },
        });
        log(`created docker network ${WORKSPACE_NETWORK} (bridge ${WORKSPACE_BRIDGE}, inter-container traffic off)`);
      } catch (createError) {
        // Another agent process on this engine created it first.
        if (statusCode(createError) !== 409) throw createError;
      }
      info = (await docker.getNetwork(WORKSPACE_NETWORK).inspect());
    }
    // Fail closed on a network of this name that someone made without the isolation.
    const options = info.Options ?? {};
    if (options["com.docker.network.bridge.enable_icc"] !== "false" || options["com.docker.network.bridge.name"] !== WORKSPACE_BRIDGE) {
      throw new Error(
        `docker network ${WORKSPACE_NETWORK} exists without enable_icc=false on bridge ${WORKSPACE_BRIDGE}; remove it (docker network rm ${WORKSPACE_NETWORK}) and the agent recreates it`,
      );
    }
    for (const { chain, rule } of firewallRules()) await ensureRule(chain, rule);
    log(`firewall rules for ${WORKSPACE_BRIDGE} in place: ${BLOCKED_RANGES.join(", ")} and the host's own addresses are blocked`);
    return WORKSPACE_NETWORK;
  }

  return {
    ensure() {
      ready ??= ensureNow().catch((error: unknown) => {
        ready = undefined;
        throw error;
      });
      return ready;
    },
  };
}
