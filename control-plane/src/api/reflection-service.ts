import { createRegistry, toBinary } from "@bufbuild/protobuf";
import type { DescFile, DescService } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import type { ConnectRouter } from "@connectrpc/connect";
import * as v1 from "../../../gen/grpc/reflection/v1/reflection_pb.js";
import * as v1alpha from "../../../gen/grpc/reflection/v1alpha/reflection_pb.js";

// v1 and v1alpha share one wire format but have distinct generated types; the
// answer is written once against this plain shape, which fits both versions.
type Answer =
  | { case: "fileDescriptorResponse"; value: { fileDescriptorProto: Uint8Array[] } }
  | { case: "allExtensionNumbersResponse"; value: { baseTypeName: string; extensionNumber: number[] } }
  | { case: "listServicesResponse"; value: { service: { name: string }[] } }
  | { case: "errorResponse"; value: { errorCode: number; errorMessage: string } };

type Query = v1.ServerReflectionRequest["messageRequest"] | v1alpha.ServerReflectionRequest["messageRequest"];

export function registerReflection(router: ConnectRouter, services: readonly DescService[]): void {
  const answer = createAnswerer([...services, v1.ServerReflection, v1alpha.ServerReflection]);
  router.service(v1.ServerReflection, { serverReflectionInfo: (requests) => respond(requests, answer) });
  router.service(v1alpha.ServerReflection, { serverReflectionInfo: (requests) => respond(requests, answer) });
}

async function* respond<R extends { host: string; messageRequest: Query }>(
  requests: AsyncIterable<R>,
  answer: (query: Query) => Answer,
): AsyncIterable<{ validHost: string; originalRequest: R; messageResponse: Answer }> {
  for await (const request of requests) {
    yield { validHost: request.host, originalRequest: request, messageResponse: answer(request.messageRequest) };
  }
}

function createAnswerer(services: readonly DescService[]): (query: Query) => Answer {
  const files = new Map<string, DescFile>();
  const collect = (file: DescFile): void => {
    if (files.has(file.proto.name)) return;
    files.set(file.proto.name, file);
    file.dependencies.forEach(collect);
  };
  services.forEach((service) => collect(service.file));
  const registry = createRegistry(...files.values());
  const serviceNames = [...new Set(services.map((service) => service.typeName))];

  // Clients resolve imports from the same response rather than asking again
  // for every file, so each answer carries the whole import closure.
  const withDependencies = (file: DescFile): Answer => {
    const closure = new Set<DescFile>();
    const visit = (f: DescFile): void => {
      if (closure.has(f)) return;
      closure.add(f);
      f.dependencies.forEach(visit);
    };
    visit(file);
    const fileDescriptorProto = [...closure].map((f) => toBinary(FileDescriptorProtoSchema, f.proto));
    return { case: "fileDescriptorResponse", value: { fileDescriptorProto } };
  };

  const findSymbol = (name: string): DescFile | undefined => {
    const type = registry.get(name);
    if (type) return type.file;
    // Methods are not registry entries; look them up through their service.
    const dot = name.lastIndexOf(".");
    const service = registry.getService(name.slice(0, dot));
    return service?.methods.some((m) => m.name === name.slice(dot + 1)) ? service.file : undefined;
  };

  const notFound = (errorMessage: string): Answer => ({
    case: "errorResponse",
    value: { errorCode: Code.NotFound, errorMessage },
  });

  return (query) => {
    switch (query.case) {
      case "listServices":
        return { case: "listServicesResponse", value: { service: serviceNames.map((name) => ({ name })) } };
      case "fileByFilename": {
        const file = files.get(query.value);
        return file ? withDependencies(file) : notFound(`file not found: ${query.value}`);
      }
      case "fileContainingSymbol": {
        const file = findSymbol(query.value);
        return file ? withDependencies(file) : notFound(`symbol not found: ${query.value}`);
      }
      case "fileContainingExtension": {
        const { containingType, extensionNumber } = query.value;
        const message = registry.getMessage(containingType);
        const extension = message && registry.getExtensionFor(message, extensionNumber);
        return extension
          ? withDependencies(extension.file)
          : notFound(`extension not found: ${containingType} ${extensionNumber}`);
      }
      case "allExtensionNumbersOfType": {
        if (!registry.getMessage(query.value)) return notFound(`message not found: ${query.value}`);
        const extensionNumber = [...registry].flatMap((type) =>
          type.kind === "extension" && type.extendee.typeName === query.value ? [type.number] : [],
        );
        return { case: "allExtensionNumbersResponse", value: { baseTypeName: query.value, extensionNumber } };
      }
      default:
        return { case: "errorResponse", value: { errorCode: Code.InvalidArgument, errorMessage: "empty request" } };
    }
  };
}
