import { Migration } from '@mikro-orm/migrations';

/**
 * run_events is the run's log for watchers: its step_id and tool_invocation_id name rows the same
 * fenced statement writes beside the event, and nothing looks an event up by them. Their foreign
 * keys cost a key check per event, and their indexes (there only so a delete of a step or a call
 * could find the events naming it) an entry per event, on every iteration of every run.
 * Retention deletes a run's events before its steps and calls, as it did.
 */
export class Migration20261223000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "run_events" drop constraint "run_events_step_id_foreign";`);
    this.addSql(`alter table "run_events" drop constraint "run_events_tool_invocation_id_foreign";`);
    this.addSql(`drop index "run_events_step_id_index";`);
    this.addSql(`drop index "run_events_tool_invocation_id_index";`);
  }

  override async down(): Promise<void> {
    this.addSql(`create index "run_events_step_id_index" on "run_events" ("step_id") where "step_id" is not null;`);
    this.addSql(`create index "run_events_tool_invocation_id_index" on "run_events" ("tool_invocation_id") where "tool_invocation_id" is not null;`);
    this.addSql(`alter table "run_events" add constraint "run_events_step_id_foreign" foreign key ("step_id") references "run_steps" ("id") on update no action on delete no action;`);
    this.addSql(`alter table "run_events" add constraint "run_events_tool_invocation_id_foreign" foreign key ("tool_invocation_id") references "tool_invocations" ("id") on update no action on delete no action;`);
  }

}
