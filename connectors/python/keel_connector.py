#!/usr/bin/env python3
"""A Keel connector in Python over gRPC: submits a message, follows the connector's emissions from
a stored cursor, acknowledges each one and answers the run's questions.

Stubs come from proto/ (see generate.sh); pass their folder with --stubs or KEEL_PY_STUBS.
Each emission is printed as one JSON line, so a program (or a test) can read the output.
"""
import argparse
import json
import os
import sys
import uuid


def load_stubs(folder):
    sys.path.insert(0, folder)
    global grpc, json_format, emission_pb2, emission_grpc, ingress_pb2, ingress_grpc, run_pb2
    import grpc
    from google.protobuf import json_format
    from keel.v1 import emission_service_pb2 as emission_pb2
    from keel.v1 import emission_service_pb2_grpc as emission_grpc
    from keel.v1 import ingress_service_pb2 as ingress_pb2
    from keel.v1 import ingress_service_pb2_grpc as ingress_grpc
    from keel.v1 import run_pb2


class KeelConnector:
    """One connector name on one Keel: its ingress calls, and its emission stream from a cursor."""

    def __init__(self, target, token, connector, state_file):
        self.channel = grpc.insecure_channel(target)
        self.metadata = (("authorization", "Bearer " + token),)
        self.ingress = ingress_grpc.IngressServiceStub(self.channel)
        self.emissions = emission_grpc.EmissionServiceStub(self.channel)
        self.connector = connector
        self.state_file = state_file
        self.after_seq = self._load_cursor()

    def _load_cursor(self):
        try:
            with open(self.state_file) as f:
                return int(json.load(f).get("after_seq", 0))
        except FileNotFoundError:
            return 0

    def handled(self, emission):
        """Moves the cursor past an emission once it is handled, so a restart resumes after it."""
        self._save_cursor(emission.seq)

    def _save_cursor(self, seq):
        # Written aside and renamed, so a crash leaves the old cursor or the new one.
        self.after_seq = seq
        temporary = self.state_file + ".tmp"
        with open(temporary, "w") as f:
            json.dump({"after_seq": seq}, f)
        os.replace(temporary, self.state_file)

    def submit(self, agent, conversation, actor, text, message_id=None):
        request = ingress_pb2.SubmitMessageRequest(
            agent_id=agent, conversation_id=conversation, actor=run_pb2.Actor(id=actor),
            message_id=message_id or "py-" + str(uuid.uuid4()), text=text, connector=self.connector)
        return self.ingress.SubmitMessage(request, metadata=self.metadata, timeout=30)

    def answer(self, run_id, actor, text):
        request = ingress_pb2.AnswerInputRequest(
            run_id=run_id, actor=run_pb2.Actor(id=actor), text=text, message_id="py-" + str(uuid.uuid4()))
        return self.ingress.AnswerInput(request, metadata=self.metadata, timeout=30)

    def acknowledge(self, emission, outcome, remote_ref="", detail=""):
        request = emission_pb2.AcknowledgeEmissionRequest(
            emission_id=emission.id, outcome=outcome, remote_ref=remote_ref, detail=detail)
        return self.emissions.AcknowledgeEmission(request, metadata=self.metadata, timeout=30)

    def follow(self, timeout=None):
        """Yields emissions after the cursor, oldest first, then live; call handled() after each."""
        request = emission_pb2.SubscribeRequest(connector=self.connector, after_seq=self.after_seq)
        stream = self.emissions.Subscribe(request, metadata=self.metadata, timeout=timeout)
        try:
            for response in stream:
                yield response.emission
        finally:
            stream.cancel()


def pending(emission):
    """Settled emissions (delivered, failed, ambiguous) are never delivered again, e.g. after a rewind."""
    return emission.delivery_status in (emission_pb2.DELIVERY_STATUS_UNSPECIFIED, emission_pb2.DELIVERY_STATUS_PENDING)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", help="the message to send; without it, only follow the stream")
    parser.add_argument("--target", default=os.environ.get("KEEL_TARGET", "127.0.0.1:7070"), help="host:port of Keel's gRPC port")
    parser.add_argument("--token", default=os.environ.get("KEEL_TOKEN"))
    parser.add_argument("--stubs", default=os.environ.get("KEEL_PY_STUBS", os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen")))
    parser.add_argument("--agent", default="demo")
    parser.add_argument("--conversation", default="py-" + uuid.uuid4().hex[:8])
    parser.add_argument("--actor", default=os.environ.get("USER", "python"))
    parser.add_argument("--connector", default="python")
    parser.add_argument("--state-file", default="keel-python-state.json")
    parser.add_argument("--answer", help="what to answer a question with (default: read a line from stdin)")
    parser.add_argument("--follow-seconds", type=float, default=None, help="stop following after this long")
    args = parser.parse_args()
    if not args.token:
        parser.error("pass --token or set KEEL_TOKEN")
    load_stubs(args.stubs)
    keel = KeelConnector(args.target, args.token, args.connector, args.state_file)

    run_id = None
    if args.text:
        submitted = keel.submit(args.agent, args.conversation, args.actor, args.text)
        run_id = submitted.run_id
        print(json.dumps({"submitted": run_id, "duplicate": submitted.duplicate}), flush=True)
    try:
        for emission in keel.follow(timeout=args.follow_seconds):
            line = json_format.MessageToDict(emission, preserving_proto_field_name=True)
            if not pending(emission):
                print(json.dumps({"skipped": line}), flush=True)
                keel.handled(emission)
                continue
            print(json.dumps({"emission": line}), flush=True)
            keel.acknowledge(emission, emission_pb2.DELIVERY_STATUS_DELIVERED, remote_ref="python-stdout")
            if emission.kind == emission_pb2.EMISSION_KIND_QUESTION:
                answer = args.answer if args.answer is not None else sys.stdin.readline().strip()
                keel.answer(emission.run_id, args.actor, answer)
                print(json.dumps({"answered": emission.run_id}), flush=True)
            keel.handled(emission)
            settled = emission.kind == emission_pb2.EMISSION_KIND_ACK and emission.ack_state in (
                emission_pb2.ACK_STATE_SUCCEEDED, emission_pb2.ACK_STATE_FAILED)
            if run_id is not None and settled and emission.run_id == run_id:
                return 0 if emission.ack_state == emission_pb2.ACK_STATE_SUCCEEDED else 1
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED or args.follow_seconds is None:
            print(json.dumps({"error": error.code().name, "detail": error.details()}), file=sys.stderr, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
