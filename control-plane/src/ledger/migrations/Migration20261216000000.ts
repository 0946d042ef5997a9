import { Migration } from '@mikro-orm/migrations';

/** Human gates (issue #14): why a gate was decided so, and when. */
export class Migration20261216000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "work_nodes" add column "gate_reason" text null, add column "gate_decided_at" timestamptz null;`);
  }

  override async down(): Promise<void> {
    this.addSql(`alter table "work_nodes" drop column "gate_reason", drop column "gate_decided_at";`);
  }

}
