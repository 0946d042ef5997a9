// The processes the chaos suite breaks: control-plane replicas (chaos-serve.ts) on fixed ports,
// so a restarted replica is found where the agents and clients left it, and sandbox agents
// (`keel sandbox-agent --backend process`, bubblewrap) with fixed host ids and data folders, so a
// restarted agent is the same host with the same workspaces. Started with the test helpers.
import { mkdir } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { killHard, startServerProcess, type ServerProcess } from "../../test/support/child-processes.js";
import { CapturedLog, startSandboxAgent, type AgentProcess } from "../../test/support/sandbox-support.js";
import { freePort } from "../support.js";

const CHAOS_SERVE = path.join(path.dirname(fileURLToPath(import.meta.url)), "chaos-serve.ts");

export interface Replica {
  readonly index: number;
  readonly port: number;
  readonly url: string;
  process: ServerProcess | undefined;
  /** SIGSTOPped: its port accepts connections that nothing answers. */
  stopped: boolean;
}

export interface Agent {
  readonly hostId: string;
  readonly token: string;
  readonly dataDir: string;
  /** The replica it attaches to first, and the others it re-attaches to when that one goes. */
  readonly url: string;
  readonly otherUrls: readonly string[];
  readonly log: CapturedLog;
  process: AgentProcess | undefined;
}

export interface ChaosTopology {
  readonly replicas: readonly Replica[];
  readonly agents: readonly Agent[];
  /** Replicas that are running and not stopped. */
  liveUrls(): string[];
  restartReplica(replica: Replica): Promise<void>;
  restartAgent(agent: Agent): Promise<void>;
  /** Restarts any replica or agent that exited though no fault killed it; returns what each said last. */
  heal(): Promise<string[]>;
  stopAll(): Promise<void>;
}

export interface TopologyOptions {
  readonly replicas: number;
  readonly agents: number;
  readonly env: Readonly<Record<string, string>>;
  readonly workDir: string;
  readonly hostToken: (hostId: string) => Promise<string>;
  readonly agentCapacity: number;
}

function replicaProcess(port: number, env: Readonly<Record<string, string>>): Promise<ServerProcess> {
  return startServerProcess({
    args: ["--import", "tsx", CHAOS_SERVE],
    env: { ...env, KEEL_PORT: String(port) },
    listening: (line) => (line.startsWith("LISTENING ") ? line.slice("LISTENING ".length).trim() : undefined),
    // A loaded machine may take a while to start node and tsx.
    timeoutMs: 90_000,
    keepLines: 300,
  });
}

export async function startTopology(options: TopologyOptions): Promise<ChaosTopology> {
  const replicas: Replica[] = [];
  for (let index = 0; index < options.replicas; index++) {
    const port = await freePort();
    replicas.push({ index, port, url: `http://127.0.0.1:${port}`, process: undefined, stopped: false });
  }
  // One at a time: three tsx start-ups at once on two cores only slow each other down.
  for (const replica of replicas) replica.process = await replicaProcess(replica.port, options.env);

  const agents: Agent[] = [];
  for (let index = 0; index < options.agents; index++) {
    const hostId = `chaos-host-${index}`;
    const dataDir = path.join(options.workDir, hostId);
    await mkdir(dataDir, { recursive: true });
    const own = replicas[index % replicas.length]!;
    agents.push({
      hostId,
      token: await options.hostToken(hostId),
      dataDir,
      url: own.url,
      otherUrls: replicas.filter((r) => r !== own).map((r) => r.url),
      log: new CapturedLog(),
      process: undefined,
    });
  }
  const launch = async (agent: Agent) => {
    agent.log.lines.length = 0; // only the latest incarnation's lines, so a long run keeps little
    agent.process = await startSandboxAgent({
      // Its own replica first (agents spread over replicas); it re-attaches to the next when that one goes.
      url: agent.url,
      moreUrls: agent.otherUrls,
      token: agent.token,
      hostId: agent.hostId,
      dataDir: agent.dataDir,
      capacity: options.agentCapacity,
      backend: "process",
      logLevel: "info",
      log: agent.log,
    });
  };
  for (const agent of agents) await launch(agent);

  return {
    replicas,
    agents,
    liveUrls: () => replicas.filter((r) => r.process?.alive() === true && !r.stopped).map((r) => r.url),
    async restartReplica(replica) {
      if (replica.process !== undefined) await replica.process.kill();
      replica.stopped = false;
      replica.process = await replicaProcess(replica.port, options.env);
    },
    async restartAgent(agent) {
      await agent.process?.kill("SIGKILL");
      await launch(agent);
    },
    async heal() {
      const exits: string[] = [];
      for (const replica of replicas) {
        const child = replica.process;
        if (child === undefined || child.alive()) continue;
        const how = `code ${String(child.process.exitCode)}, signal ${String(child.process.signalCode)}`;
        exits.push(`replica-${replica.index} exited (${how}); its last lines:\n${child.output.slice(-15).join("\n")}`);
        replica.process = await replicaProcess(replica.port, options.env);
      }
      for (const agent of agents) {
        const child = agent.process?.process;
        if (child === undefined || (child.exitCode === null && child.signalCode === null)) continue;
        const how = `code ${String(child.exitCode)}, signal ${String(child.signalCode)}`;
        exits.push(`${agent.hostId} exited (${how}); its last lines:\n${agent.log.lines.slice(-15).join("\n")}`);
        await launch(agent);
      }
      return exits;
    },
    async stopAll() {
      await Promise.all(agents.map((agent) => agent.process?.kill("SIGKILL") ?? Promise.resolve()));
      await Promise.all(replicas.map((replica) => (replica.process === undefined ? Promise.resolve() : killHard(replica.process.process))));
    },
  };
}
