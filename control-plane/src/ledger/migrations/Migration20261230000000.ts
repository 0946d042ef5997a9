import { Migration } from '@mikro-orm/migrations';

/**
 * model_calls and tool_invocations were indexed on run_id and on step_id apart, so every iteration
 * wrote four index entries for its call and its intent. Each now has one index on (run_id,
 * step_id): a run's rows are its prefix, and readers find a step's rows through the step's run.
 * About a twentieth of a held commit's round trip.
 */
export class Migration20261230000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`drop index "model_calls_run_id_index";`);
    this.addSql(`drop index "model_calls_step_id_index";`);
    this.addSql(`create index "model_calls_run_id_step_id_index" on "model_calls" ("run_id", "step_id");`);
    this.addSql(`drop index "tool_invocations_run_id_index";`);
    this.addSql(`drop index "tool_invocations_step_id_index";`);
    this.addSql(`create index "tool_invocations_run_id_step_id_index" on "tool_invocations" ("run_id", "step_id");`);
  }

  override async down(): Promise<void> {
    this.addSql(`drop index "tool_invocations_run_id_step_id_index";`);
    this.addSql(`create index "tool_invocations_step_id_index" on "tool_invocations" ("step_id");`);
    this.addSql(`create index "tool_invocations_run_id_index" on "tool_invocations" ("run_id");`);
    this.addSql(`drop index "model_calls_run_id_step_id_index";`);
    this.addSql(`create index "model_calls_step_id_index" on "model_calls" ("step_id");`);
    this.addSql(`create index "model_calls_run_id_index" on "model_calls" ("run_id");`);
  }

}
