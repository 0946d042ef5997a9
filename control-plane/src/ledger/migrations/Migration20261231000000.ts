import { Migration } from '@mikro-orm/migrations';

/** What model_calls is now: a step's call read from its step row, beside the calls made beside the loop. */
const MODEL_CALLS_VIEW = `create view model_calls as
      select s.call_id as id, s.run_id, s.id as step_id, null::text as purpose, s.call_role as role, s.call_provider as provider,
        s.call_model as model, s.call_request as request, s.call_response_text as response_text, s.call_tool_calls as tool_calls,
        s.call_input_tokens as input_tokens, s.call_output_tokens as output_tokens, s.call_latency_ms as latency_ms,
        s.call_finish_reason as finish_reason, s.call_cost_micro_usd as cost_micro_usd, s.committed_at as created_at
      from run_steps s where s.call_id is not null
      union all
      select c.id, c.run_id, null::uuid, c.purpose, c.role, c.provider, c.model, c.request, c.response_text, c.tool_calls,
        c.input_tokens, c.output_tokens, c.latency_ms, c.finish_reason, c.cost_micro_usd, c.created_at
      from side_model_calls c;`;

/**
 * A step's model call is stored on the step's row, which the same commit writes: one row, one
 * primary key and one run-key check fewer on every iteration (about a fifteenth of a held
 * commit's round trip). A step has at most one call, written only by the commit that writes the
 * step, so the two rows always came and went together. The calls beside the loop (triage,
 * follow-up, consent, progress), which have no step, keep a table of their own,
 * side_model_calls. Readers see every call as before through the view model_calls.
 */
export class Migration20261231000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "run_steps" add column "call_id" uuid null, add column "call_role" text null, add column "call_provider" text null,
      add column "call_model" text null, add column "call_request" jsonb null, add column "call_response_text" text null,
      add column "call_tool_calls" jsonb null, add column "call_input_tokens" int null, add column "call_output_tokens" int null,
      add column "call_latency_ms" int null, add column "call_finish_reason" text null, add column "call_cost_micro_usd" bigint null;`);
    this.addSql(`update run_steps s set call_id = m.id, call_role = m.role, call_provider = m.provider, call_model = m.model,
      call_request = m.request, call_response_text = m.response_text, call_tool_calls = m.tool_calls, call_input_tokens = m.input_tokens,
      call_output_tokens = m.output_tokens, call_latency_ms = m.latency_ms, call_finish_reason = m.finish_reason, call_cost_micro_usd = m.cost_micro_usd
      from model_calls m where m.run_id = s.run_id and m.step_id = s.id;`);
    this.addSql(`delete from model_calls m using run_steps s where s.call_id = m.id;`);
    this.addSql(`alter table "model_calls" rename to "side_model_calls";`);
    this.addSql(`alter table "side_model_calls" rename constraint "model_calls_pkey" to "side_model_calls_pkey";`);
    this.addSql(`alter table "side_model_calls" rename constraint "model_calls_run_id_foreign" to "side_model_calls_run_id_foreign";`);
    this.addSql(`drop index "model_calls_run_id_step_id_index";`);
    this.addSql(`alter table "side_model_calls" drop column "step_id";`);
    this.addSql(`create index "side_model_calls_run_id_index" on "side_model_calls" ("run_id");`);
    this.addSql(MODEL_CALLS_VIEW);
  }

  override async down(): Promise<void> {
    this.addSql(`drop view model_calls;`);
    this.addSql(`drop index "side_model_calls_run_id_index";`);
    this.addSql(`alter table "side_model_calls" add column "step_id" uuid null;`);
    this.addSql(`create index "model_calls_run_id_step_id_index" on "side_model_calls" ("run_id", "step_id");`);
    this.addSql(`alter table "side_model_calls" rename constraint "side_model_calls_run_id_foreign" to "model_calls_run_id_foreign";`);
    this.addSql(`alter table "side_model_calls" rename constraint "side_model_calls_pkey" to "model_calls_pkey";`);
    this.addSql(`alter table "side_model_calls" rename to "model_calls";`);
    this.addSql(`insert into model_calls (id, run_id, step_id, role, provider, model, request, response_text, tool_calls, input_tokens,
      output_tokens, latency_ms, finish_reason, cost_micro_usd, created_at)
      select call_id, run_id, id, call_role, call_provider, call_model, call_request, call_response_text, call_tool_calls, call_input_tokens,
        call_output_tokens, call_latency_ms, call_finish_reason, call_cost_micro_usd, committed_at
      from run_steps where call_id is not null;`);
    this.addSql(`alter table "run_steps" drop column "call_id", drop column "call_role", drop column "call_provider", drop column "call_model",
      drop column "call_request", drop column "call_response_text", drop column "call_tool_calls", drop column "call_input_tokens",
      drop column "call_output_tokens", drop column "call_latency_ms", drop column "call_finish_reason", drop column "call_cost_micro_usd";`);
  }

}
