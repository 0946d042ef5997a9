import { Migration } from '@mikro-orm/migrations';

/**
 * Per-node workspaces (issue #14): whether a node's child run works in a workspace of its own,
 * which a join after it reconciles.
 */
export class Migration20261217000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "work_nodes" add column "needs_workspace" boolean not null default false;`);
  }

  override async down(): Promise<void> {
    this.addSql(`alter table "work_nodes" drop column "needs_workspace";`);
  }

}
