// The dashboard's shell: sign-in, then a hash route per view (#/ for runs, #/runs/ID for one run,
// #/hosts for the sandbox hosts).
// Only run ids ever appear in the URL; the token stays in sessionStorage.
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { HostsPage } from "./hosts-page.js";
import { RunPage } from "./run-page.js";
import { RunsTable } from "./runs-table.js";
import { clearSession, loadSession, type Session } from "./session.js";
import { SignIn } from "./sign-in.js";
import "./styles.css";

type Route = { readonly view: "runs" } | { readonly view: "hosts" } | { readonly view: "run"; readonly runId: string };

function routeOf(hash: string): Route {
  if (hash === "#/hosts") return { view: "hosts" };
  const match = /^#\/runs\/([0-9a-fA-F-]{36})$/.exec(hash);
  return match?.[1] === undefined ? { view: "runs" } : { view: "run", runId: match[1] };
}

function App() {
  const [session, setSession] = useState<Session | undefined>(loadSession);
  const [route, setRoute] = useState<Route>(() => routeOf(window.location.hash));

  useEffect(() => {
    const onHash = () => setRoute(routeOf(window.location.hash));
    window.addEventListener("hashchange", onHash);
    return () => window.removeEventListener("hashchange", onHash);
  }, []);

  if (session === undefined) return <SignIn onSignedIn={setSession} />;
  const signOut = () => {
    clearSession();
    setSession(undefined);
  };
  return (
    <div class="shell">
      <header class="topbar">
        <a class="brand" href="#/">
          Keel
        </a>
        <nav aria-label="main">
          <a href="#/" aria-current={route.view === "runs" ? "page" : undefined}>
            Runs
          </a>
          <a href="#/hosts" aria-current={route.view === "hosts" ? "page" : undefined}>
            Sandbox hosts
          </a>
        </nav>
        <span class="who" data-testid="actor">
          {session.actor}
        </span>
        <button type="button" class="quiet" onClick={signOut}>
          Sign out
        </button>
      </header>
      <main id="main">
        {route.view === "runs" ? <RunsTable /> : route.view === "hosts" ? <HostsPage /> : <RunPage key={route.runId} runId={route.runId} actor={session.actor} />}
      </main>
    </div>
  );
}

const root = document.getElementById("app");
if (root !== null) render(<App />, root);
