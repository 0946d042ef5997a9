import { Migration } from '@mikro-orm/migrations';

/**
 * Forks (RunService.ForkRun): a run started by an operator from a committed step of another run.
 * The fork also inherits from its source (inherits_from_run_id), which is what keeps the source
 * from being collected while the fork exists; these columns say it is a fork and from where.
 */
export class Migration20261212000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "runs" add column "forked_from_run_id" uuid null, add column "forked_at_step" int null, add column "fork_reason" text null;`);
    this.addSql(`alter table "runs" add constraint "runs_forked_from_run_id_foreign" foreign key ("forked_from_run_id") references "runs" ("id") on update no action on delete no action;`);
    this.addSql(`create index "runs_forked_from_run_id_index" on "runs" ("forked_from_run_id") where "forked_from_run_id" is not null;`);
  }

  override async down(): Promise<void> {
    this.addSql(`drop index "runs_forked_from_run_id_index";`);
    this.addSql(`alter table "runs" drop constraint "runs_forked_from_run_id_foreign";`);
    this.addSql(`alter table "runs" drop column "forked_from_run_id", drop column "forked_at_step", drop column "fork_reason";`);
  }

}
