import { Migration } from '@mikro-orm/migrations';

/**
 * Executing root runs get an index of their own, and the ceilings' count reads it on a generic
 * plan. Every start counts them (keel_locked_root_run_counts, twice per admission, and the
 * claim's candidate query). Through the status index that count visited every run that had
 * executed since the last vacuum, as a status change leaves the old entry behind and a bitmap
 * scan never marks one dead: after 2,000 runs, 2,000 entries and 236 heap pages to find none.
 * A plain scan of this small index marks what it finds dead, so the next count skips it.
 * The function named its statuses by a parameter, which only a plan made per call (0.07-0.15 ms
 * of planning, twice per admission) could match to an index; it names them itself now. Both
 * lists are domain EXECUTING_STATUSES (test/ledger-statements.test.ts holds them to it).
 */
export class Migration20261227000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`create index "runs_executing_root_index" on "runs" ("status", "agent_id") where "parent_run_id" is null and "status" in ('running', 'awaiting_tool');`);
    this.addSql(`drop function keel_locked_root_run_counts(text, int, int, bigint, bigint, int, text[]);`);
    this.addSql(lockedCounts(`status in ('running', 'awaiting_tool')`, ""));
  }

  override async down(): Promise<void> {
    this.addSql(`drop function keel_locked_root_run_counts(text, int, int, bigint, bigint, int);`);
    this.addSql(lockedCounts("status = any(p_executing)", ", p_executing text[]"));
    this.addSql(`alter function keel_locked_root_run_counts(text, int, int, bigint, bigint, int, text[]) set plan_cache_mode = force_custom_plan;`);
    this.addSql(`drop index "runs_executing_root_index";`);
  }

}

/** The function of Migration20261206000000, counting the runs `executing` selects. */
function lockedCounts(executing: string, extraParameter: string): string {
  return `create function keel_locked_root_run_counts(
      p_agent_id text, p_agent_ceiling int, p_install_ceiling int, p_admission_lock bigint, p_slot_lock bigint, p_slots int${extraParameter},
      out agent_executing bigint, out all_executing bigint, out margin int)
    language plpgsql volatile as $$
    declare
      slot int;
    begin
      margin := 0;
      for pass in 1 .. 2 loop
        -- Counted before the locks to choose how to lock, and after them (a fresh snapshot) to answer.
        select count(*) filter (where agent_id = p_agent_id), count(*) into agent_executing, all_executing
          from runs where ${executing} and parent_run_id is null;
        exit when pass = 2;
        if agent_executing + p_slots <= p_agent_ceiling and all_executing + p_slots <= p_install_ceiling then
          select s into slot from generate_series(0, p_slots - 1) s where pg_try_advisory_xact_lock(p_slot_lock + s) limit 1;
        end if;
        if slot is null then
          perform pg_advisory_xact_lock(p_admission_lock);
        else
          perform pg_advisory_xact_lock_shared(p_admission_lock);
          margin := p_slots - 1;
        end if;
      end loop;
    end $$;`;
}
