import { Migration } from '@mikro-orm/migrations';

/**
 * Settling a tool call changes its status and result. With status in an index, every settle
 * wrote a new entry into each of the table's four indexes; with the run's calls indexed by
 * run_id alone, and a fifth of each page left free for the settle, the update is a HOT update
 * that writes no index entry. The statements that filter a run's calls by status (a stopped
 * run's work done, its open unknown outcomes, a graph's rejected plans) are off the step path
 * and read one run's calls through the run_id index.
 */
export class Migration20261222000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`drop index "tool_invocations_run_id_status_index";`);
    this.addSql(`create index "tool_invocations_run_id_index" on "tool_invocations" ("run_id");`);
    this.addSql(`alter table "tool_invocations" set (fillfactor = 80);`);
  }

  override async down(): Promise<void> {
    this.addSql(`alter table "tool_invocations" reset (fillfactor);`);
    this.addSql(`drop index "tool_invocations_run_id_index";`);
    this.addSql(`create index "tool_invocations_run_id_status_index" on "tool_invocations" ("run_id", "status");`);
  }

}
