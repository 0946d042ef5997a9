import { Migration } from '@mikro-orm/migrations';

/**
 * keel_locked_root_run_counts replaces keel_may_start_root_run: it takes the same locks (a free
 * slot lock and the admission lock shared when far from both ceilings, else the admission lock
 * exclusively), then counts executing root runs on a fresh snapshot, and returns the counts with
 * the margin the other slots need. Whether that leaves room is decided by the caller's SQL,
 * rendered from the one run-start rule (ledger/run-start.sql.ts), as are the statuses counted.
 */
export class Migration20261206000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`drop function keel_may_start_root_run(text, int, int, bigint, bigint, int);`);
    this.addSql(`create function keel_locked_root_run_counts(
        p_agent_id text, p_agent_ceiling int, p_install_ceiling int, p_admission_lock bigint, p_slot_lock bigint, p_slots int,
        p_executing text[], out agent_executing bigint, out all_executing bigint, out margin int)
      language plpgsql volatile as $$
      declare
        slot int;
      begin
        margin := 0;
        for pass in 1 .. 2 loop
          -- Counted before the locks to choose how to lock, and after them (a fresh snapshot) to answer.
          select count(*) filter (where agent_id = p_agent_id), count(*) into agent_executing, all_executing
            from runs where status = any(p_executing) and parent_run_id is null;
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
      end $$;`);
  }

  override async down(): Promise<void> {
    this.addSql(`drop function keel_locked_root_run_counts(text, int, int, bigint, bigint, int, text[]);`);
  }

}
