import { Migration } from '@mikro-orm/migrations';

/**
 * keel_run_control also fires when a run's side usage grows (a fast- or decision-model call
 * recorded beside the loop). A worker carries the side usage its last commit read back into its
 * next budget check instead of reading it before every model call; this tells it, like a
 * cancellation, that the carried value is stale.
 */
export class Migration20261211000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`drop trigger runs_control_changed on runs;`);
    this.addSql(`create trigger runs_control_changed after update on runs for each row
      when (old.cancel_requested_by_actor_id is distinct from new.cancel_requested_by_actor_id
        or old.superseded_by_run_id is distinct from new.superseded_by_run_id
        or old.paused is distinct from new.paused
        or old.trigger_count is distinct from new.trigger_count
        or old.side_usage is distinct from new.side_usage)
      execute function keel_notify_run_control();`);
  }

  override async down(): Promise<void> {
    this.addSql(`drop trigger runs_control_changed on runs;`);
    this.addSql(`create trigger runs_control_changed after update on runs for each row
      when (old.cancel_requested_by_actor_id is distinct from new.cancel_requested_by_actor_id
        or old.superseded_by_run_id is distinct from new.superseded_by_run_id
        or old.paused is distinct from new.paused
        or old.trigger_count is distinct from new.trigger_count)
      execute function keel_notify_run_control();`);
  }

}
