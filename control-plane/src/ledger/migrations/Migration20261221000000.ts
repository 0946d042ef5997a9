import { Migration } from '@mikro-orm/migrations';

/**
 * An agent's policy as a column of its own, generated from the spec. Every step commit and
 * control read returns the run's policy; taken from the spec, a spec of a few KiB (stored
 * compressed) was decompressed whole each time, the largest single cost in PostgreSQL's profile
 * of a step commit.
 */
export class Migration20261221000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "agents" add column "policy" jsonb null generated always as (spec -> 'policy') stored;`);
  }

  override async down(): Promise<void> {
    this.addSql(`alter table "agents" drop column "policy";`);
  }

}
