// Builds Keel from a validated config. main.ts (and tests) start what this returns.
import path from "node:path";
import type { Logger } from "pino";
import { isLoopbackHost } from "../../common/loopback.js";
import { createAgentService } from "./api/agent-service.js";
import { createEmissionService } from "./api/emission-service.js";
import { createIngressService } from "./api/ingress-service.js";
import { createRunService } from "./api/run-service.js";
import { createSandboxService } from "./api/sandbox-service.js";
import { createKeelServer, type KeelServer } from "./api/server.js";
import type { KeelConfig } from "./config.js";
import type { RunStatus } from "./domain/run.js";
import { LOOPBACK_ENDPOINTS } from "./domain/agent.js";
import { createKeelLogger, secretValuesOf } from "./logger.js";
import { createAgentRepository, type AgentRepository } from "./ledger/agent.repository.js";
import { createApiTokenRepository, type ApiTokenRepository } from "./ledger/api-token.repository.js";
import { createScopeLookups } from "./ledger/token-scope.repository.js";
import { startEmbeddedPostgres, type EmbeddedPostgresHandle } from "./ledger/embedded-postgres.js";
import { createEmissionFeed } from "./ledger/emission-feed.js";
import { createEmissionRepository } from "./ledger/emission.repository.js";
import { createAdmissionLedger } from "./ledger/conversation.repository.js";
import { createAdmissions } from "./conversation/admission.js";
import { QuietConversations, type SpeculativeStarts } from "./conversation/quiet-conversations.js";
import { createMailbox } from "./conversation/mailbox.js";
import { createTriager } from "./conversation/side-calls.js";
import { createModelCallRepository } from "./ledger/model-call.repository.js";
import { systemClock, type Clock } from "./domain/clock.js";
import { startNotificationHub } from "./ledger/notification-hub.js";
import { migrateLedger } from "./ledger/orm.js";
import { databaseAnswers } from "./ledger/database-health.js";
import { ledgerMetrics } from "./ledger/ledger-metrics.js";
import { createRunQueryRepository } from "./ledger/run-query.repository.js";
import { createRetentionRepository } from "./ledger/retention.repository.js";
import { createInstallSettingsRepository, type InstallSettingsRepository } from "./ledger/install-settings.repository.js";
import { adoptInstallSettingsEnv } from "./install-settings-env.js";
import { startRetentionSweeper, type RetentionSweeper } from "./retention-sweeper.js";
import { createRunControlRepository } from "./ledger/run-control.repository.js";
import { createRunForkRepository } from "./ledger/run-fork.repository.js";
import { createRunRepository } from "./ledger/run.repository.js";
import { createSqlPool, type SqlPool } from "./ledger/sql.js";
import { readServerSettings, sessionDurability } from "./ledger/server-durability.js";
import { createOpenAiModelProvider } from "./models/openai-model-provider.js";
import { createScriptedModelProvider } from "./models/scripted-model-provider.js";
import type { RunnerDeps } from "./runner/runner.js";
import { createWorkerHandoff, startWorkerPool, type WorkerPool } from "./runner/worker-pool.js";
import { createSandboxRepository } from "./ledger/sandbox.repository.js";
import { createRemoteSandboxDispatcher, type RemoteSandboxDispatcher } from "./sandbox/remote-sandbox-dispatcher.js";
import { createSandboxHub, type SandboxHub } from "./sandbox/sandbox-hub.js";
import { createSandboxRelayRepository } from "./ledger/sandbox-relay.repository.js";
import { createFleetRelay } from "./sandbox/fleet-relay.js";
import { randomUUID } from "node:crypto";
import { askUserTool } from "./tools/ask-user-tool.js";
import { createReportProgressTool } from "./tools/report-progress-tool.js";
import { createProposeWorkGraphTool } from "./graph/propose-work-graph-tool.js";
import { startWorkGraphScheduler } from "./graph/work-graph-scheduler.js";
import { createWorkspaceJoin } from "./graph/workspace-join.js";
import { createGateDecisions } from "./graph/gate-decisions.js";
import { createSandboxHostReads } from "./ledger/sandbox-host-view.repository.js";
import { createConversationHistory } from "./ledger/run-history.repository.js";
import { createWorkGraphRepository } from "./ledger/work-graph.repository.js";
import { createWorkGraphReads } from "./ledger/work-graph-view.repository.js";
import { createProgressRepository } from "./ledger/progress.repository.js";
import { createProgressSupervisors, type ProgressOptions } from "./progress/progress-supervisor.js";
import { createProgressSummarizer } from "./progress/progress-summary.js";
import { createSandboxTools, grantFor } from "./tools/sandbox-tools.js";
import { createToolRegistry, type ToolDefinition } from "./tools/tool-registry.js";
import type { SpanExporter } from "@opentelemetry/sdk-trace";
import { createLatencyHistograms } from "./telemetry/latency-histograms.js";
import { startTracing } from "./telemetry/tracing-setup.js";

export interface Ledger {
  readonly sql: SqlPool;
  readonly url: string;
  close(): Promise<void>;
}

/** Opens the ledger: DATABASE_URL if set, else the embedded PostgreSQL in the data folder. */
export async function openKeelLedger(config: KeelConfig, log: Logger): Promise<Ledger> {
  let embedded: EmbeddedPostgresHandle | undefined;
  let url = config.databaseUrl;
  if (url === undefined) {
    embedded = await startEmbeddedPostgres({
      dataDir: path.join(config.dataDir, "postgres"),
      port: config.embeddedPgPort,
      listenAddresses: config.embeddedPgListen,
      log: (line) => log.debug({ component: "postgres" }, line),
    });
    url = embedded.url;
  }
  // MikroORM migrates and lets go of its connection; every query afterwards goes through the SQL pool.
  await migrateLedger({ url, log: (message) => log.info({ component: "ledger" }, message) });
  const durability = sessionDurability(await readServerSettings(url));
  for (const notice of durability.notices) log[notice.level]({ component: "ledger" }, notice.message);
  const sql = createSqlPool({
    url,
    max: config.dbPoolMax,
    sessionSettings: durability.sessionSettings,
    onError: (error) => log.warn({ component: "ledger", err: error }, "idle database connection failed"),
  });
  return {
    sql,
    url,
    async close() {
      await sql.close();
      await embedded?.stop();
    },
  };
}

export interface KeelApp {
  readonly config: KeelConfig;
  readonly log: Logger;
  readonly ledger: Ledger;
  readonly agents: AgentRepository;
  readonly tokens: ApiTokenRepository;
  /** The install-wide settings every replica applies (AgentService Get/PutInstallSettings). */
  readonly installSettings: InstallSettingsRepository;
  readonly server: KeelServer;
  readonly sandbox: { readonly hub: SandboxHub; readonly dispatcher: RemoteSandboxDispatcher };
  /** Deletes finished runs past the install's retention_days on a timer; tests call sweepNow(). */
  readonly retention: RetentionSweeper;
  /** First model calls started before admission read the conversation, and those withdrawn (KEEL_SPECULATIVE_START). */
  speculativeStarts(): SpeculativeStarts;
  /** Starts the claim loops; separate so a test can run a server that never works. */
  startWorkers(): WorkerPool;
  stop(): Promise<void>;
}

export interface BuildOptions {
  readonly log?: Logger;
  /** Coalesce windows, admission and the interrupt ceiling read this clock; tests hold it still. */
  readonly clock?: Clock;
  /** Tools beyond the built-in ones (sandbox tools, a deployment's own, tests'). */
  readonly tools?: readonly ToolDefinition[];
  /** Wraps the run store or providers, e.g. with fault injection in crash tests. */
  readonly wrapRunnerDeps?: (deps: RunnerDeps) => RunnerDeps;
  /** The progress supervisors' cadence (may only be lowered) and tick; tests and demos. */
  readonly progress?: ProgressOptions;
  /** Spans go here as they end (tests' in-memory exporter) instead of OTLP; tracing is on with it. */
  readonly spanExporter?: SpanExporter;
}

export async function buildApp(
  config: KeelConfig,
  env: Readonly<Record<string, string | undefined>>,
  options: BuildOptions = {},
): Promise<KeelApp> {
  const logger = options.log ?? createKeelLogger({ level: config.logLevel, secretValues: secretValuesOf(env, config.secretEnvPrefixes) });
  // On only with OTEL_EXPORTER_OTLP_ENDPOINT (or a test's exporter); a bad endpoint stops here, before anything starts.
  const tracing = startTracing(env, options.spanExporter === undefined ? {} : { exporter: options.spanExporter });
  const latencies = createLatencyHistograms();
  const ledger = await openKeelLedger(config, logger);
  const hub = await startNotificationHub(ledger.url, (message) => logger.warn({ component: "notify" }, message));
  const emissionFeed = createEmissionFeed(ledger.sql, hub, { pollMs: config.idlePollMs });
  const agents = createAgentRepository(ledger.sql);
  const tokens = createApiTokenRepository(ledger.sql);
  const installSettings = createInstallSettingsRepository(ledger.sql);
  await adoptInstallSettingsEnv(installSettings, config.installSettingsFromEnv, logger.child({ component: "settings" }));
  // A token revoked by any process stops working here too, and ends the streams it opened.
  tokens.listen(hub);
  const clock = options.clock ?? systemClock;
  const runStore = createRunRepository(ledger.sql, { clock, durability: config.durability, commitPollMs: config.commitPollMs });
  const runQueries = createRunQueryRepository(ledger.sql, { clock });
  const control = createRunControlRepository(ledger.sql);
  // Admission hands runs it can start at once to this process's idle workers (none until startWorkers).
  const handoff = createWorkerHandoff();
  // What admission last knew of each conversation: a quiet one's next request starts before the read.
  const quiet = config.speculativeStart ? new QuietConversations() : undefined;
  // Fast- and decision-model calls beside the loop: recorded, counted, and the ack lifecycle.
  const modelCalls = createModelCallRepository(ledger.sql);
  const sideProviders = { scripted: createScriptedModelProvider(), openai: createOpenAiModelProvider({ env }) };
  const triage = createTriager({ ledger: modelCalls, providers: sideProviders, log: logger.child({ component: "triage" }) });

  // One supervisor per claimed root run, reading and reserving its notices in the ledger.
  const progress = createProgressSupervisors({
    ledger: createProgressRepository(ledger.sql),
    clock,
    log: logger.child({ component: "progress" }),
    ...(options.progress === undefined ? {} : { options: options.progress }),
    summarizer: createProgressSummarizer({ providers: sideProviders, ledger: modelCalls, log: logger.child({ component: "progress" }) }),
    ...(quiet === undefined ? {} : { noticing: (runId: string) => quiet.noticed(runId) }),
  });

  // Sandbox hosts attach to this process; exec-class tools reach them through the dispatcher.
  const sandboxLog = logger.child({ component: "sandbox" });
  // Hosts attached to any replica are one fleet: placement in the ledger, commands relayed (fleet-relay.ts).
  const replicaId = randomUUID();
  const leases = createSandboxRepository(ledger.sql, { replicaId, liveMs: config.sandbox.heartbeatMs * 3 });
  const sandboxHub = createSandboxHub(
    leases,
    {
      heartbeatIntervalMs: config.sandbox.heartbeatMs,
      reconnectGraceMs: config.sandbox.reconnectGraceMs,
      unclaimedTtlMs: Math.max(120_000, config.sandbox.reattachWaitMs * 2),
      maxUnclaimedBytes: config.sandbox.maxOutputBytes,
    },
    sandboxLog,
  );
  const fleet = createFleetRelay(
    sandboxHub,
    createSandboxRelayRepository(ledger.sql),
    { replicaId, route: (hostId) => leases.hostReplica(hostId), subscribe: (listener) => hub.subscribe("keel_sandbox", listener), pollMs: 1_000, environment: env },
    sandboxLog,
  );
  const dispatcher = createRemoteSandboxDispatcher(
    sandboxHub,
    fleet,
    leases,
    {
      placementWaitMs: config.sandbox.placementWaitMs,
      reattachWaitMs: config.sandbox.reattachWaitMs,
      maxOutputBytes: config.sandbox.maxOutputBytes,
      maxExecTimeoutMs: config.sandbox.maxExecTimeoutMs,
      keepMs: config.sandbox.keepMs,
    },
    sandboxLog,
  );
  const sandboxTools = createSandboxTools({
    // A run's workspace feeds its progress supervisor: the ledger says whether a notice has covered it yet.
    dispatcher: {
      ...dispatcher,
      workspaceFor: (grant, signal) => dispatcher.workspaceFor(grant, signal).then((id) => (progress.checkpoint(grant.runId), id)),
    },
    env,
    defaultExecTimeoutMs: config.sandbox.defaultExecTimeoutMs,
    maxExecTimeoutMs: config.sandbox.maxExecTimeoutMs,
    maxOutputBytes: config.sandbox.maxOutputBytes,
  });
  // WorkGraphs: the propose tool admits a graph; the scheduler moves it on as children settle.
  const graphs = createWorkGraphRepository(ledger.sql, { handoff, clock });
  // A join over nodes that had workspaces reads theirs and writes the root's, with each run's own grant.
  const grantOf = async (runId: string, agentId: string) => {
    const agent = await agents.get(agentId);
    if (agent === undefined) throw new Error(`agent ${agentId} no longer exists`);
    return grantFor({ runId, agent }, env);
  };
  const workspaceJoin = createWorkspaceJoin({
    existing: async (runId, agentId, signal) => dispatcher.existingWorkspace(await grantOf(runId, agentId), signal),
    open: async (runId, agentId, signal) => dispatcher.workspaceFor(await grantOf(runId, agentId), signal),
    listFiles: (workspaceId, path, signal) => dispatcher.listFiles(workspaceId, path, signal),
    readFile: (workspaceId, path, maxBytes, signal) => dispatcher.readFile(workspaceId, path, maxBytes, signal),
    writeFile: (workspaceId, path, content, signal) => dispatcher.writeFile(workspaceId, path, content, signal),
  });
  const graphScheduler = startWorkGraphScheduler(graphs, logger.child({ component: "graph" }), { sweepMs: 2_000, reconcile: workspaceJoin });
  const gates = createGateDecisions(graphs, graphScheduler);
  const proposeWorkGraph = createProposeWorkGraphTool({ ledger: graphs, tools: () => tools, now: () => clock.now(), admitted: (rootRunId) => graphScheduler.poke(rootRunId) });
  const tools = createToolRegistry([askUserTool, createReportProgressTool(progress), proposeWorkGraph, ...sandboxTools, ...(options.tools ?? [])]);
  let sweeping: Promise<void> | undefined;
  const stopSweeping = new AbortController();
  const sweeper = setInterval(() => {
    sweeping ??= dispatcher
      .sweep(AbortSignal.any([stopSweeping.signal, AbortSignal.timeout(60_000)]))
      .then(() => {}, (error: unknown) => sandboxLog.warn({ err: error }, "workspace sweep failed"))
      .finally(() => (sweeping = undefined));
  }, config.sandbox.sweepMs);
  sweeper.unref();
  const retention = startRetentionSweeper(
    createRetentionRepository(ledger.sql),
    { days: async () => (await installSettings.get()).retentionDays, sweepMs: config.retention.sweepMs },
    clock,
    logger.child({ component: "retention" }),
  );

  const server = createKeelServer(
    {
      ingress: createIngressService({
        mailbox: createMailbox({
          admissions: createAdmissions({
            ledger: createAdmissionLedger(ledger.sql),
            handoff,
            triage,
            graphAmended: (rootRunId) => graphScheduler.poke(rootRunId),
            ...(quiet === undefined ? {} : { quiet }),
          }),
          providers: sideProviders,
          clock,
          log: logger.child({ component: "mailbox" }),
          sideCalls: modelCalls,
        }),
        control,
        runs: runQueries,
        scopes: createScopeLookups(ledger.sql),
        maxMessageTextBytes: config.maxTextBytes,
        gates,
      }),
      emissions: createEmissionService({ emissions: createEmissionRepository(ledger.sql), feed: emissionFeed, maxStreamsPerToken: config.maxStreamsPerToken }),
      runs: createRunService({ runs: runQueries, control, forks: createRunForkRepository(ledger.sql, clock), graphs: createWorkGraphReads(ledger.sql), gates, hosts: createSandboxHostReads(ledger.sql), hub, pollMs: config.idlePollMs, maxReplyBytes: config.maxMessageBytes }),
      agents: createAgentService({
        agents,
        bounds: {
          secretEnvPrefixes: config.secretEnvPrefixes,
          // A server on loopback is a local install: models on this machine need no listing there.
          modelEndpoints: [...config.modelEndpoints, ...(isLoopbackHost(config.host) ? [LOOPBACK_ENDPOINTS] : [])],
          isLoopbackHost,
        },
        installSettings: { settings: installSettings, log: logger.child({ component: "settings" }) },
      }),
      sandbox: createSandboxService({ hub: sandboxHub, maxMessageBytes: config.maxMessageBytes, registrationWaitMs: config.sandbox.registrationWaitMs }),
      health: { databaseAnswers: () => databaseAnswers(ledger.sql, 1_000) },
    },
    tokens,
    { maxMessageBytes: config.maxMessageBytes, defaultDeadlineMs: config.defaultDeadlineMs, maxDeadlineMs: config.maxDeadlineMs, http2: config.http2 },
    logger,
    (request, response) => {
      if (request.url === "/healthz") {
        response.writeHead(200, { "content-type": "text/plain" });
        response.end("ok\n");
        return;
      }
      if (request.url === "/metrics") {
        ledgerMetrics(ledger.sql).then(
          (text) => {
            response.writeHead(200, { "content-type": "text/plain; version=0.0.4" });
            response.end(text + latencies.render() + (quiet?.render() ?? ""));
          },
          (error: unknown) => {
            logger.error({ err: error }, "metrics scrape failed");
            response.writeHead(503, { "content-type": "text/plain" });
            response.end("ledger unavailable\n");
          },
        );
        return;
      }
      response.writeHead(404, { "content-type": "text/plain" });
      response.end("not found\n");
    },
  );

  const pools: WorkerPool[] = [];
  return {
    config,
    log: logger,
    ledger,
    agents,
    tokens,
    installSettings,
    server,
    sandbox: { hub: sandboxHub, dispatcher },
    retention,
    speculativeStarts: () => quiet?.starts ?? { started: 0, withdrawn: 0 },
    startWorkers() {
      const deps: RunnerDeps = {
        store: runStore,
        conversationHistory: createConversationHistory(ledger.sql),
        providers: { scripted: createScriptedModelProvider(), openai: createOpenAiModelProvider({ env }) },
        tools,
        now: () => clock.now(),
        log: logger.child({ component: "runner" }),
        maxInvalidTurns: 3,
        readFlushMs: config.readFlushMs,
        controlChanges: (listener) => hub.subscribe("keel_run_control", listener),
        secretEnv: env,
        lifecycle: modelCalls,
        childClaimEnded: (rootRunId) => graphScheduler.passSoon(rootRunId),
        ...(quiet === undefined ? {} : { runEnded: (runId: string, status: RunStatus) => quiet.runEnded(runId, status) }),
        progress,
        latencies,
        ...(tracing === undefined ? {} : { tracing: tracing.run }),
      };
      const pool = startWorkerPool(
        options.wrapRunnerDeps?.(deps) ?? deps,
        { workers: config.workers, leaseMs: config.leaseMs, idlePollMs: config.idlePollMs },
        (listener) => hub.subscribe("keel_runs", listener),
        logger.child({ component: "runner" }),
        handoff,
      );
      pools.push(pool);
      return pool;
    },
    async stop() {
      clearInterval(sweeper);
      stopSweeping.abort();
      await retention.stop();
      // First, so hosts dropping off as the server closes are not treated as departures.
      sandboxHub.close();
      fleet.close();
      await server.close();
      await Promise.all(pools.map((pool) => pool.stop()));
      await triage.stop();
      await sweeping;
      emissionFeed.close();
      await graphScheduler.stop();
      await hub.close();
      await ledger.close();
      await tracing?.shutdown();
    },
  };
}
