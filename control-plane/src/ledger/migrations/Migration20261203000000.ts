import { Migration } from '@mikro-orm/migrations';

/**
 * keel_run_control: NOTIFY with a run's id whenever what a working run must react to at its next
 * safe point changes (cancellation, supersession, pause, new triggers), whoever wrote it; and
 * with an empty payload when an agent's policy changes (every run of it may be affected). A
 * worker that holds a read's result back (it rides with the next commit) needs to read the run's
 * control state only when one of these arrived, instead of after every read.
 */
export class Migration20261203000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`create function keel_notify_run_control() returns trigger language plpgsql as $$
      begin
        perform pg_notify('keel_run_control', case when tg_table_name = 'runs' then new.id::text else '' end);
        return null;
      end $$;`);
    this.addSql(`create trigger runs_control_changed after update on runs for each row
      when (old.cancel_requested_by_actor_id is distinct from new.cancel_requested_by_actor_id
        or old.superseded_by_run_id is distinct from new.superseded_by_run_id
        or old.paused is distinct from new.paused
        or old.trigger_count is distinct from new.trigger_count)
      execute function keel_notify_run_control();`);
    this.addSql(`create trigger agents_policy_changed after update on agents for each row
      when (old.spec -> 'policy' is distinct from new.spec -> 'policy')
      execute function keel_notify_run_control();`);
  }

  override async down(): Promise<void> {
    this.addSql(`drop trigger agents_policy_changed on agents;`);
    this.addSql(`drop trigger runs_control_changed on runs;`);
    this.addSql(`drop function keel_notify_run_control();`);
  }

}
