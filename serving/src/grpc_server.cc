#include "grpc_server.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

#include "codec.h"
#include "grpc_service.grpc.pb.h"
#include "http_server.h"  // kServerName, kServerVersion
#include "logging.h"
#include "metrics.h"
#include "model.h"
#include "repository.h"

namespace serving {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using inference::InferParameter;
using inference::InferTensorContents;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

// The KServe v2 extensions this endpoint implements.
constexpr const char* kExtensions[] = {"binary_tensor_data", "classification",
                                       "statistics", "model_repository"};

grpc::Status ToGrpc(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return grpc::Status::OK;
    case StatusCode::kInvalidArgument:
      return {grpc::StatusCode::INVALID_ARGUMENT, status.message()};
    case StatusCode::kNotFound:
      return {grpc::StatusCode::NOT_FOUND, status.message()};
    case StatusCode::kPayloadTooLarge:
      return {grpc::StatusCode::RESOURCE_EXHAUSTED, status.message()};
    case StatusCode::kUnavailable:
      return {grpc::StatusCode::UNAVAILABLE, status.message()};
    case StatusCode::kDeadlineExceeded:
      return {grpc::StatusCode::DEADLINE_EXCEEDED, status.message()};
    default:
      return {grpc::StatusCode::INTERNAL, status.message()};
  }
}

// Runs a handler body; an exception becomes an Internal error instead of
// escaping into gRPC (which would abort the process).
template <typename Fn>
Status Guarded(const char* rpc, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    LogError("gRPC handler failed", {{"rpc", rpc}, {"error", e.what()}});
    return Internal(std::string("internal error: ") + e.what());
  } catch (...) {
    LogError("gRPC handler failed", {{"rpc", rpc}, {"error", "unknown"}});
    return Internal("internal error");
  }
}

// An integer parameter's value (nullopt: not an integer, or too large).
std::optional<int64_t> IntParameter(const InferParameter& param) {
  switch (param.parameter_choice_case()) {
    case InferParameter::kInt64Param:
      return param.int64_param();
    case InferParameter::kUint64Param:
      if (param.uint64_param() >
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return std::nullopt;
      }
      return static_cast<int64_t>(param.uint64_param());
    default:
      return std::nullopt;
  }
}

// --- ModelInfer request decoding ---------------------------------------------

// Elements in all the typed lists of `c`.
int64_t ContentsCount(const InferTensorContents& c) {
  return int64_t{c.bool_contents_size()} + c.int_contents_size() +
         c.int64_contents_size() + c.uint_contents_size() +
         c.uint64_contents_size() + c.fp32_contents_size() +
         c.fp64_contents_size() + c.bytes_contents_size();
}

template <typename Dst, typename Src>
void AppendValue(Src value, std::vector<char>* out) {
  const Dst converted = static_cast<Dst>(value);
  const size_t offset = out->size();
  out->resize(offset + sizeof(Dst));
  std::memcpy(out->data() + offset, &converted, sizeof(Dst));
}

// Checks that contents.<field> (`size` elements) is the only typed list set
// (`all_lists` elements in all) and fills the shape of the input at `index`.
Status CheckList(int64_t size, int64_t all_lists, const std::string& field,
                 size_t index, RequestInputs* inputs) {
  const Tensor& tensor = inputs->input(index);
  if (all_lists != size) {
    return InvalidArgument(
        "input '" + tensor.name + "': " + DataTypeName(tensor.dtype) +
        " elements go in " + field + ", other contents lists are set");
  }
  return inputs->CheckElementCount(index, size, field);
}

// Converts the typed list `values` (contents.<field>) into the input at
// `index` as `Dst` elements, each of which must fit `Dst`.
template <typename Dst, typename List>
Status ConvertList(const List& values, const char* field, int64_t all_lists,
                   size_t index, RequestInputs* inputs) {
  const std::string name = std::string("contents.") + field;
  RETURN_IF_ERROR(CheckList(values.size(), all_lists, name, index, inputs));
  Tensor& tensor = inputs->input(index);
  tensor.data.reserve(static_cast<size_t>(values.size()) * sizeof(Dst));
  int64_t i = 0;
  for (const auto& value : values) {
    using Src = std::decay_t<decltype(value)>;
    if constexpr (std::is_integral_v<Src> && !std::is_same_v<Src, bool> &&
                  sizeof(Dst) < sizeof(Src)) {
      const int64_t wide = static_cast<int64_t>(value);
      if (wide < static_cast<int64_t>(std::numeric_limits<Dst>::min()) ||
          wide > static_cast<int64_t>(std::numeric_limits<Dst>::max())) {
        return InvalidArgument("input '" + tensor.name + "': " + name +
                               " element " + std::to_string(i) + " (" +
                               std::to_string(wide) + ") is not a valid " +
                               DataTypeName(tensor.dtype) + " value");
      }
    }
    AppendValue<Dst>(value, &tensor.data);
    ++i;
  }
  return Status::Ok();
}

// BYTES from contents.bytes_contents, stored length-prefixed like raw data.
Status ConvertBytesList(const InferTensorContents& c, int64_t all_lists,
                        size_t index, RequestInputs* inputs) {
  const auto& values = c.bytes_contents();
  RETURN_IF_ERROR(CheckList(values.size(), all_lists, "contents.bytes_contents",
                            index, inputs));
  Tensor& tensor = inputs->input(index);
  for (const std::string& item : values) {
    AppendValue<uint32_t>(static_cast<uint32_t>(item.size()), &tensor.data);
    tensor.data.insert(tensor.data.end(), item.begin(), item.end());
  }
  return Status::Ok();
}

// Fills the input at `index` (name, dtype and shape set) from its typed
// contents, in the list its datatype uses.
Status ReadTypedInput(const InferTensorContents& c, size_t index,
                      RequestInputs* inputs) {
  const int64_t all = ContentsCount(c);
  const Tensor& tensor = inputs->input(index);
  switch (tensor.dtype) {
    case DataType::kBool:
      return ConvertList<uint8_t>(c.bool_contents(), "bool_contents", all,
                                  index, inputs);
    case DataType::kInt8:
      return ConvertList<int8_t>(c.int_contents(), "int_contents", all, index,
                                 inputs);
    case DataType::kInt16:
      return ConvertList<int16_t>(c.int_contents(), "int_contents", all, index,
                                  inputs);
    case DataType::kInt32:
      return ConvertList<int32_t>(c.int_contents(), "int_contents", all, index,
                                  inputs);
    case DataType::kInt64:
      return ConvertList<int64_t>(c.int64_contents(), "int64_contents", all,
                                  index, inputs);
    case DataType::kUint8:
      return ConvertList<uint8_t>(c.uint_contents(), "uint_contents", all,
                                  index, inputs);
    case DataType::kUint16:
      return ConvertList<uint16_t>(c.uint_contents(), "uint_contents", all,
                                   index, inputs);
    case DataType::kUint32:
      return ConvertList<uint32_t>(c.uint_contents(), "uint_contents", all,
                                   index, inputs);
    case DataType::kUint64:
      return ConvertList<uint64_t>(c.uint64_contents(), "uint64_contents", all,
                                   index, inputs);
    case DataType::kFp32:
      return ConvertList<float>(c.fp32_contents(), "fp32_contents", all, index,
                                inputs);
    case DataType::kFp64:
      return ConvertList<double>(c.fp64_contents(), "fp64_contents", all, index,
                                 inputs);
    case DataType::kBytes:
      return ConvertBytesList(c, all, index, inputs);
    default:
      return InvalidArgument("input '" + tensor.name +
                             "': " + DataTypeName(tensor.dtype) +
                             " data can only be sent in raw_input_contents");
  }
}

// Fills the input at `index` from raw_input_contents[position].
Status ReadRawInput(const std::string& raw, int position, bool has_contents,
                    size_t index, RequestInputs* inputs) {
  Tensor& tensor = inputs->input(index);
  const std::string field =
      "raw_input_contents[" + std::to_string(position) + "]";
  if (has_contents) {
    return InvalidArgument("input '" + tensor.name +
                           "' has both contents and " + field);
  }
  RETURN_IF_ERROR(inputs->CheckRawByteSize(
      index, static_cast<int64_t>(raw.size()), field + " size"));
  tensor.data.assign(raw.begin(), raw.end());
  return Status::Ok();
}

// One element of `inputs`, checked like a REST input (see RequestInputs).
Status ParseInput(const ModelInferRequest& req, int position,
                  RequestInputs* inputs) {
  const auto& in = req.inputs(position);
  ASSIGN_OR_RETURN(const size_t index, inputs->Add(in.name()));
  RETURN_IF_ERROR(inputs->SetDatatype(index, in.datatype()));
  RETURN_IF_ERROR(
      inputs->SetShape(index, Shape(in.shape().begin(), in.shape().end())));
  for (const auto& [key, param] : in.parameters()) {
    RETURN_IF_ERROR(inputs->CheckParameter(index, key));
  }
  if (req.raw_input_contents_size() > 0) {
    const bool has_contents =
        in.has_contents() && ContentsCount(in.contents()) > 0;
    return ReadRawInput(req.raw_input_contents(position), position,
                        has_contents, index, inputs);
  }
  return ReadTypedInput(in.contents(), index, inputs);
}

// The requested outputs (all of them when none is named).
Status ParseOutputs(const ModelInferRequest& req, const ModelIO& io,
                    std::vector<RequestedOutput>* outputs) {
  if (req.outputs_size() == 0) {
    *outputs = AllOutputs(io, /*binary=*/true);
    return Status::Ok();
  }
  for (const auto& out : req.outputs()) {
    ASSIGN_OR_RETURN(RequestedOutput requested,
                     ResolveOutput(out.name(), io, *outputs));
    requested.binary = true;  // always raw_output_contents
    for (const auto& [key, param] : out.parameters()) {
      RETURN_IF_ERROR(
          ApplyOutputParameter(key, IntParameter(param), &requested));
    }
    outputs->push_back(std::move(requested));
  }
  return Status::Ok();
}

// Decodes and validates a ModelInferRequest with the REST codec's checks.
StatusOr<InferRequest> ParseGrpcRequest(const ModelInferRequest& req,
                                        const ModelIO& model_io) {
  InferRequest request;
  if (!req.id().empty()) request.id = req.id();
  if (const auto it = req.parameters().find("timeout");
      it != req.parameters().end()) {
    ASSIGN_OR_RETURN(request.timeout_us,
                     CheckTimeoutParameter(IntParameter(it->second)));
  }
  for (const auto& in : req.inputs()) {
    request.text = request.text || IsTextInput(in.name(), model_io);
  }
  ModelIO text_io;
  const ModelIO& io = RequestModelIO(model_io, request.text, &text_io);
  if (req.raw_input_contents_size() > 0 &&
      req.raw_input_contents_size() != req.inputs_size()) {
    return InvalidArgument(
        "raw_input_contents has " +
        std::to_string(req.raw_input_contents_size()) +
        " entries but the request has " + std::to_string(req.inputs_size()) +
        " inputs: send one per input, in the order of 'inputs'");
  }
  RequestInputs inputs(io);
  for (int i = 0; i < req.inputs_size(); ++i) {
    RETURN_IF_ERROR(ParseInput(req, i, &inputs));
  }
  RETURN_IF_ERROR(inputs.CheckComplete());
  RETURN_IF_ERROR(inputs.Finish(&request));
  RETURN_IF_ERROR(ParseOutputs(req, io, &request.outputs));
  return request;
}

// Fills `response`: one output and one raw_output_contents entry per
// requested output, in request order.
Status EncodeGrpcResponse(const Model& model, const InferRequest& request,
                          const std::vector<Tensor>& outputs,
                          ModelInferResponse* response) {
  response->set_model_name(model.name());
  response->set_model_version(model.version());
  if (request.id.has_value()) response->set_id(*request.id);
  Tensor storage;
  for (const auto& requested : request.outputs) {
    ASSIGN_OR_RETURN(const Tensor* tensor,
                     ResponseTensor(requested, outputs, model.io(), &storage));
    auto* out = response->add_outputs();
    out->set_name(requested.name);
    out->set_datatype(DataTypeName(tensor->dtype));
    for (const int64_t dim : tensor->shape)
      out->add_shape(dim);
    response->add_raw_output_contents()->assign(tensor->data.data(),
                                                tensor->data.size());
  }
  return Status::Ok();
}

// From enqueue: the server's timeout, or the request's "timeout" parameter
// or the client's gRPC deadline when shorter.
Clock::time_point InferDeadline(int64_t request_timeout_ms,
                                int64_t request_timeout_us,
                                std::chrono::system_clock::time_point client) {
  const auto now = Clock::now();
  auto deadline = RequestDeadline(request_timeout_ms, request_timeout_us);
  const auto left = client - std::chrono::system_clock::now();
  if (left < deadline - now) {
    deadline = now + std::chrono::duration_cast<Clock::duration>(
                         std::max(left, decltype(left)::zero()));
  }
  return deadline;
}

// One unary call on raw bytes: the request is parsed here, so a malformed one
// gets INVALID_ARGUMENT (gRPC's generated handler would answer an empty
// UNIMPLEMENTED), and the response is serialized when the call finishes.
// Finish must be called exactly once.
template <typename Req, typename Resp>
class UnaryCall {
 public:
  UnaryCall(grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out)
      : ctx_(ctx), reactor_(ctx->DefaultReactor()), out_(out) {}

  grpc::CallbackServerContext* context() const { return ctx_; }
  grpc::ServerUnaryReactor* reactor() const { return reactor_; }
  Req& request() { return request_; }
  Resp& response() { return response_; }

  Status Parse(const grpc::ByteBuffer* in) {
    grpc::ByteBuffer bytes(*in);  // shares the slices; Deserialize consumes it
    if (grpc::SerializationTraits<Req>::Deserialize(&bytes, &request_).ok()) {
      return Status::Ok();
    }
    return InvalidArgument("malformed request: not a valid inference." +
                           Req::descriptor()->name() + " protobuf message");
  }

  void Finish(const Status& status) {
    Status result = status;
    if (result.ok()) {
      bool own_buffer = false;
      const grpc::Status s = grpc::SerializationTraits<Resp>::Serialize(
          response_, out_, &own_buffer);
      if (!s.ok()) {
        result =
            Internal("cannot serialize the response: " + s.error_message());
      }
    }
    reactor_->Finish(ToGrpc(result));
  }

 private:
  grpc::CallbackServerContext* const ctx_;  // valid until Finish
  grpc::ServerUnaryReactor* const reactor_;
  grpc::ByteBuffer* const out_;
  Req request_;
  Resp response_;
};

// One ModelInfer call in flight: records the request metrics (as its HTTP
// equivalent status) when it finishes.
class InferCall : public UnaryCall<ModelInferRequest, ModelInferResponse> {
 public:
  using UnaryCall::UnaryCall;

  // Counts the call in `metrics` (nullable) from now on.
  void Track(ServingMetrics* metrics) {
    metrics_ = metrics;
    if (metrics_ != nullptr) metrics_->AddInflight(1);
  }
  void SetModel(std::shared_ptr<Model> model) { model_ = std::move(model); }
  Model& model() const { return *model_; }
  InferRequest& infer_request() { return infer_request_; }

  void Finish(const Status& status) {
    if (metrics_ != nullptr) {
      const double seconds =
          std::chrono::duration<double>(Clock::now() - start_).count();
      metrics_->RecordInferRequest(
          status.ok() ? 200 : HttpStatusFor(status.code()), seconds);
      metrics_->AddInflight(-1);
    }
    if (status.code() == StatusCode::kInternal) {
      LogError("gRPC ModelInfer failed", {{"error", status.message()}});
    }
    UnaryCall::Finish(status);
  }

 private:
  const Clock::time_point start_ = Clock::now();
  ServingMetrics* metrics_ = nullptr;
  std::shared_ptr<Model> model_;
  InferRequest infer_request_;  // its inputs are moved into the model
};

// --- statistics and repository mapping ---------------------------------------

void SetDuration(const json& stats, const char* key,
                 inference::StatisticDuration* out) {
  const auto it = stats.find(key);
  if (it == stats.end() || !it->is_object()) return;
  out->set_count(it->value("count", uint64_t{0}));
  out->set_ns(it->value("ns", uint64_t{0}));
}

// One element of ModelRepository::Statistics()'s "model_stats".
void SetModelStatistics(const json& in, inference::ModelStatistics* out) {
  out->set_name(in.value("name", std::string()));
  out->set_version(in.value("version", std::string()));
  out->set_last_inference(in.value("last_inference", uint64_t{0}));
  out->set_inference_count(in.value("inference_count", uint64_t{0}));
  out->set_execution_count(in.value("execution_count", uint64_t{0}));
  if (const auto it = in.find("inference_stats");
      it != in.end() && it->is_object()) {
    auto* s = out->mutable_inference_stats();
    SetDuration(*it, "success", s->mutable_success());
    SetDuration(*it, "fail", s->mutable_fail());
    SetDuration(*it, "queue", s->mutable_queue());
    SetDuration(*it, "compute_input", s->mutable_compute_input());
    SetDuration(*it, "compute_infer", s->mutable_compute_infer());
    SetDuration(*it, "compute_output", s->mutable_compute_output());
    SetDuration(*it, "cache_hit", s->mutable_cache_hit());
    SetDuration(*it, "cache_miss", s->mutable_cache_miss());
  }
  if (const auto it = in.find("batch_stats");
      it != in.end() && it->is_array()) {
    for (const auto& batch : *it) {
      auto* b = out->add_batch_stats();
      b->set_batch_size(batch.value("batch_size", uint64_t{0}));
      SetDuration(batch, "compute_input", b->mutable_compute_input());
      SetDuration(batch, "compute_infer", b->mutable_compute_infer());
      SetDuration(batch, "compute_output", b->mutable_compute_output());
    }
  }
}

// RepositoryModelLoad's parameters as the JSON object Load takes.
StatusOr<json> LoadParameters(
    const google::protobuf::Map<
        std::string, inference::ModelRepositoryParameter>& parameters) {
  json out = json::object();
  for (const auto& [key, param] : parameters) {
    switch (param.parameter_choice_case()) {
      case inference::ModelRepositoryParameter::kStringParam:
        out[key] = param.string_param();
        break;
      case inference::ModelRepositoryParameter::kBoolParam:
        out[key] = param.bool_param();
        break;
      case inference::ModelRepositoryParameter::kInt64Param:
        out[key] = param.int64_param();
        break;
      case inference::ModelRepositoryParameter::kBytesParam:
        return InvalidArgument("load parameter '" + key +
                               "': bytes_param (model file contents) is not "
                               "supported; pass model_dir instead");
      default:
        return InvalidArgument("load parameter '" + key + "' has no value");
    }
  }
  return out;
}

void SetTensorMetadata(
    const json& specs,
    google::protobuf::RepeatedPtrField<
        inference::ModelMetadataResponse::TensorMetadata>* out) {
  for (const auto& spec : specs) {
    auto* t = out->Add();
    t->set_name(spec.value("name", std::string()));
    t->set_datatype(spec.value("datatype", std::string()));
    if (const auto it = spec.find("shape"); it != spec.end()) {
      for (const auto& dim : *it)
        t->add_shape(dim.get<int64_t>());
    }
  }
}

}  // namespace

// --- the service
// ---------------------------------------------------------------

namespace {

// Every method on raw bytes (see UnaryCall).
using G = inference::GRPCInferenceService;
using RawService = G::WithRawCallbackMethod_ServerLive<
    G::WithRawCallbackMethod_ServerReady<G::WithRawCallbackMethod_ModelReady<
        G::WithRawCallbackMethod_ServerMetadata<
            G::WithRawCallbackMethod_ModelMetadata<
                G::WithRawCallbackMethod_ModelInfer<
                    G::WithRawCallbackMethod_ModelStatistics<
                        G::WithRawCallbackMethod_RepositoryIndex<
                            G::WithRawCallbackMethod_RepositoryModelLoad<
                                G::WithRawCallbackMethod_RepositoryModelUnload<
                                    G::Service>>>>>>>>>>;

}  // namespace

// A thread that runs posted tasks in order: finishes ModelInfer calls off the
// batcher workers, so a worker goes back to inference at once instead of
// encoding the response and writing it through gRPC's HTTP/2 stack itself.
class Finisher {
 public:
  Finisher() : thread_([this] { Loop(); }) {}
  ~Finisher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();  // runs what is queued first
  }
  void Post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;
};

struct GrpcServer::Impl final : public RawService {
  GrpcOptions options;
  ModelRepository* repository = nullptr;
  std::atomic<bool> draining{false};
  std::unique_ptr<grpc::Server> server;
  int port = 0;

  // finishes ModelInfer calls (see Finisher); shared with the calls' inference
  // callbacks, so one that completes after Shutdown (a cancelled call whose
  // inference still ran) still has it
  std::shared_ptr<Finisher> finisher = std::make_shared<Finisher>();

  std::mutex mu;  // guards the fields below
  std::condition_variable jobs_done;
  int jobs = 0;  // RunOffThread tasks still running
  bool shut_down = false;

  ~Impl() override = default;

  // Runs `task` on its own thread (model loads block for a long time; a
  // gRPC thread must not). Shutdown waits for it.
  void RunOffThread(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++jobs;
    }
    std::thread([this, task = std::move(task)] {
      task();
      std::lock_guard<std::mutex> lock(mu);
      --jobs;
      jobs_done.notify_all();
    }).detach();
  }

  // Parses the request, then hands the call to `start`, which finishes it
  // now or later.
  template <typename Req, typename Resp, typename Start>
  static grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* in,
                                         grpc::ByteBuffer* out, Start&& start) {
    auto call = std::make_shared<UnaryCall<Req, Resp>>(ctx, out);
    grpc::ServerUnaryReactor* reactor = call->reactor();
    if (Status parsed = call->Parse(in); !parsed.ok()) {
      call->Finish(parsed);
    } else {
      start(std::move(call));
    }
    return reactor;
  }

  // A call answered on this thread: `fn(request, &response)` -> Status.
  template <typename Req, typename Resp, typename Fn>
  static grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* in,
                                          grpc::ByteBuffer* out,
                                          const char* rpc, Fn&& fn) {
    return Serve<Req, Resp>(ctx, in, out, [&](auto call) {
      call->Finish(
          Guarded(rpc, [&] { return fn(call->request(), &call->response()); }));
    });
  }

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* in,
                                       grpc::ByteBuffer* out) override {
    return Answer<inference::ServerLiveRequest, inference::ServerLiveResponse>(
        ctx, in, out, "ServerLive", [](const auto&, auto* response) {
          response->set_live(true);
          return Status::Ok();
        });
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* in,
                                        grpc::ByteBuffer* out) override {
    return Answer<inference::ServerReadyRequest,
                  inference::ServerReadyResponse>(
        ctx, in, out, "ServerReady", [this](const auto&, auto* response) {
          response->set_ready(!draining.load() && repository->ready());
          return Status::Ok();
        });
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* in,
                                       grpc::ByteBuffer* out) override {
    return Answer<inference::ModelReadyRequest, inference::ModelReadyResponse>(
        ctx, in, out, "ModelReady",
        [this](const auto& request, auto* response) -> Status {
          auto model = repository->Find(request.name(), request.version());
          if (!model.ok() &&
              model.status().code() != StatusCode::kUnavailable) {
            return model.status();  // unknown model or version
          }
          response->set_ready(model.ok() && (*model)->ready() &&
                              !draining.load());
          return Status::Ok();
        });
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* in,
                                           grpc::ByteBuffer* out) override {
    return Answer<inference::ServerMetadataRequest,
                  inference::ServerMetadataResponse>(
        ctx, in, out, "ServerMetadata", [](const auto&, auto* response) {
          response->set_name(kServerName);
          response->set_version(kServerVersion);
          for (const char* extension : kExtensions) {
            response->add_extensions(extension);
          }
          return Status::Ok();
        });
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* in,
                                          grpc::ByteBuffer* out) override {
    return Answer<inference::ModelMetadataRequest,
                  inference::ModelMetadataResponse>(
        ctx, in, out, "ModelMetadata",
        [this](const auto& request, auto* response) -> Status {
          ASSIGN_OR_RETURN(auto model,
                           repository->Find(request.name(), request.version()));
          const json meta = model->Metadata();
          response->set_name(meta.value("name", std::string()));
          for (const auto& v : meta.value("versions", json::array())) {
            response->add_versions(v.template get<std::string>());
          }
          response->set_platform(meta.value("platform", std::string()));
          SetTensorMetadata(meta.value("inputs", json::array()),
                            response->mutable_inputs());
          SetTensorMetadata(meta.value("outputs", json::array()),
                            response->mutable_outputs());
          return Status::Ok();
        });
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* in,
                                       grpc::ByteBuffer* out) override {
    auto call = std::make_shared<InferCall>(ctx, out);
    grpc::ServerUnaryReactor* reactor = call->reactor();
    const Status status =
        Guarded("ModelInfer", [&] { return StartInfer(call, in); });
    if (!status.ok()) call->Finish(status);
    return reactor;
  }

  // Parses and queues a ModelInfer call; an error return means `call` is
  // not finished yet.
  Status StartInfer(const std::shared_ptr<InferCall>& call,
                    const grpc::ByteBuffer* in) {
    if (Status parsed = call->Parse(in); !parsed.ok()) {
      call->Track(repository->server_metrics());
      return parsed;
    }
    const ModelInferRequest& request = call->request();
    auto routed =
        repository->Route(request.model_name(), request.model_version());
    if (!routed.ok()) {
      call->Track(repository->server_metrics());
      return routed.status();
    }
    std::shared_ptr<Model> model = routed->answer;
    call->Track(model->metrics());
    if (!model->ready()) {
      return Unavailable("model '" + model->name() + "' is not ready");
    }
    ASSIGN_OR_RETURN(call->infer_request(),
                     ParseGrpcRequest(request, model->io()));
    const auto deadline = InferDeadline(options.request_timeout_ms,
                                        call->infer_request().timeout_us,
                                        call->context()->deadline());
    LogContext context{call->infer_request().id.value_or(""), routed->role, true};
    StartShadow(*routed, call->infer_request().inputs, deadline, &context);
    std::vector<Tensor> inputs = std::move(call->infer_request().inputs);
    call->SetModel(model);
    // From here on the model's callback finishes `call` (on a batcher
    // worker, or on this thread for an early error).
    model->InferAsync(std::move(inputs), deadline,
                      [finisher = finisher, call](StatusOr<std::vector<Tensor>> outputs) {
                        auto finish = [call, outputs = std::move(outputs)]() {
                          if (!outputs.ok()) return call->Finish(outputs.status());
                          call->Finish(Guarded("ModelInfer", [&] {
                            return EncodeGrpcResponse(call->model(),
                                                      call->infer_request(),
                                                      *outputs, &call->response());
                          }));
                        };
                        // Never on the batcher worker: finishing a call there
                        // runs gRPC's HTTP/2 write on it (measured: digits,
                        // 1 worker, gRPC/REST req/s 0.71 -> 1.07 at 16 clients,
                        // 0.53 -> 0.76 at 1; docs/serving-benchmark.md).
                        finisher->Post(std::move(finish));
                      },
                      context);
    return Status::Ok();
  }

  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* in,
                                            grpc::ByteBuffer* out) override {
    return Answer<inference::ModelStatisticsRequest,
                  inference::ModelStatisticsResponse>(
        ctx, in, out, "ModelStatistics",
        [this](const auto& request, auto* response) -> Status {
          ASSIGN_OR_RETURN(
              const json stats,
              repository->Statistics(request.name(), request.version()));
          for (const auto& model : stats.value("model_stats", json::array())) {
            SetModelStatistics(model, response->add_model_stats());
          }
          return Status::Ok();
        });
  }

  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* in,
                                            grpc::ByteBuffer* out) override {
    return Answer<inference::RepositoryIndexRequest,
                  inference::RepositoryIndexResponse>(
        ctx, in, out, "RepositoryIndex",
        [this](const auto& request, auto* response) {
          for (const auto& entry : repository->Index(request.ready())) {
            auto* model = response->add_models();
            model->set_name(entry.value("name", std::string()));
            model->set_version(entry.value("version", std::string()));
            model->set_state(entry.value("state", std::string()));
            model->set_reason(entry.value("reason", std::string()));
          }
          return Status::Ok();
        });
  }

  grpc::ServerUnaryReactor* RepositoryModelLoad(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
      grpc::ByteBuffer* out) override {
    using Call = UnaryCall<inference::RepositoryModelLoadRequest,
                           inference::RepositoryModelLoadResponse>;
    return Serve<inference::RepositoryModelLoadRequest,
                 inference::RepositoryModelLoadResponse>(
        ctx, in, out, [this](std::shared_ptr<Call> call) {
          auto parameters = LoadParameters(call->request().parameters());
          if (!parameters.ok()) return call->Finish(parameters.status());
          // Load compiles the model (seconds): off the gRPC threads.
          RunOffThread([this, call, params = std::move(parameters).value()] {
            call->Finish(Guarded("RepositoryModelLoad", [&] {
              return repository->Load(call->request().model_name(), params);
            }));
          });
        });
  }

  grpc::ServerUnaryReactor* RepositoryModelUnload(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
      grpc::ByteBuffer* out) override {
    using Call = UnaryCall<inference::RepositoryModelUnloadRequest,
                           inference::RepositoryModelUnloadResponse>;
    return Serve<inference::RepositoryModelUnloadRequest,
                 inference::RepositoryModelUnloadResponse>(
        ctx, in, out, [this](std::shared_ptr<Call> call) {
          // Unload waits for a running load: off the gRPC threads as well.
          RunOffThread([this, call] {
            call->Finish(Guarded("RepositoryModelUnload", [&] {
              return repository->Unload(call->request().model_name());
            }));
          });
        });
  }
};

GrpcServer::GrpcServer() : impl_(std::make_unique<Impl>()) {}

GrpcServer::~GrpcServer() {
  Shutdown(0);
}

StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Create(
    const GrpcOptions& options, ModelRepository* repository) {
  if (repository == nullptr) {
    return InvalidArgument("the gRPC server needs a model repository");
  }
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgument("--grpc-port must be in [0, 65535], got " +
                           std::to_string(options.port));
  }
  if (options.max_message_bytes < 1) {
    return InvalidArgument("the gRPC message limit must be >= 1 byte");
  }
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  server->impl_->options = options;
  server->impl_->repository = repository;
  return server;
}

Status GrpcServer::Start() {
  Impl& impl = *impl_;
  if (impl.server) return Internal("the gRPC server is already started");
  const std::string& host = impl.options.host;
  const std::string address =
      (host.find(':') != std::string::npos && host.front() != '['
           ? "[" + host + "]"
           : host) +
      ":" + std::to_string(impl.options.port);
  const int limit = static_cast<int>(
      std::min<int64_t>(impl.options.max_message_bytes, INT_MAX));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
                           &impl.port);
  builder.RegisterService(&impl);
  builder.SetMaxReceiveMessageSize(limit);
  builder.SetMaxSendMessageSize(limit);
  // Like the HTTP listener: no SO_REUSEPORT, so a second server cannot bind
  // the same port and silently share its traffic.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  impl.server = builder.BuildAndStart();
  if (!impl.server || impl.port == 0) {
    impl.server.reset();
    return Unavailable("cannot bind the gRPC port " + address +
                       " (address in use or invalid host)");
  }
  return Status::Ok();
}

void GrpcServer::SetDraining() {
  impl_->draining = true;
}

void GrpcServer::Shutdown(int64_t grace_ms) {
  Impl& impl = *impl_;
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    if (impl.shut_down) return;
    impl.shut_down = true;
  }
  if (impl.server) {
    // Returns once every call finished (in-flight ones are cancelled after
    // the grace period; inference still completes within its deadline).
    impl.server->Shutdown(
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(std::max<int64_t>(0, grace_ms)));
  }
  std::unique_lock<std::mutex> lock(impl.mu);
  impl.jobs_done.wait(lock, [&impl] { return impl.jobs == 0; });
}

int GrpcServer::port() const {
  return impl_->port;
}

}  // namespace serving
