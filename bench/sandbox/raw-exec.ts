// Raw dockerode exec: the baseline for the exec round trip and the stream.
import type { Duplex } from "node:stream";
import type Dockerode from "dockerode";
import { createDemuxer } from "../../sandbox-agent/src/docker/demuxer.js";

const delay = (millis: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, millis));

/** Counts the payload bytes of Docker's multiplexed stream with the backend's own demuxer. */
function payloadCounter(): { feed(chunk: Buffer): void; readonly bytes: number } {
  let bytes = 0;
  const feed = createDemuxer((_stream, chunk) => {
    bytes += chunk.length;
  });
  return {
    feed,
    get bytes() {
      return bytes;
    },
  };
}

/** Creates, starts and reads an exec to its end, then inspects it for its exit code (polling, as the engine may lag the stream). */
export async function rawExec(container: Dockerode.Container, cmd: readonly string[]): Promise<{ exitCode: number | null; bytes: number }> {
  const exec = await container.exec({ Cmd: [...cmd], AttachStdin: false, AttachStdout: true, AttachStderr: true, Tty: false });
  const stream: Duplex = await exec.start({ hijack: true, stdin: false });
  const counter = payloadCounter();
  try {
    await new Promise<void>((resolve, reject) => {
      stream.on("data", (chunk: Buffer) => counter.feed(chunk));
      stream.once("end", resolve);
      stream.once("close", resolve);
      stream.once("error", reject);
    });
  } finally {
    stream.destroy();
  }
  for (let step = 2; ; step = Math.min(step * 2, 50)) {
    const info = await exec.inspect();
    if (!info.Running) return { exitCode: info.ExitCode, bytes: counter.bytes };
    await delay(step);
  }
}
