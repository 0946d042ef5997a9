import { Migration } from '@mikro-orm/migrations';

/**
 * Progress notices. Each row is one notice of a subject (a logical request): its copy, what brought
 * it (the triage's ack, the deadline, a checkpoint, the first workspace), the candidates it
 * covered (report_progress invocation ids, "workspace") so none is said twice, and the emission
 * that carries it, whose delivery status is the receipt. created_at is the supervisor's clock.
 */
export class Migration20261210000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "progress_events" add column "source" text not null default 'deadline', add column "covers" jsonb not null default '[]';`);
    this.addSql(`create index "progress_events_run_id_index" on "progress_events" ("run_id");`);
  }

  override async down(): Promise<void> {
    this.addSql(`drop index "progress_events_run_id_index";`);
    this.addSql(`alter table "progress_events" drop column "source", drop column "covers";`);
  }

}
