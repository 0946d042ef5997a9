import { Migration } from '@mikro-orm/migrations';

/**
 * Human gates, verify nodes and replans (issue #14): why a gate was decided so and when; the node
 * a verify node checks; and a root may have several graphs, one per revision (a replan after a
 * failed graph), the latest being the live one.
 */
export class Migration20261216000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "work_nodes" add column "gate_reason" text null, add column "gate_decided_at" timestamptz null, add column "subject" text null;`);
    this.addSql(`alter table "work_graphs" drop constraint "work_graphs_root_run_id_unique";`);
    this.addSql(`alter table "work_graphs" add constraint "work_graphs_root_run_id_revision_unique" unique ("root_run_id", "revision");`);
  }

  override async down(): Promise<void> {
    this.addSql(`alter table "work_graphs" drop constraint "work_graphs_root_run_id_revision_unique";`);
    this.addSql(`alter table "work_graphs" add constraint "work_graphs_root_run_id_unique" unique ("root_run_id");`);
    this.addSql(`alter table "work_nodes" drop column "gate_reason", drop column "gate_decided_at", drop column "subject";`);
  }

}
