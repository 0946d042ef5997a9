// A TCP relay to a server (PostgreSQL here) that a test can cut, dropping every connection and
// refusing new ones, and open again on the same port: the database goes away for real.
import net from "node:net";

export class TcpRelay {
  private server: net.Server | undefined;
  private readonly sockets = new Set<net.Socket>();
  port = 0;

  constructor(private readonly target: net.NetConnectOpts) {}

  /** A relay to the database of a postgres:// URL, whether it listens on TCP or a Unix socket. */
  static toDatabase(databaseUrl: string): TcpRelay {
    const url = new URL(databaseUrl);
    const host = decodeURIComponent(url.hostname);
    return new TcpRelay(host.startsWith("/") ? { path: `${host}/.s.PGSQL.${url.port}` } : { host, port: Number(url.port) });
  }

  /** The same database URL, reached through this relay. */
  relayed(databaseUrl: string): string {
    const url = new URL(databaseUrl);
    url.hostname = "127.0.0.1";
    url.port = String(this.port);
    return url.toString();
  }

  async open(): Promise<void> {
    if (this.server !== undefined) return;
    const server = net.createServer((client) => {
      const upstream = net.connect(this.target);
      for (const socket of [client, upstream]) {
        this.sockets.add(socket);
        socket.on("close", () => this.sockets.delete(socket));
        socket.on("error", () => {});
      }
      client.pipe(upstream).pipe(client);
    });
    await new Promise<void>((resolve) => server.listen(this.port, "127.0.0.1", resolve));
    this.port = (server.address() as net.AddressInfo).port;
    this.server = server;
  }

  async cut(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => (server === undefined ? resolve() : server.close(() => resolve())));
  }
}
