#include "backend.h"

#ifdef SERVING_WITH_OPENVINO
#include "openvino_backend.h"
#endif
#ifdef SERVING_WITH_PADDLE_INFERENCE
#include "paddle_backend.h"
#endif

namespace serving {

StatusOr<std::unique_ptr<Backend>> Backend::Create(
    const BackendOptions& options) {
  if (options.kind == "openvino") {
#ifdef SERVING_WITH_OPENVINO
    return OpenVinoBackend::Create(options);
#else
    return InvalidArgument("built without OpenVINO (-DWITH_OPENVINO=ON)");
#endif
  }
  if (options.kind == "paddle") {
#ifdef SERVING_WITH_PADDLE_INFERENCE
    return PaddleBackend::Create(options);
#else
    return InvalidArgument(
        "--backend=paddle needs a build with -DWITH_PADDLE_INFERENCE=ON "
        "-DPADDLE_INFERENCE_DIR=<Paddle Inference C++ SDK>");
#endif
  }
  return InvalidArgument("unknown backend '" + options.kind + "'");
}

}  // namespace serving
