import { Migration } from '@mikro-orm/migrations';

/** When a change to a run's row tells its worker something (Migration20261211000000). */
const CONTROL_CHANGED = `when (old.cancel_requested_by_actor_id is distinct from new.cancel_requested_by_actor_id
        or old.superseded_by_run_id is distinct from new.superseded_by_run_id
        or old.paused is distinct from new.paused
        or old.trigger_count is distinct from new.trigger_count
        or old.side_usage is distinct from new.side_usage)
      execute function keel_notify_run_control()`;

/**
 * runs_control_changed now names the columns it watches. A row trigger's WHEN clause is read
 * back from the catalog and compiled on every statement that updates runs, step commits
 * included: about 6% of a step commit's PostgreSQL time. Named columns let PostgreSQL skip the
 * trigger, WHEN and all, for an update that sets none of them, as every step commit does; an
 * update that sets one still fires only when the value changed.
 */
export class Migration20261225000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`drop trigger runs_control_changed on runs;`);
    this.addSql(`create trigger runs_control_changed
      after update of cancel_requested_by_actor_id, superseded_by_run_id, paused, trigger_count, side_usage on runs for each row
      ${CONTROL_CHANGED};`);
  }

  override async down(): Promise<void> {
    this.addSql(`drop trigger runs_control_changed on runs;`);
    this.addSql(`create trigger runs_control_changed after update on runs for each row
      ${CONTROL_CHANGED};`);
  }

}
