import { Migration } from '@mikro-orm/migrations';

/**
 * A fenced commit no longer writes a run_events row for what its own rows already say: the step's
 * event (step_committed) is read from the step row, and each call it settles has its event
 * (tool_settled) read from the call row, each by the number the commit gave it. Readers see every
 * event through run_event_feed. On the hottest path this drops two rows, their index entries and
 * their key checks from every iteration: about a sixth of a held commit's round trip. A settled
 * call's event says its status and the first 120 characters of its result, as the stored one did.
 * Events written before keep their rows; every other event (claims, status changes, refusals,
 * answers) is still a row.
 */
export class Migration20261229000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "run_steps" add column "event_seq" int null, add column "event_summary" text null;`);
    this.addSql(`alter table "tool_invocations" add column "settled_seq" int null;`);
    this.addSql(`create view run_event_feed as
      select e.run_id, e.seq, e.kind, e.status, e.step_id, e.tool_invocation_id, e.summary, e.at from run_events e
      union all
      select s.run_id, s.event_seq, 'step_committed', s.run_status_after, s.id, null::uuid, coalesce(s.event_summary, ''), s.committed_at
      from run_steps s where s.event_seq is not null
      union all
      select i.run_id, i.settled_seq, 'tool_settled', null::text, null::uuid, i.id, i.status || ': ' || left(coalesce(i.result_text, ''), 120),
        coalesce(i.finished_at, i.created_at)
      from tool_invocations i where i.settled_seq is not null;`);
  }

  override async down(): Promise<void> {
    this.addSql(`insert into run_events (run_id, seq, kind, status, step_id, tool_invocation_id, summary, at)
      select run_id, seq, kind, status, step_id, tool_invocation_id, summary, at from run_event_feed f
      where not exists (select 1 from run_events e where e.run_id = f.run_id and e.seq = f.seq);`);
    this.addSql(`drop view run_event_feed;`);
    this.addSql(`alter table "tool_invocations" drop column "settled_seq";`);
    this.addSql(`alter table "run_steps" drop column "event_seq", drop column "event_summary";`);
  }

}
