import { Migration } from '@mikro-orm/migrations';

/** Conversations: logical requests, supersession and continuation lineage, positioned triggers, message edits. */
export class Migration20261201000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "runs" add column "logical_request_id" uuid null, add column "request_received_at" timestamptz null, add column "interruptions" int not null default 0, add column "trigger_count" int not null default 0, add column "inherits_from_run_id" uuid null;`);
    this.addSql(`create unique index "runs_continuation_of_run_id_unique" on "runs" ("continuation_of_run_id") where "continuation_of_run_id" is not null;`);
    this.addSql(`create index "runs_logical_request_id_index" on "runs" ("logical_request_id");`);

    this.addSql(`alter table "run_triggers" add column "relation" text not null default 'initial', add column "after_step" int not null default 0, add column "inherited" boolean not null default false, add column "ordinal" int not null default 0;`);
    this.addSql(`create index "run_triggers_message_id_index" on "run_triggers" ("message_id");`);

    this.addSql(`alter table "messages" add column "edit_of_message_id" uuid null;`);

    this.addSql(`alter table "run_events" alter column "at" set default clock_timestamp();`);
  }

}
