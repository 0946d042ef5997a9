// The sandbox hosts the fleet knows (issue #15): capacity, labels, whether an agent is attached and
// to which replica, workspaces in use with the runs holding them, and the last heartbeat. There is
// no stream of host changes, so it polls RunService.ListSandboxHosts every 2 s, as the runs table does.
import type { SandboxHostView } from "../../gen/keel/v1/run_service_pb.js";
import { runService } from "./client.js";
import { age, dateOf } from "./format.js";
import { usePolling } from "./polling.js";

const POLL_MS = 2_000;
const PAGE_SIZE = 500;
/** Pages read per refresh: a fleet beyond this many hundred hosts shows its first part and says so. */
const MAX_PAGES = 4;
/** A heartbeat older than this reads as a warning. */
const STALE_MS = 30_000;
/** Run links shown per host; the rest are counted. */
const RUNS_SHOWN = 4;

/** Moves focus between the hosts' rows with the arrow keys (Tab reaches the run links inside). */
function onTableKey(event: KeyboardEvent) {
  if (event.key !== "ArrowDown" && event.key !== "ArrowUp") return;
  const cells = [...document.querySelectorAll<HTMLElement>("table.hosts .host-id")];
  const current = (document.activeElement as HTMLElement | null)?.closest("tr")?.querySelector<HTMLElement>(".host-id") ?? null;
  const at = current === null ? -1 : cells.indexOf(current);
  const next = cells[Math.min(cells.length - 1, Math.max(0, at + (event.key === "ArrowDown" ? 1 : -1)))];
  if (next !== undefined) {
    event.preventDefault();
    next.focus();
  }
}

/** Up to MAX_PAGES pages of hosts, and whether more were left unread. */
async function readFleet(signal: AbortSignal): Promise<{ hosts: SandboxHostView[]; more: boolean }> {
  const hosts: SandboxHostView[] = [];
  let pageToken = "";
  for (let page = 0; page < MAX_PAGES; page++) {
    const reply = await runService.listSandboxHosts({ pageSize: PAGE_SIZE, pageToken }, { signal });
    hosts.push(...reply.hosts);
    pageToken = reply.nextPageToken;
    if (pageToken === "") break;
  }
  return { hosts, more: pageToken !== "" };
}

export function cpuText(millis: number): string {
  if (millis === 0) return "—";
  return millis % 1000 === 0 ? `${millis / 1000} CPU` : `${(millis / 1000).toFixed(1)} CPU`;
}

export function bytesText(value: bigint | number): string {
  const n = Number(value);
  if (n === 0) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let size = n;
  let unit = 0;
  while (size >= 1024 && unit < units.length - 1) {
    size /= 1024;
    unit += 1;
  }
  return `${size >= 10 || Number.isInteger(size) ? Math.round(size) : size.toFixed(1)} ${units[unit]}`;
}

export function HostsPage() {
  const { value: fleet, error, at: now } = usePolling(readFleet, POLL_MS, []);
  const hosts = fleet?.hosts;
  const more = fleet?.more ?? false;

  const attached = (hosts ?? []).filter((h) => h.connected);
  const inUse = attached.reduce((sum, h) => sum + h.workspacesInUse, 0);
  const capacity = attached.reduce((sum, h) => sum + (h.capacity?.workspaces ?? 0), 0);
  return (
    <section aria-labelledby="hosts-title">
      <div class="toolbar">
        <h1 id="hosts-title">Sandbox hosts</h1>
        <span class="muted live" aria-live="off" data-testid="hosts-summary">
          {hosts === undefined
            ? "loading…"
            : `${hosts.length}${more ? "+" : ""} host${hosts.length === 1 && !more ? "" : "s"} · ${attached.length} attached · ${inUse} of ${capacity} workspaces in use · refreshes every 2 s`}
        </span>
      </div>
      <p class="error" role="alert">
        {error}
      </p>
      {hosts !== undefined && hosts.length === 0 ? (
        <EmptyHosts />
      ) : (
        <table class="hosts" onKeyDown={onTableKey}>
          <thead>
            <tr>
              <th scope="col">Host</th>
              <th scope="col">Attachment</th>
              <th scope="col">Workspaces</th>
              <th scope="col" class="num">CPU</th>
              <th scope="col" class="num">Memory</th>
              <th scope="col">Labels</th>
              <th scope="col">Backends · images</th>
              <th scope="col" class="num">Heartbeat</th>
              <th scope="col">Runs</th>
            </tr>
          </thead>
          <tbody>
            {(hosts ?? []).map((host) => (
              <HostRow key={host.hostId} host={host} now={now} />
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

function HostRow(props: { readonly host: SandboxHostView; readonly now: number }) {
  const { host } = props;
  const total = host.capacity?.workspaces ?? 0;
  const share = total > 0 ? Math.min(1, host.workspacesInUse / total) : 0;
  const heartbeat = dateOf(host.lastHeartbeatAt);
  const stale = heartbeat === undefined || props.now - heartbeat.getTime() > STALE_MS;
  const labels = Object.entries(host.labels).sort(([a], [b]) => a.localeCompare(b));
  const hidden = host.runIds.length - RUNS_SHOWN;
  return (
    <tr data-host-id={host.hostId} data-attached={host.connected ? "yes" : "no"}>
      <td class="mono clip">
        <span class="host-id" tabIndex={0} title={host.hostId}>
          {host.hostId}
        </span>
      </td>
      <td class="clip" data-testid="attachment">
        <span class={`badge ${host.connected ? "s-succeeded" : "s-paused"}`}>{host.connected ? "attached" : "detached"}</span>
        {host.replicaId === "" ? null : (
          <span class="muted small replica" title={`replica ${host.replicaId}`} data-replica-id={host.replicaId}>
            {host.connected ? " to " : " last on "}
            {host.replicaId.slice(0, 8)}
          </span>
        )}
      </td>
      <td data-testid="workspaces">
        <span class="ws-text">
          {host.workspacesInUse} of {total} in use
        </span>
        <span class="bar" role="meter" aria-valuemin={0} aria-valuemax={total} aria-valuenow={host.workspacesInUse} aria-label={`workspaces in use on ${host.hostId}`}>
          <span class={`fill${total > 0 && host.workspacesInUse >= total ? " hot" : ""}`} style={{ width: `${(share * 100).toFixed(1)}%` }} />
        </span>
      </td>
      <td class="num">{cpuText(host.capacity?.cpuMillis ?? 0)}</td>
      <td class="num">{bytesText(host.capacity?.memoryBytes ?? 0n)}</td>
      <td class="clip chips">
        {labels.length === 0 ? <span class="muted">none</span> : labels.map(([k, v]) => <span key={k} class="chip">{`${k}=${v}`}</span>)}
      </td>
      <td class="clip" title={[...host.backends, ...host.images].join(", ")}>
        {host.backends.join(", ")}
        {host.images.length > 0 ? <span class="muted"> · {host.images.join(", ")}</span> : null}
      </td>
      <td class={`num${stale ? " stale" : ""}`} data-testid="heartbeat" data-stale={stale ? "yes" : "no"} title={heartbeat?.toISOString() ?? "never"}>
        {heartbeat === undefined ? "never" : `${age(heartbeat, props.now)} ago`}
      </td>
      <td class="clip runs-on-host">
        {host.runIds.slice(0, RUNS_SHOWN).map((runId) => (
          <a key={runId} class="run-link mono" href={`#/runs/${runId}`} title={runId}>
            {runId.slice(0, 8)}
          </a>
        ))}
        {hidden > 0 ? <span class="muted small">+{hidden}</span> : null}
      </td>
    </tr>
  );
}

/** No host has ever attached: say how to attach one. */
function EmptyHosts() {
  return (
    <div class="panel empty-hosts" data-testid="hosts-empty">
      <h2>No sandbox host has attached yet</h2>
      <p>
        Exec-class tools (<code>sandbox.exec.v1</code> and the file tools) run only on a sandbox host. Create a host token (it fixes the host's id, most
        workspaces and allowed labels), then start an agent on a machine with Docker, pointing it at this server's gRPC port (7070 by
        default):
      </p>
      <pre class="block">
        {"keel token create --role sandbox-host --host-id host-1 --max-capacity 4 --label zone=eu   # prints T once\n" +
          "keel sandbox-agent --control-plane http://CONTROL-PLANE:7070 --token T --host-id host-1 \\\n" +
          "  --backend docker --capacity 4 --label zone=eu --data-dir /var/lib/keel-sandbox"}
      </pre>
      <p class="muted small">The host shows here once it attaches; this page refreshes every 2 s.</p>
    </div>
  );
}
