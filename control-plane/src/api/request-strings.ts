// PostgreSQL text cannot hold NUL, so a string field carrying one would fail deep in a
// transaction as Internal. Every request is checked here first, field by field through the
// descriptor, and refused as InvalidArgument naming the field: one rule for every RPC.
import { ScalarType, type DescMessage, type Message } from "@bufbuild/protobuf";
import { isReflectMessage, reflect, type ReflectMessage } from "@bufbuild/protobuf/reflect";
import type { Interceptor } from "@connectrpc/connect";
import { InvalidArgumentError } from "../domain/errors.js";

const hasNul = (value: unknown): boolean => typeof value === "string" && value.includes("\0");

/** The path of the first string field (or string map key) holding a NUL character, if any. */
export function fieldWithNul(message: ReflectMessage, prefix = ""): string | undefined {
  for (const field of message.fields) {
    if (!message.isSet(field)) continue;
    const path = `${prefix}${field.name}`;
    switch (field.fieldKind) {
      case "scalar":
        if (field.scalar === ScalarType.STRING && hasNul(message.get(field))) return path;
        break;
      case "message": {
        const found = fieldWithNul(message.get(field), `${path}.`);
        if (found !== undefined) return found;
        break;
      }
      case "list": {
        let index = 0;
        for (const item of message.get(field)) {
          const found = isReflectMessage(item) ? fieldWithNul(item, `${path}[${index}].`) : hasNul(item) ? `${path}[${index}]` : undefined;
          if (found !== undefined) return found;
          index += 1;
        }
        break;
      }
      case "map":
        for (const [key, value] of message.get(field)) {
          if (hasNul(key)) return `${path} (a key)`;
          const found = isReflectMessage(value) ? fieldWithNul(value, `${path}[${String(key)}].`) : hasNul(value) ? `${path}[${String(key)}]` : undefined;
          if (found !== undefined) return found;
        }
        break;
      default:
        break;
    }
  }
  return undefined;
}

function check(schema: DescMessage, message: Message): void {
  const field = fieldWithNul(reflect(schema, message));
  if (field !== undefined) throw new InvalidArgumentError(field, "must not contain a NUL character");
}

/** Refuses any request message with a NUL in a string field, including each message of a client stream. */
export function nulStringInterceptor(): Interceptor {
  return (next) => async (request) => {
    const schema = request.method.input;
    if (!request.stream) {
      check(schema, request.message);
      return next(request);
    }
    const messages = request.message;
    return next({
      ...request,
      message: (async function* () {
        for await (const message of messages) {
          check(schema, message);
          yield message;
        }
      })(),
    });
  };
}
