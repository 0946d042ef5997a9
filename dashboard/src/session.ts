// The operator's sign-in lives in sessionStorage: it dies with the tab and never enters a URL,
// so it is not in history, bookmarks or a Referer header.
const TOKEN_KEY = "keel.token";
const ACTOR_KEY = "keel.actor";

export interface Session {
  readonly token: string;
  /** Who the operator says they are: recorded as the actor of every action they take. */
  readonly actor: string;
}

export function loadSession(): Session | undefined {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const actor = sessionStorage.getItem(ACTOR_KEY);
  return token === null || actor === null ? undefined : { token, actor };
}

export function saveSession(session: Session): void {
  sessionStorage.setItem(TOKEN_KEY, session.token);
  sessionStorage.setItem(ACTOR_KEY, session.actor);
}

export function clearSession(): void {
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(ACTOR_KEY);
}
