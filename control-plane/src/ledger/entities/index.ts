import { ActorEntity } from "./actor.entity.js";
import { AgentEntity } from "./agent.entity.js";
import { ApiTokenEntity } from "./api-token.entity.js";
import { ApiTokenKeyEntity } from "./api-token-key.entity.js";
import { ArtifactEntity } from "./artifact.entity.js";
import { ConversationEntity } from "./conversation.entity.js";
import { EmissionEntity } from "./emission.entity.js";
import { InstallSettingsEntity } from "./install-settings.entity.js";
import { MessageEntity } from "./message.entity.js";
import { SideModelCallEntity } from "./side-model-call.entity.js";
import { ModelToolSetEntity } from "./model-tool-set.entity.js";
import { ObservationEntity } from "./observation.entity.js";
import { ProgressEventEntity } from "./progress-event.entity.js";
import { RunEventEntity } from "./run-event.entity.js";
import { RunStepEntity } from "./run-step.entity.js";
import { RunTriggerEntity } from "./run-trigger.entity.js";
import { RunEntity } from "./run.entity.js";
import { SandboxHostEntity } from "./sandbox-host.entity.js";
import { SandboxRelayEntity } from "./sandbox-relay.entity.js";
import { ToolInvocationEntity } from "./tool-invocation.entity.js";
import { WorkGraphEntity } from "./work-graph.entity.js";
import { WorkNodeAttemptEntity } from "./work-node-attempt.entity.js";
import { WorkNodeEntity } from "./work-node.entity.js";
import { WorkspaceEntity } from "./workspace.entity.js";

/** Every entity, listed explicitly: no folder scanning. */
export const ledgerEntities = [
  AgentEntity,
  ActorEntity,
  ConversationEntity,
  MessageEntity,
  RunEntity,
  RunTriggerEntity,
  RunStepEntity,
  SideModelCallEntity,
  ModelToolSetEntity,
  ToolInvocationEntity,
  ObservationEntity,
  ArtifactEntity,
  EmissionEntity,
  ProgressEventEntity,
  RunEventEntity,
  WorkGraphEntity,
  WorkNodeEntity,
  WorkNodeAttemptEntity,
  SandboxHostEntity,
  WorkspaceEntity,
  SandboxRelayEntity,
  ApiTokenEntity,
  ApiTokenKeyEntity,
  InstallSettingsEntity,
] as const;
