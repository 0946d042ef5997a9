// AgentService's install settings RPCs (admin only, as the whole service is). A change is one
// ledger write that every replica's next start decision reads; it is logged with who, old and new.
import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import type { Logger } from "pino";
import { InstallSettingsSchema, type AgentService, type InstallSettings as InstallSettingsMessage } from "../../../gen/keel/v1/agent_service_pb.js";
import { describeChange, validateInstallSettingsChange, type InstallSettingsChange, type InstallSettingsRecord } from "../domain/install-settings.js";
import type { InstallSettingsRepository } from "../ledger/install-settings.repository.js";
import { principalOf } from "./auth.js";

export interface InstallSettingsRpcDeps {
  readonly settings: InstallSettingsRepository;
  /** Where each change is recorded at info. */
  readonly log: Logger;
}

export function installSettingsToProto(record: InstallSettingsRecord): InstallSettingsMessage {
  return create(InstallSettingsSchema, {
    rootRunCeiling: record.rootRunCeiling,
    retentionDays: record.retentionDays,
    updatedBy: record.updatedBy ?? "",
    updatedAt: timestampFromDate(record.updatedAt),
  });
}

export function createInstallSettingsRpcs(deps: InstallSettingsRpcDeps): Pick<ServiceImpl<typeof AgentService>, "getInstallSettings" | "putInstallSettings"> {
  return {
    async getInstallSettings() {
      return { settings: installSettingsToProto(await deps.settings.get()) };
    },
    async putInstallSettings(request, context) {
      const change: InstallSettingsChange = validateInstallSettingsChange({
        ...(request.rootRunCeiling === undefined ? {} : { rootRunCeiling: request.rootRunCeiling }),
        ...(request.retentionDays === undefined ? {} : { retentionDays: request.retentionDays }),
      });
      // Nothing to set: the current settings, and no change recorded.
      if (Object.keys(change).length === 0) return { settings: installSettingsToProto(await deps.settings.get()) };
      const principal = principalOf(context);
      const by = `${principal.role} token ${principal.tokenId}${principal.label === "" ? "" : ` (${principal.label})`}`;
      const { before, after } = await deps.settings.update(change, by);
      deps.log.info({ by, changed: describeChange(before, after), at: after.updatedAt.toISOString() }, "install settings changed");
      return { settings: installSettingsToProto(after) };
    },
  };
}
