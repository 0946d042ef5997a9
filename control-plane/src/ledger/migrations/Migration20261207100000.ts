import { Migration } from '@mikro-orm/migrations';

/**
 * Indexes retention needs: deleting a run (and its steps, calls and invocations) makes PostgreSQL
 * look up every row that could still reference it, which without an index is a scan of the whole
 * referencing table per deleted row. Columns that are mostly null get partial indexes, so the hot
 * inserts that leave them null pay nothing; finished_at finds the runs old enough to delete.
 */
export class Migration20261207100000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`create index "runs_finished_at_index" on "runs" ("finished_at") where "finished_at" is not null;`);
    this.addSql(`create index "runs_parent_run_id_index" on "runs" ("parent_run_id") where "parent_run_id" is not null;`);
    this.addSql(`create index "runs_root_run_id_index" on "runs" ("root_run_id") where "root_run_id" is not null;`);
    this.addSql(`create index "runs_superseded_by_run_id_index" on "runs" ("superseded_by_run_id") where "superseded_by_run_id" is not null;`);
    this.addSql(`create index "runs_inherits_from_run_id_index" on "runs" ("inherits_from_run_id") where "inherits_from_run_id" is not null;`);
    this.addSql(`create index "messages_run_id_index" on "messages" ("run_id");`);
    this.addSql(`create index "run_events_step_id_index" on "run_events" ("step_id") where "step_id" is not null;`);
    this.addSql(`create index "run_events_tool_invocation_id_index" on "run_events" ("tool_invocation_id") where "tool_invocation_id" is not null;`);
    this.addSql(`create index "tool_invocations_model_call_id_index" on "tool_invocations" ("model_call_id") where "model_call_id" is not null;`);
    this.addSql(`create index "artifacts_tool_invocation_id_index" on "artifacts" ("tool_invocation_id") where "tool_invocation_id" is not null;`);
  }

  override async down(): Promise<void> {
    for (const name of [
      "runs_finished_at_index", "runs_parent_run_id_index", "runs_root_run_id_index", "runs_superseded_by_run_id_index",
      "runs_inherits_from_run_id_index", "messages_run_id_index", "run_events_step_id_index", "run_events_tool_invocation_id_index",
      "tool_invocations_model_call_id_index", "artifacts_tool_invocation_id_index",
    ]) {
      this.addSql(`drop index "${name}";`);
    }
  }

}
