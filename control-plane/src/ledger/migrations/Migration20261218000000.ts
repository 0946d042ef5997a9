import { Migration } from '@mikro-orm/migrations';

/**
 * Admission plans its statements generically (plan_cache_mode force_generic_plan, set for the
 * transaction). keel_locked_root_run_counts, which its insert calls, counts the executing root
 * runs by a status list passed as a parameter: only a plan made with the list's values reads
 * that through the status index, so the function plans with the values whatever its caller set.
 */
export class Migration20261218000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter function keel_locked_root_run_counts(text, int, int, bigint, bigint, int, text[]) set plan_cache_mode = force_custom_plan;`);
  }

  override async down(): Promise<void> {
    this.addSql(`alter function keel_locked_root_run_counts(text, int, int, bigint, bigint, int, text[]) reset plan_cache_mode;`);
  }

}
