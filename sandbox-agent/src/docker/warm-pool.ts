// Warm pools: idle containers created ahead, one pool per image, so acquiring a workspace costs
// one local record write instead of a container create and start. Pool containers carry a fresh
// pool id as keel.workspace-id (with keel.warm=true and keel.run-id "") and a folder of their
// own, <workspaceRoot>/.warm-<uuid>, which is not renamed when the container is taken: a
// container restart must find its bind-mount source where it was. A pool serves specs with its
// image, no network and its limits (tmpfs size and network mode cannot change after creation).
// Each pool refills in the background, one container at a time.
import { randomUUID } from "node:crypto";
import { DEFAULT_WORKSPACE_LIMITS, type WorkspaceLimits, type WorkspaceSpec } from "../workspace-backend.js";
import type { Containers } from "./containers.js";
import { message } from "./engine-errors.js";

export interface WarmPoolOptions {
  readonly image: string;
  readonly size: number;
  /** Limits of the pool's containers; specs with other limits are created cold. Default: DEFAULT_WORKSPACE_LIMITS. */
  readonly limits?: WorkspaceLimits;
}

export interface WarmPoolStatus {
  readonly image: string;
  readonly size: number;
  readonly idle: number;
}

export interface PoolSlot {
  readonly containerId: string;
  readonly folder: string;
}

export interface WarmPool {
  readonly image: string;
  readonly size: number;
  readonly limits: WorkspaceLimits;
  readonly idle: PoolSlot[];
  filling: Promise<void> | undefined;
}

export interface WarmPools {
  /** The pool that serves a spec: its image and limits, and no network. */
  poolFor(spec: WorkspaceSpec): WarmPool | undefined;
  /** Starts filling the pool up to its size in the background, unless it already is or the backend closed. */
  refill(pool: WarmPool): void;
  /** Whether an unassigned pool container belongs to this process (an earlier process's is an orphan). */
  ownsIdle(containerId: string, poolId: string): boolean;
  status(): WarmPoolStatus[];
  /** Resolves when no pool is refilling (full, closed, or a refill failed and was logged). */
  filled(): Promise<void>;
  /** After the backend closed: waits for refills, then removes the idle containers and their folders. */
  drain(): Promise<void>;
}

function sameLimits(a: WorkspaceLimits, b: WorkspaceLimits): boolean {
  return a.memoryBytes === b.memoryBytes && a.nanoCpus === b.nanoCpus && a.pids === b.pids && a.tmpfsBytes === b.tmpfsBytes;
}

export function createWarmPools(
  options: readonly WarmPoolOptions[],
  containers: Containers,
  isClosed: () => boolean,
  log: (msg: string) => void,
): WarmPools {
  /** Pool ids this process created; idle pool containers of earlier processes are reaped. */
  const ownPoolIds = new Set<string>();
  const pools: WarmPool[] = options
    .filter((p) => p.size > 0)
    .map((p) => ({ image: p.image, size: p.size, limits: p.limits ?? DEFAULT_WORKSPACE_LIMITS, idle: [], filling: undefined }));

  function refill(pool: WarmPool): void {
    if (pool.filling !== undefined || isClosed()) return;
    pool.filling = (async () => {
      try {
        while (!isClosed() && pool.idle.length < pool.size) {
          const poolId = `warm-${randomUUID()}`;
          ownPoolIds.add(poolId);
          const folder = `.${poolId}`;
          let containerId: string;
          try {
            containerId = await containers.create({
              image: pool.image,
              limits: pool.limits,
              networkAccess: false,
              folder,
              workspaceLabel: poolId,
              runId: "",
              warm: true,
            });
          } catch (error) {
            await containers.removeFolder(folder).catch(() => undefined);
            throw error;
          }
          if (isClosed()) {
            await containers.remove(containerId);
            await containers.removeFolder(folder);
            break;
          }
          pool.idle.push({ containerId, folder });
        }
      } catch (error) {
        log(`warm pool for ${pool.image}: refill failed: ${message(error)}`);
      } finally {
        pool.filling = undefined;
      }
    })();
  }

  for (const pool of pools) refill(pool);

  return {
    poolFor(spec) {
      if (spec.networkAccess) return undefined;
      return pools.find((p) => p.image === spec.image && sameLimits(p.limits, spec.limits));
    },

    refill,

    ownsIdle(containerId, poolId) {
      return ownPoolIds.has(poolId) || pools.some((p) => p.idle.some((s) => s.containerId === containerId));
    },

    status() {
      return pools.map((p) => ({ image: p.image, size: p.size, idle: p.idle.length }));
    },

    async filled() {
      for (;;) {
        const filling = pools.map((p) => p.filling).filter((f) => f !== undefined);
        if (filling.length === 0) return;
        await Promise.allSettled(filling);
      }
    },

    async drain() {
      await Promise.allSettled(pools.map((p) => p.filling).filter((f) => f !== undefined));
      for (const pool of pools) {
        for (const slot of pool.idle.splice(0)) {
          await containers.remove(slot.containerId).catch((error: unknown) => log(`close: remove ${slot.containerId}: ${message(error)}`));
          await containers.removeFolder(slot.folder);
        }
      }
    },
  };
}
