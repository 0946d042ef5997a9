// Polling for a state a test waits on, for the integration tests that watch the ledger or the API.

/** Resolves with the first defined value `read` gives, polled every 100 ms; throws after a minute, naming `what`. */
export async function until<T>(what: string, read: () => Promise<T | undefined>): Promise<T> {
  for (let i = 0; i < 600; i++) {
    const value = await read();
    if (value !== undefined) return value;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`timed out waiting for ${what}`);
}
