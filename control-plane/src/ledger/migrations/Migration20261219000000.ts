import { Migration } from '@mikro-orm/migrations';

/**
 * The key of the check tag new token secrets end with, so a made-up secret is refused without a
 * lookup (issue #12, item 5). gen_random_uuid draws on PostgreSQL's strong random source: two of
 * them hashed give 32 bytes with 244 random bits.
 */
export class Migration20261219000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`create table "api_token_keys" ("id" int not null, "key" text not null, "created_at" timestamptz not null default now(), constraint "api_token_keys_pkey" primary key ("id"));`);
    this.addSql(`insert into "api_token_keys" ("id", "key") values (1, encode(sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8')), 'hex'));`);
  }

  override async down(): Promise<void> {
    this.addSql(`drop table if exists "api_token_keys" cascade;`);
  }

}
