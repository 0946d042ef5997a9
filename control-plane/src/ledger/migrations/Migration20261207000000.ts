import { Migration } from '@mikro-orm/migrations';

/**
 * Tokens get a scope (the host or connectors they may act as) and an optional expiry. Connector
 * tokens made before scopes existed keep acting for any connector, as they did; sandbox-host
 * tokens made before are left unbound, which refuses their registration until they are
 * re-created with a host id: an unbound host token could otherwise claim any host.
 */
export class Migration20261207000000 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`alter table "api_tokens" add column "scope" jsonb not null default '{}', add column "expires_at" timestamptz null;`);
    this.addSql(`update "api_tokens" set "scope" = '{"connectors":"any","agents":"any"}' where "role" = 'connector';`);
  }

  override async down(): Promise<void> {
    this.addSql(`alter table "api_tokens" drop column "scope", drop column "expires_at";`);
  }

}
