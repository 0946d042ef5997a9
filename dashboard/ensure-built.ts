// Builds the dashboard when its build is missing or older than a file it is built from, so
// `npm start` and the browser test always serve current assets and skip the build otherwise.
import { spawn } from "node:child_process";
import { readdirSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const DASHBOARD = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.dirname(DASHBOARD);
const BUILT = path.join(DASHBOARD, "dist", "index.html");
const SOURCES = [path.join(DASHBOARD, "src"), path.join(DASHBOARD, "index.html"), path.join(DASHBOARD, "vite.config.ts"), path.join(ROOT, "gen")];

/** The newest modification time under a file or folder, in ms (0 when it does not exist). */
function newest(target: string): number {
  let stats;
  try {
    stats = statSync(target);
  } catch {
    return 0;
  }
  if (!stats.isDirectory()) return stats.mtimeMs;
  return readdirSync(target).reduce((max, name) => Math.max(max, newest(path.join(target, name))), stats.mtimeMs);
}

export function dashboardIsStale(): boolean {
  const built = newest(BUILT);
  return built === 0 || SOURCES.some((source) => newest(source) > built);
}

/** Runs `vite build` in a child process when the build is stale; resolves once it is current. */
export async function ensureDashboardBuilt(): Promise<"fresh" | "built"> {
  if (!dashboardIsStale()) return "fresh";
  const vite = path.join(ROOT, "node_modules", "vite", "bin", "vite.js");
  await new Promise<void>((resolve, reject) => {
    const child = spawn(process.execPath, [vite, "build", "--config", path.join(DASHBOARD, "vite.config.ts")], { cwd: ROOT, stdio: "inherit" });
    child.once("error", reject);
    child.once("exit", (code) => (code === 0 ? resolve() : reject(new Error(`vite build exited with ${code ?? "a signal"}`))));
  });
  return "built";
}

if (process.argv[1] !== undefined && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  ensureDashboardBuilt().then(
    (result) => console.log(result === "built" ? "dashboard built into dashboard/dist" : "dashboard is up to date"),
    (error: unknown) => {
      console.error(error);
      process.exitCode = 1;
    },
  );
}
