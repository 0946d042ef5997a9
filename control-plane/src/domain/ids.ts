// Shapes of identifiers. Keel's own ids are UUIDs; connectors' ids are bounded opaque strings.
import { InvalidArgumentError, ResourceExhaustedError } from "./errors.js";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const SLUG = /^[a-z0-9][a-z0-9._-]{0,63}$/;
// Printable, no whitespace or control characters; covers Slack timestamps, UUIDs, e-mail-ish actors.
const EXTERNAL = /^[\x21-\x7e]{1,256}$/;

export function requireUuid(field: string, value: string): string {
  if (value === "") throw new InvalidArgumentError(field, "is required");
  if (!UUID.test(value)) throw new InvalidArgumentError(field, "must be a UUID");
  return value.toLowerCase();
}

export function requireSlug(field: string, value: string): string {
  if (value === "") throw new InvalidArgumentError(field, "is required");
  if (!SLUG.test(value)) {
    throw new InvalidArgumentError(field, "must be 1-64 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit");
  }
  return value;
}

export function requireExternalId(field: string, value: string): string {
  if (value === "") throw new InvalidArgumentError(field, "is required");
  if (!EXTERNAL.test(value)) throw new InvalidArgumentError(field, "must be 1-256 printable ASCII characters without spaces");
  return value;
}

export function optionalExternalId(field: string, value: string): string | undefined {
  return value === "" ? undefined : requireExternalId(field, value);
}

export function requireText(field: string, value: string, maxBytes: number): string {
  if (value.trim() === "") throw new InvalidArgumentError(field, "must not be empty");
  if (byteLength(value) > maxBytes) throw new ResourceExhaustedError(`${field}: must be at most ${maxBytes} bytes`);
  return value;
}

/** UTF-8 length without Node's Buffer, so the domain stays pure. */
export function byteLength(text: string): number {
  let bytes = 0;
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code < 0x80) bytes += 1;
    else if (code < 0x800) bytes += 2;
    else if (code >= 0xd800 && code <= 0xdbff) {
      bytes += 4;
      i++;
    } else bytes += 3;
  }
  return bytes;
}
