import { Migration } from '@mikro-orm/migrations';

/**
 * Observation text is stored out of line without compression. Command output arrives in large
 * chunks on the streaming hot path; compressing each one (pglz, the only method the embedded
 * build has) cost PostgreSQL about as much CPU as everything else it does for a stream. Disk is
 * the cheaper resource here; operators who prefer the other trade can set it back per install
 * (ALTER TABLE observations ALTER COLUMN text SET STORAGE EXTENDED).
 */
export class Migration20261202000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "observations" alter column "text" set storage external;`);
  }

  override async down(): Promise<void> {
    this.addSql(`alter table "observations" alter column "text" set storage extended;`);
  }

}
