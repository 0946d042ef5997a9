import { Migration } from '@mikro-orm/migrations';

/**
 * A step's model call and tool calls name the step, and a call its model call, all written by the
 * one fenced statement that also writes what they name; a call's result observation names the call
 * that statement settles by key. Their foreign keys re-checked that, each check locking the row it
 * found and logging the lock, on every iteration of every run: about a tenth of a step commit's
 * PostgreSQL time. Streamed observations now name only a call of their run that exists (the
 * append selects it). Every row keeps its key to its run, and retention deletes children first.
 * tool_invocations_model_call_id_index served only its key: nothing looks a call up by it.
 */
export class Migration20261224000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "model_calls" drop constraint "model_calls_step_id_foreign";`);
    this.addSql(`alter table "tool_invocations" drop constraint "tool_invocations_step_id_foreign";`);
    this.addSql(`alter table "tool_invocations" drop constraint "tool_invocations_model_call_id_foreign";`);
    this.addSql(`alter table "observations" drop constraint "observations_tool_invocation_id_foreign";`);
    this.addSql(`drop index "tool_invocations_model_call_id_index";`);
  }

  override async down(): Promise<void> {
    this.addSql(`create index "tool_invocations_model_call_id_index" on "tool_invocations" ("model_call_id") where "model_call_id" is not null;`);
    this.addSql(`alter table "observations" add constraint "observations_tool_invocation_id_foreign" foreign key ("tool_invocation_id") references "tool_invocations" ("id") on update no action on delete no action;`);
    this.addSql(`alter table "tool_invocations" add constraint "tool_invocations_model_call_id_foreign" foreign key ("model_call_id") references "model_calls" ("id") on update no action on delete no action;`);
    this.addSql(`alter table "tool_invocations" add constraint "tool_invocations_step_id_foreign" foreign key ("step_id") references "run_steps" ("id") on update no action on delete no action;`);
    this.addSql(`alter table "model_calls" add constraint "model_calls_step_id_foreign" foreign key ("step_id") references "run_steps" ("id") on update no action on delete no action;`);
  }

}
