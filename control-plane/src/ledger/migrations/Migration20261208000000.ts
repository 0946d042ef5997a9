import { Migration } from '@mikro-orm/migrations';

/**
 * Triage and side model calls. A root run stores its triage (duration, shape, the stashed ack
 * copy, and why it fell back when it did); fast- and decision-model calls made outside a step
 * (triage, follow-up classification, continuation consent) are model calls with no step and a
 * purpose, and their usage accumulates in side_usage, which step commits never overwrite.
 */
export class Migration20261208000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "runs" add column "triage_duration" text null, add column "triage_shape" text null, add column "triage_ack_text" text null, add column "triage_fallback" text null, add column "side_usage" jsonb not null default '{}';`);
    this.addSql(`alter table "model_calls" alter column "step_id" drop not null;`);
    this.addSql(`alter table "model_calls" add column "purpose" text null;`);
  }

  override async down(): Promise<void> {
    this.addSql(`alter table "model_calls" drop column "purpose";`);
    this.addSql(`alter table "model_calls" alter column "step_id" set not null;`);
    this.addSql(`alter table "runs" drop column "triage_duration", drop column "triage_shape", drop column "triage_ack_text", drop column "triage_fallback", drop column "side_usage";`);
  }

}
