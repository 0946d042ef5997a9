// Shapes of identifiers, shared by the control plane and the sandbox agent. Keel's own ids are
// UUIDs; connectors' ids are bounded opaque strings. Pure: each check returns what is wrong
// with a value (or undefined), and each side throws its own error type with that reason.

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const SLUG = /^[a-z0-9][a-z0-9._-]{0,63}$/;
// Printable, no whitespace or control characters; covers Slack timestamps, UUIDs, e-mail-ish actors.
const EXTERNAL = /^[\x21-\x7e]{1,256}$/;

export const REQUIRED = "is required";

export function uuidProblem(value: string): string | undefined {
  if (value === "") return REQUIRED;
  return UUID.test(value) ? undefined : "must be a UUID";
}

export function slugProblem(value: string): string | undefined {
  if (value === "") return REQUIRED;
  return SLUG.test(value) ? undefined : "must be 1-64 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit";
}

export function externalIdProblem(value: string): string | undefined {
  if (value === "") return REQUIRED;
  return EXTERNAL.test(value) ? undefined : "must be 1-256 printable ASCII characters without spaces";
}

/** UTF-8 length without Node's Buffer, so callers stay pure. */
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
