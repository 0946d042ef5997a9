import { Migration } from '@mikro-orm/migrations';

/**
 * A model request's tool list is stored once, in model_tool_sets under the digest of its JSON,
 * and a request names it ("toolSet") instead of carrying it. A run's first request carried the
 * whole list, every run again: 5.5 KB for the demo agent's three built-in tools, compressed and
 * moved out of line by TOAST on every new run (pglz alone was 4% of PostgreSQL's CPU in
 * first-slice). Requests stored before this keep their lists inline; readers take either form.
 */
export class Migration20261228000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`create table "model_tool_sets" ("digest" text not null, "tools" jsonb not null, "created_at" timestamptz not null default now(), constraint "model_tool_sets_pkey" primary key ("digest"));`);
  }

  override async down(): Promise<void> {
    this.addSql(`update model_calls m set request = (m.request - 'toolSet') || jsonb_build_object('tools', t.tools)
      from model_tool_sets t where m.request ? 'toolSet' and t.digest = m.request ->> 'toolSet';`);
    this.addSql(`drop table "model_tool_sets";`);
  }

}
