// Sign-in by pasting a token: it is checked with one ListRuns call before it is kept.
import { Code, ConnectError } from "@connectrpc/connect";
import { useState } from "preact/hooks";
import { runService } from "./client.js";
import { errorText } from "./format.js";
import { clearSession, saveSession, type Session } from "./session.js";

export function SignIn(props: { readonly onSignedIn: (session: Session) => void }) {
  const [token, setToken] = useState("");
  const [actor, setActor] = useState("");
  const [error, setError] = useState("");
  const [busy, setBusy] = useState(false);

  const submit = async (event: Event) => {
    event.preventDefault();
    const session = { token: token.trim(), actor: actor.trim() };
    if (session.token === "" || session.actor === "") {
      setError("Both the token and your name are needed.");
      return;
    }
    setBusy(true);
    saveSession(session);
    try {
      await runService.listRuns({ pageSize: 1 });
      props.onSignedIn(session);
    } catch (caught) {
      clearSession();
      const denied = caught instanceof ConnectError && (caught.code === Code.Unauthenticated || caught.code === Code.PermissionDenied);
      setError(denied ? `This token cannot read runs: ${errorText(caught)}` : errorText(caught));
    } finally {
      setBusy(false);
    }
  };

  return (
    <main class="signin">
      <form onSubmit={(event) => void submit(event)} aria-labelledby="signin-title">
        <h1 id="signin-title">Sign in to Keel</h1>
        <p class="muted">Paste an operator token. It is kept in this tab only (sessionStorage) and sent as a bearer header.</p>
        <label>
          Operator token
          <input name="token" type="password" autoComplete="off" value={token} onInput={(e) => setToken(e.currentTarget.value)} autoFocus />
        </label>
        <label>
          Your name (recorded on every action)
          <input name="actor" autoComplete="username" value={actor} onInput={(e) => setActor(e.currentTarget.value)} />
        </label>
        <p class="error" role="alert">
          {error}
        </p>
        <button type="submit" disabled={busy}>
          Sign in
        </button>
      </form>
    </main>
  );
}
