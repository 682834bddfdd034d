#include "server/coordinator/coordinator_service.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/impl/codegen/server_callback_handlers.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"

namespace cairn::coordinator {
namespace {

template <typename T>
using Done = Coordinator::Done<T>;

// How a method answers: calls `done` exactly once, on any thread.
template <typename Req, typename Resp>
using Handler =
    std::function<void(Coordinator&, std::shared_ptr<const Req>, Done<Resp>)>;

// A handler for a blocking library call: runs it on the worker pool.
template <typename Req, typename Resp>
Handler<Req, Resp> OnWorkers(
    std::function<absl::StatusOr<Resp>(Coordinator&, const Req&)> fn) {
  return [fn](Coordinator& c, std::shared_ptr<const Req> request,
              Done<Resp> done) {
    c.workers().Schedule(
        [&c, fn, request, done = std::move(done)] { done(fn(c, *request)); });
  };
}

template <typename Req, typename Resp>
Handler<Req, Resp> OnWorkersStatus(
    std::function<absl::Status(Coordinator&, const Req&)> fn) {
  return OnWorkers<Req, Resp>(
      [fn](Coordinator& c, const Req& r) -> absl::StatusOr<Resp> {
        absl::Status s = fn(c, r);
        if (!s.ok()) return s;
        return Resp();
      });
}

// The raw gRPC handler of one method: parses the request (INVALID_ARGUMENT
// when the bytes are not a `Req`), runs `handler`, and serializes its answer.
template <typename Req, typename Resp>
grpc::internal::MethodHandler* RawHandler(Coordinator* c,
                                          const std::string& method,
                                          Handler<Req, Resp> handler) {
  return new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer,
                                                  grpc::ByteBuffer>(
      [c, method, handler](grpc::CallbackServerContext* context,
                           const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
        grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
        auto request = std::make_shared<Req>();
        grpc::ByteBuffer bytes(*in);  // shares the slices
        const size_t size = bytes.Length();
        bool parsed = false;
        {
          grpc::ProtoBufferReader reader(&bytes);
          parsed =
              reader.status().ok() && request->ParseFromZeroCopyStream(&reader);
        }
        if (!parsed) {
          reactor->Finish(
              grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                           absl::StrCat("malformed request to ", method, ": ",
                                        size, " bytes that are not a valid ",
                                        Req::descriptor()->full_name())));
          return reactor;
        }
        handler(*c, std::move(request),
                [reactor, out](absl::StatusOr<Resp> result) {
                  if (!result.ok()) {
                    reactor->Finish(ToGrpcStatus(result.status()));
                    return;
                  }
                  bool own = false;
                  grpc::Status s = grpc::SerializationTraits<Resp>::Serialize(
                      *result, out, &own);
                  reactor->Finish(s);
                });
        return reactor;
      });
}

}  // namespace

CoordinatorService::CoordinatorService(Coordinator* coordinator) {
  const google::protobuf::ServiceDescriptor* service =
      v1::BeginSaveRequest::descriptor()->file()->FindServiceByName(
          "Coordinator");
  auto add = [&](const std::string& name, grpc::internal::MethodHandler* h) {
    const google::protobuf::MethodDescriptor* m =
        service->FindMethodByName(name);
    MarkMethodRawCallback(m->index(), h);
  };
  auto name = [&](const std::string& m) {
    return absl::StrCat(service->full_name(), "/", m);
  };
  using v1::AbortSaveRequest;
  using v1::AbortSaveResponse;
  using v1::BeginSaveRequest;
  using v1::BeginSaveResponse;
  using v1::CommitSaveRequest;
  using v1::CommitSaveResponse;
  using v1::DeleteCheckpointRequest;
  using v1::DeleteCheckpointResponse;
  using v1::ForgetAgentRequest;
  using v1::ForgetAgentResponse;
  using v1::GarbageCollectRequest;
  using v1::GarbageCollectResponse;
  using v1::GetCheckpointRequest;
  using v1::GetCheckpointResponse;
  using v1::ListAgentsRequest;
  using v1::ListAgentsResponse;
  using v1::ListCheckpointsRequest;
  using v1::ListCheckpointsResponse;
  using v1::PlanLoadRequest;
  using v1::PlanLoadResponse;
  using v1::RegisterAgentRequest;
  using v1::RegisterAgentResponse;
  using v1::VerifyLoadRequest;
  using v1::VerifyLoadResponse;

  // BeginSave and CommitSave park without a thread until every rank is in.
  add("BeginSave",
      RawHandler<BeginSaveRequest, BeginSaveResponse>(
          coordinator, name("BeginSave"),
          [](Coordinator& c, std::shared_ptr<const BeginSaveRequest> r,
             Done<BeginSaveResponse> done) {
            c.BeginSave(*r, std::move(done));
          }));
  add("CommitSave",
      RawHandler<CommitSaveRequest, CommitSaveResponse>(
          coordinator, name("CommitSave"),
          [](Coordinator& c, std::shared_ptr<const CommitSaveRequest> r,
             Done<CommitSaveResponse> done) {
            c.CommitSave(*r, std::move(done));
          }));
  add("AbortSave", RawHandler<AbortSaveRequest, AbortSaveResponse>(
                       coordinator, name("AbortSave"),
                       OnWorkersStatus<AbortSaveRequest, AbortSaveResponse>(
                           [](Coordinator& c, const AbortSaveRequest& r) {
                             return c.AbortSave(r);
                           })));
  add("PlanLoad", RawHandler<PlanLoadRequest, PlanLoadResponse>(
                      coordinator, name("PlanLoad"),
                      OnWorkers<PlanLoadRequest, PlanLoadResponse>(
                          [](Coordinator& c, const PlanLoadRequest& r) {
                            return c.PlanLoad(r);
                          })));
  // VerifyLoad may read the manifest first: start on a worker; the call then
  // parks without a thread until every rank of the load has reported.
  add("VerifyLoad",
      RawHandler<VerifyLoadRequest, VerifyLoadResponse>(
          coordinator, name("VerifyLoad"),
          [](Coordinator& c, std::shared_ptr<const VerifyLoadRequest> r,
             Done<VerifyLoadResponse> done) {
            c.workers().Schedule([&c, r, done = std::move(done)]() mutable {
              c.VerifyLoad(*r, std::move(done));
            });
          }));
  add("ListCheckpoints",
      RawHandler<ListCheckpointsRequest, ListCheckpointsResponse>(
          coordinator, name("ListCheckpoints"),
          OnWorkers<ListCheckpointsRequest, ListCheckpointsResponse>(
              [](Coordinator& c, const ListCheckpointsRequest& r) {
                return c.ListCheckpoints(r);
              })));
  add("GetCheckpoint",
      RawHandler<GetCheckpointRequest, GetCheckpointResponse>(
          coordinator, name("GetCheckpoint"),
          OnWorkers<GetCheckpointRequest, GetCheckpointResponse>(
              [](Coordinator& c, const GetCheckpointRequest& r) {
                return c.GetCheckpoint(r);
              })));
  add("DeleteCheckpoint",
      RawHandler<DeleteCheckpointRequest, DeleteCheckpointResponse>(
          coordinator, name("DeleteCheckpoint"),
          OnWorkersStatus<DeleteCheckpointRequest, DeleteCheckpointResponse>(
              [](Coordinator& c, const DeleteCheckpointRequest& r) {
                return c.DeleteCheckpoint(r);
              })));
  add("GarbageCollect",
      RawHandler<GarbageCollectRequest, GarbageCollectResponse>(
          coordinator, name("GarbageCollect"),
          OnWorkers<GarbageCollectRequest, GarbageCollectResponse>(
              [](Coordinator& c, const GarbageCollectRequest& r) {
                return c.GarbageCollect(r);
              })));
  // The agent registry writes the catalog: on a worker.
  add("RegisterAgent",
      RawHandler<RegisterAgentRequest, RegisterAgentResponse>(
          coordinator, name("RegisterAgent"),
          OnWorkers<RegisterAgentRequest, RegisterAgentResponse>(
              [](Coordinator& c, const RegisterAgentRequest& r) {
                return c.agents().Register(r);
              })));
  add("ListAgents",
      RawHandler<ListAgentsRequest, ListAgentsResponse>(
          coordinator, name("ListAgents"),
          [](Coordinator& c, std::shared_ptr<const ListAgentsRequest>,
             Done<ListAgentsResponse> done) { done(c.agents().List()); }));
  add("ForgetAgent", RawHandler<ForgetAgentRequest, ForgetAgentResponse>(
                         coordinator, name("ForgetAgent"),
                         OnWorkers<ForgetAgentRequest, ForgetAgentResponse>(
                             [](Coordinator& c, const ForgetAgentRequest& r) {
                               return c.agents().Forget(r);
                             })));
}

}  // namespace cairn::coordinator
