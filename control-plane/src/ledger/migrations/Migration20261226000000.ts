import { Migration } from '@mikro-orm/migrations';

/**
 * A call's result is no longer stored a second time as its last observation: tool_invocations
 * holds it (result_text, output_truncated, finished_at). Readers see a call's observations
 * through call_observations, which adds the result after what the call streamed, numbered one past
 * the last of it, as the stored row was. On the hottest path this drops a row, its three index
 * entries, its run key check and a sequence lookup from every iteration that settles a call:
 * about an eighth of a step commit's PostgreSQL time. The result's observation id is its call's.
 */
export class Migration20261226000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`create view call_observations as
      select o.id, o.run_id, o.tool_invocation_id, o.seq, o.stream, o.text, o.truncated, o.observed_at from observations o
      union all
      select i.id, i.run_id, i.id,
        (select coalesce(max(o.seq), 0) + 1 from observations o where o.tool_invocation_id = i.id),
        'result', i.result_text, i.output_truncated, coalesce(i.finished_at, i.created_at)
      from tool_invocations i
      where i.status not in ('pending', 'refused') and i.result_text <> '';`);
    this.addSql(`delete from observations where stream = 'result';`);
  }

  override async down(): Promise<void> {
    this.addSql(`insert into observations (id, run_id, tool_invocation_id, seq, stream, text, truncated, observed_at)
      select gen_random_uuid(), run_id, tool_invocation_id, seq, stream, text, truncated, observed_at from call_observations where stream = 'result';`);
    this.addSql(`drop view call_observations;`);
  }

}
