import { Migration } from '@mikro-orm/migrations';

/**
 * Sandbox hosts as a fleet shared by every replica: a host row names the replica holding its
 * Attach stream, and sandbox_relays carries commands for a host attached to another replica, and
 * their output and outcome back, between replicas (docs/architecture.md, "Sandbox fleet").
 */
export class Migration20261213000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "sandbox_hosts" add column "replica_id" text not null default '';`);
    this.addSql(`create table "sandbox_relays" ("id" bigserial primary key, "to_replica" text not null, "command_id" text not null, "kind" text not null, "body" jsonb not null, "created_at" timestamptz not null default now());`);
    this.addSql(`create index "sandbox_relays_to_replica_id_index" on "sandbox_relays" ("to_replica", "id");`);
  }

  override async down(): Promise<void> {
    this.addSql(`drop table if exists "sandbox_relays" cascade;`);
    this.addSql(`alter table "sandbox_hosts" drop column "replica_id";`);
  }

}
