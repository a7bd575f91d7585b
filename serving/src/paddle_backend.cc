#include "paddle_backend.h"

#include <cctype>
#include <cstdlib>
#include <exception>

#include "logging.h"

namespace serving {
namespace {

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Runtime name for served tensor i: the signature's recorded runtime name,
// else the served name, else position i.
StatusOr<std::vector<std::string>> MapNames(
    const std::vector<std::string>& runtime,
    const std::vector<TensorSpec>& specs, const std::vector<std::string>& hints,
    const char* what) {
  if (runtime.size() != specs.size()) {
    return InvalidArgument("the model has " + std::to_string(runtime.size()) +
                           " " + what + "s but signature.json declares " +
                           std::to_string(specs.size()));
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::string chosen = runtime[i];
    for (const std::string& want :
         {i < hints.size() ? hints[i] : std::string(), specs[i].name}) {
      bool found = false;
      for (const auto& name : runtime) {
        if (!want.empty() && name == want) {
          chosen = name;
          found = true;
          break;
        }
      }
      if (found) break;
    }
    names.push_back(chosen);
  }
  return names;
}

// "gpu" | "gpu:N" -> N (0), -1 for CPU.
int GpuId(const std::string& device) {
  std::string lower;
  for (char c : device)
    lower += static_cast<char>(std::tolower(c));
  if (lower.rfind("gpu", 0) != 0) return -1;
  const auto colon = lower.find(':');
  return colon == std::string::npos ? 0 : std::atoi(lower.c_str() + colon + 1);
}

}  // namespace

StatusOr<std::unique_ptr<Backend>> PaddleBackend::Create(
    const BackendOptions& options) {
  if (options.instances < 1) return InvalidArgument("need at least 1 worker");
  std::unique_ptr<PaddleBackend> backend(new PaddleBackend(options));
  RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

Status PaddleBackend::Init() {
  paddle_infer::Config config;
  config.SetModel(options_.model_path, options_.params_path);
  // PIR programs (.json) need the new IR; legacy .pdmodel programs the old.
  config.EnableNewIR(EndsWith(options_.model_path, ".json"));
  const int gpu = GpuId(options_.device);
  if (gpu >= 0) {
    config.EnableUseGpu(static_cast<uint64_t>(options_.gpu_memory_mb), gpu);
    if (options_.tensorrt) {
      config.EnableTensorRtEngine(
          1 << 30, static_cast<int>(options_.max_batch_size),
          /*min_subgraph_size=*/3, paddle_infer::PrecisionType::kFloat32,
          /*use_static=*/false, /*use_calib_mode=*/false);
    }
  } else {
    config.DisableGpu();
    config.EnableMKLDNN();
    if (options_.threads_per_instance > 0) {
      config.SetCpuMathLibraryNumThreads(options_.threads_per_instance);
    }
  }
  config.EnableMemoryOptim();
  try {
    main_ = paddle_infer::CreatePredictor(config);
  } catch (const std::exception& e) {
    return InvalidArgument("Paddle Inference cannot load " +
                           options_.model_path + ": " + e.what());
  }
  if (!main_) {
    return InvalidArgument("Paddle Inference cannot load " +
                           options_.model_path);
  }
  ASSIGN_OR_RETURN(input_names_,
                   MapNames(main_->GetInputNames(), options_.inputs,
                            options_.runtime_input_names, "input"));
  ASSIGN_OR_RETURN(output_names_,
                   MapNames(main_->GetOutputNames(), options_.outputs,
                            options_.runtime_output_names, "output"));
  predictors_.push_back(main_);
  for (int i = 1; i < options_.instances; ++i) {
    predictors_.push_back(
        std::shared_ptr<paddle_infer::Predictor>(main_->Clone()));
  }
  LogInfo("paddle inference predictor created",
          {{"model", options_.model_path},
           {"device", gpu >= 0 ? "gpu:" + std::to_string(gpu) : "cpu"},
           {"tensorrt", gpu >= 0 && options_.tensorrt},
           {"workers", options_.instances}});
  return Status::Ok();
}

Status PaddleBackend::Infer(size_t instance, const std::vector<Tensor>& inputs,
                            std::vector<Tensor>* outputs) {
  if (instance >= predictors_.size()) {
    return Internal("no predictor #" + std::to_string(instance));
  }
  paddle_infer::Predictor& predictor = *predictors_[instance];
  try {
    for (size_t i = 0; i < inputs.size() && i < input_names_.size(); ++i) {
      const Tensor& in = inputs[i];
      auto handle = predictor.GetInputHandle(input_names_[i]);
      handle->Reshape(std::vector<int>(in.shape.begin(), in.shape.end()));
      switch (in.dtype) {
        case DataType::kFp32:
          handle->CopyFromCpu(in.data_as<float>());
          break;
        case DataType::kInt64:
          handle->CopyFromCpu(in.data_as<int64_t>());
          break;
        case DataType::kInt32:
          handle->CopyFromCpu(in.data_as<int32_t>());
          break;
        default:
          return InvalidArgument(std::string("datatype ") +
                                 DataTypeName(in.dtype) +
                                 " is not supported by the paddle backend");
      }
    }
    if (!predictor.Run()) return Internal("Paddle Inference Run() failed");
    outputs->clear();
    for (size_t j = 0; j < output_names_.size(); ++j) {
      auto handle = predictor.GetOutputHandle(output_names_[j]);
      const std::vector<int> shape = handle->shape();
      Tensor out =
          Tensor::Allocate(options_.outputs[j].name, options_.outputs[j].dtype,
                           Shape(shape.begin(), shape.end()));
      switch (out.dtype) {
        case DataType::kFp32:
          handle->CopyToCpu(out.data_as<float>());
          break;
        case DataType::kInt64:
          handle->CopyToCpu(out.data_as<int64_t>());
          break;
        case DataType::kInt32:
          handle->CopyToCpu(out.data_as<int32_t>());
          break;
        default:
          return Internal(std::string("output datatype ") +
                          DataTypeName(out.dtype) +
                          " is not supported by the paddle backend");
      }
      outputs->push_back(std::move(out));
    }
  } catch (const std::exception& e) {
    return Internal(std::string("Paddle Inference failed: ") + e.what());
  }
  return Status::Ok();
}

}  // namespace serving
