import { Migration } from '@mikro-orm/migrations';

/**
 * keel_may_start_root_run: the locks and the ceiling check for starting a root run at admission,
 * inside the statement that inserts the run, so the start costs no round trip of its own. The
 * counts after the locks are taken on fresh snapshots (a volatile function's queries each take
 * their own), so they see every start committed before the locks were granted.
 *
 * Far from both ceilings (room for every slot), it takes a free slot lock and the admission lock
 * in shared mode: up to `slots` starts commit side by side, each leaving room for the others.
 * Near a ceiling, or with every slot taken, it takes the admission lock exclusively and counts
 * exactly, as claimNext does. The lock keys and the slot count come from the caller.
 */
export class Migration20261204100000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`create function keel_may_start_root_run(
        p_agent_id text, p_agent_ceiling int, p_install_ceiling int, p_admission_lock bigint, p_slot_lock bigint, p_slots int)
      returns boolean language plpgsql volatile as $$
      declare
        agent_running bigint;
        all_running bigint;
        slot int;
        margin int := 0;
      begin
        select count(*) filter (where agent_id = p_agent_id), count(*) into agent_running, all_running
          from runs where status in ('running', 'awaiting_tool') and parent_run_id is null;
        if agent_running + p_slots <= p_agent_ceiling and all_running + p_slots <= p_install_ceiling then
          for s in 0 .. p_slots - 1 loop
            if pg_try_advisory_xact_lock(p_slot_lock + s) then
              slot := s;
              exit;
            end if;
          end loop;
        end if;
        if slot is null then
          perform pg_advisory_xact_lock(p_admission_lock);
        else
          perform pg_advisory_xact_lock_shared(p_admission_lock);
          margin := p_slots - 1;
        end if;
        select count(*) filter (where agent_id = p_agent_id), count(*) into agent_running, all_running
          from runs where status in ('running', 'awaiting_tool') and parent_run_id is null;
        return agent_running + margin < p_agent_ceiling and all_running + margin < p_install_ceiling;
      end $$;`);
  }

  override async down(): Promise<void> {
    this.addSql(`drop function keel_may_start_root_run(text, int, int, bigint, bigint, int);`);
  }

}
