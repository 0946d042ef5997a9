import { Migration } from '@mikro-orm/migrations';

/**
 * A progress notice carries its run's conversation. Admission reads a conversation's latest
 * notices on every message; found through the conversation's runs, that read visited every run
 * the conversation ever had. Existing notices take their run's conversation.
 */
export class Migration20261220000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "progress_events" add column "conversation_id" uuid null;`);
    this.addSql(`update "progress_events" pe set "conversation_id" = r."conversation_id" from "runs" r where r."id" = pe."run_id";`);
    this.addSql(`alter table "progress_events" alter column "conversation_id" set not null;`);
    this.addSql(`alter table "progress_events" add constraint "progress_events_conversation_id_foreign" foreign key ("conversation_id") references "conversations" ("id") on update no action on delete no action;`);
    this.addSql(`create index "progress_events_conversation_id_created_at_seq_index" on "progress_events" ("conversation_id", "created_at", "seq");`);
  }

  override async down(): Promise<void> {
    this.addSql(`drop index "progress_events_conversation_id_created_at_seq_index";`);
    this.addSql(`alter table "progress_events" drop constraint "progress_events_conversation_id_foreign";`);
    this.addSql(`alter table "progress_events" drop column "conversation_id";`);
  }

}
