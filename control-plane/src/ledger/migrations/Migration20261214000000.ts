import { Migration } from '@mikro-orm/migrations';

/**
 * Install-wide settings every replica must agree on, in one row of the ledger instead of each
 * process's environment (issue #17, item 2). The row exists from the start with the defaults the
 * environment variables had (64 root runs, 30 days), so statements can read it by a subquery and
 * never find it missing; updated_by stays null until someone sets a value.
 */
export class Migration20261214000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`create table "install_settings" ("id" int not null, "root_run_ceiling" int not null, "retention_days" int not null, "updated_by" text null, "updated_at" timestamptz not null default now(), constraint "install_settings_pkey" primary key ("id"));`);
    this.addSql(`insert into "install_settings" ("id", "root_run_ceiling", "retention_days") values (1, 64, 30);`);
  }

  override async down(): Promise<void> {
    this.addSql(`drop table if exists "install_settings" cascade;`);
  }

}
