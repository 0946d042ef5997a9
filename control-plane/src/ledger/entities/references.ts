import { defineEntity, type EntitySchema } from "@mikro-orm/core";

/**
 * A foreign key to `target`'s primary key, kept as the plain id (no entity loading: only the
 * schema is described here). The ledger never deletes rows nor changes ids, so the rules are
 * NO ACTION both ways: a delete that would orphan a row fails instead of rewriting history.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- any entity schema may be referenced
export function references<Target extends EntitySchema<any, any>>(target: Target, column: string) {
  return defineEntity.properties.manyToOne(target).mapToPk().fieldName(column).updateRule("no action").deleteRule("no action");
}
