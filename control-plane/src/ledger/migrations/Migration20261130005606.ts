import { Migration } from '@mikro-orm/migrations';

export class Migration20261130005606 extends Migration {

  override async up(): Promise<void> {
    this.addSql(`create table "actors" ("id" text not null, "display_name" text not null default '', "first_seen_at" timestamptz not null default now(), constraint "actors_pkey" primary key ("id"));`);

    this.addSql(`create table "agents" ("id" text not null, "spec" jsonb not null, "revision" int not null, "created_at" timestamptz not null default now(), "updated_at" timestamptz not null default now(), constraint "agents_pkey" primary key ("id"));`);

    this.addSql(`create table "api_tokens" ("id" uuid not null, "token_hash" text not null, "role" text not null, "label" text not null default '', "created_at" timestamptz not null default now(), "revoked_at" timestamptz null, constraint "api_tokens_pkey" primary key ("id"));`);
    this.addSql(`alter table "api_tokens" add constraint "api_tokens_token_hash_unique" unique ("token_hash");`);

    this.addSql(`create table "artifacts" ("id" uuid not null, "run_id" uuid not null, "tool_invocation_id" uuid null, "type" text not null, "schema_version" text not null, "provenance" text not null, "inline_data" text null, "reference" text null, "subject_artifact_id" uuid null, "conclusion" text null, "created_at" timestamptz not null default now(), constraint "artifacts_pkey" primary key ("id"));`);
    this.addSql(`create index "artifacts_run_id_index" on "artifacts" ("run_id");`);

    this.addSql(`create table "conversations" ("id" uuid not null, "agent_id" text not null, "external_id" text not null, "connector" text not null, "created_at" timestamptz not null default now(), constraint "conversations_pkey" primary key ("id"));`);
    this.addSql(`alter table "conversations" add constraint "conversations_agent_id_external_id_unique" unique ("agent_id", "external_id");`);

    this.addSql(`create table "emissions" ("id" uuid not null, "seq" bigserial, "idempotency_key" text not null, "connector" text not null, "kind" text not null, "run_id" uuid null, "agent_id" text not null, "conversation_id" uuid not null, "external_conversation_id" text not null, "reply_to_message_id" text null, "text" text not null default '', "ack_state" text null, "addressed_actor_ids" jsonb not null, "delivery_status" text not null default 'pending', "remote_ref" text null, "delivery_detail" text null, "created_at" timestamptz not null default now(), "settled_at" timestamptz null, constraint "emissions_pkey" primary key ("id"));`);
    this.addSql(`alter table "emissions" add constraint "emissions_seq_unique" unique ("seq");`);
    this.addSql(`alter table "emissions" add constraint "emissions_idempotency_key_unique" unique ("idempotency_key");`);
    this.addSql(`create index "emissions_connector_seq_index" on "emissions" ("connector", "seq");`);
    this.addSql(`create index "emissions_run_id_index" on "emissions" ("run_id");`);

    this.addSql(`create table "messages" ("id" uuid not null, "conversation_id" uuid not null, "external_id" text not null, "actor_id" text not null, "text" text not null, "reply_to_external_id" text null, "run_id" uuid null, "edited_at" timestamptz null, "created_at" timestamptz not null default now(), constraint "messages_pkey" primary key ("id"));`);
    this.addSql(`alter table "messages" add constraint "messages_conversation_id_external_id_unique" unique ("conversation_id", "external_id");`);

    this.addSql(`create table "model_calls" ("id" uuid not null, "run_id" uuid not null, "step_id" uuid not null, "role" text not null, "provider" text not null, "model" text not null, "request" jsonb not null, "response_text" text not null, "tool_calls" jsonb not null, "input_tokens" int not null, "output_tokens" int not null, "latency_ms" int not null, "finish_reason" text not null, "cost_micro_usd" bigint not null default 0, "created_at" timestamptz not null default now(), constraint "model_calls_pkey" primary key ("id"));`);
    this.addSql(`create index "model_calls_run_id_index" on "model_calls" ("run_id");`);
    this.addSql(`create index "model_calls_step_id_index" on "model_calls" ("step_id");`);

    this.addSql(`create table "observations" ("id" uuid not null, "run_id" uuid not null, "tool_invocation_id" uuid not null, "seq" int not null, "stream" text not null, "text" text not null, "truncated" boolean not null default false, "observed_at" timestamptz not null default now(), constraint "observations_pkey" primary key ("id"));`);
    this.addSql(`create index "observations_run_id_index" on "observations" ("run_id");`);
    this.addSql(`alter table "observations" add constraint "observations_tool_invocation_id_seq_unique" unique ("tool_invocation_id", "seq");`);

    this.addSql(`create table "progress_events" ("id" uuid not null, "run_id" uuid not null, "subject" text not null, "seq" int not null, "emission_id" uuid null, "text" text not null, "created_at" timestamptz not null default now(), constraint "progress_events_pkey" primary key ("id"));`);
    this.addSql(`alter table "progress_events" add constraint "progress_events_subject_seq_unique" unique ("subject", "seq");`);

    this.addSql(`create table "runs" ("id" uuid not null, "agent_id" text not null, "conversation_id" uuid not null, "connector" text not null, "status" text not null, "wait_reason" text null, "shape" text not null default 'loop', "commit_boundary" text not null default 'buffering', "parent_run_id" uuid null, "root_run_id" uuid null, "superseded_by_run_id" uuid null, "continuation_of_run_id" uuid null, "requested_by_actor_id" text not null, "reply_to_message_id" text null, "budget" jsonb not null, "usage" jsonb not null, "final_reply" text null, "error" text null, "exhausted_dimension" text null, "step_count" int not null default 0, "event_seq" int not null default 0, "paused" boolean not null default false, "cancel_requested_by_actor_id" text null, "cancel_reason" text null, "lease_owner" text null, "lease_epoch" bigint not null default 0, "lease_expires_at" timestamptz null, "not_before" timestamptz not null default now(), "started_at" timestamptz null, "created_at" timestamptz not null default now(), "updated_at" timestamptz not null default now(), "finished_at" timestamptz null, constraint "runs_pkey" primary key ("id"));`);
    this.addSql(`create index "runs_status_not_before_index" on "runs" ("status", "not_before");`);
    this.addSql(`create index "runs_agent_id_conversation_id_created_at_index" on "runs" ("agent_id", "conversation_id", "created_at");`);
    this.addSql(`create index "runs_conversation_id_status_index" on "runs" ("conversation_id", "status");`);

    this.addSql(`create table "run_events" ("run_id" uuid not null, "seq" int not null, "kind" text not null, "status" text null, "step_id" uuid null, "tool_invocation_id" uuid null, "summary" text not null default '', "at" timestamptz not null default now(), constraint "run_events_pkey" primary key ("run_id", "seq"));`);

    this.addSql(`create table "run_steps" ("id" uuid not null, "run_id" uuid not null, "index" int not null, "replayability" text not null, "run_status_after" text not null, "actor_id" text null, "feedback" text null, "lease_epoch" bigint not null, "started_at" timestamptz not null, "committed_at" timestamptz not null default now(), constraint "run_steps_pkey" primary key ("id"));`);
    this.addSql(`alter table "run_steps" add constraint "run_steps_run_id_index_unique" unique ("run_id", "index");`);

    this.addSql(`create table "run_triggers" ("run_id" uuid not null, "message_id" uuid not null, "actor_id" text not null, "external_message_id" text not null, "received_at" timestamptz not null default now(), constraint "run_triggers_pkey" primary key ("run_id", "message_id"));`);

    this.addSql(`create table "sandbox_hosts" ("id" text not null, "capacity" jsonb not null, "labels" jsonb not null, "backends" jsonb not null, "images" jsonb not null, "instance_id" text not null default '', "connected" boolean not null default false, "last_heartbeat_at" timestamptz null, "registered_at" timestamptz not null default now(), constraint "sandbox_hosts_pkey" primary key ("id"));`);

    this.addSql(`create table "tool_invocations" ("id" uuid not null, "run_id" uuid not null, "step_id" uuid null, "model_call_id" uuid null, "provider_call_id" text not null, "ordinal" int not null, "tool_name" text not null, "tool_version" text not null, "effect" text not null, "arguments" jsonb not null, "status" text not null, "refusal_reason" text null, "result_text" text null, "exit_code" int null, "duration_ms" int null, "output_truncated" boolean not null default false, "resolved_outcome" text null, "resolved_by_actor_id" text null, "resolution_reason" text null, "created_at" timestamptz not null default now(), "finished_at" timestamptz null, constraint "tool_invocations_pkey" primary key ("id"));`);
    this.addSql(`create index "tool_invocations_run_id_status_index" on "tool_invocations" ("run_id", "status");`);
    this.addSql(`create index "tool_invocations_step_id_index" on "tool_invocations" ("step_id");`);

    this.addSql(`create table "work_graphs" ("id" uuid not null, "root_run_id" uuid not null, "revision" int not null default 0, "replans" int not null default 0, "aggregate_usage" jsonb not null, "created_at" timestamptz not null default now(), constraint "work_graphs_pkey" primary key ("id"));`);
    this.addSql(`alter table "work_graphs" add constraint "work_graphs_root_run_id_unique" unique ("root_run_id");`);

    this.addSql(`create table "work_nodes" ("id" uuid not null, "graph_id" uuid not null, "key" text not null, "kind" text not null, "status" text not null, "objective" text not null, "depends_on" jsonb not null, "gate_decision" text null, "gate_decided_by_actor_id" text null, "created_at" timestamptz not null default now(), constraint "work_nodes_pkey" primary key ("id"));`);
    this.addSql(`alter table "work_nodes" add constraint "work_nodes_graph_id_key_unique" unique ("graph_id", "key");`);

    this.addSql(`create table "work_node_attempts" ("id" uuid not null, "node_id" uuid not null, "ordinal" int not null, "status" text not null, "replayability" text not null, "child_run_id" uuid null, "started_at" timestamptz not null default now(), "finished_at" timestamptz null, constraint "work_node_attempts_pkey" primary key ("id"));`);
    this.addSql(`alter table "work_node_attempts" add constraint "work_node_attempts_node_id_ordinal_unique" unique ("node_id", "ordinal");`);

    this.addSql(`create table "workspaces" ("id" uuid not null, "host_id" text not null, "run_id" uuid not null, "image" text not null, "status" text not null, "acquired_at" timestamptz not null default now(), "released_at" timestamptz null, "keep_until" timestamptz null, constraint "workspaces_pkey" primary key ("id"));`);
    this.addSql(`create index "workspaces_host_id_status_index" on "workspaces" ("host_id", "status");`);
    this.addSql(`create index "workspaces_run_id_status_index" on "workspaces" ("run_id", "status");`);
  }

}
