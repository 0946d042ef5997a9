// Hostile request values for the RPC fuzzer, generated from the protobuf descriptors.
//
// A generated request is a base (the contract case's valid request, or an empty message) with
// an overlay: some fields replaced by hostile values chosen by the field's type. Starting from a
// valid request lets a bad value reach the handler's deeper checks instead of the first one.
// On top, wire-level extras that no typed client can express: unknown fields, out-of-range
// varints and invalid UTF-8 written over a known field, a truncated tail.
import { create, ScalarType, type DescField, type DescMessage, type Message } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import fc from "fast-check";

/** The server's message limit (KEEL_MAX_MESSAGE_BYTES default): huge strings sit just under and just over it. */
export const MESSAGE_LIMIT = 4 * 1024 * 1024;

/** Field local name → hostile value; a nested message's value is its own overlay; a oneof's is { case, value }. */
export type Overlay = { readonly [localName: string]: unknown };

/** A value too big to print: fast-check shows its label in a counterexample, the request carries the value. */
export class Huge<T> {
  constructor(
    readonly value: T,
    readonly label: string,
  ) {}
  [fc.toStringMethod](): string {
    return this.label;
  }
}

const labelled = <T extends object>(value: T, label: string): T => Object.assign(value, { [fc.toStringMethod]: () => label });
const unwrap = (value: unknown): unknown => (value instanceof Huge ? (value as Huge<unknown>).value : value);

// Built once: the runs share these instead of allocating megabytes each.
const HUGE_STRINGS = [
  new Huge("x".repeat(4097), '"x" * 4097'),
  new Huge("é".repeat(40_000), '"é" * 40000'),
  new Huge("y".repeat(300 * 1024), '"y" * 300 KiB'),
  new Huge("z".repeat(MESSAGE_LIMIT - 256), '"z" * (4 MiB - 256)'),
  new Huge("w".repeat(MESSAGE_LIMIT + 16), '"w" * (4 MiB + 16)'),
];
const HUGE_BYTES = [new Huge(new Uint8Array(300 * 1024).fill(0xff), "0xff * 300 KiB"), new Huge(new Uint8Array(MESSAGE_LIMIT + 16), "0x00 * (4 MiB + 16)")];
const INVALID_UTF8 = [
  Uint8Array.of(0xff),
  Uint8Array.of(0xc0, 0x80), // overlong NUL
  Uint8Array.of(0xed, 0xa0, 0x80), // a lone surrogate, CESU-8 style
  Uint8Array.of(0x61, 0x00, 0x62),
  Uint8Array.of(0xf4, 0x90, 0x80, 0x80), // above U+10FFFF
];
const NASTY_CHARS = ["\u0000", "\ud800", "\udfff", "a", "é", "😀", " ", "\n", "-", "/", "%", "'", "\\", "\u202e", "\ufeff"];

const I64_MAX = 2n ** 63n - 1n;
const U64_MAX = 2n ** 64n - 1n;

/** Strings the handlers recognise (seeded ids, the demo agent, the host id), so hostile values land beside real ones. */
export function stringArbitrary(known: readonly string[], huge: boolean): fc.Arbitrary<string | Huge<string>> {
  const arbs: fc.WeightedArbitrary<string | Huge<string>>[] = [
    { arbitrary: fc.constantFrom(...known), weight: 4 },
    { arbitrary: fc.string({ maxLength: 40 }), weight: 2 },
    { arbitrary: fc.string({ unit: fc.constantFrom(...NASTY_CHARS), maxLength: 12 }), weight: 3 },
    { arbitrary: fc.constant(""), weight: 1 },
  ];
  if (huge) arbs.push({ arbitrary: fc.constantFrom(...HUGE_STRINGS), weight: 1 });
  return fc.oneof(...arbs);
}

function scalarArbitrary(type: ScalarType, known: readonly string[], huge: boolean): fc.Arbitrary<unknown> {
  switch (type) {
    case ScalarType.STRING:
      return stringArbitrary(known, huge);
    case ScalarType.BYTES:
      return fc.oneof(fc.uint8Array({ maxLength: 64 }), fc.constantFrom(...INVALID_UTF8), ...(huge ? [fc.constantFrom(...HUGE_BYTES)] : []));
    case ScalarType.BOOL:
      return fc.boolean();
    case ScalarType.INT32:
    case ScalarType.SINT32:
    case ScalarType.SFIXED32:
      return fc.oneof(fc.constantFrom(0, -1, 1, 2 ** 31 - 1, -(2 ** 31)), fc.integer());
    case ScalarType.UINT32:
    case ScalarType.FIXED32:
      return fc.oneof(fc.constantFrom(0, 1, 2 ** 31, 2 ** 32 - 1), fc.nat());
    case ScalarType.INT64:
    case ScalarType.SINT64:
    case ScalarType.SFIXED64:
      return fc.oneof(fc.constantFrom(0n, -1n, I64_MAX, -I64_MAX - 1n, 2n ** 53n + 1n), fc.bigInt({ min: -I64_MAX - 1n, max: I64_MAX }));
    case ScalarType.UINT64:
    case ScalarType.FIXED64:
      return fc.oneof(fc.constantFrom(0n, I64_MAX, U64_MAX, 2n ** 32n), fc.bigInt({ min: 0n, max: U64_MAX }));
    case ScalarType.FLOAT:
      return fc.float();
    case ScalarType.DOUBLE:
      return fc.double();
  }
}

const enumArbitrary = (field: DescField): fc.Arbitrary<number> => {
  const known = field.enum?.values.map((v) => v.number) ?? [0];
  return fc.oneof({ arbitrary: fc.constantFrom(...known), weight: 3 }, { arbitrary: fc.constantFrom(-1, 999, 2 ** 31 - 1), weight: 1 });
};

/** One element of a field: a scalar, an enum number, or a nested overlay (`huge` reaching its fields too). */
function elementArbitrary(field: DescField, known: readonly string[], depth: number, huge: boolean): fc.Arbitrary<unknown> {
  if (field.message !== undefined) return overlayArbitrary(field.message, known, depth + 1, huge);
  if (field.enum !== undefined) return enumArbitrary(field);
  return scalarArbitrary(field.scalar ?? ScalarType.STRING, known, huge);
}

function fieldArbitrary(field: DescField, known: readonly string[], depth: number, huge: boolean): fc.Arbitrary<unknown> {
  if (field.fieldKind === "list") {
    const few = fc.array(elementArbitrary(field, known, depth, huge), { maxLength: 4 });
    // Thousands of entries, each small (a message's fields too: 3,000 copies of a 4 MiB string
    // would not fit in our own encoder's buffer): the count is the attack, not the size. Only at
    // the top level: thousands of thousands would measure our own encoder, not the server.
    if (depth > 0) return few;
    return fc.oneof(
      { arbitrary: few, weight: 4 },
      { arbitrary: elementArbitrary(field, known, depth, false).map((e) => labelled(Array.from({ length: 3000 }, () => e), `3000 * ${fc.stringify(e)}`)), weight: 1 },
    );
  }
  if (field.fieldKind === "map") {
    return fc.dictionary(stringArbitrary(known, false) as fc.Arbitrary<string>, elementArbitrary(field, known, depth, false), { maxKeys: 4 });
  }
  return elementArbitrary(field, known, depth, huge);
}

/** Some fields of `desc` (about half of them, each independently) replaced by hostile values. */
export function overlayArbitrary(desc: DescMessage, known: readonly string[], depth = 0, huge = true): fc.Arbitrary<Overlay> {
  if (depth > 3) return fc.constant({});
  const members: Record<string, fc.Arbitrary<unknown>> = {};
  for (const member of desc.members) {
    if (member.kind === "oneof") {
      members[member.localName] = fc.oneof(
        ...member.fields.map((f) => fieldArbitrary(f, known, depth, huge).map((value) => ({ case: f.localName, value }))),
      );
    } else {
      members[member.localName] = fieldArbitrary(member, known, depth, huge);
    }
  }
  return fc.record(members, { requiredKeys: [] });
}

/** Writes `overlay` onto `target` (a message of `desc`), creating nested messages as needed. */
export function applyOverlay<T extends Message>(desc: DescMessage, target: T, overlay: Overlay): T {
  const record = target as unknown as Record<string, unknown>;
  for (const member of desc.members) {
    const value = overlay[member.localName];
    if (value === undefined) continue;
    if (member.kind === "oneof") {
      const chosen = value as { case: string; value: unknown };
      const field = member.fields.find((f) => f.localName === chosen.case)!;
      record[member.localName] = { case: chosen.case, value: fieldValue(field, chosen.value, undefined) };
    } else {
      record[member.localName] = fieldValue(member, value, record[member.localName]);
    }
  }
  return target;
}

function fieldValue(field: DescField, value: unknown, current: unknown): unknown {
  const nested = (message: DescMessage, overlay: unknown, base?: unknown) =>
    applyOverlay(message, (base as Message | undefined) ?? create(message), overlay as Overlay);
  if (field.fieldKind === "message") return nested(field.message, value, current);
  if (field.fieldKind === "list") return (value as unknown[]).map((e) => (field.listKind === "message" ? nested(field.message, e) : unwrap(e)));
  if (field.fieldKind === "map") {
    return Object.fromEntries(Object.entries(value as Record<string, unknown>).map(([k, v]) => [k, field.mapKind === "message" ? nested(field.message, v) : unwrap(v)]));
  }
  return unwrap(value);
}

// ---------------------------------------------------------------------------------------
// Wire-level extras.

export interface UnknownField {
  readonly no: number;
  readonly wireType: WireType;
  readonly data: Uint8Array;
}

const lengthDelimited = (payload: Uint8Array): Uint8Array => new BinaryWriter().bytes(payload).finish();

/** 2,000 levels of a length-delimited field inside another: nesting no schema here allows. */
const DEEP_NESTING = (() => {
  let inner: Uint8Array = new Uint8Array(0);
  for (let i = 0; i < 2000; i++) inner = new BinaryWriter().tag(1, WireType.LengthDelimited).bytes(inner).finish();
  return labelled(lengthDelimited(inner), "2000 nested length-delimited fields");
})();

export const unknownFieldArbitrary: fc.Arbitrary<UnknownField> = fc.oneof<fc.Arbitrary<UnknownField>[]>(
  fc.record({ no: fc.integer({ min: 1000, max: 2 ** 29 - 1 }), wireType: fc.constant(WireType.Varint), data: fc.bigInt({ min: 0n, max: U64_MAX }).map((v: bigint): Uint8Array => new BinaryWriter().uint64(v).finish()) }),
  fc.record({ no: fc.integer({ min: 1000, max: 2 ** 29 - 1 }), wireType: fc.constant(WireType.LengthDelimited), data: fc.uint8Array({ maxLength: 32 }).map(lengthDelimited) }),
  fc.record({ no: fc.integer({ min: 1000, max: 2 ** 29 - 1 }), wireType: fc.constant(WireType.Bit32), data: fc.uint8Array({ minLength: 4, maxLength: 4 }) }),
  fc.record({ no: fc.integer({ min: 1000, max: 2 ** 29 - 1 }), wireType: fc.constant(WireType.Bit64), data: fc.uint8Array({ minLength: 8, maxLength: 8 }) }),
  fc.record({ no: fc.constant(4242), wireType: fc.constant(WireType.LengthDelimited), data: fc.constant(DEEP_NESTING) }),
);

/** Raw bytes appended after the encoded message: the last value of a field wins, so they override it. */
export interface WireOverride {
  readonly fieldNo: number;
  readonly kind: "varint" | "invalid-utf8" | "wrong-wire-type";
  readonly value: bigint;
  readonly bytes: Uint8Array;
}

export function wireOverrideArbitrary(desc: DescMessage): fc.Arbitrary<WireOverride> {
  const numbers = desc.fields.map((f) => f.number);
  return fc.record({
    fieldNo: fc.constantFrom(...(numbers.length > 0 ? numbers : [1])),
    kind: fc.constantFrom("varint" as const, "invalid-utf8" as const, "wrong-wire-type" as const),
    value: fc.constantFrom(U64_MAX, I64_MAX, 2n ** 32n, 2n ** 32n + 5n, 2n ** 31n),
    bytes: fc.constantFrom(...INVALID_UTF8),
  });
}

export function encodeOverride(override: WireOverride): Uint8Array {
  const writer = new BinaryWriter();
  if (override.kind === "varint") writer.tag(override.fieldNo, WireType.Varint).uint64(override.value);
  else if (override.kind === "invalid-utf8") writer.tag(override.fieldNo, WireType.LengthDelimited).bytes(override.bytes);
  else writer.tag(override.fieldNo, WireType.Bit32).fixed32(7);
  return writer.finish();
}
