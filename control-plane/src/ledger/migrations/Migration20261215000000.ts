import { Migration } from '@mikro-orm/migrations';

/**
 * WorkGraph scheduling (issue #14): a graph's own status and the call that proposed it (which gets
 * the graph's result); per node its admitted order, its child run's spec override, its output and
 * when it finished; per run the spec override a child run is claimed with (tools, policy, slice).
 */
export class Migration20261215000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "work_graphs" add column "status" text not null default 'running', add column "proposed_by_invocation_id" uuid null, add column "finished_at" timestamptz null;`);
    this.addSql(`alter table "work_nodes" add column "ordinal" int not null default 0, add column "child_spec" jsonb null, add column "output" text null, add column "finished_at" timestamptz null;`);
    this.addSql(`alter table "runs" add column "spec_override" jsonb null;`);
  }

  override async down(): Promise<void> {
    this.addSql(`alter table "runs" drop column "spec_override";`);
    this.addSql(`alter table "work_nodes" drop column "ordinal", drop column "child_spec", drop column "output", drop column "finished_at";`);
    this.addSql(`alter table "work_graphs" drop column "status", drop column "proposed_by_invocation_id", drop column "finished_at";`);
  }

}
