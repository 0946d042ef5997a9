// Images pinned by content: the first time this process uses a tag it resolves it to the image
// id (sha256 of the image config) and creates every later container from that id, so retagging
// or pulling the tag on the engine cannot change what new workspaces run. The pin is logged.
import type Dockerode from "dockerode";
import { statusCode } from "./engine-errors.js";

export interface ImagePins {
  /** The image id the reference is pinned to; an id reference is its own pin. */
  resolve(reference: string): Promise<string>;
  /** Forgets a pin whose image went away (the next use resolves the tag again). */
  forget(reference: string): void;
}

export function createImagePins(docker: Dockerode, log: (msg: string) => void): ImagePins {
  const pins = new Map<string, Promise<string>>();

  async function resolveNow(reference: string): Promise<string> {
    const info = await docker.getImage(reference).inspect();
    const digests = info.RepoDigests.length > 0 ? ` (${info.RepoDigests.join(", ")})` : "";
    log(`image ${reference} pinned to ${info.Id}${digests}`);
    return info.Id;
  }

  return {
    resolve(reference) {
      if (/^sha256:[0-9a-f]{64}$/.test(reference)) return Promise.resolve(reference);
      let pin = pins.get(reference);
      if (pin === undefined) {
        pin = resolveNow(reference).catch((error: unknown) => {
          pins.delete(reference);
          throw statusCode(error) === 404 ? new Error(`image ${reference} is not on the engine (pull or build it first)`, { cause: error }) : error;
        });
        pins.set(reference, pin);
      }
      return pin;
    },

    forget(reference) {
      pins.delete(reference);
    },
  };
}
